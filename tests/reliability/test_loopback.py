"""Everything streamjudge (or its example app) opens for listening is bound to 127.0.0.1: the example app
under zero-code instrumentation with its defaults, and the OTLP file receiver of ``replay`` /
``cases-from-trace``. Read from the kernel's socket tables, not from the code's intentions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import streamjudge
from streamjudge.offline.otlp_file import OTLPFileReceiver

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "adaptive_rag" / "app.py"


def _hex_addr(text: str) -> str:
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return f"[{socket.inet_ntop(socket.AF_INET6, words)}]:{int(port, 16)}"


def listening(pid: int) -> list[str]:
    """The local addresses of the TCP sockets ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                    out.append(_hex_addr(fields[1]))
    return out


def _loopback(addr: str) -> bool:
    return addr.startswith(("127.", "[::1]"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads /proc")
def test_the_otlp_file_receiver_listens_on_loopback_only(tmp_path: Path) -> None:
    before = set(listening(os.getpid()))
    with OTLPFileReceiver(tmp_path / "spans.jsonl"):
        opened = set(listening(os.getpid())) - before
    assert opened and all(_loopback(a) for a in opened), opened


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads /proc")
@pytest.mark.timeout(90)
def test_the_example_app_under_zero_code_listens_on_loopback_only(tmp_path: Path) -> None:
    port = _free_port()
    src = str(Path(streamjudge.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "STREAMJUDGE_", "LANGFUSE_", "PHOENIX_", "EXAMPLE_"))}
    env.update({"PYTHONPATH": src, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none", "EXAMPLE_PORT": str(port)})  # EXAMPLE_HOST: its default
    instrument = Path(sys.executable).with_name("opentelemetry-instrument")
    log = (tmp_path / "app.log").open("wb")
    proc = subprocess.Popen([str(instrument), sys.executable, str(APP)], env=env, cwd=APP.parent,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "app.log").read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the example app did not start"
            time.sleep(0.2)
        # one judged answer, so every lazily started part (judge pool, exporters) is running
        with httpx.stream("GET", f"http://127.0.0.1:{port}/chat", params={"q": "How tall is the Eiffel Tower?"},
                          timeout=30) as r:
            assert r.status_code == 200
            r.read()
        addrs = listening(proc.pid)
        assert f"127.0.0.1:{port}" in addrs, addrs
        assert all(_loopback(a) for a in addrs), addrs
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
