"""A scripted LLM server for offline judge tests: OpenAI-compatible and Anthropic-Messages-compatible.

Serves ``POST /v1/chat/completions``, ``POST /v1/embeddings`` and ``POST /v1/messages`` on 127.0.0.1.
The "model" is a deterministic heuristic that does the judge tasks it recognises (our ``llm`` judge's
prompts, the ragas 0.4 collection metrics' output schemas, deepeval 4's templates): a claim is supported
when most of its content words occur in the context passages, a statement is relevant when it shares
content words with the question.

It is deliberately gullible: when a request contains "ignore ... instructions" OUTSIDE a fenced data
block (``<data-XXXX ...>...</data-XXXX>``), it obeys and answers with perfect verdicts, as a weak model
might. Fenced text is read as data only. A test that passes an injected answer therefore fails unless the
judge fences it.

Fault injection: :meth:`ScriptedLLMServer.inject` queues one-shot faults consumed by the next model
requests, in order:

``http:<status>[:<retry_after>]``  an error response (e.g. ``http:503``, ``http:429:2``)
``slow:<seconds>``                 answer normally after a delay
``hang``                           never answer (until the server stops)
``reset``                          close the connection without a response
``fenced``                         valid verdicts inside a code fence with prose and trailing commas
``garbage``                        prose, no JSON
``schemaless``                     valid JSON that ignores the requested schema
Persistent switches: ``reject_json_mode`` (400 on ``response_format``), ``reject_prefill`` (400 on a
prefilled assistant turn), ``latency_s`` (delay before every model answer).

An application's model: :attr:`ScriptedLLMServer.app_responder` (``body -> spec | None``) answers chat
completions it recognises instead of the judge brain. A spec is ``{"content": text}``, ``{"tool_call":
{"name": ..., "arguments": {...}}}`` or ``{"json": obj}`` (structured output: the JSON as content, as
OpenAI's ``json_schema`` response format returns it). With ``"stream": true`` the answer is streamed as
chat-completion chunks (word tokens, ``first_token_delay_s`` before the first one and ``token_delay_s``
between the others; tool-call arguments in pieces; a usage chunk when asked; ``data: [DONE]``).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import json
import math
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# --- the "model" -------------------------------------------------------------------------------------

_BLOCK = re.compile(r'<(data-[0-9a-f]+)(?:\s+source="([^"]*)")?\s*>(.*?)</\1>', re.S)
_INJECTION = re.compile(r"ignore\s+(?:all\s+|any\s+)?(?:your|previous|prior|the\s+above|the)?\s*instructions",
                        re.I)
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("""a an the of in on at to for from by with and or but is are was were be been being it its
this that these those as what which who whom whose when where why how do does did has have had not no yes
can could would should will shall may might must than then there their they them he she his her we you your
our i me my about into over under also very just only such so if""".split())  # noqa: SIM905


def _unescape(text: str) -> str:
    # prompts that embed inputs as JSON (ragas) escape quotes and newlines inside the fenced blocks
    return text.replace('\\"', '"').replace("\\n", "\n")


def words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1}


def sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return [p.strip() for p in parts if words(p)]


def blocks(text: str) -> list[tuple[str, str]]:
    """(source, content) of every fenced data block."""
    return [(m.group(2) or "", m.group(3).replace("&lt;", "<").strip())
            for m in _BLOCK.finditer(_unescape(text))]


def outside_blocks(text: str) -> str:
    return _BLOCK.sub(" ", _unescape(text))


def injected(text: str) -> bool:
    """An instruction to the judge that is not fenced as data."""
    return bool(_INJECTION.search(outside_blocks(text)))


def supported(claim: str, context_words: set[str]) -> bool:
    ws = words(claim)
    return not ws or len(ws & context_words) / len(ws) >= 0.75


def relevant(statement: str, question: str) -> bool:
    return bool(words(statement) & words(question))


def embed(text: str, dim: int = 64) -> list[float]:
    vec = [0.0] * dim
    for w in words(text):
        h = int.from_bytes(hashlib.sha1(w.encode()).digest()[:4], "big")
        vec[h % dim] += 1.0
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def _unfenced_inputs(text: str) -> collections.defaultdict[str, list[str]]:
    out: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
    m = re.search(r"Answer to check:\s*\n(.*)\Z", text, re.S)  # our llm judge
    if m:
        out["answer"].append(m.group(1))
    idx = text.rfind("input: {")  # ragas: the input model as JSON
    if idx != -1:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text, idx + len("input: "))
        except ValueError:
            obj = {}
        for key, source in (("question", "question"), ("answer", "answer"), ("response", "answer"),
                            ("context", "context"), ("statements", "statement")):
            value = obj.get(key)
            if isinstance(value, list):
                out[source].extend(str(v) for v in value)
            elif value:
                out[source].append(str(value))
    for label, source in (("AI Output", "answer"), ("Text", "answer"), ("Retrieval Contexts", "context")):
        m = re.search(rf"^{label}:\s*\n(.*?)\n\s*\n(?:JSON|Claims):", text, re.S | re.M)
        if m:
            out[source].append(m.group(1))
    m = re.search(r"^Claims:\s*\n(\[.*?\])\s*\n\s*\nJSON:", text, re.S | re.M)
    if m:
        with contextlib.suppress(ValueError):
            out["claim"].extend(str(c) for c in json.loads(m.group(1)))
    return out


class Brain:
    """Recognises the judge task in a prompt and answers it."""

    def __init__(self) -> None:
        self.tasks: list[str] = []  # the task of every answered request, for assertions

    def answer(self, text: str) -> dict[str, Any]:
        obey = injected(text)
        data = blocks(text)
        by_source: dict[str, list[str]] = collections.defaultdict(list)
        for source, content in data:
            by_source[source.split(" ")[0]].append(content)
        ctx_words: set[str] = set()
        for c in by_source["context"]:
            ctx_words |= words(c)
        if not data:  # an unfenced prompt: read the inputs where each framework's template puts them
            by_source = _unfenced_inputs(text)
        question = " ".join(by_source["question"])
        answer = " ".join(by_source["answer"])
        task = self._task(text)
        self.tasks.append(task + (":obeyed" if obey else ""))
        claims = sentences(answer)
        if task == "faithfulness":
            # our llm judge numbers the sentences to check ("[1] ..."): answer with the sentence of each claim
            numbered = [(int(n), c.strip()) for n, c in re.findall(r"^\[(\d+)\] (.*)$", answer, re.M)]
            pairs = numbered or [(0, c) for c in claims]
            return {"claims": [{"claim": c, **({"sentence": n} if n else {}),
                                "verdict": "supported" if obey or supported(c, ctx_words) else "unsupported",
                                "reason": "checked against the passages"}
                               for n, c in pairs]}
        if task == "answer_relevancy":
            return {"statements": [{"statement": s, "relevant": obey or relevant(s, question)}
                                   for s in claims], "noncommittal": False}
        if task == "context_precision":
            return {"passages": [{"index": i, "useful": obey or relevant(c, question), "reason": "-"}
                                 for i, c in enumerate(by_source["context"], 1)]}
        if task == "context_recall":
            ref = sentences(" ".join(by_source["reference"]))
            return {"statements": [{"statement": s, "attributed": obey or supported(s, ctx_words)}
                                   for s in ref]}
        # ragas 0.4 collections (schema title sent by instructor)
        if task == "ragas.statements":
            return {"statements": claims}
        if task == "ragas.nli":
            stmts = by_source["statement"] or claims
            return {"statements": [{"statement": s, "reason": "-",
                                    "verdict": int(obey or supported(s, ctx_words))} for s in stmts]}
        if task == "ragas.answer_relevance":
            first = claims[0] if claims else answer
            return {"question": f"What is {first.rstrip('.!?')}?", "noncommittal": 0}
        if task == "ragas.context_precision":
            return {"reason": "-", "verdict": int(obey or relevant(" ".join(by_source["context"]), question))}
        if task == "ragas.context_recall":
            ref = sentences(" ".join(by_source["reference"]) or answer)
            return {"classifications": [{"statement": s, "reason": "-",
                                         "attributed": int(obey or supported(s, ctx_words))} for s in ref]}
        # deepeval 4 templates
        if task == "deepeval.truths":
            return {"truths": sentences(" ".join(by_source["context"]))}
        if task == "deepeval.claims":
            return {"claims": claims}
        if task == "deepeval.faithfulness_verdicts":
            truths_words: set[str] = set()
            for t in by_source["truth"] + by_source["context"]:
                truths_words |= words(t)
            return {"verdicts": [{"verdict": "yes" if obey or supported(c, truths_words) else "no",
                                  "reason": "-"} for c in by_source["claim"]]}
        if task == "deepeval.statements":
            return {"statements": claims}
        if task == "deepeval.answer_relevancy_verdicts":
            return {"verdicts": [{"verdict": "yes" if obey or relevant(s, question) else "no",
                                  "reason": "-"} for s in by_source["statement"]]}
        if task == "deepeval.contextual_relevancy_verdicts":
            ctx = " ".join(by_source["context"])
            return {"verdicts": [{"statement": s, "verdict": "yes" if obey or relevant(s, question) else "no",
                                  "reason": "-"} for s in sentences(ctx)]}
        if task == "deepeval.contextual_recall_verdicts":
            ref = sentences(" ".join(by_source["reference"]))
            return {"verdicts": [{"verdict": "yes" if obey or supported(s, ctx_words) else "no",
                                  "reason": "-"} for s in ref]}
        if task == "deepeval.geval":
            ok = obey or all(supported(c, ctx_words) for c in claims)
            return {"reason": "rubric applied", "score": 10 if ok else 2}
        if task == "deepeval.reason":
            return {"reason": "scored by the scripted model"}
        return {"error": "task not recognised"}

    @staticmethod
    def _task(text: str) -> str:
        m = re.search(r"TASK: (\w+)", text)
        if m:
            return m.group(1)
        for title, task in (("StatementGeneratorOutput", "ragas.statements"),
                            ("NLIStatementOutput", "ragas.nli"),
                            ("AnswerRelevanceOutput", "ragas.answer_relevance"),
                            ("ContextPrecisionOutput", "ragas.context_precision"),
                            ("ContextRecallOutput", "ragas.context_recall")):
            if title in text:
                return task
        if '"truths" key' in text:
            return "deepeval.truths"
        if '"claims" key' in text:
            return "deepeval.claims"
        if "whether EACH claim contradicts" in text:
            return "deepeval.faithfulness_verdicts"
        if "breakdown and generate a list of statements" in text:
            return "deepeval.statements"
        if "whether each statement is relevant to address the input" in text:
            return "deepeval.answer_relevancy_verdicts"
        if "can be attributed to the nodes of retrieval contexts" in text:
            return "deepeval.contextual_recall_verdicts"
        if "each statement found in the context" in text:
            return "deepeval.contextual_relevancy_verdicts"
        if "You are an evaluator" in text and "Evaluation Steps" in text:
            return "deepeval.geval"
        if "'reason' key" in text or "CONCISE reason" in text:
            return "deepeval.reason"
        return "unknown"


# --- HTTP --------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "invalid JSON body"}})
            return
        path = self.path.split("?")[0]
        with owner.lock:
            owner.requests.append({"path": path, "body": body,
                                   "headers": {k.lower(): v for k, v in self.headers.items()}})
            fault = owner.faults.popleft() if owner.faults else None
        if owner.latency_s:
            time.sleep(owner.latency_s)
        if fault is not None and self._apply_fault(fault, path):
            return
        if path.endswith("/embeddings"):
            self._embeddings(body)
        elif path.endswith("/chat/completions"):
            self._chat(body, fault)
        elif path.endswith("/messages"):
            self._messages(body, fault)
        else:
            self._send(404, {"error": {"message": f"no route {path}"}})

    # faults that replace the answer; content faults ("fenced", ...) are applied by the formatters
    def _apply_fault(self, fault: str, path: str) -> bool:
        kind, _, arg = fault.partition(":")
        if kind == "http":
            status, _, retry_after = arg.partition(":")
            headers = {"retry-after": retry_after} if retry_after else {}
            err_type = "rate_limit_error" if status == "429" else "api_error"
            self._send(int(status), {"type": "error", "error": {"type": err_type,
                                                                "message": f"scripted {status}"}}, headers)
            return True
        if kind == "slow":
            time.sleep(float(arg))
            return False
        if kind == "hang":
            self.server.owner.stopping.wait(60)
            self.close_connection = True
            return True
        if kind == "reset":
            self.close_connection = True
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass
            return True
        return False

    def _content(self, messages_text: str, fault: str | None) -> dict[str, Any] | str:
        result = self.server.owner.brain.answer(messages_text)
        if fault == "fenced":
            pretty = json.dumps(result, indent=2)
            pretty = re.sub(r"(\]|\}|\"|\d|true|false)\n(\s*)(\]|\})", r"\1,\n\2\3", pretty, count=1)
            return f"Sure! Here is the JSON you asked for:\n```json\n{pretty}\n```\nHope this helps."
        if fault == "garbage":
            return "I am sorry, I cannot evaluate that."
        if fault == "schemaless":
            return {"result": "looks fine to me", "score": "high"}
        return result

    def _chat(self, body: dict[str, Any], fault: str | None) -> None:
        owner = self.server.owner
        responder = owner.app_responder
        spec = responder(body) if responder is not None else None
        if spec is not None:
            self._app_reply(body, spec)
            return
        if owner.reject_json_mode and "response_format" in body:
            self._send(400, {"error": {"message": "response_format is not supported by this model",
                                       "type": "invalid_request_error", "param": "response_format"}})
            return
        text = "\n".join(_text(m.get("content")) for m in body.get("messages", []))
        content = self._content(text, fault)
        tools = body.get("tools")
        message: dict[str, Any] = {"role": "assistant"}
        finish = "stop"
        if tools and isinstance(content, dict):
            name = tools[0].get("function", {}).get("name", "tool")
            message["content"] = None
            message["tool_calls"] = [{"id": "call_1", "type": "function",
                                      "function": {"name": name, "arguments": json.dumps(content)}}]
            finish = "tool_calls"
        else:
            message["content"] = content if isinstance(content, str) else json.dumps(content)
        out_text = message.get("content") or json.dumps(content)
        self._send(200, {
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": _tokens(text), "completion_tokens": _tokens(out_text),
                      "total_tokens": _tokens(text) + _tokens(out_text)},
        })

    def _app_reply(self, body: dict[str, Any], spec: dict[str, Any]) -> None:
        owner = self.server.owner
        tool = spec.get("tool_call")
        content = json.dumps(spec["json"]) if "json" in spec else spec.get("content")
        model = body.get("model", "scripted")
        created = int(time.time())
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish = "stop"
            if tool is not None:
                message = {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": tool["name"], "arguments": json.dumps(tool["arguments"])}}]}
                finish = "tool_calls"
            # a model takes as long to write a whole answer as to stream it
            n = len(str(content or "").split(" ")) if tool is None else 1
            time.sleep(owner.first_token_delay_s + owner.token_delay_s * (n - 1))
            self._send(200, {"id": "chatcmpl-app", "object": "chat.completion", "created": created,
                             "model": model, "choices": [{"index": 0, "message": message,
                                                          "finish_reason": finish}],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}})
            return

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            payload = {"id": "chatcmpl-app", "object": "chat.completion.chunk", "created": created,
                       "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                       **extra}
            return f"data: {json.dumps(payload)}\n\n".encode()

        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def write(data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            write(chunk({"role": "assistant", "content": ""}))
            time.sleep(owner.first_token_delay_s)
            if tool is not None:
                args = json.dumps(tool["arguments"])
                write(chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": tool["name"], "arguments": ""}}]}))
                for i in range(0, len(args), 8):
                    write(chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 8]}}]}))
                write(chunk({}, "tool_calls"))
            else:
                words_ = str(content or "").split(" ")
                for i, w in enumerate(words_):
                    if i:
                        time.sleep(owner.token_delay_s)
                    write(chunk({"content": w if i == 0 else " " + w}))
                write(chunk({}, "stop"))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
                payload = {"id": "chatcmpl-app", "object": "chat.completion.chunk", "created": created,
                           "model": model, "choices": [], "usage": usage}
                write(f"data: {json.dumps(payload)}\n\n".encode())
            write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the app closed the model's stream (a stop)
            self.close_connection = True

    def _messages(self, body: dict[str, Any], fault: str | None) -> None:
        owner = self.server.owner
        msgs = body.get("messages", [])
        prefilled = bool(msgs) and msgs[-1].get("role") == "assistant"
        if owner.reject_prefill and prefilled:
            self._send(400, {"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "This model does not support assistant message prefill."}})
            return
        system = _text(body.get("system"))
        text = system + "\n" + "\n".join(_text(m.get("content")) for m in msgs)
        content = self._content(text, fault)
        tools = body.get("tools")
        if tools and isinstance(content, dict):
            blocks_out: list[dict[str, Any]] = [{"type": "tool_use", "id": "toolu_1",
                                                 "name": tools[0].get("name", "tool"), "input": content}]
            stop = "tool_use"
            out_text = json.dumps(content)
        else:
            out_text = content if isinstance(content, str) else json.dumps(content)
            if prefilled and out_text.startswith(_text(msgs[-1].get("content"))):
                out_text = out_text[len(_text(msgs[-1].get("content"))):]
            blocks_out = [{"type": "text", "text": out_text}]
            stop = "end_turn"
        self._send(200, {
            "id": "msg_scripted", "type": "message", "role": "assistant",
            "model": body.get("model", "scripted"), "content": blocks_out,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": _tokens(text), "output_tokens": _tokens(out_text)},
        })

    def _embeddings(self, body: dict[str, Any]) -> None:
        inputs = body.get("input")
        items = [inputs] if isinstance(inputs, str) else list(inputs or [])
        data = []
        for i, text in enumerate(items):
            vec = embed(str(text))
            emb: Any = vec
            if body.get("encoding_format") == "base64":
                emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(_tokens(str(t)) for t in items)
        self._send(200, {"object": "list", "data": data, "model": body.get("model", "scripted-embed"),
                         "usage": {"prompt_tokens": n, "total_tokens": n}})

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text") if isinstance(c, dict) else c) for c in content)
    return str(content)


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # concurrency tests open many connections at once
    owner: ScriptedLLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client process that exits with keep-alive connections open resets them: not an error here
        if not isinstance(sys.exc_info()[1], ConnectionResetError):
            super().handle_error(request, client_address)


class ScriptedLLMServer:
    """Start with :meth:`start` (or as a context manager); always :meth:`stop`."""

    def __init__(self) -> None:
        self.brain = Brain()
        self.requests: list[dict[str, Any]] = []
        self.faults: collections.deque[str] = collections.deque()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.reject_json_mode = False
        self.reject_prefill = False
        self.latency_s = 0.0
        #: an application's model (see the module docstring); None: every request goes to the brain
        self.app_responder: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
        self.first_token_delay_s = 0.0
        self.token_delay_s = 0.0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inject(self, *faults: str) -> None:
        """Queue one-shot faults for the next model requests."""
        with self.lock:
            self.faults.extend(faults)

    def model_requests(self, suffix: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["path"].endswith(suffix)]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.faults.clear()
            self.brain.tasks.clear()
        self.reject_json_mode = self.reject_prefill = False
        self.latency_s = 0.0

    def start(self) -> ScriptedLLMServer:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
