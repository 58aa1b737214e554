"""The model tap: the guard sits between the answer node's chat model and the node.

Zero-code apps never hand their token iterator to streamjudge, so the guard goes where the tokens are
born: ``_astream`` of the chat model class (``BaseChatModel.astream``, ``ainvoke`` with a streaming
handler, LangGraph's ``messages`` stream and ``astream_events`` all iterate it). The callback handler arms
the tap in ``on_chat_model_start`` for answer runs only (see ``_langgraph``); the next ``_astream`` call in
the same task takes it. Everything the app sees of the model's output then passes through the guard:

- stream-first: each chunk goes on as it arrives; the guard's warnings / retractions go to the client
  events (when switched on);
- hold-back: text chunks reach the node only once their window passed (released text is re-chunked at
  window boundaries; chunks without text — role, tool calls, usage — keep their order relative to it);
- stop: the node receives the fallback message as the model's last chunk and the model's stream is
  closed;
- regenerate: the same model is re-prompted (the original messages, the accepted prefix as the
  assistant's turn so far, the stick-to-context instruction with the contexts) and its continuation flows
  into the same output; with hold-back the node never sees the rejected text.

``_astream`` is wrapped lazily, on the class that defines it, the first time a model of that class is
called (subclasses override it, so wrapping ``BaseChatModel`` alone would miss them).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from wrapt import wrap_function_wrapper

from streamjudge.instrumentation._binding import StreamBinding
from streamjudge.judging.guard import AsyncWaker, SourceStep, end_wait, wait_step

if TYPE_CHECKING:
    from streamjudge.judging.guard import GuardSession, RegenerateRequest, StreamEvent

_log = logging.getLogger(__name__)

#: the answer stream the next ``_astream`` call in this task feeds (set by ``on_chat_model_start``)
_armed: contextvars.ContextVar[StreamBinding | None] = contextvars.ContextVar("streamjudge_tap", default=None)

_CLIENT_EVENTS = frozenset({"warning", "retract", "stop"})


def arm(binding: StreamBinding | None) -> None:
    """The chat-model run starting now feeds ``binding`` (None: it is not an answer run)."""
    if binding is not None or _armed.get() is not None:
        _armed.set(binding)


class ModelPatcher:
    """Wraps ``_astream`` on each chat model class the first time one of its models runs."""

    def __init__(self) -> None:
        self.patched: list[tuple[Any, str]] = []
        self._seen: set[type] = set()

    def ensure(self, cls: type) -> None:
        if cls in self._seen:
            return
        self._seen.add(cls)
        for name, wrapper in (("_astream", astream_wrapper), ("_stream", stream_wrapper)):
            for owner in cls.__mro__:
                if name in vars(owner):
                    if not hasattr(vars(owner)[name], "__wrapped__"):
                        wrap_function_wrapper(owner, name, wrapper)
                        self.patched.append((owner, name))
                    break

    def caller_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        """Around ``astream`` / ``_agenerate_with_cache``: make sure the model's class is tapped.

        An answer call that would not stream (``ainvoke`` without a streaming handler) is asked to when
        the guard has to act on it (hold-back, stop, regenerate): the node still receives one message,
        the aggregate of what the guard released.
        """
        try:
            self.ensure(type(instance))
            if (
                wrapped.__name__ in ("_agenerate_with_cache", "_generate_with_cache")
                and "stream" not in kwargs
                and _armed.get() is not None
                and _acts()
                and _streams(type(instance))
            ):
                kwargs = {**kwargs, "stream": True}
        except Exception:  # never break the app's model call
            _log.debug("streamjudge: could not tap %r", type(instance), exc_info=True)
        return wrapped(*args, **kwargs)


def _acts() -> bool:
    from streamjudge.runtime import current_runtime

    rt = current_runtime()
    return rt is not None and (rt.settings.mode == "hold_back" or rt.settings.action != "flag")


def _streams(cls: type) -> bool:
    from langchain_core.language_models.chat_models import BaseChatModel

    return getattr(cls, "_astream", None) is not getattr(BaseChatModel, "_astream", None) or (
        getattr(cls, "_stream", None) is not getattr(BaseChatModel, "_stream", None))


def _take_armed() -> StreamBinding | None:
    binding = _armed.get()
    if binding is None:
        return None
    _armed.set(None)  # one model call takes it (a super()._astream inside is not tapped twice)
    if binding.closed or binding.driver is not None or binding.source not in (None, "graph"):
        return None
    return binding


def astream_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    binding = _take_armed()
    if binding is None:
        return wrapped(*args, **kwargs)
    return _Tap(binding, wrapped, args, kwargs).run()


def stream_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    binding = _take_armed()
    if binding is None:
        return wrapped(*args, **kwargs)
    return _SyncTap(binding, wrapped, args, kwargs).run()


def chunk_text(chunk: Any) -> str:
    """The answer text of a ``ChatGenerationChunk`` (content blocks joined; tool-call chunks have none)."""
    message = getattr(chunk, "message", None)
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content
                       if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text"))
    return ""


def _text_chunk(text: str, like: Any) -> Any:
    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk

    msg_id = getattr(getattr(like, "message", None), "id", None)
    return ChatGenerationChunk(message=AIMessageChunk(content=text, id=msg_id))


def reprompt(messages: Sequence[Any], req: RegenerateRequest) -> list[Any]:
    """The original conversation, the accepted prefix as the answer so far, and the instruction."""
    from langchain_core.messages import AIMessage, HumanMessage

    out = list(messages)
    context = "\n\n".join(f"[{i + 1}] {c}" for i, c in enumerate(req.contexts))
    ask = f"{req.instruction}\n\nContext:\n{context}" if context else req.instruction
    if req.accepted_prefix:
        out.append(AIMessage(content=req.accepted_prefix))
        ask += "\n\nContinue the answer right after the text you already wrote; do not repeat it."
    out.append(HumanMessage(content=ask))
    return out


class _TapBase:
    """What the async and the sync tap share: opening the session, applying its events, regenerating."""

    def __init__(self, binding: StreamBinding, wrapped: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.binding = binding
        self.wrapped = wrapped
        self.args = args
        self.kwargs = kwargs
        self.session: GuardSession | None = None
        self.accepted: list[str] = []  # the answer text since the last regeneration's prefix
        self.released = 0  # chars of it the node received
        self.like: Any = None  # a chunk of this model, for re-chunked text
        self.meta: list[Any] = []  # text-less chunks that arrived while text was held
        self._deferring = False  # the tap set the session's deferral (and removes it when it ends)

    def _begin(self) -> None:
        binding = self.binding
        binding.driver = self
        binding.source = "graph"
        binding.regenerate = self._regenerate

    def _end(self) -> None:
        s = self.session
        if s is not None:
            s.set_notify(None)
            if self._deferring:
                # the spans of windows still waiting for the loop go out now: whatever feeds the
                # session after this tap (another model call, the graph's callbacks) sends inline
                s.set_deferral(None)
                self._deferring = False
        self.binding.driver = None
        self.binding.regenerate = None

    def _regenerate(self, req: RegenerateRequest) -> Any:
        args, kwargs = self.args, dict(self.kwargs)
        if args:
            messages = args[0]
            args = (reprompt(messages, req), *args[1:])
        else:
            kwargs["messages"] = reprompt(kwargs["messages"], req)
        return self.wrapped(*args, **kwargs)

    def _open(self, notify: Callable[[], None],
              defer: Callable[[Callable[[], None]], object] | None) -> GuardSession:
        s = self.binding.ensure_session()
        self.session = s
        s.set_notify(notify)
        if defer is not None and not s.defers:
            # checkpoint spans and judge requests are made when the loop next runs, not between two chunks
            # of the model's stream; the windows a chunk burst closes go out as one checkpoint (the tap
            # runs on the loop, and while it drives nothing else feeds the session)
            s.set_deferral(defer)
            self._deferring = True
        return s

    def _held(self) -> bool:
        return self.released < sum(map(len, self.accepted))

    def _waits(self, s: GuardSession) -> bool:
        # hold-back must see its last window judged; stop / regenerate can only act while the model's
        # stream is open; a graph run without a server has nobody else to wait for its verdicts
        return s.hold_back or s.settings.action != "flag" or self.binding.owner == "graph"

    def _keeps(self, s: GuardSession | None, chunk: Any) -> bool:
        """A chunk without text: whether it waits behind held text (else it goes on at once)."""
        if s is not None and s.hold_back and self._held():
            self.meta.append(chunk)
            return True
        return False

    def _accept(self, s: GuardSession, text: str, chunk: Any) -> Any:
        """Feed one text chunk; the chunk when the node gets it now (stream-first), else None."""
        if self.like is None:
            self.like = chunk
        if s.accept(text) is None:
            return None
        self.accepted.append(text)
        if s.hold_back:
            return None
        self.released += len(text)
        return chunk

    def _tail(self) -> list[Any]:
        """The model's stream ended: what is still held (released fail-open) and the held text-less
        chunks."""
        out: list[Any] = []
        s = self.session
        if s is not None and s.hold_back and not s.stopped:
            rest = "".join(self.accepted)[self.released:]
            if rest:  # not judged in time: released fail-open (the span says why)
                self.released += len(rest)
                out.append(_text_chunk(rest, self.like))
        out.extend(self.meta)
        self.meta = []
        return out

    def _drained(self) -> list[Any]:
        s = self.session
        return self._apply(s.drain()) if s is not None else []

    def _apply(self, events: list[StreamEvent]) -> list[Any]:
        """Chunks for the node (released text, the fallback); client events go to the wrapper."""
        out: list[Any] = []
        client: list[StreamEvent] = []
        for ev in events:
            kind = ev.type
            if kind == "token":
                if ev.text:
                    self.released += len(ev.text)
                    out.append(_text_chunk(ev.text, self.like))
            elif kind in _CLIENT_EVENTS:
                client.append(ev)
                if kind == "stop" and ev.text:
                    shown = "".join(self.accepted)[: self.released]
                    sep = " " if shown and not shown[-1].isspace() else ""
                    out.append(_text_chunk(sep + ev.text, self.like))
                    if self.session is not None:
                        self.session.note_delivered(sep + ev.text)
        if client:
            self.binding.post(client)
        return out

    def _next_source(self, s: GuardSession) -> Any:
        req = s.begin_regeneration()
        self.accepted = [req.accepted_prefix] if req.accepted_prefix else []
        if s.hold_back:
            self.released = len(req.accepted_prefix)  # what passed of the rejected text was released
        else:
            self.released = sum(map(len, self.accepted))
        return s.open_regeneration(req)


class _Tap(_TapBase):
    """Drives one answer stream's guard session over one async chat-model stream."""

    def __init__(self, binding: StreamBinding, wrapped: Callable[..., Any], args: Any, kwargs: Any) -> None:
        super().__init__(binding, wrapped, args, kwargs)
        # a verdict wakes the loop only while the tap sleeps on one (see AsyncWaker): while tokens flow the
        # tap reads the inbox after every chunk anyway, and each cross-thread wake-up costs a syscall, a loop
        # iteration and a GIL hand-off
        self._waker: AsyncWaker | None = None

    async def run(self) -> AsyncIterator[Any]:
        self._begin()
        source: AsyncIterator[Any] = aiter(self.wrapped(*self.args, **self.kwargs))
        loop = asyncio.get_running_loop()
        waker = self._waker = AsyncWaker(loop)
        step: SourceStep | None = None  # the model's next chunk, asked for while text is held
        ok = False
        try:
            while True:
                s = self.session
                if s is not None and s.has_events:
                    for out in self._apply(s.drain()):
                        yield out
                    if s.stopped:
                        break
                    if s.regen_request is not None:
                        if step is not None:
                            step.abandon()
                            step = None
                        await _aclose(source)
                        source = aiter(self._next_source(s))
                        continue
                try:
                    if step is None and not (s is not None and s.hold_back and s.outstanding):
                        chunk = await anext(source)
                    else:
                        # text held while verdicts are in flight: race the next chunk against them, the
                        # model's stream stepped in this task and context as under a plain await (a task
                        # of its own would run it in a copy of the context: see SourceStep)
                        if step is None:
                            step = SourceStep(anext(source))
                            step.advance()
                        if not step.ready and s is not None and not s.has_events and s.outstanding:
                            await wait_step(step, waker, None)
                            if not step.ready:
                                continue  # a verdict: drained above, the model's step kept as it is
                        taken, step = step, None
                        chunk = await taken  # at once when the chunk is in
                except StopAsyncIteration:
                    if s is None or not self._waits(s):
                        break
                    # the model is done: the last window is judged before the node gets the rest
                    s.close_tail()
                    for wait in end_wait(s, take=self._drained, clock=loop.time):
                        if isinstance(wait, list):
                            for out in wait:
                                yield out
                        else:
                            await waker.wait(None, wait)
                    if s.regen_request is not None and not s.stopped:
                        source = aiter(self._next_source(s))
                        continue
                    break
                text = chunk_text(chunk)
                if not text:
                    if not self._keeps(s, chunk):
                        yield chunk
                    continue
                if s is None:
                    s = self._open(waker.notify, loop.call_soon)
                    if s.span is None or not s.span.is_recording():
                        # unsampled: no verdict will ever come, so the guard stays out of the way
                        yield chunk
                        async for rest in source:
                            yield rest
                        ok = True
                        return
                    if s.preflight_pending:
                        await self._wait_preflight(s)
                    for out in self._apply(s.drain()) if s.has_events else ():
                        yield out
                    if s.stopped:
                        break
                out = self._accept(s, text, chunk)
                if out is not None:
                    yield out
            for out in self._tail():
                yield out
            ok = True
        finally:
            if step is not None:
                step.abandon()
            if not ok or (self.session is not None and self.session.stopped):
                await _aclose(source)
            self._end()

    async def _wait_preflight(self, s: GuardSession) -> None:
        waker = self._waker
        assert waker is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.settings.preflight_wait_s
        while s.preflight_pending and not s.has_events and loop.time() < deadline:
            await waker.wait(None, deadline - loop.time())


