"""The distro and configurator ``opentelemetry-instrument`` loads from streamjudge's entry points.

``opentelemetry-instrument python app.py`` runs, before the app: the distro's ``configure`` (defaults for
unset ``OTEL_*`` exporter variables), then the first ``opentelemetry_configurator`` entry point (ours:
the SDK built from ``OTEL_*`` with the judge processor in its export path), then every
``opentelemetry_instrumentor`` (ours among them). When another distro's configurator wins that race,
streamjudge's instrumentor still joins whatever provider it built (see ``_setup.ensure_runtime``).

OTLP goes where the OpenTelemetry SDK sends it: over gRPC to ``localhost:4317`` unless
``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_|LOGS_]PROTOCOL=http/protobuf`` (then ``http://localhost:4318``).
An endpoint on the other protocol's well-known port (4318 without a protocol set) is kept as given, as the
SDK keeps it, with one warning at start-up that says which variable to set: the OpenTelemetry Java SDK's
choice, since guessing the protocol from a port would be wrong for a collector listening elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

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
        for message in otlp_port_mismatches(os.environ):
            _log.warning("streamjudge: %s", message)

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


#: the IANA ports of OTLP's two transports, and the protocol the SDK picks for each exporter name
_OTLP_PORTS = {"grpc": 4317, "http/protobuf": 4318}
_PROTOCOL_OF_EXPORTER = {"otlp": "grpc", "otlp_proto_grpc": "grpc", "otlp_proto_http": "http/protobuf"}


def _port(endpoint: str) -> int | None:
    # "host:4318" without a scheme parses as scheme "host": read it as a network location
    parts = urlsplit(endpoint if "//" in endpoint else "//" + endpoint)
    try:
        return parts.port
    except ValueError:
        return None


def otlp_port_mismatches(env: Mapping[str, str]) -> list[str]:
    """One message per OTLP endpoint whose port is the other protocol's (4318 spoken to over gRPC, 4317
    over HTTP), naming the signals that would be lost and the variable that fixes it; [] when none."""
    found: dict[tuple[str, str], list[str]] = {}
    for signal in ("traces", "metrics", "logs"):
        up = signal.upper()
        names = [n.strip() for n in env.get(f"OTEL_{up}_EXPORTER", "").split(",")]
        otlp = next((n for n in names if n in _PROTOCOL_OF_EXPORTER), None)
        endpoint = env.get(f"OTEL_EXPORTER_OTLP_{up}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if otlp is None or not endpoint:
            continue
        # "otlp": the protocol variable decides, gRPC when unset (the SDK's default); otlp_proto_*: the name
        protocol = (env.get(f"OTEL_EXPORTER_OTLP_{up}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                    or "grpc").strip() if otlp == "otlp" else _PROTOCOL_OF_EXPORTER[otlp]
        if protocol in _OTLP_PORTS and _port(endpoint) == _OTLP_PORTS[_other(protocol)]:
            found.setdefault((endpoint, protocol), []).append(signal)
    return [
        f"OTLP {'/'.join(signals)} go to {endpoint} over {protocol}, but port "
        f"{_OTLP_PORTS[_other(protocol)]} is OTLP's {_other(protocol)} port: nothing will arrive. Set "
        f"OTEL_EXPORTER_OTLP_PROTOCOL="
        f"{_other(protocol)} (or point the endpoint at port {_OTLP_PORTS[protocol]})"
        for (endpoint, protocol), signals in found.items()
    ]


def _other(protocol: str) -> str:
    return "http/protobuf" if protocol == "grpc" else "grpc"
