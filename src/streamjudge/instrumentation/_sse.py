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
from typing import Any, Final

from streamjudge.config import DEFAULT_TERMINAL_FRAMES, TERMINAL_FRAME_KINDS

#: event names whose payload is answer text (None = an unnamed frame, which EventSource calls "message";
#: langserve's ``/stream`` sends its chunks as ``event: data``)
DEFAULT_TOKEN_EVENTS: frozenset[str | None] = frozenset({None, "message", "token", "delta", "chunk", "data"})
#: keys tried, in order, in JSON payloads when no ``sse_token_field`` is configured
DEFAULT_TOKEN_KEYS: tuple[str, ...] = ("token", "content", "delta", "text", "chunk")
#: event names that mark the end of one answer (used on WebSockets, where one connection carries many)
DONE_EVENTS: frozenset[str] = frozenset({"done", "end", "final", "complete"})
#: frames (and JSON lines) longer than this are passed through unparsed: holding or decoding them on the
#: event loop would stall every request, and no answer token is that long
MAX_FRAME_BYTES: Final = 1 << 20


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

    Linear in the bytes fed, however they are chunked: each chunk is searched once (plus the 3 bytes
    before it, where a frame end can begin), never the whole unfinished frame again. A frame longer than
    ``max_frame_bytes`` is not held: its bytes go out as they arrive, unparsed, and ``skipped`` counts it
    (``frame_too_large``), so neither a huge frame nor one that never ends can hold the client's bytes or
    grow the buffer. ``scanned`` counts the bytes searched and copied, for tests and benchmarks.
    """

    __slots__ = ("_buf", "_ctx", "_max_frame", "_maybe_terminal", "_overflow", "_terminal", "scanned",
                 "skipped")

    def __init__(
        self,
        terminal: Callable[[SSEFrame], bool] | None = None,
        maybe_terminal: Callable[[bytes], bool] | None = None,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be >= 1, got {max_frame_bytes!r}")
        self._buf = bytearray()  # the unfinished frame, from its first byte
        self._terminal = terminal
        self._maybe_terminal = maybe_terminal
        self._max_frame = max_frame_bytes
        self._overflow = False  # an oversized frame is being passed through until its end
        self._ctx = b""  # the last bytes passed through of it: its end may begin there
        #: frames passed through without being parsed, by reason
        self.skipped: dict[str, int] = {}
        #: bytes searched for frame ends and copied, since the start
        self.scanned = 0

    def feed(self, chunk: bytes | str) -> list[SSEFrame]:
        """Frames completed by ``chunk`` (possibly none)."""
        return self.feed_split(chunk)[1]

    def feed_split(self, chunk: bytes | str, frames: bool = True) -> tuple[bytes, list[SSEFrame], int]:
        """``(complete, frames, terminal_at)`` for a wrapper that forwards whole frames only.

        ``complete``: the raw bytes of the frames ``chunk`` completed, with those of their beginnings held
        from earlier chunks; the unfinished tail stays here (:meth:`flush` hands it out). ``terminal_at``:
        where in ``complete`` the first terminal frame starts, or -1. ``frames=False``: the caller only
        needs ``complete`` and ``terminal_at`` (its tokens come from elsewhere), so frames that cannot be
        terminal are not parsed and the returned list holds only those that were. While a frame over
        ``max_frame_bytes`` passes through, ``complete`` ends inside it (:attr:`pending` is true).
        """
        data = chunk.encode() if isinstance(chunk, str) else chunk
        if data.__class__ is not bytes:
            data = bytes(data)
        if self._overflow:
            return self._pass_through(data, frames)
        buf = self._buf
        raw: bytes | bytearray
        if buf:
            # the buffered tail holds no frame end; one that begins in its last 3 bytes ("\r\n" + "\r\n")
            # is found by searching from there
            pos = len(buf) - 3 if len(buf) > 3 else 0
            buf += data
            raw = buf
        else:
            pos = 0
            raw = data
        n = len(raw)
        self.scanned += n - pos
        out: list[SSEFrame] = []
        terminal = self._terminal
        terminal_at = -1
        # frames=False: parse a frame only to test it for the terminal frame, and only if it may be one
        skip: Callable[[bytes], bool] | None = None
        if not frames:
            maybe = self._maybe_terminal
            if terminal is None:
                skip = _always
            elif maybe is not None:
                skip = lambda block: not maybe(block)  # noqa: E731
        # the search only covers raw[pos:], so the choice of search looks at that part only (see _FRAME_END)
        sep: bytes | None
        if raw.find(b"\r", pos) < 0:
            sep = b"\n\n"
        elif raw.count(b"\r", pos) == raw.count(b"\n", pos) == raw.count(b"\r\n", pos):
            sep = b"\r\n\r\n"  # every line ends in "\r\n" (sse-starlette's default): a plain search
        else:
            sep = None
        cap = self._max_frame
        start = 0
        while True:
            if sep is not None:
                end = raw.find(sep, pos)
                if end < 0:
                    break
                nxt = end + len(sep)
            else:
                m = _FRAME_END.search(raw, pos)
                if m is None:
                    break
                end, nxt = m.span()
            if end - start > cap:
                self._skip("frame_too_large")
            else:
                block = raw[start:end]
                if skip is None or not skip(block):  # type: ignore[arg-type]
                    text = block.decode("utf-8", "replace")
                    if "\r" in text:
                        text = text.replace("\r\n", "\n").replace("\r", "\n")
                    frame = _parse_block(text)
                    if frame is not None:
                        out.append(frame)
                        if terminal_at < 0 and terminal is not None and terminal(frame):
                            terminal_at = start
            start = pos = nxt
        if raw is buf:
            self.scanned += len(data)  # appended to the buffer
            if start:
                complete = bytes(buf[:start])
                del buf[:start]
                self.scanned += n
            else:
                complete = b""
        else:
            complete = data if start == n else data[:start]  # raw is data
            if start < n:
                buf += data[start:]
                self.scanned += n - start
        if len(buf) > cap + 3:
            # an unfinished frame over the cap (not counting 3 bytes of a frame end that may be coming): let
            # its bytes go now and the rest as it comes
            self._skip("frame_too_large")
            complete += buf
            self._ctx = bytes(buf[-3:])
            buf.clear()
            self._overflow = True
        return complete, out, terminal_at

    def _pass_through(self, data: bytes, frames: bool) -> tuple[bytes, list[SSEFrame], int]:
        ctx = self._ctx
        raw = ctx + data
        self.scanned += len(raw)
        if b"\r" not in raw:
            end = raw.find(b"\n\n")
            end = end + 2 if end >= 0 else -1
        else:
            m = _FRAME_END.search(raw)
            end = -1 if m is None else m.end()
        if end < 0:
            self._ctx = raw[-3:]
            return data, [], -1
        # the oversized frame ends in this chunk; what follows is parsed as usual
        cut = end - len(ctx)
        self._overflow = False
        self._ctx = b""
        head = data[:cut]
        complete, out, at = self.feed_split(data[cut:], frames)
        return head + complete, out, at + len(head) if at >= 0 else -1

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def flush(self) -> bytes:
        """The unfinished tail (the body ended without completing it); the parser starts afresh."""
        out = bytes(self._buf)
        self._buf.clear()
        self._overflow = False
        self._ctx = b""
        return out

    @property
    def pending(self) -> bool:
        """True while an unfinished frame is buffered or partly sent (an injected frame would corrupt it)."""
        return self._overflow or bool(self._buf.strip(b"\r\n"))


# a blank line ends a frame: two line ends in a row, where "\r\n" is one line end (a lone "\r" at the end
# of the buffer counts as one: a "\n" that follows in the next chunk is then an empty line, which is
# harmless). Where the searched part of the buffer has no "\r", its first match is the first "\n\n"; where
# every "\r" in it is followed by "\n" and every "\n" preceded by "\r", the first "\r\n\r\n": the parser
# searches for those with bytes.find and uses the regex only for mixed line ends.
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
) -> FrameTokenExtractor:
    """Build the extractor for frames like ``event: token`` / ``data: {"token": "..."}``.

    ``token_field`` is a dot-separated path into JSON ``data`` (``choices.0.delta.content`` for
    OpenAI-style chunks); without it the first of :data:`DEFAULT_TOKEN_KEYS` present is used. Frames whose
    event is not in ``token_events`` (None = any event) carry no token. Non-JSON ``data`` of a token event
    is the token itself; ``data`` that is a JSON string (``data: "token"``, langserve's form) is decoded.
    """
    return FrameTokenExtractor(tuple(token_field.split(".")) if token_field else None, token_events)


class FrameTokenExtractor:
    """A :data:`TokenExtractor` (see :func:`make_token_extractor`) that never raises on the app's data.

    JSON too deeply nested to decode (``json.loads`` raises ``RecursionError`` for it, not ``ValueError``)
    carries no token; ``skipped`` counts such frames (``json_too_deep``).
    """

    __slots__ = ("_events", "_path", "skipped")

    def __init__(self, path: tuple[str, ...] | None, events: frozenset[str | None] | None) -> None:
        self._path = path
        self._events = events
        #: frames whose data could not be read, by reason
        self.skipped: dict[str, int] = {}

    def __call__(self, frame: SSEFrame) -> str | None:
        events = self._events
        if events is not None and frame.event not in events:
            return None
        data = frame.data
        if not data or data == "[DONE]":
            return None
        if data[0] not in '{["':
            return data
        payload = _decode_json(data, self.skipped)
        if payload is _NOT_JSON:
            return data
        return None if payload is _SKIPPED else extract_from_json(payload, self._path)


_NOT_JSON: Final[Any] = object()
_SKIPPED: Final[Any] = object()


def _decode_json(data: str | bytes | bytearray, skipped: dict[str, int] | None = None) -> Any:
    """``json.loads(data)``, safe for any input: a marker object instead of an exception.

    Returns ``_NOT_JSON`` for text that is not JSON and ``_SKIPPED`` for JSON nested too deeply to decode
    (``json.loads`` raises ``RecursionError`` there), counted in ``skipped`` as ``json_too_deep``.
    """
    try:
        return json.loads(data)
    except ValueError:
        return _NOT_JSON
    except RecursionError:
        if skipped is not None:
            skipped["json_too_deep"] = skipped.get("json_too_deep", 0) + 1
        return _SKIPPED


class JSONLinesParser:
    """A JSON-lines body (NDJSON, JSON Lines, json-seq) as it is sent: whole lines out, their tokens.

    :meth:`feed_split` returns the complete lines a chunk finished (a reader cannot use half a line), the
    tokens in them (``extract_from_json`` at ``path``) and where the terminal line (``terminal``'s
    ``type:NAME``) starts; tokens after the terminal line are not returned. Like :class:`SSEParser` it is
    linear however the body is chunked, and a line longer than ``max_line_bytes`` goes out as it arrives,
    unparsed, counted in ``skipped`` (``line_too_large``); a line that is not JSON is skipped silently, one
    nested too deeply to decode counts as ``json_too_deep``.
    """

    __slots__ = ("_buf", "_max_line", "_overflow", "_path", "_terminal", "scanned", "skipped")

    def __init__(
        self,
        terminal: TerminalFrames | None = None,
        path: tuple[str, ...] | None = None,
        *,
        max_line_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes!r}")
        self._buf = bytearray()
        self._terminal = terminal if terminal is not None and terminal.types else None
        self._path = path
        self._max_line = max_line_bytes
        self._overflow = False  # an oversized line is being passed through until its "\n"
        #: lines passed through without being decoded, by reason
        self.skipped: dict[str, int] = {}
        #: bytes searched for line ends and copied, since the start
        self.scanned = 0

    def feed_split(self, chunk: bytes | str, tokens: bool = True) -> tuple[bytes, list[str], int]:
        """``(complete, tokens, terminal_at)``: ``tokens=False`` decodes only lines that may be terminal."""
        data = chunk.encode() if isinstance(chunk, str) else chunk
        if data.__class__ is not bytes:
            data = bytes(data)
        head = b""
        if self._overflow:
            nl = data.find(b"\n")
            self.scanned += len(data) if nl < 0 else nl + 1
            if nl < 0:
                return data, [], -1
            self._overflow = False
            head, data = data[: nl + 1], data[nl + 1 :]
        buf = self._buf
        cut = data.rfind(b"\n") + 1
        self.scanned += len(data)
        if not cut:
            buf += data
            if len(buf) <= self._max_line:
                return head, [], -1
            self._skip("line_too_large")
            out = head + buf
            buf.clear()
            self._overflow = True
            return out, [], -1
        if buf:
            self.scanned += len(buf)
            complete = bytes(buf) + data[:cut]
            buf.clear()
        else:
            complete = data if cut == len(data) else data[:cut]
        if cut < len(data):
            buf += data[cut:]
            if len(buf) > self._max_line:
                self._skip("line_too_large")
                complete += buf
                buf.clear()
                self._overflow = True
        toks, at = self._lines(complete, tokens)
        return head + complete, toks, at + len(head) if at >= 0 else -1

    def _lines(self, complete: bytes, tokens: bool) -> tuple[list[str], int]:
        terminal = self._terminal
        out: list[str] = []
        if not tokens and terminal is None:
            return out, -1
        path = self._path
        cap = self._max_line
        skipped = self.skipped
        pos = 0
        end = complete.rfind(b"\n")  # an oversized tail after the last "\n" is not a line yet
        while pos <= end:
            nl = complete.find(b"\n", pos)
            at = pos
            line = complete[pos:nl]
            pos = nl + 1
            maybe_terminal = terminal is not None and terminal.may_be_json(line)
            if not (tokens or maybe_terminal) or not line.strip():
                continue
            if len(line) > cap:
                self._skip("line_too_large")
                continue
            payload = _decode_json(line, skipped)
            if payload is _NOT_JSON or payload is _SKIPPED:
                continue
            if maybe_terminal and terminal.json(payload):  # type: ignore[union-attr]
                return out, at
            if tokens:
                tok = extract_from_json(payload, path)
                if tok:
                    out.append(tok)
        return out, -1

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def flush(self) -> bytes:
        """The unfinished last line (the body ended without a line end); the parser starts afresh."""
        out = bytes(self._buf)
        self._buf.clear()
        self._overflow = False
        return out

    @property
    def pending(self) -> bool:
        """True while an unfinished line is buffered or partly sent (an injected line would corrupt it)."""
        return self._overflow or bool(self._buf)


def extract_from_json(payload: Any, path: tuple[str, ...] | None) -> str | None:
    """The token in a decoded JSON message: at ``path``, under the first default key present, or the message
    itself when it is a JSON string (``"token"``: the quotes are JSON's, not the answer's)."""
    if isinstance(payload, str):
        return payload if path is None and payload else None
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
