"""Content capture off means no question, document or answer text on any span we switch on or sit beside.

Two places carry such text besides streamjudge's own spans:

- openinference's LangChain spans (``input.value``, ``output.value``, ``llm.*_messages``,
  ``retrieval.documents``). Its instrumentor is a process-wide singleton that may have been switched on
  before streamjudge (its own ``opentelemetry_instrumentor`` entry point, which ``opentelemetry-instrument``
  may load first, or the app's code): its hiding settings are applied to the tracer it already runs, and to
  any later instrumentation of it while streamjudge is active.
- the server span's URL: a GET request's query string is often the question itself.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, MutableMapping
from typing import Any

from opentelemetry import trace

from streamjudge._redact import MASK

_log = logging.getLogger(__name__)

#: openinference's switches that keep text off its spans (those this openinference has are used)
_OI_HIDE = (
    "hide_inputs", "hide_outputs", "hide_input_messages", "hide_output_messages", "hide_input_text",
    "hide_output_text", "hide_input_images", "hide_prompts", "hide_choices", "hide_retrieval_documents",
    "hide_embeddings_text", "hide_llm_invocation_parameters",
)


def hiding_config(config: Any = None) -> Any:
    """``config`` (an openinference ``TraceConfig``; None: the default one) with every text switch on, or
    None when this openinference has no ``TraceConfig``."""
    try:
        from openinference.instrumentation import TraceConfig
    except ImportError:
        return None
    base = config if isinstance(config, TraceConfig) else TraceConfig()
    names = {f.name for f in dataclasses.fields(TraceConfig)}
    switches: dict[str, Any] = {n: True for n in _OI_HIDE if n in names}
    return dataclasses.replace(base, **switches)


def openinference_kwargs(capture_content: bool) -> dict[str, Any]:
    """The ``instrument()`` arguments of openinference's LangChain instrumentor under the policy."""
    if capture_content:
        return {}
    config = hiding_config()
    if config is None:  # an openinference too old to hide content: say so rather than leak quietly
        _log.warning("streamjudge: STREAMJUDGE_CAPTURE_CONTENT=false, but this openinference cannot hide "
                     "LangChain inputs and outputs")
        return {}
    return {"config": config}


def hide_in_running(instrumentor: Any) -> Callable[[], None] | None:
    """Apply the hiding settings to the tracer of an openinference LangChain instrumentor someone else
    switched on. Returns the undo, or None when its tracer is not where this openinference keeps it."""
    # the instrumentor's OpenInferenceTracer holds the OITracer whose config masks every attribute
    oi_tracer = getattr(getattr(instrumentor, "_tracer", None), "_tracer", None)
    before = getattr(oi_tracer, "_self_config", None)
    hidden = hiding_config(before) if before is not None else None
    if hidden is None or type(hidden) is not type(before):
        return None
    oi_tracer._self_config = hidden  # type: ignore[union-attr]

    def undo() -> None:
        if getattr(oi_tracer, "_self_config", None) is hidden:
            oi_tracer._self_config = before  # type: ignore[union-attr]

    return undo


def hide_on_instrument(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``LangChainInstrumentor._instrument`` while streamjudge runs with capture off: whoever switches
    openinference on (again) gets the hiding settings on top of the configuration he passed."""
    hidden = hiding_config(kwargs.get("config"))
    if hidden is not None:
        kwargs = {**kwargs, "config": hidden}
    return wrapped(*args, **kwargs)


_QUERY_VALUE = re.compile(r"=[^&]*")
#: server span attributes holding the query string (old and new HTTP semantic conventions)
_URL_KEYS = ("http.url", "url.full", "http.target")


def hide_query(scope: MutableMapping[str, Any]) -> None:
    """With capture off, the values of the request's query string are masked on the current (server) span:
    ``GET /ask?q=<the question>`` keeps its parameter names, not their values. Never raises."""
    from streamjudge.runtime import current_runtime

    rt = current_runtime()
    if rt is None or rt.settings.capture_content:
        return
    try:
        _mask_query(scope)
    except Exception:  # on the request's path: a failure here must not reach the app
        _log.warning("streamjudge: could not mask the query string on the request span", exc_info=True)


def _mask_query(scope: MutableMapping[str, Any]) -> None:
    span = trace.get_current_span()
    if not span.is_recording():
        return
    raw = scope.get("query_string") or b""
    query = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    masked = _QUERY_VALUE.sub("=" + MASK, query)
    attributes = getattr(span, "attributes", None) or {}
    for key in _URL_KEYS:
        value = attributes.get(key)
        if isinstance(value, str) and "?" in value:
            span.set_attribute(key, value.partition("?")[0] + "?" + masked)
    if "url.query" in attributes:
        span.set_attribute("url.query", masked)
