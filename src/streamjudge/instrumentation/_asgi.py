"""ASGI middleware: the answer stream of each HTTP response body or WebSocket, watched as it is sent.

It sits inside the request span (first of the app's own middlewares), so every stream span is a child of
the request. Per request whose path may carry an answer (``routes_include`` / ``routes_exclude``) and
whose span is recording, it binds a stream to the trace (see ``_binding``); the answer node's chat-model
stream feeds it (``_model``), or — for apps whose tokens do not come from an instrumented graph — the
streamed body itself does: SSE frames (``text/event-stream``, e.g. ``StreamingResponse`` or
sse-starlette's ``EventSourceResponse``), JSON lines, streamed plain text and WebSocket messages are
parsed and their token extracted. A response that is not a stream (``/metrics``, a JSON reply) feeds
nothing; an answer the graph produced for it is still judged.

By default the client receives exactly the app's bytes, message by message: the stream's last verdicts
are awaited after the body ended. With ``client_events`` on, the guard's ``warning`` / ``retract`` /
``stop`` events are injected between the app's frames in its own format (a hook decides how; whole
frames only, so the bytes of a frame split across chunks go out when it is complete), and the app's
terminal frame (``event: done``, ``data: [DONE]``, a ``{"type": "done"}`` line …; ``terminal_frames``) is
held back until the tail checkpoint was judged (bounded by ``end_wait_s``) and its events were sent. A stop
of a body-fed stream drops the rest of the app's answer up to its terminal frame, which still goes out
(a stream the graph feeds was stopped where its tokens are born); a client that disconnects ends the
stream span with ``disconnected`` and cancels its queued judge work. The stream span ends before the
body's last message, which ends the request's span.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace

from streamjudge.config import DEFAULT_ROUTES_EXCLUDE, DEFAULT_TERMINAL_FRAMES
from streamjudge.instrumentation import _binding
from streamjudge.instrumentation._binding import StreamBinding
from streamjudge.instrumentation._privacy import hide_query
from streamjudge.instrumentation._sse import (
    DEFAULT_TOKEN_EVENTS,
    DONE_EVENTS,
    SSEParser,
    TerminalFrames,
    TokenExtractor,
    extract_from_json,
    json_event_name,
    make_token_extractor,
    render_sse,
    render_sse_data,
)
from streamjudge.judging.guard import AsyncWaker, end_wait

if TYPE_CHECKING:
    from streamjudge.judging.guard import StreamEvent

_log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: ``sse-data``: an SSE app whose frames are data-only JSON (``data: {"type": "token", ...}``)
FrameKind = Literal["sse", "sse-data", "ndjson", "text", "websocket"]
#: (event, frame kind) -> what to send for a guard event: bytes/str for bodies, str/dict for WebSocket
#: messages, or None to send nothing
FrameHook = Callable[["StreamEvent", FrameKind], "bytes | str | Mapping[str, Any] | None"]

#: guard events injected into the client stream by default (``done``: the app sends its own)
DEFAULT_INJECT: frozenset[str] = frozenset({"warning", "retract", "stop"})


def event_payload(event: StreamEvent) -> dict[str, Any]:
    """The JSON payload of an injected frame: ``type``, ``text`` and the event's data."""
    payload: dict[str, Any] = {"type": event.type, "text": event.text}
    if event.data:
        payload.update(event.data)
    return payload


def default_frame_hook(event: StreamEvent, kind: FrameKind) -> bytes | str | Mapping[str, Any] | None:
    """``event: warning`` + JSON for SSE (a data-only ``{"type": "warning", ...}`` frame for apps whose
    frames are data-only), a JSON line for NDJSON, a JSON message on WebSockets."""
    if event.type not in DEFAULT_INJECT:
        return None
    if kind == "sse":
        return render_sse(event.type, event_payload(event))
    if kind == "sse-data":
        return render_sse_data(event_payload(event))
    if kind == "ndjson":
        return (json.dumps(event_payload(event), default=str) + "\n").encode()
    if kind == "websocket":
        return event_payload(event)
    return None  # a plain text body has no room for out-of-band frames


def _mode_for(headers: Any) -> FrameKind | None:
    ctype = b""
    for k, v in headers or ():
        if k.lower() == b"content-type":
            ctype = v.lower()
            break
    if ctype.startswith(b"text/event-stream"):
        return "sse"
    if ctype.startswith((b"application/x-ndjson", b"application/jsonl", b"application/json-seq")):
        return "ndjson"
    if ctype.startswith(b"text/plain"):
        return "text"
    return None


