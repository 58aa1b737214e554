"""Making sure a runtime exists and sits where it should in the export path.

Shared by the distro/configurator (``opentelemetry-instrument``), the instrumentor and
``instrument_app``: all three end in the same state, whichever runs first.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider

from streamjudge._shutdown import install_signal_drain
from streamjudge.config import Settings, load_settings_or_default
from streamjudge.runtime import Runtime, configure, current_runtime

_log = logging.getLogger(__name__)

#: defaults the distro applies when the variable is unset (the same as the OpenTelemetry distro's, so
#: ``opentelemetry-instrument`` behaves as users expect: traces, metrics and logs over OTLP)
ENV_DEFAULTS: dict[str, str] = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "otlp",
}


def apply_env_defaults(env: Any = None) -> None:
    """Set :data:`ENV_DEFAULTS` for variables the user left unset."""
    env = os.environ if env is None else env
    for key, value in ENV_DEFAULTS.items():
        env.setdefault(key, value)


def sdk_provider() -> SDKTracerProvider | None:
    """The global tracer provider when it is an SDK one (someone already set tracing up)."""
    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, SDKTracerProvider) else None


def configure_from_env(settings: Settings | None = None, **sdk_kwargs: Any) -> Runtime:
    """Build the SDK from ``OTEL_*`` variables, then put the judge processor in its export path.

    The OpenTelemetry SDK's own initialisation reads the exporter, endpoint, protocol, headers, service
    name/resource, sampler and id generator; streamjudge then takes over the exporters it configured, so
    judged spans reach them once, enriched with their scores.
    """
    from opentelemetry.sdk._configuration import _initialize_components

    apply_env_defaults()
    _initialize_components(**sdk_kwargs)
    provider = sdk_provider()
    if provider is None:  # the global provider was set (by someone else) before us and is not the SDK's
        _log.warning("streamjudge: the global tracer provider is not the SDK's; judging in a private one")
        return configure(settings, set_global=False)
    rt = configure(settings, tracer_provider=provider)
    rt.take_over_export(provider)
    install_signal_drain()
    return rt


def ensure_runtime(
    settings: Settings | None = None, tracer_provider: SDKTracerProvider | None = None
) -> Runtime:
    """The runtime, configured now if needed.

    - already configured (the distro ran, or the app called ``configure``): used as it is;
    - an SDK provider exists (the app's or the Langfuse SDK's): the judge processor joins it beside its
      processors, which keep exporting as before; results leave as EVALUATOR spans and log events;
    - nothing is set up: the SDK is built from ``OTEL_*`` variables with streamjudge in its export path.
    """
    rt = current_runtime()
    if rt is None:
        settings = settings or load_settings_or_default(_log)
        provider = tracer_provider or sdk_provider()
        rt = configure(settings, tracer_provider=provider) if provider else configure_from_env(settings)
    # SIGTERM must not lose the spans waiting for their judgement (uvicorn re-raises it after its own
    # shutdown, and the SDK's atexit flush never runs); a no-op off the main thread or when installed
    install_signal_drain()
    return rt
