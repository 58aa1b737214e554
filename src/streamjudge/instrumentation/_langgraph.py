"""LangGraph: node spans with timings, question/contexts for the trace, answer tokens for the stream.

Built on openinference-instrumentation-langchain, which already turns every LangChain run into a span:
when it is active, its node spans get what it lacks (``node`` and ``elapsed_ms`` attributes, the node span
type). Without it, streamjudge opens its own graph and node spans. Either way a callback handler, added to
every LangChain callback manager the way openinference adds its tracer:

- registers the question (graph input, node state) and the retrieved contexts (retriever runs, node state
  under ``documents`` / ``contexts`` ...) for the trace as soon as they are known;
- marks the answer stream's start when an answer node (``settings.answer_nodes``) starts, and arms the
  model tap (``_model``) for the chat-model calls made inside answer nodes only: not the runs of the
  node's conditional edges (LangGraph tags them with the *source* node's name, so a grader edge after
  ``generate`` looks like the answer's LLM call; they are the node's children tagged ``seq:step:N``,
  N > 1, after the node's own function), not structured-output calls (``with_structured_output``),
  not ``nostream`` ones. Grading and reflection calls never reach the answer text;
- registers what tools return as contexts (a ReAct agent retrieves inside its answer node, before the
  answer's first token);
- gives a graph run outside any span a root span of its own, so it is judged;
- finds the answer of LangChain runnables without LangGraph (``_chains``: the chat-model call whose output
  reaches the chain's output) and says once per route, on INFO and on the request span, when an app's
  answer cannot be found.
"""

from __future__ import annotations

import contextlib
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
from streamjudge._sdk import is_instrumentation_enabled
from streamjudge.config import DEFAULT_QUESTION_KEYS
from streamjudge.instrumentation import _binding, _chains, _model
from streamjudge.instrumentation._binding import StreamBinding

_log = logging.getLogger(__name__)

QUESTION_KEYS: tuple[str, ...] = DEFAULT_QUESTION_KEYS
#: input keys holding a conversation whose last human message is the question
MESSAGE_KEYS: tuple[str, ...] = ("messages", "chat_history", "history")
CONTEXT_KEYS: tuple[str, ...] = ("documents", "contexts", "context", "docs", "retrieved", "sources")
_NOSTREAM_TAGS = frozenset({"nostream", "langsmith:nostream"})
_MAX_RUNS = 20_000  # a run that never ends (cancelled without callbacks) must not grow the map forever

# judge LLM calls run with instrumentation suppressed (the public helper) and must stay invisible


class _Run:
    __slots__ = ("answer", "binding", "edge", "fed", "got_docs", "is_node", "is_tool", "node", "reaches",
                 "root", "search", "span", "start", "steps", "tool", "trace_id")

    def __init__(self, trace_id: int, node: str | None) -> None:
        self.trace_id = trace_id
        self.node = node
        self.is_node = False
        self.answer = False
        self.edge = False  # a run of a conditional edge (or under one)
        self.fed = False  # an answer run whose tokens reached the stream
        self.start = 0.0
        self.span: Span | None = None
        self.binding: StreamBinding | None = None
        self.root: _Run | None = None  # the graph's run (None: this is it)
        self.reaches = True  # its output reaches the top-level run's output (see _chains)
        self.steps: tuple[bool, ...] | None = None  # a sequence run: which steps reach its output
        self.is_tool = False
        self.tool: _Run | None = None  # the tool run this run is part of (never itself: no cycle)
        self.got_docs = False  # a tool run: a retriever inside it returned documents
        self.search: _chains.ChainSearch | None = None  # a top-level run: its answer's search


def _after_node_function(tags: Sequence[str] | None) -> bool:
    """True for the tags of a node's step after its function: the writers and the conditional edges."""
    for tag in tags or ():
        if tag.startswith("seq:step:"):
            return tag != "seq:step:1"
    return False


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