class _SyncTap(_TapBase):
    """Drives one answer stream's guard session over one sync chat-model stream (a sync node, a sync
    ``invoke`` / ``stream``). It cannot race a chunk against a verdict without a thread: verdicts are
    applied before each chunk goes on, and at the model's end within the end-of-stream wait."""

    def run(self) -> Iterator[Any]:
        self._begin()
        woke = threading.Event()
        source: Iterator[Any] = iter(self.wrapped(*self.args, **self.kwargs))
        ok = False
        try:
            while True:
                s = self.session
                if s is not None and s.has_events:
                    yield from self._apply(s.drain())
                    if s.stopped:
                        break
                    if s.regen_request is not None:
                        _close(source)
                        source = iter(self._next_source(s))
                        continue
                try:
                    chunk = next(source)
                except StopIteration:
                    if s is None or not self._waits(s):
                        break
                    s.close_tail()
                    for wait in end_wait(s, take=self._drained):
                        if isinstance(wait, list):
                            yield from wait
                        else:
                            woke.clear()
                            if not s.has_events:
                                woke.wait(wait)
                    if s.regen_request is not None and not s.stopped:
                        source = iter(self._next_source(s))
                        continue
                    break
                text = chunk_text(chunk)
                if not text:
                    if not self._keeps(s, chunk):
                        yield chunk
                    continue
                if s is None:
                    s = self._open(woke.set, None)
                    if s.span is None or not s.span.is_recording():
                        yield chunk  # unsampled: the guard stays out of the way
                        yield from source
                        ok = True
                        return
                    deadline = time.monotonic() + s.settings.preflight_wait_s
                    while s.preflight_pending and not s.has_events and time.monotonic() < deadline:
                        woke.clear()
                        if s.preflight_pending and not s.has_events:
                            woke.wait(deadline - time.monotonic())
                    if s.has_events:
                        yield from self._apply(s.drain())
                    if s.stopped:
                        break
                out = self._accept(s, text, chunk)
                if out is not None:
                    yield out
            yield from self._tail()
            ok = True
        finally:
            if not ok or (self.session is not None and self.session.stopped):
                _close(source)
            self._end()


def _close(source: Iterator[Any]) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            _log.debug("streamjudge: closing the model stream failed", exc_info=True)


async def _aclose(source: AsyncIterator[Any]) -> None:
    close = getattr(source, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            _log.debug("streamjudge: closing the model stream failed", exc_info=True)
