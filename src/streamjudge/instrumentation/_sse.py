"""Server-sent events on the wire: an incremental frame parser, token extraction and frame rendering.

The parser follows the WHATWG EventSource rules that matter for finding tokens: lines end in ``\\r\\n``,
``\\n`` or ``\\r``; a blank line ends a frame; ``data:`` lines of one frame are joined with ``\\n``; one
space after the colon is dropped; lines starting with ``:`` are comments. Chunks may split a frame (or a
``\\r\\n``) anywhere, so the parser keeps the unfinished tail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from streamjudge.config import DEFAULT_TERMINAL_FRAMES, TERMINAL_FRAME_KINDS

#: event names whose payload is answer text (None = an unnamed frame, which EventSource calls "message")
DEFAULT_TOKEN_EVENTS: frozenset[str | None] = frozenset({None, "message", "token", "delta", "chunk"})
#: keys tried, in order, in JSON payloads when no ``sse_token_field`` is configured
DEFAULT_TOKEN_KEYS: tuple[str, ...] = ("token", "content", "delta", "text", "chunk")
#: event names that mark the end of one answer (used on WebSockets, where one connection carries many)
DONE_EVENTS: frozenset[str] = frozenset({"done", "end", "final", "complete"})


@dataclass(frozen=True, slots=True)
class SSEFrame:
    """One complete frame: its ``event`` name (None when absent) and its joined ``data``."""

    event: str | None
    data: str
    id: str | None = None


class TerminalFrames:
    """Recognises the app's terminal frame, which the middleware holds back until the guard's last events
    are out (a front end treats that frame as the end of the answer).

    ``specs``: ``event:NAME`` (an SSE event name), ``data:TEXT`` (an SSE frame's whole data) or
    ``type:NAME`` (the ``type`` field of a JSON line or WebSocket message); none: nothing is held back.
    """

    __slots__ = ("_marks", "_quoted", "data", "events", "types")

    def __init__(self, specs: Iterable[str] = DEFAULT_TERMINAL_FRAMES) -> None:
        events: set[str] = set()
        data: set[str] = set()
        types: set[str] = set()
        for spec in specs:
            kind, sep, value = spec.partition(":")
            kind = kind.strip()
            if not sep or kind not in TERMINAL_FRAME_KINDS or not value.strip():
                kinds = ", ".join(k + ":VALUE" for k in TERMINAL_FRAME_KINDS)
                raise ValueError(f"terminal frame {spec!r}: expected one of {kinds}")
            {"event": events, "data": data, "type": types}[kind].add(value.strip())
        self.events = frozenset(events)
        self.data = frozenset(data)
        self.types = frozenset(types)
        # a JSON line can only be terminal if it contains one of these (skips decoding the others)
        self._quoted = tuple(json.dumps(t).encode() for t in self.types)
        # an SSE frame can only be terminal if its raw bytes contain one of these; None: a data value
        # spans lines (joined data lines do not appear verbatim in the frame) or a value holds U+FFFD
        # (which an undecodable byte also turns into), so every frame is parsed
        marks = tuple(v.encode() for v in (*self.events, *self.data))
        self._marks = None if any(b"\n" in m or b"\r" in m or b"\xef\xbf\xbd" in m for m in marks) else marks

    def __bool__(self) -> bool:
        return bool(self.events or self.data or self.types)

    def sse(self, frame: SSEFrame) -> bool:
        """True for a terminal SSE frame (``event: done``, ``data: [DONE]`` …)."""
        return frame.event in self.events or frame.data in self.data

    def may_be_sse(self, block: bytes) -> bool:
        """Cheap pre-check of a raw SSE frame before parsing it only to look for a terminal frame."""
        marks = self._marks
        return marks is None or any(m in block for m in marks)

    def json(self, payload: Any) -> bool:
        """True for a decoded JSON line or message whose ``type`` is terminal."""
        if not isinstance(payload, Mapping):
            return False
        kind = payload.get("type")
        return isinstance(kind, str) and kind in self.types

    def may_be_json(self, line: bytes) -> bool:
        """Cheap pre-check of a raw JSON line before decoding it only to look for a terminal type."""
        return any(q in line for q in self._quoted)


#: (frame) -> answer text carried by the frame, or None when the frame carries none
TokenExtractor = Callable[[SSEFrame], "str | None"]


class SSEParser:
    """Turns a byte stream into :class:`SSEFrame` objects; feed it chunks as they are sent.

    It works on bytes (``\\r`` and ``\\n`` never occur inside a UTF-8 sequence), so a character split
    across chunks is decoded whole, and a wrapper can forward exactly the bytes of complete frames.
    ``terminal`` marks the frame that ends the answer (see :meth:`feed_split`); ``maybe_terminal``, a cheap
    test of a frame's raw bytes that is true at least for every terminal frame, lets
    ``feed_split(..., frames=False)`` skip parsing the others.
    """

    __slots__ = ("_buf", "_maybe_terminal", "_terminal")

    def __init__(
        self,
        terminal: Callable[[SSEFrame], bool] | None = None,
        maybe_terminal: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._buf = b""
        self._terminal = terminal
        self._maybe_terminal = maybe_terminal

    def feed(self, chunk: bytes | str) -> list[SSEFrame]:
        """Frames completed by ``chunk`` (possibly none)."""
        return self.feed_split(chunk)[1]

    def feed_split(self, chunk: bytes | str, frames: bool = True) -> tuple[bytes, list[SSEFrame], int]:
        """``(complete, frames, terminal_at)`` for a wrapper that forwards whole frames only.

        ``complete``: the raw bytes of the frames ``chunk`` completed, with those of their beginnings held
        from earlier chunks; the unfinished tail stays here (:meth:`flush` hands it out). ``terminal_at``:
        where in ``complete`` the first terminal frame starts, or -1. ``frames=False``: the caller only
        needs ``complete`` and ``terminal_at`` (its tokens come from elsewhere), so frames that cannot be
        terminal are not parsed and the returned list holds only those that were.
        """
        raw = self._buf + (chunk.encode() if isinstance(chunk, str) else bytes(chunk))
        out: list[SSEFrame] = []
        terminal = self._terminal
        terminal_at = -1
        start = 0
        # frames=False: parse a frame only to test it for the terminal frame, and only if it may be one
        skip: Callable[[bytes], bool] | None = None
        if not frames:
            maybe = self._maybe_terminal
            if terminal is None:
                skip = _always
            elif maybe is not None:
                skip = lambda block: not maybe(block)  # noqa: E731
        if b"\r" not in raw:
            while True:
                end = raw.find(b"\n\n", start)
                if end < 0:
                    break
                block = raw[start:end]
                if skip is not None and skip(block):
                    start = end + 2
                    continue
                frame = _parse_block(block.decode("utf-8", "replace"))
                if frame is not None:
                    out.append(frame)
                    if terminal_at < 0 and terminal is not None and terminal(frame):
                        terminal_at = start
                start = end + 2
        elif raw.count(b"\r\n") == raw.count(b"\r") == raw.count(b"\n"):
            # every line ends in "\r\n" (sse-starlette's default separator): a plain search, no regex
            while True:
                end = raw.find(b"\r\n\r\n", start)
                if end < 0:
                    break
                block = raw[start:end]
                if skip is not None and skip(block):
                    start = end + 4
                    continue
                frame = _parse_block(block.decode("utf-8", "replace").replace("\r\n", "\n"))
                if frame is not None:
                    out.append(frame)
                    if terminal_at < 0 and terminal is not None and terminal(frame):
                        terminal_at = start
                start = end + 4
        else:
            for m in _FRAME_END.finditer(raw):
                raw_block = raw[start:m.start()]
                if skip is not None and skip(raw_block):
                    start = m.end()
                    continue
                text = raw_block.decode("utf-8", "replace")
                frame = _parse_block(text.replace("\r\n", "\n").replace("\r", "\n"))
                if frame is not None:
                    out.append(frame)
                    if terminal_at < 0 and terminal is not None and terminal(frame):
                        terminal_at = start
                start = m.end()
        if start == len(raw):
            self._buf = b""
            return raw, out, terminal_at
        self._buf = raw[start:]
        return raw[:start], out, terminal_at

    def flush(self) -> bytes:
        """The unfinished tail (the body ended without completing it); the parser starts afresh."""
        out, self._buf = self._buf, b""
        return out

    @property
    def pending(self) -> bool:
        """True while an unfinished frame is buffered (an injected frame would corrupt it)."""
        return bool(self._buf.strip(b"\r\n"))


# a blank line ends a frame: two line ends in a row, where "\r\n" is one line end (a lone "\r" at the end
# of the buffer counts as one: a "\n" that follows in the next chunk is then an empty line, which is
# harmless); only used when the buffer holds a "\r"
_FRAME_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")


def _always(block: bytes) -> bool:
    return True


def _parse_block(block: str) -> SSEFrame | None:
    event: str | None = None
    ident: str | None = None
    data: list[str] = []
    for line in block.split("\n"):
        if not line or line[0] == ":":
            continue
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value or None
        elif name == "id":
            ident = value
    if not data and event is None:
        return None  # comments / keep-alives only
    return SSEFrame(event, "\n".join(data), ident)


def _lookup(payload: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(payload, Mapping):
            payload = payload.get(part)
        elif isinstance(payload, list) and part.isdigit() and int(part) < len(payload):
            payload = payload[int(part)]
        else:
            return None
    return payload


def make_token_extractor(
    token_field: str | None = None,
    token_events: frozenset[str | None] | None = DEFAULT_TOKEN_EVENTS,
) -> TokenExtractor:
    """Build the extractor for frames like ``event: token`` / ``data: {"token": "..."}``.

    ``token_field`` is a dot-separated path into JSON ``data`` (``choices.0.delta.content`` for
    OpenAI-style chunks); without it the first of :data:`DEFAULT_TOKEN_KEYS` present is used. Frames whose
    event is not in ``token_events`` (None = any event) carry no token. Non-JSON ``data`` of a token event
    is the token itself.
    """
    path = tuple(token_field.split(".")) if token_field else None
    events = token_events

    def extract(frame: SSEFrame) -> str | None:
        if events is not None and frame.event not in events:
            return None
        data = frame.data
        if not data or data == "[DONE]":
            return None
        if data[0] not in "{[":
            return data
        try:
            payload = json.loads(data)
        except ValueError:
            return data
        return extract_from_json(payload, path)

    return extract


def extract_from_json(payload: Any, path: tuple[str, ...] | None) -> str | None:
    """The token in a decoded JSON message: at ``path`` or under the first default key present."""
    if path is not None:
        value = _lookup(payload, path)
        return value if isinstance(value, str) and value else None
    if isinstance(payload, Mapping):
        for key in DEFAULT_TOKEN_KEYS:
            value = payload.get(key)
            if isinstance(value, str):
                return value or None
    return None


def json_event_name(payload: Any) -> str | None:
    """The event name of a JSON message (``type`` or ``event`` key), as WebSocket apps usually send it."""
    if isinstance(payload, Mapping):
        for key in ("type", "event"):
            value = payload.get(key)
            if isinstance(value, str):
                return value
    return None


def render_sse(event: str, data: Mapping[str, Any]) -> bytes:
    """One SSE frame with a JSON payload, terminated by a blank line."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def render_sse_data(data: Mapping[str, Any]) -> bytes:
    """One data-only SSE frame with a JSON payload (for apps whose frames carry no ``event:`` field)."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
