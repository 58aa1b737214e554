"""LangGraph: node spans with timings, question/contexts for the trace, answer tokens for the stream.

Built on openinference-instrumentation-langchain, which already turns every LangChain run into a span:
when it is active, its node spans get what it lacks (``node`` and ``elapsed_ms`` attributes, the node span
type). Without it, streamjudge opens its own graph and node spans. Either way a callback handler, added to
every LangChain callback manager the way openinference adds its tracer:

- registers the question (graph input, node state) and the retrieved contexts (retriever runs, node state
  under ``documents`` / ``contexts`` ...) for the trace as soon as they are known;
- opens the answer stream when an answer node (``settings.answer_nodes``) starts — contexts are fixed by
  then, so the pre-flight gate runs before the first token — and feeds it the tokens of LLM calls made
  inside answer nodes only. Grading and reflection calls in other nodes never reach the answer text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from streamjudge import semconv
from streamjudge._context import ContextStore
from streamjudge.instrumentation import _binding
from streamjudge.instrumentation._binding import StreamBinding

_log = logging.getLogger(__name__)

QUESTION_KEYS: tuple[str, ...] = ("question", "query", "input", "user_question", "standalone_question")
CONTEXT_KEYS: tuple[str, ...] = ("documents", "contexts", "context", "docs", "retrieved", "sources")
_NOSTREAM_TAGS = frozenset({"nostream", "langsmith:nostream"})
_MAX_RUNS = 20_000  # a run that never ends (cancelled without callbacks) must not grow the map forever

try:  # the suppression key: judge LLM calls run with it set and must stay invisible
    from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
except ImportError:  # pragma: no cover - very old API
    _SUPPRESS_INSTRUMENTATION_KEY = "suppress_instrumentation"  # type: ignore[assignment]


class _Run:
    __slots__ = ("answer", "binding", "is_node", "node", "span", "start", "trace_id")

    def __init__(self, trace_id: int, node: str | None) -> None:
        self.trace_id = trace_id
        self.node = node
        self.is_node = False
        self.answer = False
        self.start = 0.0
        self.span: Span | None = None
        self.binding: StreamBinding | None = None


def _text_of(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    content = getattr(item, "page_content", None)  # langchain Document
    if isinstance(content, str):
        return content
    if isinstance(item, Mapping):
        for key in ("page_content", "content", "text"):
            v = item.get(key)
            if isinstance(v, str):
                return v
    return None


def find_question(state: Any) -> str | None:
    """The user's question in a graph state or node input (question-like key or the last human message)."""
    if isinstance(state, str):
        return state or None
    if not isinstance(state, Mapping):
        return None
    for key in QUESTION_KEYS:
        v = state.get(key)
        if isinstance(v, str) and v.strip():
            return v
    messages = state.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        for m in reversed(messages):
            if getattr(m, "type", None) == "human" and isinstance(getattr(m, "content", None), str):
                return str(m.content)
            if isinstance(m, Mapping) and m.get("role") in ("user", "human"):
                content = m.get("content")
                if isinstance(content, str):
                    return content
    return None


def find_contexts(state: Any) -> list[str] | None:
    """Retrieved passages in a node's output (documents, strings or dicts under a context-like key)."""
    if not isinstance(state, Mapping):
        return None
    for key in CONTEXT_KEYS:
        v = state.get(key)
        if isinstance(v, Sequence) and not isinstance(v, str | bytes):
            texts = [t for t in (_text_of(x) for x in v) if t is not None]
            if texts or not v:
                return texts
    return None


def _llm_token_text(token: str | list[str | dict[str, Any]], chunk: Any) -> str:
    if isinstance(token, str) and token:
        return token
    if isinstance(token, list):  # content blocks
        return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in token)
    # content-block models (Anthropic) deliver the text in the chunk, not in ``token``
    message = getattr(chunk, "message", None)
    content = getattr(message, "content", None)
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, Mapping) and b.get("type") == "text"
        )
    return ""