def find_question(state: Any, keys: Sequence[str] = QUESTION_KEYS) -> str | None:
    """The user's question in a graph state or a chain's input: the first question-like key (``keys``)
    holding text, else the last human message of the conversation (``messages``, ``chat_history``, a
    message list or a prompt value)."""
    if isinstance(state, str):
        return state if state.strip() else None
    if isinstance(state, Mapping):
        for key in keys:
            v = state.get(key)
            if isinstance(v, str) and v.strip():
                return v
        for key in MESSAGE_KEYS:
            q = _last_human(state.get(key))
            if q is not None:
                return q
        return None
    to_messages = getattr(state, "to_messages", None)  # a PromptValue
    if callable(to_messages):
        with contextlib.suppress(Exception):
            return _last_human(to_messages())
        return None
    return _last_human(state)


def _last_human(messages: Any) -> str | None:
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        return None
    for m in reversed(messages):
        if getattr(m, "type", None) == "human":
            content = getattr(m, "content", None)
        elif isinstance(m, Mapping) and m.get("role") in ("user", "human"):
            content = m.get("content")
        elif isinstance(m, tuple) and len(m) == 2 and m[0] in ("user", "human"):
            content = m[1]
        else:
            continue
        if isinstance(content, list):  # content blocks
            content = _llm_token_text(content, None)
        text = content if isinstance(content, str) else ""
        if text.strip():
            return text
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
        root_tracer: trace.Tracer | None = None,
        question_keys: Sequence[str] = QUESTION_KEYS,
    ) -> None:
        super().__init__()
        self.question_keys = tuple(question_keys)
        self._root_tracer = root_tracer  # for a graph run outside any span when openinference has none
        self.answer_nodes = frozenset(answer_nodes)
        self._contexts = contexts
        self._tracer = tracer  # None: openinference makes the spans
        self._node_span = node_span_lookup
        self._runs: dict[UUID, _Run] = {}

    # --- bookkeeping ------------------------------------------------------------------------------
    def _new_run(self, run_id: UUID, parent_run_id: UUID | None, metadata: Mapping[str, Any] | None,
                 tags: Sequence[str] | None = None) -> _Run:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is not None:
            trace_id = parent.trace_id
        else:
            trace_id = trace.get_current_span().get_span_context().trace_id
        node = metadata.get("langgraph_node") if metadata else None
        run = _Run(trace_id, node if isinstance(node, str) else None)
        if parent is not None:
            run.edge = parent.edge
            run.root = parent.root or parent
            run.tool = parent if parent.is_tool else parent.tool
            run.reaches = parent.reaches and _chains.link_reaches(tags, parent.steps)
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
        if not is_instrumentation_enabled():
            return
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        run = self._new_run(run_id, parent_run_id, metadata, tags)
        sequence = _chains.take_starting()
        if sequence is not None:  # a sequence's invoke: its steps are known before they run
            run.steps = _chains.reaching_steps(sequence)
        name = kwargs.get("name")
        root = parent_run_id is None or parent is None
        run.is_node = (
            run.node is not None and name == run.node and (parent is None or parent.node != run.node)
        )
        if parent is not None and parent.is_node and name != parent.node and _after_node_function(tags):
            run.edge = True
        if root:
            if not run.trace_id:
                self._own_root(run, run_id, name)
            sid = (metadata or {}).get("thread_id") or (metadata or {}).get("session_id")
            self._register(run.trace_id, question=find_question(inputs, self.question_keys),
                           session_id=str(sid) if sid is not None else None)
            if run.node is None:
                run.search = _chains.ChainSearch(run_id, str(name or "chain"), _chains.streamed_start(inputs))
            if self._tracer is not None and run.node is None and run.span is None:
                run.span = self._tracer.start_span(
                    str(name or "LangGraph"), attributes={semconv.SPAN_TYPE: "graph"}
                )
        if not run.is_node:
            return
        run.start = time.perf_counter()
        search = (run.root or run).search
        if search is not None:
            search.nodes.add(run.node or "")
        q = find_question(inputs, self.question_keys)
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
        if node in self.answer_nodes and run.trace_id and not run.edge:
            self._open_answer(run, run_id)

    def _own_root(self, run: _Run, run_id: UUID, name: Any) -> None:
        """A graph run outside any span (a script, a worker): its trace starts here."""
        span = self._node_span(run_id) if self._node_span else None  # openinference's root span
        if span is None or not span.get_span_context().is_valid:
            tracer = self._tracer or self._root_tracer
            if tracer is None:
                return
            span = tracer.start_span(str(name or "LangGraph"), kind=trace.SpanKind.INTERNAL,
                                     attributes={semconv.SPAN_TYPE: "graph"})
            run.span = span
        run.trace_id = span.get_span_context().trace_id

    def _open_answer(self, run: _Run, run_id: UUID) -> None:
        span = run.span or (self._node_span(run_id) if self._node_span else None)
        parent = trace.set_span_in_context(span) if span is not None else None
        binding = _binding.lookup(run.trace_id)
        if binding is None or binding.closed:
            current = span or trace.get_current_span()
            if current.get_span_context().is_valid and not current.is_recording():
                return  # unsampled or the SDK is off: nothing would ever judge it, nothing may wait
            binding = StreamBinding(run.trace_id, owner="graph",
                                    parent=parent or otel_context.get_current())
            _binding.bind(binding)
            owner = run.root or run  # the graph owns it: finished when the graph's run ends
            if owner.binding is None:
                owner.binding = binding
            else:
                run.binding = binding
        try:
            binding.open(source="graph")
        except Exception:  # the app's graph must run even if the guard cannot start
            _log.exception("streamjudge: could not open the answer stream")

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        if run.is_node:
            self._register(run.trace_id, question=_output_question(outputs, self.question_keys),
                           contexts=find_contexts(outputs))
        if run.search is not None:
            self._check_found(run, run_id)
        self._end(run, None)

    # --- chains without LangGraph (see _chains) -------------------------------------------------------
    def sequence_steps(self, run_id: UUID | None, steps: tuple[bool, ...]) -> bool:
        """A streamed sequence run's steps; True when its input is wanted for the question."""
        run = self._runs.get(run_id) if run_id is not None else None
        if run is None:
            return False
        run.steps = steps
        if run.search is None or not run.trace_id:
            return False
        run.search.streamed = True
        known = self._contexts().get(run.trace_id)
        return known is None or not known.question

    def chain_input(self, run_id: UUID, value: Any) -> None:
        """The input of a streamed top-level chain (its start callback saw a placeholder)."""
        run = self._runs.get(run_id)
        if run is not None:
            self._register(run.trace_id, question=find_question(value, self.question_keys))

    def _chain_answer(self, run: _Run, excluded: bool) -> bool:
        """Whether a chat-model run outside LangGraph is its chain's answer (and open its stream)."""
        root = run.root
        search = root.search if root is not None else None
        if root is None or search is None or search.nodes or not run.trace_id:
            return False
        search.models += 1
        if not run.reaches:
            search.not_returned += 1
            return False
        if excluded or search.answered or not search.streamed:
            return False
        current = _binding.lookup(run.trace_id)
        if current is not None and (current.source is not None or current.session is not None):
            return False  # the request's stream has its answer (a graph's, the body's, an earlier chain's)
        search.answered = True
        self._open_answer(root, search.run_id)
        return True

    def _check_found(self, run: _Run, run_id: UUID) -> None:
        """A top-level run ended: say (once per route) when its answer could not be found."""
        search = run.search
        assert search is not None
        found = search.reason(self.answer_nodes)
        if found is None or not run.trace_id:
            return
        binding = _binding.lookup(run.trace_id)
        if binding is not None and binding.source is not None:
            return  # the answer reached the stream another way (the body, the app's own guard)
        span: Span | None = None
        if binding is not None and binding.parent is not None:
            span = trace.get_current_span(binding.parent)
        if span is None or not span.get_span_context().is_valid:
            span = run.span or (self._node_span(run_id) if self._node_span else None)
        try:
            _chains.report_not_found(search, found[0], found[1], span)
        except Exception:
            _log.debug("streamjudge: could not report a missing answer", exc_info=True)

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
                    _finish_blocking(binding)
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
        if not is_instrumentation_enabled():
            return
        run = self._new_run(run_id, parent_run_id, metadata, tags)
        excluded = bool((tags and _NOSTREAM_TAGS.intersection(tags))
                        or (metadata and metadata.get("ls_structured_output_format")))
        if run.node is None:
            run.answer = self._chain_answer(run, excluded)
        else:
            run.answer = (
                run.node in self.answer_nodes and bool(run.trace_id) and not run.edge and not excluded
            )
        binding = _binding.lookup(run.trace_id) if run.answer else None
        _model.arm(binding if binding is not None and not binding.closed else None)

    def on_llm_new_token(
        self, token: str | list[str | dict[str, Any]], *, chunk: Any = None, run_id: UUID, **kwargs: Any
    ) -> None:
        run = self._runs.get(run_id)
        if run is None or not run.answer:
            return
        text = _llm_token_text(token, chunk)
        if not text:
            return
        run.fed = True
        binding = _binding.lookup(run.trace_id)
        if binding is not None and binding.driver is None:  # a driving model tap feeds it itself
            binding.feed(text, "graph")

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        _model.arm(None)  # a call that never streamed must not leave the tap armed for the next one
        if run is None or not run.answer or run.fed:
            return
        # an answer that was not streamed (ainvoke without a streaming handler): judged whole
        text = _response_text(response)
        binding = _binding.lookup(run.trace_id)
        if text and binding is not None and not binding.closed:
            binding.feed(text, "graph")

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)
        _model.arm(None)

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
        if not is_instrumentation_enabled():
            return
        run = self._new_run(run_id, parent_run_id, metadata, tags)
        run.reaches = False  # a model inside a retriever (query generation) is never the answer

    def on_retriever_end(self, documents: Sequence[Any], *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is not None:
            texts = [t for t in (_text_of(d) for d in documents) if t is not None]
            if texts and run.tool is not None:
                run.tool.got_docs = True  # the tool's own output repeats these documents
            self._register(run.trace_id, contexts=texts)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    # --- tools: an agent's retrieval happens here, inside its answer node --------------------------
    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                      tags: list[str] | None = None, **kwargs: Any) -> None:
        if not is_instrumentation_enabled():
            return
        run = self._new_run(run_id, parent_run_id, metadata, tags)
        run.is_tool = True
        run.reaches = False

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is None or not run.trace_id or run.got_docs:
            # a retriever inside the tool registered its documents: the tool's output (often the same
            # documents joined) would count them twice
            return
        texts = _tool_texts(output)
        if not texts:
            return
        store = self._contexts()
        old = store.get(run.trace_id)
        before = list(old.contexts) if old is not None and old.contexts else []
        self._register(run.trace_id, contexts=before + [t for t in texts if t not in before])

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)


