"""The example app's page in a real browser: headless Chromium (the Debian package, see mk/browser.mk) driven
by Playwright, against the example app served on loopback in a subprocess.

The page must underline exactly the sentences the local judge fails (not the grounded sentence before them),
show the reason and score on hover, render a stop as a stop notice and a regeneration as a struck-through,
labelled retraction, and load without a 404 (no favicon request). Screenshots go to the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (it is in the dev extra: pip install -e '.[dev]')"
)

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "adaptive_rag" / "app.py"
BIN = Path(sys.executable).parent
QUESTION = "How tall is the Eiffel Tower?"
GROUNDED_FIRST = "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France."
INVENTED = "It was originally painted bright green by Leonardo Marconi in 1712."


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("no `chromium` on PATH: `make test` installs the Debian package (mk/browser.mk), "
                    "or run `apt-get install -y chromium`")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _App:
    """The example app in a subprocess on a free loopback port, stopped by its pid."""

    def __init__(self, action: str, *, zero_code: bool, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMJUDGE_", "OTEL_"))}
        env.update({
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p),
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "EXAMPLE_PORT": str(self.port),
            "EXAMPLE_TOKEN_DELAY_MS": "5",
            "STREAMJUDGE_JUDGE": "local",
            "STREAMJUDGE_CHECKPOINT_JUDGE": "local",
            "STREAMJUDGE_ACTION": action,
        })
        env.pop("EXAMPLE_LLM_MODEL", None)
        cmd = [str(BIN / "python"), str(APP)]
        if zero_code:
            # settings are read before the app's code runs: zero-code needs the variable
            env["STREAMJUDGE_CLIENT_EVENTS"] = "on"
            cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
        else:
            cmd.append("--instrument-app")  # the app switches client events on for its own page
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"app exited early ({self.proc.returncode}):\n{log.read_text()}")
            try:
                httpx.get(f"{self.url}/docs", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"app did not start:\n{log.read_text()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def warnings(self, hallucinate: bool) -> list[dict[str, Any]]:
        """The warning frames a plain SSE client receives for QUESTION (what the judge flags)."""
        out, event = [], None
        params = {"q": QUESTION, "hallucinate": "1" if hallucinate else "0"}
        with httpx.stream("GET", f"{self.url}/chat", params=params, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "warning":
                    out.append(json.loads(line[5:]))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture()
def app_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[_App] = []

    def start(action: str, *, zero_code: bool) -> _App:
        app = _App(action, zero_code=zero_code, log=tmp_path / f"app-{action}.log")
        started.append(app)
        return app

    yield start
    for app in started:
        app.stop()


class _Page:
    """A browser tab on the app's page, recording every response status."""

    def __init__(self, browser: Any, app: _App) -> None:
        self.page = browser.new_page(viewport={"width": 900, "height": 700})
        self.responses: list[tuple[int, str]] = []
        self.page.on("response", lambda r: self.responses.append((r.status, r.url)))
        self.page.goto(app.url + "/")
        self.page.wait_for_load_state("networkidle")

    def ask(self, hallucinate: bool) -> str:
        self.page.fill("#q", QUESTION)
        self.page.set_checked("#h", hallucinate)
        self.page.click("button")
        self.page.wait_for_function("document.body.dataset.stream && document.body.dataset.stream !== 'streaming'",
                                    timeout=30_000)
        return str(self.page.get_attribute("body", "data-stream"))

    def texts(self, selector: str) -> list[str]:
        return [str(t) for t in self.page.eval_on_selector_all(selector, "els => els.map(e => e.textContent)")]

    def shot(self, path: Path) -> None:
        self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")

    def not_found(self) -> list[tuple[int, str]]:
        return [r for r in self.responses if r[0] >= 400]


