"""A setting streamjudge cannot use never breaks or silences the app: zero-code logs it once, names the
variable, what it accepts and the default used instead, and every answer still streams, traced and judged."""

from __future__ import annotations

import pytest

from apps.conftest import ANSWER, serve, stop, stream_exported, stream_span
from apps.test_react_sse import SETTINGS, strict_client
from instrumentation.otlp_receiver import OTLPReceiver
from judges.scripted_server import ScriptedLLMServer
from streamjudge import semconv

pytestmark = pytest.mark.integration

BAD = {
    "checkpoint_every": ("-1", "STREAMJUDGE_CHECKPOINT_EVERY='-1': expected an integer >= 0 (using the default: 0)"),
    "end_wait": ("nan", "STREAMJUDGE_END_WAIT='nan': expected a number >= 0 (using the default: 2)"),
    "hold_timeout": ("0", "STREAMJUDGE_HOLD_TIMEOUT='0': expected a number > 0 (using the default: 60)"),
    "judge_processes": ("1e20", "STREAMJUDGE_JUDGE_PROCESSES='1e20': expected an integer from 0 to 64, or auto"),
}


def test_bad_settings_leave_every_frame_streamed_traced_and_judged(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver
) -> None:
    settings = {**SETTINGS, **{name: raw for name, (raw, _) in BAD.items()}}
    with serve("react_sse.py", llm_server, receiver, **settings) as app:
        texts = [strict_client(app.url)[1] for _ in range(2)]
        spans = receiver.wait_for(stream_exported)
        out = stop(app.proc)
    assert texts == [ANSWER, ANSWER]  # every token frame, twice
    assert "Traceback" not in out and "Exception in ASGI application" not in out, out
    errors = [line for line in out.splitlines() if "STREAMJUDGE_CHECKPOINT_EVERY" in line]
    assert len(errors) == 1, out  # once, not per request nor per component
    for _, message in BAD.values():
        assert message in errors[0]
    stream = stream_span([s for s in spans if s.name == semconv.SPAN_STREAM][:1])
    assert stream.attributes[semconv.STREAM_ANSWER] == ANSWER
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"  # judged, with the defaults
