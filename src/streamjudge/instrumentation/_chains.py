"""LangChain runnables without LangGraph: which chat-model call of a chain is its answer.

A chain has no node names, so the answer is found by where a model's output goes. A chain run is a tree
of runs (LangChain's callbacks); a chat-model call is the chain's answer when its output reaches the
output of the top-level run:

- at each ``RunnableSequence`` on the way up, every step after it passes its output on: a step that is
  (or contains) a prompt template, a language model, a retriever or a tool consumes it instead. The
  condense-question call of a conversational chain feeds a retriever (``prompt | model | parser |
  retriever``), so it is not the answer; ``prompt | model | parser`` at the end of the chain is;
- a ``RunnableBranch`` condition never reaches the output; parallel maps, ``assign``, branches,
  bindings, fallbacks and functions pass on what their children return;
- calls inside a tool or a retriever, structured-output calls and ``nostream`` calls are never the answer;
- the first call of a top-level run that qualifies is its answer; later ones (a follow-up or a grader of
  the answer) are not judged;
- only a streamed top-level run (``astream``, ``stream``, ``astream_events``) has an answer, and only
  while the request's stream has none yet: a helper chain invoked beside a LangGraph graph (a title, a
  rewrite) never takes the request's stream.

Callbacks do not say which steps follow a model, so the sequences tell us themselves: their
``invoke`` / ``ainvoke`` / ``_transform`` / ``_atransform`` are wrapped to hand the handler each step's
"passes on to the end" flag as the sequence run starts, before any of its steps runs. A function step
(``RunnableLambda``, ``@chain``) is opaque: what it returns cannot be seen, so a model called inside one
counts as passing its output on, and a function after a model as passing it on.

When a streamed chain that called a model (or a graph) ends without an answer found, one INFO line per
route says so and why, and the request span records the reason (``streamjudge.answer.not_found``). See
docs/app-shapes-langchain.md.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Protocol
from uuid import UUID

from opentelemetry import trace

from streamjudge import semconv

_log = logging.getLogger(__name__)

#: why a chain's answer was not found (the value of ``streamjudge.answer.not_found``)
NOT_RETURNED = "model_output_not_returned"
EXCLUDED = "model_calls_excluded"
NO_ANSWER_NODE = "no_answer_node"

_WALK_LIMIT = 400  # runnables looked at per step: a huge chain is judged as opaque past this
_CACHE_MAX = 512
_LOGGED_MAX = 1024

#: the sequence whose own run starts next in this context (its ``invoke`` / ``ainvoke`` is running)
_starting: contextvars.ContextVar[Any] = contextvars.ContextVar("streamjudge_sequence", default=None)


class SequenceSink(Protocol):
    """What the sequence wrappers tell (the callback handler)."""

    def sequence_steps(self, run_id: UUID | None, steps: tuple[bool, ...]) -> bool:
        """A sequence run's steps (True: that step's output reaches the sequence's output); returns True
        when the handler wants the run's input (a top-level run whose question is not known yet)."""

    def chain_input(self, run_id: UUID, value: Any) -> None:
        """The input of a streamed top-level sequence (its start callback only sees a placeholder)."""


# --- which steps pass a model's output on ----------------------------------------------------------

_consumers: tuple[type, ...] | None = None


def _consumer_types() -> tuple[type, ...]:
    global _consumers
    if _consumers is None:
        from langchain_core.language_models import BaseLanguageModel
        from langchain_core.prompts import BasePromptTemplate
        from langchain_core.retrievers import BaseRetriever
        from langchain_core.tools import BaseTool

        _consumers = (BasePromptTemplate, BaseLanguageModel, BaseRetriever, BaseTool)
    return _consumers


def _children(obj: Any) -> Iterator[Any]:
    """The runnables a composite runnable holds (sequence steps, map branches, a binding's bound...)."""
    from langchain_core.runnables import Runnable

    fields = getattr(obj, "__dict__", None)
    if not isinstance(fields, dict):
        return
    for value in fields.values():
        if isinstance(value, Runnable):
            yield value
        elif isinstance(value, list | tuple | dict):
            items = value.values() if isinstance(value, dict) else value
            for item in items:
                if isinstance(item, Runnable):
                    yield item
                elif isinstance(item, tuple):  # a RunnableBranch's (condition, runnable) pairs
                    yield from (x for x in item if isinstance(x, Runnable))


