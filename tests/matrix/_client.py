"""What a client of each shape receives: the app's frames and the guard's, parsed in the app's format.

A :class:`Frame` is one frame (or WebSocket message) in arrival order: an answer ``token``, the app's
``terminal`` frame, a ``guard`` event (warning / retract / stop, injected when client events are on) or
``other`` (an app frame that carries no answer, e.g. langserve's ``event: metadata``). Each shape's
:class:`Wire` also renders the app's own frames back to bytes, so a test can say that the bytes the client
got are exactly a sequence of the app's frames.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from websockets.sync.client import connect as ws_connect

import matrix._kit as kit

GUARD_KINDS = frozenset({"warning", "retract", "stop"})


@dataclass(frozen=True)
class Frame:
    kind: str  # "token" / "terminal" / "guard" / "other"
    text: str = ""  # the token, or the guard event's text
    payload: Any = None  # the guard event's JSON payload; an "other" frame's raw text

    @property
    def guard_type(self) -> str | None:
        return self.payload.get("type") if self.kind == "guard" else None


@dataclass
class Received:
    """One request's result: the raw body (WebSocket: the text of its messages, one a line) and its
    frames."""

    raw: bytes
    frames: list[Frame]
    trace_id: str
    parent_id: str  # the client's span (the traceparent it sent): the request span's parent

    @property
    def tokens(self) -> list[str]:
        return [f.text for f in self.frames if f.kind == "token"]

    @property
    def guard(self) -> list[dict[str, Any]]:
        return [f.payload for f in self.frames if f.kind == "guard"]

    def shown(self) -> str:
        """The answer as the client shows it: its token frames, less what a retract frame withdrew."""
        text = ""
        for f in self.frames:
            if f.kind == "token":
                text += f.text
            elif f.guard_type == "retract":
                text = text[: int(f.payload["from"])]
        return text


# --- parsing -------------------------------------------------------------------------------------------

def _sse_blocks(raw: bytes) -> list[tuple[str | None, str, str]]:
    """(event, data, block text) of each SSE frame."""
    out = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
        out.append((event, "\n".join(data), block))
    return out


def _guard(payload: Any) -> Frame:
    return Frame("guard", str(payload.get("text", "")), payload)


def parse_named_sse(raw: bytes) -> list[Frame]:
    """``event: token`` + ``{"token": ...}``, ``event: end``; guard events as ``event: <type>`` + JSON."""
    out = []
    for event, data, block in _sse_blocks(raw):
        if event == "token":
            out.append(Frame("token", json.loads(data)["token"]))
        elif event == "end":
            out.append(Frame("terminal"))
        elif event in GUARD_KINDS:
            out.append(_guard(json.loads(data)))
        else:
            out.append(Frame("other", payload=block))
    return out


def parse_data_sse(raw: bytes) -> list[Frame]:
    """Data-only JSON frames (``type`` token / warning / ...), ``data: [DONE]``."""
    out = []
    for event, data, block in _sse_blocks(raw):
        if event is None and data == "[DONE]":
            out.append(Frame("terminal"))
            continue
        payload = json.loads(data) if event is None and data.startswith("{") else None
        if isinstance(payload, dict) and payload.get("type") == "token":
            out.append(Frame("token", payload["content"]))
        elif isinstance(payload, dict) and payload.get("type") in GUARD_KINDS:
            out.append(_guard(payload))
        else:
            out.append(Frame("other", payload=block))
    return out


def parse_langserve(raw: bytes) -> list[Frame]:
    """``event: data`` + a JSON string, ``event: metadata``, ``event: end``; guard events by name."""
    out = []
    for event, data, block in _sse_blocks(raw):
        if event == "data":
            out.append(Frame("token", json.loads(data)))
        elif event == "end":
            out.append(Frame("terminal"))
        elif event in GUARD_KINDS:
            out.append(_guard(json.loads(data)))
        else:
            out.append(Frame("other", payload=block))
    return out


def _json_message(payload: dict[str, Any]) -> Frame:
    kind = payload.get("type")
    if kind == "token":
        return Frame("token", payload["content"])
    if kind == "done":
        return Frame("terminal")
    if kind in GUARD_KINDS:
        return _guard(payload)
    return Frame("other", payload=json.dumps(payload))


def parse_ndjson(raw: bytes) -> list[Frame]:
    return [_json_message(json.loads(line)) for line in raw.decode().split("\n") if line.strip()]


# --- the apps' own frames, rendered back -------------------------------------------------------------

def _render(token: Callable[[str], str], terminal: str) -> Callable[[list[Frame]], bytes]:
    def render(frames: list[Frame]) -> bytes:
        out = []
        for f in frames:
            if f.kind == "token":
                out.append(token(f.text))
            elif f.kind == "terminal":
                out.append(terminal)
            elif f.kind == "other":
                out.append(str(f.payload) + "\n\n")
            else:
                raise AssertionError(f"not an app frame: {f}")
        return "".join(out).encode()
    return render


def _ws_text(message: dict[str, str]) -> str:
    # how the app's ``send_json`` (Starlette's) encodes a message
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def _render_ws(frames: list[Frame]) -> bytes:
    out = []
    for f in frames:
        if f.kind == "token":
            out.append(_ws_text(kit.ws_token(f.text)) + "\n")
        elif f.kind == "terminal":
            out.append(_ws_text(kit.WS_END) + "\n")
        else:
            raise AssertionError(f"not an app frame: {f}")
    return "".join(out).encode()


# --- the requests ------------------------------------------------------------------------------------

def _headers(cell: str | None) -> tuple[dict[str, str], str]:
    """A sampled traceparent of a new trace (the spans of this request are found by it) and the switch."""
    trace = f"{secrets.token_hex(16)}-{secrets.token_hex(8)}"
    headers = {"traceparent": f"00-{trace}-01"}
    if cell is not None:
        headers[kit.CELL_HEADER] = cell
    return headers, trace


def _http(method: str, path: str, **kwargs: Any) -> Callable[[str, str | None], tuple[bytes, str]]:
    def call(url: str, cell: str | None) -> tuple[bytes, str]:
        headers, trace = _headers(cell)
        with httpx.stream(method, url + path, headers=headers, timeout=30, **kwargs) as r:
            assert r.status_code == 200, r.status_code
            return r.read(), trace
    return call


def _ws(question: str) -> Callable[[str, str | None], tuple[bytes, str]]:
    def call(url: str, cell: str | None) -> tuple[bytes, str]:
        headers, trace = _headers(None)
        target = url.replace("http://", "ws://") + "/ws" + (f"?cell={cell}" if cell else "")
        lines = []
        with ws_connect(target, additional_headers=headers, open_timeout=30) as ws:
            ws.send(json.dumps({"question": question}))
            while True:  # one answer: up to the app's terminal message
                text = str(ws.recv(timeout=30))
                lines.append(text)
                if json.loads(text).get("type") == "done":
                    break
        return ("\n".join(lines) + "\n").encode(), trace
    return call


@dataclass(frozen=True)
class Wire:
    """One shape's route: which process serves it, how to call it, parse and render its frames."""

    process: str
    call: Callable[[str, str | None], tuple[bytes, str]]
    parse: Callable[[bytes], list[Frame]]
    render: Callable[[list[Frame]], bytes]
    fallback_in_answer: bool  # the app's answer carries the guard's fallback (the tokens come from its model)

    def request(self, url: str, cell: str | None) -> Received:
        raw, trace = self.call(url, cell)
        trace_id, _, parent_id = trace.partition("-")
        return Received(raw, self.parse(raw), trace_id, parent_id)


