"""Where the HTTP wrapper puts a ``retract`` among the app's frames: after every frame carrying the text it
withdraws, before the first frame past it, whether the app's frames run in step with the model (a chain
that writes each chunk as it comes) or behind it (a graph that queues its messages)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from streamjudge.instrumentation import StreamJudgeMiddleware
from streamjudge.instrumentation._asgi import _HttpResponse
from streamjudge.instrumentation._binding import StreamBinding
from streamjudge.instrumentation._order import EventOrder
from streamjudge.instrumentation._sse import SSEParser
from streamjudge.judging.guard import StreamEvent

GROUNDED = "Paris is old."
RETRACTED = [" Napoleon", " built", " it."]  # the model's text past the retraction point
CONTINUATION = [" It", " stands."]
KEEP = len(GROUNDED)
SHOWN = KEEP + len("".join(RETRACTED))


def _retract() -> StreamEvent:
    return StreamEvent("retract", "".join(RETRACTED), {"from": KEEP, "to": SHOWN, "checkpoint": 0})


def _warning() -> StreamEvent:
    return StreamEvent("warning", "invented", {"sentences": [{"start": KEEP, "end": SHOWN}]})


def langserve(token: str) -> bytes:
    """langserve's frame: the chunk as a JSON string under ``event: data``."""
    return f"event: data\ndata: {json.dumps(token)}\n\n".encode()


def token_frame(token: str) -> bytes:
    return f"event: token\ndata: {json.dumps({'token': token})}\n\n".encode()


async def _never() -> dict[str, Any]:  # pragma: no cover - the wrapper does not read the request here
    raise AssertionError


def _run(steps: list[bytes | list[StreamEvent]], end: bytes) -> list[tuple[str | None, str]]:
    """Feed the wrapper of a graph-fed stream (client events on) the app's frames, posting the guard's
    events where ``steps`` says (as the model tap does, from where the tokens are born); the frames the
    client received."""
    out: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    async def main() -> None:
        mw = StreamJudgeMiddleware(_never, client_events=True)  # type: ignore[arg-type]
        binding = StreamBinding(1, owner="http")
        binding.source = "graph"  # the model tap feeds the session; the wrapper only delivers its events
        response = _HttpResponse(mw, binding, _never, send)  # type: ignore[arg-type]
        await response.send({"type": "http.response.start", "status": 200,
                             "headers": [(b"content-type", b"text/event-stream")]})
        for step in steps:
            if isinstance(step, list):
                binding.post(step)
            else:
                await response.send({"type": "http.response.body", "body": step, "more_body": True})
        await response.send({"type": "http.response.body", "body": end, "more_body": False})

    asyncio.run(main())
    return [(f.event, f.data) for f in SSEParser().feed(b"".join(out))]


def _client_text(frames: list[tuple[str | None, str]]) -> str:
    """The text a client shows: token frames appended, a retract cutting back to its ``from``."""
    text = ""
    for event, data in frames:
        if event == "retract":
            text = text[:json.loads(data)["from"]]
        elif event == "data":
            text += json.loads(data)
        elif event == "token":
            text += json.loads(data)["token"]
    return text


def test_a_retraction_posted_in_step_with_the_frames_precedes_the_continuations_first_frame() -> None:
    # a chain writes each chunk as the model makes it: the retraction is posted before the frame of the
    # continuation's first word reaches the wrapper
    steps: list[bytes | list[StreamEvent]] = [b"event: metadata\ndata: {}\n\n", langserve(GROUNDED)]
    steps += [langserve(t) for t in RETRACTED]
    steps += [[_warning(), _retract()]]
    steps += [langserve(t) for t in CONTINUATION]
    frames = _run(steps, b"event: end\n\n")
    events = [e for e, _ in frames]
    assert events.index("warning") < events.index("retract")
    assert frames[events.index("retract") + 1] == ("data", json.dumps(CONTINUATION[0]))
    assert _client_text(frames) == GROUNDED + "".join(CONTINUATION)
    assert events[-1] == "end"


def test_a_retraction_posted_ahead_of_the_frames_waits_for_the_text_it_withdraws() -> None:
    # a graph queues the model's messages: the retraction is posted while frames of the text it withdraws
    # are still on their way to the wrapper
    steps: list[bytes | list[StreamEvent]] = [token_frame(GROUNDED), [_warning(), _retract()]]
    steps += [token_frame(t) for t in RETRACTED + CONTINUATION]
    frames = _run(steps, b"event: end\ndata: {}\n\n")
    events = [e for e, _ in frames]
    retract = events.index("retract")
    assert [json.loads(d)["token"] for e, d in frames[:retract] if e == "token"] == [GROUNDED, *RETRACTED]
    assert [json.loads(d)["token"] for e, d in frames[retract:] if e == "token"] == CONTINUATION
    assert _client_text(frames) == GROUNDED + "".join(CONTINUATION)


def test_frames_in_one_body_message_are_split_around_the_retraction() -> None:
    steps: list[bytes | list[StreamEvent]] = [token_frame(GROUNDED) + token_frame(RETRACTED[0]), [_retract()]]
    steps += [b"".join(token_frame(t) for t in RETRACTED[1:] + CONTINUATION)]
    frames = _run(steps, b"event: end\ndata: {}\n\n")
    assert _client_text(frames) == GROUNDED + "".join(CONTINUATION)
    assert frames[[e for e, _ in frames].index("retract") + 1] == ("token", json.dumps({"token": " It"}))


def test_a_retraction_that_never_sees_its_text_goes_out_before_the_terminal_frame() -> None:
    steps: list[bytes | list[StreamEvent]] = [token_frame(GROUNDED), [_retract()]]
    frames = _run(steps, b"event: end\ndata: {}\n\n")
    assert [e for e, _ in frames] == ["token", "retract", "end"]


def test_without_readable_frames_events_keep_their_arrival_order() -> None:
    order = EventOrder()
    order.add([_warning(), _retract(), StreamEvent("stop", "fallback")])
    assert [e.type for e in order.due()] == ["warning", "retract", "stop"]
    assert order.chars == KEEP


def test_events_after_a_pending_retraction_keep_their_place_behind_it() -> None:
    order = EventOrder()
    order.sent(KEEP + 3)
    order.add([_warning(), _retract(), StreamEvent("stop", "fallback")])
    assert [e.type for e in order.due()] == ["warning"]
    assert order.due(before_frame=True) == []  # the next frame still carries retracted text
    order.sent(SHOWN - KEEP - 3)
    assert [e.type for e in order.due(before_frame=True)] == ["retract"]
    assert order.chars == KEEP
    assert [e.type for e in order.due()] == ["stop"]