def passes_on(step: Any) -> bool:
    """True when ``step`` hands its input's content on: it neither is nor holds a prompt template, a
    language model, a retriever or a tool (functions are opaque and count as passing on)."""
    consumers = _consumer_types()
    seen: set[int] = set()
    todo = [step]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        if len(seen) >= _WALK_LIMIT:
            return False  # too large to tell: not claimed as passing on
        seen.add(id(obj))
        if isinstance(obj, consumers):
            return False
        todo.extend(_children(obj))
    return True


_cache: dict[int, tuple[weakref.ref[Any], tuple[bool, ...]]] = {}
_cache_lock = threading.Lock()


def reaching_steps(sequence: Any) -> tuple[bool, ...]:
    """Per step of ``sequence``: True when every step after it passes its output on (cached per sequence:
    a chain is built once and run many times)."""
    key = id(sequence)
    hit = _cache.get(key)
    if hit is not None and hit[0]() is sequence:
        return hit[1]
    steps = list(sequence.steps)
    flags = [True] * len(steps)
    tail_ok = True
    for i in range(len(steps) - 1, -1, -1):
        flags[i] = tail_ok
        tail_ok = tail_ok and passes_on(steps[i])
    out = tuple(flags)
    try:
        ref = weakref.ref(sequence)
    except TypeError:
        return out
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = (ref, out)
    return out


def streamed_start(inputs: Any) -> bool:
    """True for the start callback of a streamed run: LangChain reports a placeholder input then (the
    input is streamed in, and only known when the run ends)."""
    return isinstance(inputs, dict) and len(inputs) == 1 and inputs.get("input") == ""


def link_reaches(tags: Sequence[str] | None, parent_steps: tuple[bool, ...] | None) -> bool:
    """Whether a run's output reaches its parent run's output, from the run's tags (``seq:step:N`` in a
    sequence, ``condition:N`` for a branch's condition) and the parent sequence's step flags."""
    for tag in tags or ():
        if tag.startswith("seq:step:"):
            if parent_steps is None:
                return False  # a sequence run whose steps were not seen (batch): not claimed
            try:
                index = int(tag[9:]) - 1
            except ValueError:
                return False
            return 0 <= index < len(parent_steps) and parent_steps[index]
        if tag.startswith("condition:"):
            return False
    return True


# --- the sequence wrappers ---------------------------------------------------------------------------

