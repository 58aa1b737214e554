"""Vendor backends (Langfuse, Phoenix) behind one small interface, used by ``configure()``.

Each backend says which span exporters and evaluation sinks its environment variables ask for (none that
would duplicate what the application's own vendor SDK already sends), and how to join that SDK when it is
found in the provider — at configure time, or later when the SDK adds its processor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from streamjudge.exporters.base import EvaluationSink, find_span_processors

_log = logging.getLogger(__name__)

# What tells a backend is wanted, checked before its module is imported: that module brings an HTTP client
# (httpx, which loads rich and pygments for its command line when they are installed): 65-80 ms and ~10k
# objects at configure() (measured) for an app that sends nothing to that vendor
LANGFUSE_KEYS = ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY")
PHOENIX_ENDPOINT = "PHOENIX_COLLECTOR_ENDPOINT"


def is_langfuse_sdk_processor(cls: type) -> bool:
    """The Langfuse SDK's span processor class (found by name: the SDK need not be importable)."""
    return cls.__name__ == "LangfuseSpanProcessor" and cls.__module__.startswith("langfuse.")


def is_phoenix_otel_processor(cls: type) -> bool:
    """A span processor class of ``phoenix.otel`` (``register()``'s)."""
    return cls.__module__.startswith("phoenix.otel")


def _langfuse_env() -> bool:
    return all((os.environ.get(k) or "").strip() for k in LANGFUSE_KEYS)


def _phoenix_env() -> bool:
    return bool(os.environ.get(PHOENIX_ENDPOINT))


def _any_found(processors: Sequence[SpanProcessor], match: Callable[[type], bool]) -> bool:
    return any(find_span_processors(p, match) for p in processors)


class VendorBackend(Protocol):
    """One backend streamjudge can send spans and scores to."""

    name: str

    def exporters(self, processors: Sequence[SpanProcessor]) -> list[SpanExporter]:
        """Span exporters its environment asks for, unless one of ``processors`` already sends there."""
        ...

    def sinks(self) -> list[EvaluationSink]:
        """Evaluation sinks its environment asks for."""
        ...

    def join(self, processor: SpanProcessor, sinks: Sequence[EvaluationSink]) -> EvaluationSink | None:
        """Join the application's own SDK processor ``processor`` if it is this vendor's: make it export
        streamjudge's spans and stop our exporter duplicating it; return a sink to add (scores through the
        SDK client) or None. Must be cheap for a processor of another kind."""
        ...


class LangfuseBackend:
    """Langfuse: OTLP spans to ``/api/public/otel``; scores through its API or the app's SDK client."""

    name = "langfuse"

    def __init__(self) -> None:
        self._exporter: SpanExporter | None = None
        self.joined = False

    def exporters(self, processors: Sequence[SpanProcessor]) -> list[SpanExporter]:
        if not _langfuse_env() or _any_found(processors, is_langfuse_sdk_processor):
            return []
        from streamjudge.exporters.langfuse import langfuse_exporter_from_env

        self._exporter = langfuse_exporter_from_env()
        return [self._exporter] if self._exporter is not None else []

    def sinks(self) -> list[EvaluationSink]:
        if not _langfuse_env():
            return []
        from streamjudge.exporters.langfuse import langfuse_score_sink_from_env

        sink = langfuse_score_sink_from_env()
        return [sink] if sink is not None else []

    def join(self, processor: SpanProcessor, sinks: Sequence[EvaluationSink]) -> EvaluationSink | None:
        if not find_span_processors(processor, is_langfuse_sdk_processor):
            return None
        from streamjudge.exporters.langfuse import (
            LangfuseClientScoreSink,
            LangfuseScoreSink,
            LangfuseSpanExporter,
            adopt_langfuse_sdk,
            langfuse_sdk_processors,
        )

        found = langfuse_sdk_processors(processor)
        if not found:
            return None
        adopt_langfuse_sdk(_Holder(found))
        if self.joined:
            return None
        self.joined = True
        if isinstance(self._exporter, LangfuseSpanExporter):
            self._exporter.defer_to_sdk()
        _log.info("streamjudge: joined the Langfuse SDK's span processor")
        if any(isinstance(s, LangfuseScoreSink | LangfuseClientScoreSink) for s in sinks):
            return None
        return LangfuseClientScoreSink.for_processor(found[0])


class PhoenixBackend:
    """Phoenix: OTLP spans to its collector endpoint, scores as span annotations."""

    name = "phoenix"

    def exporters(self, processors: Sequence[SpanProcessor]) -> list[SpanExporter]:
        if not _phoenix_env() or _any_found(processors, is_phoenix_otel_processor):
            return []
        from streamjudge.exporters.phoenix import phoenix_exporter_from_env

        exporter = phoenix_exporter_from_env()
        return [exporter] if exporter is not None else []

    def sinks(self) -> list[EvaluationSink]:
        if not _phoenix_env():
            return []
        from streamjudge.exporters.phoenix import phoenix_annotation_sink_from_env

        sink = phoenix_annotation_sink_from_env()
        return [sink] if sink is not None else []

    def join(self, processor: SpanProcessor, sinks: Sequence[EvaluationSink]) -> EvaluationSink | None:
        return None  # phoenix.otel's exporter is left as the application set it up


class _Holder:
    """Looks like a provider whose active processor holds ``processors`` (what adopt_langfuse_sdk reads)."""

    def __init__(self, processors: list[SpanProcessor]) -> None:
        self._active_span_processor = _Composite(processors)


class _Composite:
    def __init__(self, processors: list[SpanProcessor]) -> None:
        self._span_processors = tuple(processors)


def default_backends() -> list[VendorBackend]:
    """The vendor backends streamjudge knows."""
    return [LangfuseBackend(), PhoenixBackend()]