async def finish_stream(binding: StreamBinding, *, wait_s: float | None = None) -> list[StreamEvent]:
    """End an answer stream: tail checkpoint, wait (bounded, off the token path) for verdicts in flight.

    The wait happens after the last token was sent, before the app's terminal frame and the body's end,
    so a late warning still reaches the client ahead of them; it never exceeds ``settings.end_wait_s``.
    """
    session = binding.session
    if session is None:
        return binding.finish()
    loop = asyncio.get_running_loop()
    waker = AsyncWaker(loop)
    events: list[StreamEvent] = []
    session.set_notify(waker.notify)
    try:
        if not session.stopped:
            session.close_tail()
            for step in end_wait(session, wait_s=wait_s, ready=lambda: binding.has_events,
                                 take=binding.take_events, clock=loop.time):
                if isinstance(step, list):
                    events.extend(step)
                else:
                    await waker.wait(None, step)
        events.extend(binding.take_events())
    finally:
        session.set_notify(None)
    events.extend(binding.finish())
    return events


class StreamJudgeMiddleware:
    """Watches streamed answers in HTTP bodies and WebSocket messages. Add with ``instrument_app``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token_field: str | None = None,
        token_events: frozenset[str | None] | None = DEFAULT_TOKEN_EVENTS,
        token_extractor: TokenExtractor | None = None,
        frame_hook: FrameHook | None = None,
        terminal_frames: Iterable[str] | None = None,
        client_events: bool | None = None,
        routes_include: Iterable[str] = (),
        routes_exclude: Iterable[str] = DEFAULT_ROUTES_EXCLUDE,
    ) -> None:
        self.app = app
        # an explicit frame hook asks for client events unless they are switched off explicitly
        self._client_events = frame_hook is not None if client_events is None else client_events
        self._include = tuple(routes_include)
        self._exclude = tuple(routes_exclude)
        self._terminal = TerminalFrames(DEFAULT_TERMINAL_FRAMES if terminal_frames is None
                                        else terminal_frames)
        self._path = tuple(token_field.split(".")) if token_field else None
        self._extract = token_extractor or make_token_extractor(token_field, token_events)
        self._hook = frame_hook or default_frame_hook
        self._tracer = trace.get_tracer(__name__)

    def _judged_route(self, path: str) -> bool:
        if self._include and not any(fnmatch.fnmatchcase(path, p) for p in self._include):
            return False
        return not any(fnmatch.fnmatchcase(path, p) for p in self._exclude)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if scope.get("query_string") and kind in ("http", "websocket"):
            hide_query(scope)  # capture off: the question in a GET's query string stays off the server span
        if kind in ("http", "websocket") and not self._judged_route(scope.get("path", "")):
            await self.app(scope, receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    # --- helpers -----------------------------------------------------------------------------------
    def _render(self, events: list[StreamEvent], kind: FrameKind) -> list[Any]:
        out: list[Any] = []
        if not self._client_events:
            return out
        for ev in events:
            try:
                frame = self._hook(ev, kind)
            except Exception:
                _log.exception("streamjudge: frame_hook failed; event not sent")
                continue
            if frame is not None:
                out.append(frame)
        return out

    def _bind(self, scope: Scope, owner: str) -> tuple[StreamBinding | None, Any]:
        """The request's stream, or None when its span does not record (unsampled, SDK disabled)."""
        start_ns = time.time_ns()
        ctx = otel_context.get_current()
        current = trace.get_current_span(ctx)
        span_ctx = current.get_span_context()
        own_span = None
        if not span_ctx.is_valid:
            # no server instrumentation in front of us: the stream still needs a trace to live in
            method = scope.get("method", "WS") if owner == "http" else "WS"
            name = f"{method} {scope.get('path', '')}"
            from streamjudge.runtime import current_runtime

            rt = current_runtime()  # the judged provider, also when it is not the global one
            tracer = rt.tracer if rt is not None else self._tracer
            own_span = tracer.start_span(name, kind=trace.SpanKind.SERVER)
            ctx = trace.set_span_in_context(own_span, ctx)
            current = own_span
            span_ctx = own_span.get_span_context()
        if not current.is_recording():
            # nobody will ever judge this trace: nothing may wait for its verdicts
            if own_span is not None:
                own_span.end()
            return None, None
        binding = StreamBinding(span_ctx.trace_id, owner=owner, parent=ctx, request_start_ns=start_ns)
        binding.client_events = self._client_events
        _binding.bind(binding)
        return binding, own_span

    # --- HTTP ----------------------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        bound, own_span = self._bind(scope, "http")
        if bound is None:
            await self.app(scope, receive, send)
            return
        binding = bound
        response = _HttpResponse(self, binding, receive, send)
        outcome = "completed"
        token = otel_context.attach(trace.set_span_in_context(own_span)) if own_span is not None else None
        try:
            await self.app(scope, response.receive, response.send)
        except asyncio.CancelledError:
            outcome = "disconnected"
            raise
        except BaseException as exc:
            # starlette turns a write to a closed socket into ClientDisconnect (not an OSError)
            outcome = "disconnected" if isinstance(exc, OSError) or type(exc).__name__ == "ClientDisconnect" \
                else "error"
            raise
        finally:
            _binding.unbind(binding)
            try:
                if outcome != "completed":
                    binding.abort(outcome)
                elif binding.session is not None:
                    # an answer without a streamed body (a JSON endpoint): its verdicts still count
                    await finish_stream(binding)
            except Exception:
                _log.exception("streamjudge: could not close the answer stream")
            if token is not None:
                otel_context.detach(token)
            if own_span is not None:
                own_span.end()

    # --- WebSocket -----------------------------------------------------------------------------------
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        bound, own_span = self._bind(scope, "websocket")
        if bound is None:
            await self.app(scope, receive, send)
            return
        binding = bound
        socket = _WebSocket(self, binding, receive, send)
        token = otel_context.attach(trace.set_span_in_context(own_span)) if own_span is not None else None
        outcome = "completed"
        try:
            await self.app(scope, socket.receive, socket.send)
        except BaseException:
            outcome = "error"
            raise
        finally:
            _binding.unbind(binding)
            try:
                if binding.session is not None:
                    binding.abort("disconnected" if outcome == "completed" else outcome)
            except Exception:
                _log.exception("streamjudge: could not close the answer stream")
            if token is not None:
                otel_context.detach(token)
            if own_span is not None:
                own_span.end()