class SequenceWrappers:
    """wrapt wrappers around ``RunnableSequence`` that hand its step flags to the callback handler."""

    __slots__ = ("sink",)

    def __init__(self, sink: SequenceSink) -> None:
        self.sink = sink

    def invoke(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        token = _starting.set(instance)
        try:
            return wrapped(*args, **kwargs)
        finally:
            _starting.reset(token)

    def ainvoke(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        return _ainvoke(wrapped(*args, **kwargs), instance)

    def transform(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        args, wants = self._started(instance, args, kwargs)
        if wants is not None:
            args = (_peek(args[0], wants, self.sink), *args[1:])
        return wrapped(*args, **kwargs)

    def atransform(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        args, wants = self._started(instance, args, kwargs)
        if wants is not None:
            args = (_apeek(args[0], wants, self.sink), *args[1:])
        return wrapped(*args, **kwargs)

    def _started(self, instance: Any, args: Any, kwargs: Any) -> tuple[Any, UUID | None]:
        """``_transform(inputs, run_manager, config)``: the run has started, its steps have not."""
        try:
            manager = args[1] if len(args) > 1 else kwargs.get("run_manager")
            run_id = getattr(manager, "run_id", None)
            if run_id is not None and self.sink.sequence_steps(run_id, reaching_steps(instance)) and args:
                return args, run_id
        except Exception:  # a chain must run even if its shape cannot be read
            _log.debug("streamjudge: could not read a sequence's steps", exc_info=True)
        return args, None


async def _ainvoke(coro: Any, instance: Any) -> Any:
    token = _starting.set(instance)
    try:
        return await coro
    finally:
        _starting.reset(token)


def take_starting() -> Any:
    """The sequence whose run is starting now (called from its start callback), once."""
    seq = _starting.get()
    if seq is not None:
        _starting.set(None)  # the sequence's steps start runs of their own in this context
    return seq


def _peek(inputs: Iterator[Any], run_id: UUID, sink: SequenceSink) -> Iterator[Any]:
    first = True
    for item in inputs:
        if first:
            first = False
            _safe_input(sink, run_id, item)
        yield item


async def _apeek(inputs: AsyncIterator[Any], run_id: UUID, sink: SequenceSink) -> AsyncIterator[Any]:
    first = True
    async for item in inputs:
        if first:
            first = False
            _safe_input(sink, run_id, item)
        yield item


def _safe_input(sink: SequenceSink, run_id: UUID, item: Any) -> None:
    try:
        sink.chain_input(run_id, item)
    except Exception:
        _log.debug("streamjudge: could not read a chain's input", exc_info=True)


def wrap_sequences(sink: SequenceSink, patched: list[tuple[Any, str]]) -> None:
    """Wrap ``RunnableSequence``'s entry points (appended to ``patched`` for uninstrument)."""
    from langchain_core.runnables import RunnableSequence
    from wrapt import wrap_function_wrapper

    wrappers = SequenceWrappers(sink)
    for attr, wrapper in (("invoke", wrappers.invoke), ("ainvoke", wrappers.ainvoke),
                          ("_transform", wrappers.transform), ("_atransform", wrappers.atransform)):
        if attr in vars(RunnableSequence):
            wrap_function_wrapper(RunnableSequence, attr, wrapper)
            patched.append((RunnableSequence, attr))


# --- a top-level run's search for its answer ---------------------------------------------------------

class ChainSearch:
    """Per top-level run: its answer call once found, and why the other calls were not it."""

    __slots__ = ("answered", "models", "name", "nodes", "not_returned", "run_id", "streamed")

    def __init__(self, run_id: UUID, name: str, streamed: bool) -> None:
        self.run_id = run_id
        self.name = name
        #: the run streams its output (``astream`` / ``stream`` / ``astream_events``): only such a run's
        #: answer is looked for, so a helper chain that a LangGraph app invokes beside its graph (a title,
        #: a rewrite) never takes the request's stream
        self.streamed = streamed
        self.answered = False
        self.models = 0  # chat-model calls seen
        self.not_returned = 0  # of them: output consumed by a later step
        self.nodes: set[str] = set()  # LangGraph nodes that ran (a graph's run)

    def reason(self, answer_nodes: frozenset[str]) -> tuple[str, str] | None:
        """(code, explanation) when the run had an answer to find and none was found, else None."""
        if self.answered:
            return None
        if self.nodes:
            if answer_nodes & self.nodes:
                return None
            wanted = ", ".join(sorted(answer_nodes))
            return NO_ANSWER_NODE, (f"no node of STREAMJUDGE_ANSWER_NODES ({wanted}) ran; "
                                    f"nodes: {', '.join(sorted(self.nodes)[:12])}")
        if not self.models or not self.streamed:
            return None  # no model call, or not streamed: not a chain answering the request
        if self.not_returned == self.models:
            return NOT_RETURNED, (f"the output of its {self.models} chat-model call(s) does not reach the "
                                  "chain's output (each feeds a later prompt, model, retriever or tool)")
        return EXCLUDED, ("its chat-model calls reaching the output are structured-output or nostream "
                          "calls, or the request's stream had its answer already")


_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def report_not_found(search: ChainSearch, code: str, why: str, span: trace.Span | None) -> None:
    """Record on ``span`` (the request's) that no answer was found; log it once per route and chain."""
    route = getattr(span, "name", None) or search.name
    if span is not None and span.is_recording():
        span.set_attribute(semconv.ANSWER_NOT_FOUND, code)
    key = (str(route), search.name)
    with _logged_lock:
        if key in _logged:
            return
        if len(_logged) >= _LOGGED_MAX:
            _logged.clear()
        _logged.add(key)
    _log.info("streamjudge: no answer to judge in %r on %s: %s; see docs/app-shapes-langchain.md",
              search.name, route, why)