class StreamJudgeCallbackHandler(BaseCallbackHandler):
    """LangChain callbacks -> context registration, answer-stream feeding and (fallback) node spans."""

    run_inline = True  # called in the caller's task, in order: token feeding must not hop threads
    raise_error = False

    def __init__(
        self,
        *,
        answer_nodes: Iterable[str],
        contexts: Callable[[], ContextStore],
        tracer: trace.Tracer | None,
        node_span_lookup: Callable[[UUID], Span | None] | None = None,
    ) -> None:
        super().__init__()
        self.answer_nodes = frozenset(answer_nodes)
        self._contexts = contexts
        self._tracer = tracer  # None: openinference makes the spans
        self._node_span = node_span_lookup
        self._runs: dict[UUID, _Run] = {}

    # --- bookkeeping ------------------------------------------------------------------------------
    def _new_run(self, run_id: UUID, parent_run_id: UUID | None, metadata: Mapping[str, Any] | None) -> _Run:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is not None:
            trace_id = parent.trace_id
        else:
            trace_id = trace.get_current_span().get_span_context().trace_id
        node = metadata.get("langgraph_node") if metadata else None
        run = _Run(trace_id, node if isinstance(node, str) else None)
        runs = self._runs
        if len(runs) >= _MAX_RUNS:
            for key in list(runs)[: _MAX_RUNS // 10]:
                runs.pop(key, None)
        runs[run_id] = run
        return run

    def _register(self, trace_id: int, *, question: str | None = None,
                  contexts: list[str] | None = None, session_id: str | None = None) -> None:
        if trace_id and (question is not None or contexts is not None or session_id is not None):
            self._contexts().register(trace_id, question=question, contexts=contexts, session_id=session_id)

    # --- chains (the graph and its nodes) -----------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY):
            return
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        run = self._new_run(run_id, parent_run_id, metadata)
        name = kwargs.get("name")
        root = parent_run_id is None or parent is None
        run.is_node = (
            run.node is not None and name == run.node and (parent is None or parent.node != run.node)
        )
        if root:
            sid = (metadata or {}).get("thread_id") or (metadata or {}).get("session_id")
            self._register(run.trace_id, question=find_question(inputs),
                           session_id=str(sid) if sid is not None else None)
            if self._tracer is not None and run.node is None:
                run.span = self._tracer.start_span(
                    str(name or "LangGraph"), attributes={semconv.SPAN_TYPE: "graph"}
                )
        if not run.is_node:
            return
        run.start = time.perf_counter()
        q = find_question(inputs)
        if q is not None:
            self._register(run.trace_id, question=q)
        node = run.node
        assert node is not None
        if self._tracer is not None:
            ctx = trace.set_span_in_context(parent.span) if parent is not None and parent.span else None
            run.span = self._tracer.start_span(
                f"{semconv.SPAN_NODE_PREFIX}.{node}",
                context=ctx,
                attributes={semconv.NODE_NAME: node, semconv.SPAN_TYPE: semconv.SPAN_TYPE_NODE},
            )
        if node in self.answer_nodes and run.trace_id:
            self._open_answer(run, run_id)

    def _open_answer(self, run: _Run, run_id: UUID) -> None:
        binding = _binding.lookup(run.trace_id)
        if binding is None or binding.closed:
            span = run.span or (self._node_span(run_id) if self._node_span else None)
            parent = trace.set_span_in_context(span) if span is not None else otel_context.get_current()
            binding = StreamBinding(run.trace_id, owner="graph", parent=parent)
            _binding.bind(binding)
            run.binding = binding  # the graph owns it: finished when this node ends
        try:
            binding.open(source="graph")
        except Exception:  # the app's graph must run even if the guard cannot start
            _log.exception("streamjudge: could not open the answer stream")

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        if run.is_node:
            self._register(run.trace_id, question=_output_question(outputs), contexts=find_contexts(outputs))
        self._end(run, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is not None:
            self._end(run, error)

    def _end(self, run: _Run, error: BaseException | None) -> None:
        span = run.span
        if span is not None:
            if run.is_node:
                span.set_attribute(semconv.NODE_ELAPSED_MS, round((time.perf_counter() - run.start) * 1e3, 3))
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.end()
        binding = run.binding
        if binding is not None:
            _binding.unbind(binding)
            try:
                if error is None:
                    binding.finish()
                else:
                    binding.abort("error")
            except Exception:
                _log.exception("streamjudge: could not finish the answer stream")

    # --- LLM calls ----------------------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._llm_start(run_id, parent_run_id, tags, metadata)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._llm_start(run_id, parent_run_id, tags, metadata)

    def _llm_start(self, run_id: UUID, parent_run_id: UUID | None, tags: list[str] | None,
                   metadata: dict[str, Any] | None) -> None:
        if otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY):
            return
        run = self._new_run(run_id, parent_run_id, metadata)
        run.answer = (
            run.node in self.answer_nodes
            and bool(run.trace_id)
            and not (tags and _NOSTREAM_TAGS.intersection(tags))
        )

    def on_llm_new_token(
        self, token: str | list[str | dict[str, Any]], *, chunk: Any = None, run_id: UUID, **kwargs: Any
    ) -> None:
        run = self._runs.get(run_id)
        if run is None or not run.answer:
            return
        text = _llm_token_text(token, chunk)
        if not text:
            return
        binding = _binding.lookup(run.trace_id)
        if binding is not None:
            binding.feed(text, "graph")

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    # --- retrievers ---------------------------------------------------------------------------------
    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY):
            return
        self._new_run(run_id, parent_run_id, metadata)

    def on_retriever_end(self, documents: Sequence[Any], *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is not None:
            texts = [t for t in (_text_of(d) for d in documents) if t is not None]
            self._register(run.trace_id, contexts=texts)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        return None


def _output_question(outputs: Any) -> str | None:
    # a node that rewrites the question (contextualize, rewrite) states the self-contained version
    if isinstance(outputs, Mapping):
        for key in QUESTION_KEYS:
            v = outputs.get(key)
            if isinstance(v, str) and v.strip():
                return v
    return None


# --- openinference enrichment -------------------------------------------------------------------------

def _is_node_run(tracer: Any, run: Any) -> str | None:
    """The node name when ``run`` (an openinference/LangChain ``Run``) is a LangGraph node run."""
    extra = getattr(run, "extra", None) or {}
    meta = extra.get("metadata") if isinstance(extra, Mapping) else None
    node = meta.get("langgraph_node") if isinstance(meta, Mapping) else None
    if not isinstance(node, str) or run.name != node:
        return None
    parent_id = getattr(run, "parent_run_id", None)
    if parent_id is not None:
        parent = tracer.run_map.get(str(parent_id))
        pextra = getattr(parent, "extra", None) or {}
        pmeta = pextra.get("metadata") if isinstance(pextra, Mapping) else None
        if isinstance(pmeta, Mapping) and pmeta.get("langgraph_node") == node:
            return None  # a runnable inside the node that happens to share its name
    return node


def oi_start_trace_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """After openinference opens a run's span: mark node spans with ``node`` and the node span type."""
    result = wrapped(*args, **kwargs)
    try:
        run = args[0] if args else kwargs["run"]
        node = _is_node_run(instance, run)
        if node is not None:
            span = instance.get_span(run.id)
            if span is not None:
                span.set_attribute(semconv.NODE_NAME, node)
                span.set_attribute(semconv.SPAN_TYPE, semconv.SPAN_TYPE_NODE)
    except Exception:
        _log.debug("streamjudge: could not annotate a node span", exc_info=True)
    return result


def oi_end_trace_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """Before openinference ends a node span: record the node's elapsed time from the run's own clock."""
    try:
        run = args[0] if args else kwargs["run"]
        if run.end_time is not None and _is_node_run(instance, run) is not None:
            span = instance.get_span(run.id)
            if span is not None:
                elapsed = (run.end_time - run.start_time).total_seconds() * 1e3
                span.set_attribute(semconv.NODE_ELAPSED_MS, round(elapsed, 3))
    except Exception:
        _log.debug("streamjudge: could not time a node span", exc_info=True)
    return wrapped(*args, **kwargs)


class CallbackManagerInitWrapper:
    """Adds the handler to every LangChain callback manager (inheritable, so nested runs see it too)."""

    __slots__ = ("handler",)

    def __init__(self, handler: StreamJudgeCallbackHandler) -> None:
        self.handler = handler

    def __call__(self, wrapped: Callable[..., None], instance: Any, args: Any, kwargs: Any) -> None:
        wrapped(*args, **kwargs)
        for h in instance.inheritable_handlers:
            if h is self.handler:
                return
        instance.add_handler(self.handler, True)