def _tool_texts(output: Any) -> list[str]:
    """The passages a tool returned: a string, documents, a ToolMessage's content, or a list of those."""
    content = getattr(output, "content", output)  # ToolMessage
    artifact = getattr(output, "artifact", None)
    items = artifact if isinstance(artifact, list) and artifact else content
    if isinstance(items, str):
        return [items] if items.strip() else []
    if isinstance(items, Sequence):
        return [t for t in (_text_of(x) for x in items) if t and t.strip()]
    t = _text_of(items)
    return [t] if t else []


def _response_text(response: Any) -> str:
    """The text of an ``LLMResult`` (the first generation's message content)."""
    try:
        gen = response.generations[0][0]
    except (AttributeError, IndexError, TypeError):
        return ""
    message = getattr(gen, "message", None)
    if message is not None:
        if getattr(message, "tool_calls", None) and not message.content:
            return ""
        return _llm_token_text(message.content, None) if message.content else ""
    text = getattr(gen, "text", "")
    return text if isinstance(text, str) else ""


def _finish_blocking(binding: StreamBinding) -> None:
    """Finish a graph-owned stream (no server delivers it): wait, bounded, for verdicts in flight."""
    import threading

    session = binding.session
    if session is not None and not session.stopped:
        woke = threading.Event()
        session.set_notify(woke.set)
        try:
            session.close_tail()
            deadline = time.monotonic() + session.settings.end_wait_s
            while session.outstanding and not session.stopped:
                if session.has_events:
                    binding.take_events()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                woke.clear()
                if not session.has_events:
                    woke.wait(remaining)
            binding.take_events()
        finally:
            session.set_notify(None)
    binding.finish()


