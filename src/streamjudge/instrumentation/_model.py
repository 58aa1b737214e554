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
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from wrapt import wrap_function_wrapper

from streamjudge.instrumentation._binding import StreamBinding

if TYPE_CHECKING:
    from streamjudge.judging._drivers import AsyncWaker
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
        for owner in cls.__mro__:
            if "_astream" in vars(owner):
                if not hasattr(vars(owner)["_astream"], "__wrapped__"):
                    wrap_function_wrapper(owner, "_astream", astream_wrapper)
                    self.patched.append((owner, "_astream"))
                return

    def caller_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        """Around ``astream`` / ``_agenerate_with_cache``: make sure the model's class is tapped.

        An answer call that would not stream (``ainvoke`` without a streaming handler) is asked to when
        the guard has to act on it (hold-back, stop, regenerate): the node still receives one message,
        the aggregate of what the guard released.
        """
        try:
            self.ensure(type(instance))
            if (
                wrapped.__name__ == "_agenerate_with_cache"
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


def astream_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    binding = _armed.get()
    if binding is None:
        return wrapped(*args, **kwargs)
    _armed.set(None)  # one model call takes it (a super()._astream inside is not tapped twice)
    if binding.closed or binding.driver is not None or binding.source not in (None, "graph"):
        return wrapped(*args, **kwargs)
    return _Tap(binding, wrapped, args, kwargs).run()


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


class _Tap:
    """Drives one answer stream's guard session over one chat-model stream."""

    def __init__(self, binding: StreamBinding, wrapped: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.binding = binding
        self.wrapped = wrapped
        self.args = args
        self.kwargs = kwargs
        self.session: GuardSession | None = None
        self.accepted: list[str] = []  # the answer text since the last regeneration's prefix
        self.released = 0  # chars of it the node received
        self.like: Any = None  # a chunk of this model, for re-chunked text
        # a verdict wakes the loop only while the tap sleeps on one (see AsyncWaker): while tokens flow the
        # tap reads the inbox after every chunk anyway, and each cross-thread wake-up costs a syscall, a loop
        # iteration and a GIL hand-off
        self._waker: AsyncWaker | None = None
        self._deferring = False  # the tap set the session's deferral (and removes it when it ends)

    def _regenerate(self, req: RegenerateRequest) -> AsyncIterator[Any]:
        args, kwargs = self.args, dict(self.kwargs)
        if args:
            messages = args[0]
            args = (reprompt(messages, req), *args[1:])
        else:
            kwargs["messages"] = reprompt(kwargs["messages"], req)
        return self.wrapped(*args, **kwargs)  # type: ignore[no-any-return]

    async def run(self) -> AsyncIterator[Any]:
        binding = self.binding
        binding.driver = self
        binding.source = "graph"
        binding.regenerate = self._regenerate
        from streamjudge.judging._drivers import AsyncWaker, SourceStep, wait_step

        source: AsyncIterator[Any] = aiter(self.wrapped(*self.args, **self.kwargs))
        loop = asyncio.get_running_loop()
        waker = self._waker = AsyncWaker(loop)

        meta: list[Any] = []  # text-less chunks that arrived while text was held
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
                        source = self._begin_regeneration(s)
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
                    switched = False
                    deadline = loop.time() + s.settings.end_wait_s
                    while not s.stopped:
                        if s.has_events:
                            for out in self._apply(s.drain()):
                                yield out
                            if s.regen_request is not None:
                                source = self._begin_regeneration(s)
                                switched = True
                                break
                            continue
                        remaining = deadline - loop.time()
                        if not s.outstanding or remaining <= 0:
                            break
                        if not s.has_events:
                            await waker.wait(None, remaining)
                    if switched:
                        continue
                    break
                text = chunk_text(chunk)
                if not text:
                    if s is not None and s.hold_back and self._held():
                        meta.append(chunk)
                    else:
                        yield chunk
                    continue
                if self.like is None:
                    self.like = chunk
                if s is None:
                    s = self._open(waker.notify)
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
                if s.accept(text) is None:
                    continue
                self.accepted.append(text)
                if not s.hold_back:
                    self.released += len(text)
                    yield chunk
            s = self.session
            if s is not None and s.hold_back and not s.stopped:
                rest = "".join(self.accepted)[self.released:]
                if rest:  # not judged in time: released fail-open (the span says why)
                    self.released += len(rest)
                    yield _text_chunk(rest, self.like)
            for c in meta:
                yield c
            ok = True
        finally:
            if step is not None:
                step.abandon()
            if not ok or (self.session is not None and self.session.stopped):
                await _aclose(source)
            if self.session is not None:
                self.session.set_notify(None)
                if self._deferring:
                    # the spans of windows still waiting for the loop go out now: whatever feeds the
                    # session after this tap (another model call, the graph's callbacks) sends inline
                    self.session.set_deferral(None)
                    self._deferring = False
            binding.driver = None
            binding.regenerate = None

    # --- helpers -------------------------------------------------------------------------------------
    def _open(self, notify: Callable[[], None]) -> GuardSession:
        s = self.binding.ensure_session()
        self.session = s
        s.set_notify(notify)
        if not s.defers:
            # checkpoint spans and judge requests are made when the loop next runs, not between two chunks
            # of the model's stream; the windows a chunk burst closes go out as one checkpoint (the tap
            # runs on the loop, and while it drives nothing else feeds the session)
            s.set_deferral(asyncio.get_running_loop().call_soon)
            self._deferring = True
        return s

    def _held(self) -> bool:
        return self.released < sum(map(len, self.accepted))

    def _waits(self, s: GuardSession) -> bool:
        # hold-back must see its last window judged; stop / regenerate can only act while the model's
        # stream is open; a graph run without a server has nobody else to wait for its verdicts
        return s.hold_back or s.settings.action != "flag" or self.binding.owner == "graph"

    async def _wait_preflight(self, s: GuardSession) -> None:
        waker = self._waker
        assert waker is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.settings.preflight_wait_s
        while s.preflight_pending and not s.has_events and loop.time() < deadline:
            await waker.wait(None, deadline - loop.time())

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
        if client:
            self.binding.post(client)
        return out

    def _begin_regeneration(self, s: GuardSession) -> AsyncIterator[Any]:
        req = s.begin_regeneration()
        self.accepted = [req.accepted_prefix] if req.accepted_prefix else []
        if s.hold_back:
            self.released = len(req.accepted_prefix)  # the rejected window was never released
        else:
            self.released = sum(map(len, self.accepted))
        return aiter(s.open_regeneration(req))  # type: ignore[arg-type]



async def _aclose(source: AsyncIterator[Any]) -> None:
    close = getattr(source, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            _log.debug("streamjudge: closing the model stream failed", exc_info=True)