class _HttpResponse:
    """One watched HTTP response: reads the answer's tokens from its body (when no graph feeds them),
    injects the guard's events between whole frames when client events are on, holds the app's terminal
    frame until the last verdicts are in, and after a stop of a body-fed stream drops the app's answer up to
    its terminal frame."""

    def __init__(
        self, mw: StreamJudgeMiddleware, binding: StreamBinding, receive: Receive, send: Send
    ) -> None:
        self._mw = mw
        self._binding = binding
        self._receive = receive
        self._send = send
        self._events_on = mw._client_events
        self._extract = mw._extract
        self._path = mw._path
        self._terminal = mw._terminal
        self._parser: SSEParser | None = None
        self._line_buf = b""
        self._mode: FrameKind | None = None
        self._started = False
        # after a stop of a body-fed stream: the app's frames are dropped up to its terminal frame
        self._swallow = False
        self._body_done = False  # the last body message went out
        self._sse_style: FrameKind = "sse"  # "sse-data" once the app's first frame turns out data-only
        self._styled = False

    async def _send_body(self, body: bytes, more: bool) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    async def _send_events(self, events: list[StreamEvent]) -> None:
        assert self._mode is not None
        for frame in self._mw._render(events, self._sse_style if self._mode == "sse" else self._mode):
            body = frame.encode() if isinstance(frame, str) else frame
            if isinstance(body, bytes | bytearray):
                await self._send_body(bytes(body), True)

    async def _swallowed(self, body: bytes, more: bool) -> None:
        # the rest of a stopped answer: nothing of it goes out but the app's terminal frame (and what
        # follows it), after the stream's last events
        parser = self._parser
        if parser is not None:
            complete, _, at = parser.feed_split(body, False) if body else (b"", [], -1)
        elif self._mode == "ndjson":
            complete, at = self._split_ndjson(body) if body else (b"", -1)
        else:
            complete, at = b"", -1
        tail = complete[at:] if at >= 0 else b""
        if not more:
            tail += parser.flush() if parser is not None else self._line_buf
            self._line_buf = b""
        if at < 0 and more:
            return
        self._swallow = False
        if self._binding.session is not None:
            await self._send_events(await finish_stream(self._binding))
        self._body_done = not more
        await self._send_body(tail, more)

    def _check_stop(self) -> None:
        # a graph-fed stream was stopped where its tokens are born (the node got the fallback): the app's
        # own frames after it still go out. A body-fed one can only drop the rest of the app's answer
        if self._binding.stopped and self._binding.source == "body" and not self._body_done:
            self._swallow = True

    def _split_ndjson(self, body: bytes) -> tuple[bytes, int]:
        # whole lines only (a reader cannot use half a line); the terminal line's offset or -1
        binding, terminal = self._binding, self._terminal
        data = self._line_buf + body if self._line_buf else body
        cut = data.rfind(b"\n") + 1
        self._line_buf = data[cut:]
        complete = data[:cut]
        feed = binding.source != "graph"
        check = bool(terminal.types)
        if not complete or not (feed or check):
            return complete, -1
        pos = 0
        for line in complete.split(b"\n")[:-1]:
            at = pos
            pos += len(line) + 1
            maybe_terminal = check and terminal.may_be_json(line)
            if not line.strip() or not (feed or maybe_terminal):
                continue
            try:
                payload = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: JSON nested too deeply
                continue
            if maybe_terminal and terminal.json(payload):
                return complete, at
            if feed:
                tok = extract_from_json(payload, self._path)
                if tok:
                    binding.feed(tok, "body")
        return complete, -1

    async def _pass_through(self, message: Message) -> None:
        # client events off: the app's messages go out as they are; tokens are only read from them
        binding = self._binding
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if body and binding.source != "graph" and not binding.closed:
            if self._parser is not None:
                for f in self._parser.feed_split(body, True)[1]:
                    tok = self._extract(f)
                    if tok:
                        binding.feed(tok, "body")
            elif self._mode == "ndjson":
                self._split_ndjson(bytes(body))
            elif self._mode == "text" and (more or binding.source == "body"):  # a streamed text body
                binding.feed(bytes(body).decode("utf-8", "replace"), "body")
        if not more and binding.session is not None:
            # the stream span ends inside the request's: the app's bytes go out now, the body's end after
            # the last verdicts (which land on the span; nothing is sent)
            if body:
                await self._send({**message, "more_body": True})
            # the app's answer is complete: a client that leaves now (at the app's terminal frame) has it all
            self._body_done = True
            await finish_stream(binding)
            await self._send({**message, "body": b""} if body else message)
            return
        await self._send(message)
        if binding.has_events:
            binding.take_events()  # client events are off: the guard's events act, nothing is sent
        if not more:
            self._body_done = True
        self._check_stop()

    async def send(self, message: Message) -> None:
        """The app's ``send``."""
        binding, terminal = self._binding, self._terminal
        mtype = message["type"]
        if self._swallow and mtype == "http.response.body":
            await self._swallowed(bytes(message.get("body", b"")), message.get("more_body", False))
            return
        if mtype == "http.response.body" and self._mode is not None and not self._events_on:
            await self._pass_through(message)
            return
        if self._mode == "sse" and not self._styled and message.get("body"):
            self._styled = True
            head = bytes(message["body"]).lstrip()
            if head.startswith(b"data:"):
                self._sse_style = "sse-data"
        if mtype == "http.response.start":
            self._mode = _mode_for(message.get("headers"))
            self._started = True
            if self._mode == "sse":
                self._parser = SSEParser(terminal.sse if terminal else None,
                                         terminal.may_be_sse if terminal else None)
            await self._send(message)
            return
        if mtype != "http.response.body" or self._mode is None:
            if (mtype == "http.response.body" and not message.get("more_body", False)
                    and binding.session is not None):
                # an answer in a body that is not a stream (a JSON endpoint): its stream span ends inside
                # the request's, whose span the body's last message ends; the client has every byte first
                body = message.get("body", b"")
                if body:
                    await self._send({**message, "more_body": True})
                self._body_done = True
                await finish_stream(binding)
                await self._send({**message, "body": b""} if body else message)
                return
            await self._send(message)
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        parser = self._parser
        at = -1  # where the app's terminal frame starts in ``complete``
        if parser is not None:
            # the graph's callbacks deliver the tokens: frames are parsed only to find the terminal one
            from_body = binding.source != "graph"
            complete, frames, at = parser.feed_split(body, from_body) if body else (b"", [], -1)
            if from_body:
                for f in frames:
                    tok = self._extract(f)
                    if tok:
                        binding.feed(tok, "body")
        elif self._mode == "ndjson":
            complete, at = self._split_ndjson(bytes(body)) if body else (b"", -1)
        else:
            complete = bytes(body)
            if body and binding.source != "graph" and (more or binding.source == "body"):
                binding.feed(complete.decode("utf-8", "replace"), "body")
        if at < 0 and more:
            # the hot path: forward whole frames, then whatever the guard has to say
            if complete:
                await self._send_body(complete, True)
            # never inside an app frame that is still passing through (one over the parser's cap)
            if binding.has_events and not (parser is not None and parser.pending):
                await self._send_events(binding.take_events())
            self._check_stop()
            return
        # the app's terminal frame or the body's end: the stream's last events go out before either
        held = b""
        if at >= 0:
            complete, held = complete[:at], complete[at:]
        if not more:
            held += parser.flush() if parser is not None else self._line_buf
            self._line_buf = b""
        if complete:
            await self._send_body(complete, True)
        if binding.session is not None:
            await self._send_events(await finish_stream(binding))
        elif at >= 0:
            binding.finish()  # the answer is over: later frames start nothing new
        if held or not more:
            self._body_done = not more
            await self._send_body(held, more)

    async def receive(self) -> Message:
        """The app's ``receive``: the client going away mid-answer ends the answer stream."""
        message = await self._receive()
        if message["type"] == "http.disconnect" and not self._body_done and not (
                self._started and self._mode is None):
            self._binding.abort("disconnected")
        return message


