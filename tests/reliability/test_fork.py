"""Pre-fork servers (gunicorn, ``uvicorn --workers``) fork after the app configured streamjudge and may
have judged already: each worker must judge its own streams with its own pool thread, export each span
once, and exit promptly; the parent keeps judging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import streamjudge

SCRIPT = Path(__file__).with_name("_forked_workers.py")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.timeout(120)
def test_forked_workers_judge_their_own_streams_and_exit() -> None:
    src = str(Path(streamjudge.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STREAMJUDGE_", "LANGFUSE_"))}
    env["PYTHONPATH"] = src
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    workers = [x for x in lines if x["role"] == "worker"]
    parent = [x for x in lines if x["role"].startswith("parent")]
    assert len(workers) == 3 and len(parent) == 2, proc.stdout
    assert parent[1]["codes"] == [0, 0, 0], proc.stderr[-3000:]
    assert len({w["pid"] for w in workers} | {parent[0]["pid"]}) == 4
    for seen in (*workers, *parent):
        n = 5 if seen["role"] == "worker" else 2
        assert seen["flushed"] and seen["unique"] and seen["held"] == 0, seen
        assert seen["streams"] == n and seen["warned"] == n, seen
        assert seen["statuses"] == ["judged"], seen
