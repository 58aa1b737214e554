"""The distro and configurator ``opentelemetry-instrument`` loads from streamjudge's entry points.

``opentelemetry-instrument python app.py`` runs, before the app: the distro's ``configure`` (defaults for
unset ``OTEL_*`` exporter variables), then the first ``opentelemetry_configurator`` entry point (ours:
the SDK built from ``OTEL_*`` with the judge processor in its export path), then every
``opentelemetry_instrumentor`` (ours among them). When another distro's configurator wins that race,
streamjudge's instrumentor still joins whatever provider it built (see ``_setup.ensure_runtime``).
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]
from opentelemetry.sdk._configuration import _OTelSDKConfigurator

from streamjudge._shutdown import install_signal_drain
from streamjudge.config import load_settings_or_default
from streamjudge.instrumentation._setup import apply_env_defaults, configure_from_env, sdk_provider
from streamjudge.runtime import configure, current_runtime

_log = logging.getLogger(__name__)

#: instrumentations whose per-chunk ``http send`` / ``receive`` spans would add one span per streamed
#: token to every trace (the ASGI server span already covers the whole body)
_ASGI_INSTRUMENTATIONS = frozenset({"fastapi", "starlette", "asgi"})


class StreamJudgeDistro(BaseDistro):  # type: ignore[misc]
    """Sets exporter defaults like the OpenTelemetry distro and tunes the ASGI instrumentations."""

    def _configure(self, **kwargs: Any) -> None:
        apply_env_defaults()

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        """Instrument one library; ASGI frameworks get ``exclude_spans=["send", "receive"]``."""
        if entry_point.name in _ASGI_INSTRUMENTATIONS:
            kwargs.setdefault("exclude_spans", ["send", "receive"])
        instrumentor = entry_point.load()()
        if getattr(instrumentor, "is_instrumented_by_opentelemetry", False):
            # instrumentors are singletons: one that streamjudge set up already (OpenInference's
            # LangChain instrumentor, with our settings) would only log "Attempting to instrument while
            # already instrumented" at every app start
            return
        instrumentor.instrument(**kwargs)


class StreamJudgeConfigurator(_OTelSDKConfigurator):
    """The OpenTelemetry SDK set up from ``OTEL_*`` variables, with the judge processor in its export path.

    Honours everything the SDK's own configurator does (``OTEL_TRACES_EXPORTER``,
    ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` / ``PROTOCOL`` / ``HEADERS``, ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER[_ARG]``...) plus streamjudge's ``STREAMJUDGE_*``
    and ``EVAL_*`` settings. If a tracer provider already exists it is joined, not replaced.
    """

    def _configure(self, **kwargs: Any) -> None:
        if current_runtime() is not None:
            return
        # a bad STREAMJUDGE_* variable logs one line and keeps its default: the app must start regardless
        settings = load_settings_or_default(_log)
        existing = sdk_provider()
        if existing is not None:
            configure(settings, tracer_provider=existing)
            install_signal_drain()  # before the app starts its server, which installs handlers of its own
            return
        configure_from_env(settings, **kwargs)