def wires(question: str) -> dict[str, Wire]:
    """Each shape's route (the four zero-code shapes share one app; the body shape has three transports)."""
    sse = _render(kit.sse_token, kit.SSE_END)
    ndjson = _render(kit.ndjson_token, kit.NDJSON_END)
    langserve = _render(kit.langserve_token, kit.LANGSERVE_END)
    chain_input = {"input": {"question": question, "chat_history": []}}
    return {
        "async_graph": Wire("zero_code", _http("GET", "/async_graph/chat", params={"q": question}),
                            parse_named_sse, sse, True),
        "sync_graph": Wire("zero_code", _http("POST", "/sync_graph/ask", json={"question": question}),
                           parse_ndjson, ndjson, True),
        "react": Wire("zero_code", _http("POST", "/react/stream", json={"message": question}),
                      parse_data_sse, _render(kit.data_token, kit.DATA_END), True),
        "lcel": Wire("zero_code", _http("POST", "/lcel/stream", json=chain_input), parse_langserve, langserve,
                     True),
        "body_sse": Wire("body", _http("GET", "/sse", params={"q": question}), parse_named_sse, sse, False),
        "body_ndjson": Wire("body", _http("GET", "/ndjson", params={"q": question}), parse_ndjson, ndjson,
                            False),
        "body_ws": Wire("body", _ws(question), parse_ndjson, _render_ws, False),
    }
