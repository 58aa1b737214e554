"""How spans come to be: the instrumentor, LangGraph node spans, streamed bodies, the one-line setup.

- :class:`StreamJudgeInstrumentor`: the ``opentelemetry_instrumentor`` entry point. Instruments LangGraph
  (through LangChain callbacks, on top of openinference-instrumentation-langchain) and every FastAPI /
  Starlette application created afterwards.
- :func:`instrument_app`: the same for one existing app, from code; idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.dependencies import DependencyConflict, get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from wrapt import wrap_function_wrapper

from streamjudge import semconv
from streamjudge._version import __version__
from streamjudge.config import Settings
from streamjudge.instrumentation import _privacy
from streamjudge.instrumentation._asgi import FrameHook, StreamJudgeMiddleware, default_frame_hook
from streamjudge.instrumentation._setup import ensure_runtime
from streamjudge.instrumentation._sse import DEFAULT_TOKEN_EVENTS, SSEFrame, TokenExtractor
from streamjudge.instrumentation.package import _instruments, _instruments_any

__all__ = [
    "FrameHook",
    "SSEFrame",
    "StreamJudgeInstrumentor",
    "StreamJudgeMiddleware",
    "TokenExtractor",
    "default_frame_hook",
    "instrument_app",
    "uninstrument_app",
]

_log = logging.getLogger(__name__)


def _unwrap(obj: Any, attr: str) -> None:
    # read the class dict, not the attribute: a descriptor would hand back a fresh bound wrapper
    func = vars(obj).get(attr)
    if func is not None and hasattr(func, "__wrapped__"):
        setattr(obj, attr, func.__wrapped__)


class StreamJudgeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Zero-code instrumentation of LangGraph + FastAPI streaming apps.

    ``instrument(settings=None, tracer_provider=None, middleware_options=None)``: makes sure a runtime
    exists (joining the provider that is set up, or building one from ``OTEL_*``), then

    - LangGraph: node spans carry ``node`` and ``elapsed_ms`` (openinference's spans when its LangChain
      instrumentation is installed — it is switched on if needed — streamjudge's own otherwise); the
      question and contexts are registered per trace; answer-node tokens feed the answer stream;
    - FastAPI / Starlette: every application created from now on gets :class:`StreamJudgeMiddleware`.

    ``uninstrument()`` restores every patched function and removes the middleware again.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        # any one of the instrumented libraries is enough
        return get_dependency_conflicts(_instruments, _instruments_any)

    def instrument(self, **kwargs: Any) -> Any:
        """Instrument LangGraph and every FastAPI app created from now on (see the class docstring)."""
        if self.is_instrumented_by_opentelemetry and getattr(self, "_langgraph_only", False):
            # instrument_app() set LangGraph up for one app: the process-wide call adds the web part now
            # (the base class would see "instrumented" and silently do nothing)
            self._langgraph_only = False
            self._middleware_options: dict[str, Any] = dict(kwargs.get("middleware_options") or {})
            self._instrument_web()
            return None
        return super().instrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> None:
        self._langgraph_only = False
        settings: Settings | None = kwargs.get("settings")
        provider: SDKTracerProvider | None = kwargs.get("tracer_provider")
        rt = ensure_runtime(settings, provider)
        self._settings = settings or rt.settings
        self._middleware_options = dict(kwargs.get("middleware_options") or {})
        self._patched: list[tuple[Any, str]] = []
        self._restore: list[Callable[[], None]] = []
        self._enabled_openinference = False
        self._handler: Any = None
        self._apps: weakref.WeakSet[Any] = weakref.WeakSet()
        self._instrument_langgraph(rt)
        self._instrument_web()

    # --- LangGraph ------------------------------------------------------------------------------
    def _instrument_langgraph(self, rt: Any) -> None:
        try:
            import langchain_core.callbacks  # noqa: F401
        except ImportError:
            return
        from streamjudge.instrumentation import _langgraph

        oi_tracer_cls = None
        node_span_lookup = None
        try:
            from openinference.instrumentation.langchain import LangChainInstrumentor
            from openinference.instrumentation.langchain._tracer import OpenInferenceTracer

            oi = LangChainInstrumentor()
            if not oi.is_instrumented_by_opentelemetry:
                oi.instrument(tracer_provider=rt.tracer_provider,
                              **_privacy.openinference_kwargs(self._settings.capture_content))
                self._enabled_openinference = True
            elif not self._settings.capture_content:
                self._hide_in_running(oi, rt)
            if not self._settings.capture_content and "_instrument" in vars(LangChainInstrumentor):
                # whoever switches it on again while we run (the app, its entry point) hides text too
                wrap_function_wrapper(LangChainInstrumentor, "_instrument", _privacy.hide_on_instrument)
                self._patched.append((LangChainInstrumentor, "_instrument"))
            oi_tracer_cls = OpenInferenceTracer
            node_span_lookup = oi.get_span
        except ImportError:
            _log.debug("openinference-instrumentation-langchain not installed: streamjudge opens node spans")
        except Exception:  # openinference changed shape: fall back to our own spans
            _log.warning("streamjudge: openinference LangChain instrumentation unusable", exc_info=True)
            oi_tracer_cls = None
        if oi_tracer_cls is not None and hasattr(oi_tracer_cls, "_start_trace"):
            wrap_function_wrapper(oi_tracer_cls, "_start_trace", _langgraph.oi_start_trace_wrapper)
            wrap_function_wrapper(oi_tracer_cls, "_end_trace", _langgraph.oi_end_trace_wrapper)
            self._patched += [(oi_tracer_cls, "_start_trace"), (oi_tracer_cls, "_end_trace")]
            if self._settings.openinference_inline:
                _run_inline(oi_tracer_cls, self._restore)
            tracer = None
        else:
            tracer = rt.tracer_provider.get_tracer(semconv.TRACER_NAME, __version__)
            node_span_lookup = None
        self._handler = _langgraph.StreamJudgeCallbackHandler(
            answer_nodes=self._settings.answer_nodes,
            contexts=lambda: rt.contexts,
            tracer=tracer,
            node_span_lookup=node_span_lookup,
            root_tracer=rt.tracer_provider.get_tracer(semconv.TRACER_NAME, __version__),
            question_keys=self._settings.question_keys,
        )
        import langchain_core.callbacks as cb

        from streamjudge.instrumentation import _chains

        _chains.wrap_sequences(self._handler, self._patched)  # chains without LangGraph: their answer

        wrap_function_wrapper(cb.BaseCallbackManager, "__init__",
                              _langgraph.CallbackManagerInitWrapper(self._handler, oi_tracer_cls))
        self._patched.append((cb.BaseCallbackManager, "__init__"))
        pregel: Any = None
        try:
            from langgraph.pregel import Pregel

            pregel = Pregel
        except ImportError:  # LangChain without LangGraph
            pass
        if pregel is not None:
            root_tracer = rt.tracer_provider.get_tracer(semconv.TRACER_NAME, __version__)
            roots = _langgraph.GraphRootWrapper(root_tracer)
            for attr, wrapper in (("invoke", roots.sync), ("stream", roots.sync), ("ainvoke", roots.asyn),
                                  ("astream", roots.asyn)):
                if attr in vars(pregel):
                    wrap_function_wrapper(pregel, attr, wrapper)
                    self._patched.append((pregel, attr))
        # the model tap: the answer node's chat-model stream passes through the guard
        from langchain_core.language_models.chat_models import BaseChatModel

        from streamjudge.instrumentation._model import ModelPatcher

        self._models: ModelPatcher | None = ModelPatcher()
        for attr in ("astream", "_agenerate_with_cache", "stream", "_generate_with_cache"):
            if attr in vars(BaseChatModel):
                wrap_function_wrapper(BaseChatModel, attr, self._models.caller_wrapper)  # type: ignore[union-attr]
                self._patched.append((BaseChatModel, attr))

    def _hide_in_running(self, oi: Any, rt: Any) -> None:
        """openinference was switched on before us (its entry point ran first, or the app did it): its
        tracer gets the hiding settings; if this openinference keeps it elsewhere, it is switched on again
        with them, into our provider."""
        undo = _privacy.hide_in_running(oi)
        if undo is not None:
            self._restore.append(undo)
            return
        _log.warning("streamjudge: openinference's LangChain instrumentation was set up without hiding "
                     "content; setting it up again with STREAMJUDGE_CAPTURE_CONTENT=false")
        oi.uninstrument()
        oi.instrument(tracer_provider=rt.tracer_provider, **_privacy.openinference_kwargs(False))

    # --- FastAPI / Starlette ------------------------------------------------------------------------
    def _instrument_web(self) -> None:
        st = self._settings
        options = {"token_field": st.sse_token_field, "terminal_frames": st.terminal_frames,
                   "client_events": st.client_events, "routes_include": st.routes_include,
                   "routes_exclude": st.routes_exclude, **self._middleware_options}
        apps = self._apps

        def after_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
            wrapped(*args, **kwargs)
            try:
                if _add_middleware(instance, options):
                    apps.add(instance)
            except Exception:
                _log.exception("streamjudge: could not instrument %r", instance)

        targets = (("starlette.applications", "Starlette"), ("fastapi.applications", "FastAPI"))
        for module, cls_name in targets:
            try:
                mod = __import__(module, fromlist=[cls_name])
            except ImportError:
                continue
            cls = getattr(mod, cls_name)
            wrap_function_wrapper(cls, "__init__", after_init)
            self._patched.append((cls, "__init__"))

    def _uninstrument(self, **kwargs: Any) -> None:
        models = getattr(self, "_models", None)
        for obj, attr in reversed(self._patched + (models.patched if models is not None else [])):
            _unwrap(obj, attr)
        self._patched = []
        for undo in reversed(getattr(self, "_restore", ())):
            undo()
        self._restore = []
        self._models = None
        for app in list(self._apps):
            uninstrument_app(app)
        if self._enabled_openinference:
            from openinference.instrumentation.langchain import LangChainInstrumentor

            LangChainInstrumentor().uninstrument()
            self._enabled_openinference = False
        self._handler = None


def _run_inline(tracer_cls: type, restore: list[Callable[[], None]]) -> None:
    """Have LangChain call openinference's tracer in the caller's task instead of a thread pool.

    LangChain's async callback manager hands every callback of a synchronous handler to the loop's
    executor (one thread hop per callback, ~65 per request in the example app, a token being one) unless
    the handler says ``run_inline``. The tracer's callbacks are short (a dict update, a span start or end)
    and take the GIL like any other Python code, so the hop buys the loop nothing and costs about as much
    as the tracer itself: measured on the example app, 18 -> 9 ms of CPU per request. The spans are the
    same; they are now made in callback order on the caller's thread, as they already are for sync runs.
    """
    had = "run_inline" in vars(tracer_cls)
    before = vars(tracer_cls).get("run_inline")

    def undo() -> None:
        if had:
            tracer_cls.run_inline = before  # type: ignore[attr-defined]
        else:
            with contextlib.suppress(AttributeError):
                delattr(tracer_cls, "run_inline")

    tracer_cls.run_inline = True  # type: ignore[attr-defined]
    restore.append(undo)


def _add_middleware(app: Any, options: dict[str, Any]) -> bool:
    """Put the middleware first among the app's own (inside the request span); False if already there."""
    from starlette.middleware import Middleware

    if any(getattr(m, "cls", None) is StreamJudgeMiddleware for m in app.user_middleware):
        return False
    app.user_middleware.insert(0, Middleware(StreamJudgeMiddleware, **options))
    if app.middleware_stack is not None:  # already serving: rebuild so the next request sees it
        app.middleware_stack = app.build_middleware_stack()
    return True