class _WebSocket:
    """One watched WebSocket: each message's token feeds the stream, the app's done message ends an answer
    (after its last verdicts), and after a stop the rest of that answer is dropped."""

    def __init__(
        self, mw: StreamJudgeMiddleware, binding: StreamBinding, receive: Receive, send: Send
    ) -> None:
        self._mw = mw
        self._binding = binding
        self._receive = receive
        self._send = send
        self._events_on = mw._client_events
        self._swallow = False  # after a stop: drop the rest of this answer until the app's done message

    async def _send_events(self, events: list[StreamEvent]) -> None:
        for frame in self._mw._render(events, "websocket"):
            if isinstance(frame, Mapping):
                await self._send({"type": "websocket.send", "text": json.dumps(frame, default=str)})
            elif isinstance(frame, str):
                await self._send({"type": "websocket.send", "text": frame})
            elif isinstance(frame, bytes | bytearray):
                await self._send({"type": "websocket.send", "bytes": bytes(frame)})

    async def send(self, message: Message) -> None:
        """The app's ``send``."""
        binding = self._binding
        mtype = message["type"]
        if mtype == "websocket.send":
            text = message.get("text")
            if text is None:  # a binary message (audio, an image, a file) is no answer text: not judged
                await self._send(message)
                return
            payload: Any = None
            if text and text[0] == "{":
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = None
                except RecursionError:  # JSON nested too deeply to read: pass it on, no token
                    await self._send(message)
                    return
            event = json_event_name(payload)
            if event in DONE_EVENTS or (payload is not None and self._mw._terminal.json(payload)):
                self._swallow = False
                if not self._events_on:
                    await self._send(message)
                if binding.session is not None:
                    await self._send_events(await finish_stream(binding))
                binding.closed = False
                binding.source = None
                binding.node_start_ns = 0
                if self._events_on:
                    await self._send(message)
                return
            tok = extract_from_json(payload, self._mw._path) if payload is not None else text
            if self._swallow and tok:
                return
            if tok and binding.source != "graph":
                binding.feed(tok, "body")
            await self._send(message)
            if binding.has_events:
                await self._send_events(binding.take_events())
            if binding.stopped and binding.source == "body":
                self._swallow = True  # a graph-fed stream was stopped at its model: its frames go on
            return
        if mtype == "websocket.close" and binding.session is not None:
            await self._send_events(await finish_stream(binding, wait_s=0.0))
        await self._send(message)

    async def receive(self) -> Message:
        """The app's ``receive``: a disconnect ends the answer stream."""
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self._binding.abort("disconnected")
        elif message["type"] == "websocket.receive" and self._binding.session is None:
            self._binding.request_start_ns = time.time_ns()  # the next answer is asked for now
        return message
