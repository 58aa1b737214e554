"""Server-sent events on the wire: an incremental frame parser, token extraction and frame rendering.

The parser follows the WHATWG EventSource rules that matter for finding tokens: lines end in ``\\r\\n``,
``\\n`` or ``\\r``; a blank line ends a frame; ``data:`` lines of one frame are joined with ``\\n``; one
space after the colon is dropped; lines starting with ``:`` are comments. Chunks may split a frame (or a
``\\r\\n``) anywhere, so the parser keeps the unfinished tail.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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


#: (frame) -> answer text carried by the frame, or None when the frame carries none
TokenExtractor = Callable[[SSEFrame], "str | None"]


class SSEParser:
    """Turns a byte stream into :class:`SSEFrame` objects; feed it chunks as they are sent."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, chunk: bytes | str) -> list[SSEFrame]:
        """Frames completed by ``chunk`` (possibly none)."""
        text = chunk if isinstance(chunk, str) else bytes(chunk).decode("utf-8", "replace")
        buf = self._buf + text
        # normalise line ends, but keep a trailing "\r": it may be the first half of "\r\n"
        tail_cr = buf.endswith("\r")
        if tail_cr:
            buf = buf[:-1]
        if "\r" in buf:
            buf = buf.replace("\r\n", "\n").replace("\r", "\n")
        frames: list[SSEFrame] = []
        start = 0
        while True:
            end = buf.find("\n\n", start)
            if end < 0:
                break
            frame = _parse_block(buf[start:end])
            if frame is not None:
                frames.append(frame)
            start = end + 2
        self._buf = buf[start:] + ("\r" if tail_cr else "")
        return frames

    @property
    def pending(self) -> bool:
        """True while an unfinished frame is buffered (an injected frame would corrupt it)."""
        return bool(self._buf.strip("\r\n"))


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