def _output_question(outputs: Any, keys: Sequence[str] = QUESTION_KEYS) -> str | None:
    # a node that rewrites the question (contextualize, rewrite) states the self-contained version
    if isinstance(outputs, Mapping):
        for key in keys:
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
    if not isinstance(node, str) or run.name != node or node.startswith("__"):
        return None  # LangGraph's own __start__ (a visible run in 0.2) is no node of the app
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


def _is_langfuse_handler(handler: Any) -> bool:
    # langfuse.langchain.CallbackHandler (class LangchainCallbackHandler); by module, so no import
    cls = type(handler)
    return cls.__module__.startswith("langfuse") and cls.__name__.endswith("CallbackHandler")


class CallbackManagerInitWrapper:
    """Adds the handler to every LangChain callback manager (inheritable, so nested runs see it too).

    When the app passes Langfuse's LangChain ``CallbackHandler``, Langfuse already exports every
    LangChain run as a span: openinference's tracer (switched on by streamjudge) is taken out of that
    manager so no run is exported twice.
    """

    __slots__ = ("handler", "oi_tracer_cls")

    def __init__(self, handler: StreamJudgeCallbackHandler, oi_tracer_cls: type | None = None) -> None:
        self.handler = handler
        self.oi_tracer_cls = oi_tracer_cls

    def __call__(self, wrapped: Callable[..., None], instance: Any, args: Any, kwargs: Any) -> None:
        wrapped(*args, **kwargs)
        oi = self.oi_tracer_cls
        if oi is not None and any(_is_langfuse_handler(h) for h in instance.handlers):
            for h in [h for h in instance.handlers if isinstance(h, oi)]:
                instance.remove_handler(h)
        for h in instance.inheritable_handlers:
            if h is self.handler:
                return
        instance.add_handler(self.handler, True)