def test_page_underlines_only_the_fabricated_sentences_with_the_reason_on_hover(
    browser: Any, app_factory: Any, tmp_path: Path
) -> None:
    app = app_factory("flag", zero_code=True)
    flagged = [s for w in app.warnings(hallucinate=True) for s in w["sentences"]]
    assert flagged, "the local judge flagged nothing in the hallucinating answer"
    tab = _Page(browser, app)

    assert tab.ask(hallucinate=False) == "done"
    grounded = tab.page.inner_text("#answer")
    assert grounded.startswith(GROUNDED_FIRST) and "330 metres" in grounded
    assert tab.texts(".flagged") == [] and tab.texts(".retracted") == []
    tab.shot(tmp_path / "grounded.png")

    assert tab.ask(hallucinate=True) == "done"
    answer = tab.page.inner_text("#answer")
    underlined = tab.texts(".flagged")
    # exactly the sentences the judge fails, each on its own, in the answer's order
    assert underlined == [answer[s["start"]:s["end"]] for s in sorted(flagged, key=lambda s: s["start"])]
    assert INVENTED in underlined
    assert not any(GROUNDED_FIRST in u or u in GROUNDED_FIRST for u in underlined)
    assert answer.startswith(GROUNDED_FIRST)

    first = tab.page.locator(".flagged").first
    first.hover()
    tip = str(first.get_attribute("data-tip"))
    reason = next(s["reason"] for s in flagged if answer[s["start"]:s["end"]] == INVENTED)
    assert reason and reason in tip and "faithfulness 0.00" in tip
    # the tooltip really shows on hover: the pseudo-element's content is the reason
    shown = tab.page.evaluate("e => getComputedStyle(e, '::after').content", first.element_handle())
    assert reason in shown
    # each underlined sentence carries its own reason and score
    tips = [str(t) for t in tab.page.eval_on_selector_all(".flagged", "els => els.map(e => e.dataset.tip)")]
    by_text = {answer[s["start"]:s["end"]]: s for s in flagged}
    for u, tip_text in zip(underlined, tips, strict=True):
        assert by_text[u]["reason"] in tip_text and f"{by_text[u]['score']:.2f}" in tip_text, (u, tip_text)
    tab.shot(tmp_path / "hallucinating-hover.png")
    assert tab.not_found() == []
    tab.page.close()


def test_page_renders_stop_and_retract(browser: Any, app_factory: Any, tmp_path: Path) -> None:
    stop_app = app_factory("stop", zero_code=False)  # client events switched on by the app itself
    tab = _Page(browser, stop_app)
    assert tab.ask(hallucinate=True) == "stopped"
    notice = tab.page.locator("#notice.stop")
    assert notice.is_visible()
    notice_text = notice.inner_text()
    assert notice_text.startswith("Stopped.") and "not confident" in notice_text
    answer = tab.page.inner_text("#answer")
    assert answer.startswith(GROUNDED_FIRST) and "not confident" not in answer  # the notice, not the answer
    assert "submarine" not in answer
    assert tab.texts(".flagged") == [INVENTED]
    tab.shot(tmp_path / "stop.png")
    assert tab.not_found() == []
    tab.page.close()

    regen_app = app_factory("regenerate", zero_code=True)
    tab = _Page(browser, regen_app)
    assert tab.ask(hallucinate=True) == "done"
    retracted = tab.texts(".retracted")
    assert len(retracted) == 1 and retracted[0].startswith("retracted") and INVENTED in retracted[0]
    deco = tab.page.eval_on_selector(".retracted", "e => getComputedStyle(e).textDecorationLine")
    assert "line-through" in deco
    answer = tab.page.inner_text("#answer")
    # the accepted first sentence, the struck-through retraction, then the regenerated, grounded rest
    assert answer.startswith(GROUNDED_FIRST) and answer.count(GROUNDED_FIRST) == 1
    assert answer.index(INVENTED) < answer.index("Gustave Eiffel") and "330 metres" in answer
    assert tab.texts(".flagged") == []  # the flagged sentence went with the retraction
    tab.shot(tmp_path / "regenerate.png")
    assert tab.not_found() == []
    tab.page.close()