def instrument_app(
    app: Any,
    *,
    settings: Settings | None = None,
    tracer_provider: SDKTracerProvider | None = None,
    token_field: str | None = None,
    token_events: frozenset[str | None] | None = DEFAULT_TOKEN_EVENTS,
    token_extractor: TokenExtractor | None = None,
    frame_hook: FrameHook | None = None,
    client_events: bool | None = None,
    instrument_requests: bool = True,
) -> Any:
    """Instrument one FastAPI/Starlette ``app`` (and LangGraph) from code; calling it again does nothing.

    Equivalent to running under ``opentelemetry-instrument``: a runtime is configured if none exists
    (joining an SDK provider already set up, else built from ``OTEL_*`` variables with the judge
    processor in its export path); LangGraph is instrumented; the app gets request spans
    (opentelemetry-instrumentation-fastapi, when installed and not already applied, without per-chunk
    send/receive spans) and :class:`StreamJudgeMiddleware`.

    ``token_field`` (default ``settings.sse_token_field``) is the dot path of the token in JSON SSE
    ``data`` for apps whose tokens do not come from an instrumented graph; ``token_events`` the SSE event
    names carrying tokens; ``token_extractor`` replaces both. ``client_events`` (default
    ``settings.client_events``, or True when a ``frame_hook`` is given) sends the guard's
    warning/retract/stop events to the client; ``frame_hook(event, kind)`` renders them in the app's own
    frame format (return None to send nothing). Returns ``app``.
    """
    rt = ensure_runtime(settings, tracer_provider)
    settings = settings or rt.settings
    instrumentor = StreamJudgeInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        # only LangGraph here: this app gets the middleware below, other apps stay untouched
        instrumentor._settings = settings
        instrumentor._middleware_options = {}
        instrumentor._patched = []
        instrumentor._restore = []
        instrumentor._enabled_openinference = False
        instrumentor._apps = weakref.WeakSet()
        instrumentor._instrument_langgraph(rt)
        instrumentor._is_instrumented_by_opentelemetry = True
        instrumentor._langgraph_only = True  # a later instrument() still instruments the web part
    if getattr(app, "_streamjudge_instrumented", False):
        return app
    if instrument_requests:
        try:
            from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

            if not getattr(app, "_is_instrumented_by_opentelemetry", False):
                FastAPIInstrumentor.instrument_app(app, tracer_provider=rt.tracer_provider,
                                                   exclude_spans=["send", "receive"])
        except ImportError:
            _log.debug("opentelemetry-instrumentation-fastapi missing: the middleware opens request spans")
    options: dict[str, Any] = {
        "token_field": token_field if token_field is not None else settings.sse_token_field,
        "token_events": token_events,
        "token_extractor": token_extractor,
        "frame_hook": frame_hook,
        "terminal_frames": settings.terminal_frames,
        "client_events": client_events if client_events is not None
        else (settings.client_events or frame_hook is not None),
        "routes_include": settings.routes_include,
        "routes_exclude": settings.routes_exclude,
    }
    _add_middleware(app, options)
    app._streamjudge_instrumented = True
    instrumentor._apps.add(app)
    return app


def uninstrument_app(app: Any) -> None:
    """Remove streamjudge's middleware from ``app`` (request spans, if we added them, stay)."""
    app.user_middleware[:] = [
        m for m in app.user_middleware if getattr(m, "cls", None) is not StreamJudgeMiddleware
    ]
    if app.middleware_stack is not None:
        app.middleware_stack = app.build_middleware_stack()
    if hasattr(app, "_streamjudge_instrumented"):
        app._streamjudge_instrumented = False