# --- a root span for graph runs outside any span ---------------------------------------------------------

class GraphRootWrapper:
    """Around ``Pregel.invoke/ainvoke/stream/astream``: a run outside any span gets a root span first.

    A script or a worker calling ``graph.ainvoke`` under ``opentelemetry-instrument`` has no request span;
    without one, every LangChain run would start a trace of its own and the answer could not be judged.
    The span is made current for the run, so openinference's spans, the node spans and the stream span
    all land in its trace. Runs nested in another runnable (a subgraph in a node) are left alone.
    """

    __slots__ = ("tracer",)

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def _needed(self) -> bool:
        from langchain_core.runnables.config import var_child_runnable_config

        if var_child_runnable_config.get() is not None:
            return False
        if not is_instrumentation_enabled():
            return False
        return not trace.get_current_span().get_span_context().is_valid

    def _span(self, instance: Any) -> Span:
        name = getattr(instance, "name", None) or "LangGraph"
        return self.tracer.start_span(str(name), attributes={semconv.SPAN_TYPE: "graph"})

    def sync(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        if not self._needed():
            return wrapped(*args, **kwargs)
        if wrapped.__name__ == "stream":
            return self._sync_gen(wrapped(*args, **kwargs), self._span(instance))
        with trace.use_span(self._span(instance), end_on_exit=True):
            return wrapped(*args, **kwargs)

    def asyn(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        if not self._needed():
            return wrapped(*args, **kwargs)
        span = self._span(instance)
        if wrapped.__name__ == "astream":
            return self._async_gen(wrapped, args, kwargs, span)
        return self._coro(wrapped(*args, **kwargs), span)

    @staticmethod
    async def _coro(coro: Any, span: Span) -> Any:
        with trace.use_span(span, end_on_exit=True):
            return await coro

    @staticmethod
    def _sync_gen(gen: Any, span: Span) -> Any:
        with trace.use_span(span, end_on_exit=True):
            yield from gen

    @staticmethod
    async def _async_gen(wrapped: Callable[..., Any], args: Any, kwargs: Any, span: Span) -> Any:
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            gen = wrapped(*args, **kwargs)  # created under the span: its tasks copy this context
            try:
                async for item in gen:
                    yield item
            finally:
                await gen.aclose()
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()
            with contextlib.suppress(ValueError):  # iterated from another context: nothing to restore
                otel_context.detach(token)
