"""Arize Phoenix: traces over OTLP, evaluation results as span annotations.

Phoenix receives OTLP/HTTP at ``{PHOENIX_COLLECTOR_ENDPOINT}/v1/traces`` and stores annotations posted to
``POST /v1/span_annotations`` (body ``{"data": [SpanAnnotationData, ...]}``: ``span_id``, ``name``,
``annotator_kind`` LLM/CODE/HUMAN, ``result`` {label, score, explanation}, ``metadata``, ``identifier``).
Annotations are sent asynchronously (``sync=false``): Phoenix queues them and attaches them once the span
has arrived, so a score may be posted before its span is exported. ``identifier`` makes a retried
annotation an upsert rather than a duplicate.

Opt-in like Langfuse: the factories return ``None`` unless ``PHOENIX_COLLECTOR_ENDPOINT`` is set, or build
for the loopback default (``http://127.0.0.1:6006``) when asked with ``require_env=False``.

The variables ``phoenix.otel`` reads are honoured the same way:

- ``PHOENIX_CLIENT_HEADERS``: headers for the span exporter and the annotation bridge, in the W3C-baggage
  form of ``OTEL_EXPORTER_OTLP_HEADERS`` (``k=v,k2=v2``, values URL-encoded; names lower-cased);
- ``PHOENIX_API_KEY``: ``authorization: Bearer <key>``, which wins over an ``authorization`` of the
  client headers (as in ``phoenix.otel``);
- ``PHOENIX_PROJECT_NAME`` (or ``PHOENIX_PROJECT``, which wins): the project, as the resource attribute
  ``openinference.project.name`` on the spans streamjudge exports to Phoenix (only there: the app's other
  exporters see its resource unchanged). Unset: the resource is left alone (Phoenix files the spans under
  a project the resource names, else ``default``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from streamjudge._redact import register_secret
from streamjudge._vendors import PHOENIX_ENDPOINT, is_phoenix_otel_processor
from streamjudge.exporters._bridge import BridgeSink, HttpBridge, JsonRequest, Secret, result_name
from streamjudge.exporters._content import capture_content_from_env, scrub_explanation
from streamjudge.exporters._counting import counting
from streamjudge.exporters.base import EvaluationRecord, find_span_processors
from streamjudge.results import Score

DEFAULT_ENDPOINT = "http://127.0.0.1:6006"
OTLP_TRACES_PATH = "/v1/traces"
SPAN_ANNOTATIONS_PATH = "/v1/span_annotations"
ENV_ENDPOINT = PHOENIX_ENDPOINT
ENV_API_KEY = "PHOENIX_API_KEY"
ENV_CLIENT_HEADERS = "PHOENIX_CLIENT_HEADERS"
ENV_PROJECT_NAME = "PHOENIX_PROJECT_NAME"
ENV_PROJECT = "PHOENIX_PROJECT"  # newer phoenix.otel's canonical name; PHOENIX_PROJECT_NAME is its alias
#: the resource attribute Phoenix files spans by (OpenInference's ``ResourceAttributes.PROJECT_NAME``)
PROJECT_NAME_ATTRIBUTE = "openinference.project.name"

#: judges that score with a language model; every other judge is deterministic code
LLM_JUDGES = frozenset({"llm", "ragas", "deepeval", "openai", "anthropic"})
ANNOTATION_IDENTIFIER_PREFIX = "streamjudge"
_MAX_ANNOTATIONS_PER_REQUEST = 100


def phoenix_endpoint(env: Mapping[str, str]) -> str:
    """Phoenix's base URL (``PHOENIX_COLLECTOR_ENDPOINT`` without a trailing ``/v1/traces``)."""
    raw = (env.get(ENV_ENDPOINT) or DEFAULT_ENDPOINT).strip().rstrip("/")
    return raw.removesuffix(OTLP_TRACES_PATH)


def phoenix_headers(env: Mapping[str, str]) -> dict[str, str]:
    """``PHOENIX_CLIENT_HEADERS`` parsed as ``phoenix.otel`` parses it, plus ``PHOENIX_API_KEY`` (bearer)."""
    headers = dict(parse_env_headers(env.get(ENV_CLIENT_HEADERS) or "", liberal=True))
    for value in headers.values():
        register_secret(value)  # header values are credentials more often than not: never in error texts
    key = (env.get(ENV_API_KEY) or "").strip()
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers


def phoenix_project(env: Mapping[str, str]) -> str | None:
    """The project named by ``PHOENIX_PROJECT`` or ``PHOENIX_PROJECT_NAME`` (None when neither is set)."""
    for var in (ENV_PROJECT, ENV_PROJECT_NAME):
        value = (env.get(var) or "").strip()
        if value:
            return value
    return None


class ProjectSpanExporter(SpanExporter):
    """Exports spans with ``openinference.project.name`` merged into their resource.

    The resource belongs to the tracer provider, shared by every exporter; the project is Phoenix's
    concern, so it is added on the way to Phoenix only (one resource per source resource, cached).
    """

    def __init__(self, exporter: SpanExporter, project: str) -> None:
        self.exporter = exporter
        self.project = project
        self._resources: dict[int, tuple[Resource, Resource]] = {}

    def _resource(self, resource: Resource) -> Resource:
        hit = self._resources.get(id(resource))
        if hit is not None and hit[0] is resource:
            return hit[1]
        merged = resource.merge(Resource({PROJECT_NAME_ATTRIBUTE: self.project}))
        if len(self._resources) > 64:  # providers are few; never grow without bound
            self._resources.clear()
        self._resources[id(resource)] = (resource, merged)
        return merged

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([
            ReadableSpan(
                name=s.name, context=s.context, parent=s.parent, resource=self._resource(s.resource),
                attributes=s.attributes, events=s.events, links=s.links, kind=s.kind, status=s.status,
                start_time=s.start_time, end_time=s.end_time, instrumentation_scope=s.instrumentation_scope,
            )
            for s in spans
        ])

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def phoenix_exporter_from_env(
    env: Mapping[str, str] | None = None, *, require_env: bool = True, timeout_s: float | None = None
) -> SpanExporter | None:
    """An OTLP/HTTP span exporter to Phoenix, or ``None`` when ``PHOENIX_COLLECTOR_ENDPOINT`` is unset
    (and ``require_env``). Failed exports are counted in
    ``streamjudge.export.failures{exporter="phoenix"}``."""
    env = os.environ if env is None else env
    if require_env and not env.get(ENV_ENDPOINT):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter: SpanExporter = OTLPSpanExporter(
        endpoint=phoenix_endpoint(env) + OTLP_TRACES_PATH, headers=phoenix_headers(env), timeout=timeout_s
    )
    project = phoenix_project(env)
    if project is not None:
        exporter = ProjectSpanExporter(exporter, project)
    return counting(exporter, "phoenix")


def phoenix_otel_processors(processor: object) -> list[SpanProcessor]:
    """The span processors of ``phoenix.otel`` (``register()``'s exporter) reachable from ``processor``."""
    return find_span_processors(processor, is_phoenix_otel_processor)


def annotator_kind(judge: str) -> str:
    """``LLM`` for judges that call a language model, ``CODE`` for deterministic ones (``local``)."""
    base = judge.split(":", 1)[0].split("/", 1)[0].lower()
    return "LLM" if base in LLM_JUDGES else "CODE"


def annotation(record: EvaluationRecord, score: Score, *, capture_content: bool = True) -> dict[str, Any]:
    """One ``SpanAnnotationData`` for ``score`` of ``record``.

    A skipped metric becomes an annotation with label ``skipped`` and the reason as explanation, so the
    span shows why it has no score. Without content capture the explanation carries no quoted text.
    """
    if score.value is None:
        why = score.skipped or scrub_explanation(score.explanation, capture_content)
        result: dict[str, Any] = {"label": "skipped", "explanation": why}
    else:
        result = {"score": float(score.value)}
        if score.label is not None:
            result["label"] = score.label
        explanation = scrub_explanation(score.explanation, capture_content)
        if explanation:
            result["explanation"] = explanation
    metadata: dict[str, Any] = {
        "judge": record.judge,
        "trace_id": record.trace_id_hex,
        "span_name": record.span_name,
        "span_type": record.span_type,
    }
    metadata.update(record.attributes)
    return {
        "span_id": record.span_id_hex,
        "name": result_name(record, score),
        "annotator_kind": annotator_kind(record.judge),
        "result": result,
        "metadata": metadata,
        "identifier": f"{ANNOTATION_IDENTIFIER_PREFIX}.{record.judge}",
    }


class PhoenixAnnotationSink(BridgeSink):
    """Posts evaluation results to Phoenix as span annotations, batched, in the background.

    See :class:`~streamjudge.exporters._bridge.HttpBridge` for queueing, retry and shutdown semantics.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        capture_content: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **bridge_options: Any,
    ) -> None:
        self._capture = capture_content
        sent = {k.lower(): v for k, v in (headers or {}).items()}
        if api_key:
            sent["authorization"] = f"Bearer {api_key}"
        self._bridge = HttpBridge(
            name="phoenix-annotations",
            base_url=endpoint.rstrip("/").removesuffix(OTLP_TRACES_PATH),
            build=self._build,
            headers=Secret(sent),
            transport=transport,
            **bridge_options,
        )

    def _build(self, records: Sequence[EvaluationRecord]) -> list[JsonRequest]:
        data = [annotation(r, s, capture_content=self._capture) for r in records for s in r.scores]
        return [
            JsonRequest(
                SPAN_ANNOTATIONS_PATH,
                {"data": data[i : i + _MAX_ANNOTATIONS_PER_REQUEST]},
                len(data[i : i + _MAX_ANNOTATIONS_PER_REQUEST]),
                {"sync": "false"},
            )
            for i in range(0, len(data), _MAX_ANNOTATIONS_PER_REQUEST)
        ]


def phoenix_annotation_sink_from_env(
    env: Mapping[str, str] | None = None, *, require_env: bool = True, **options: Any
) -> PhoenixAnnotationSink | None:
    """A :class:`PhoenixAnnotationSink` for ``PHOENIX_COLLECTOR_ENDPOINT``, or ``None`` when it is unset
    (and ``require_env``)."""
    env = os.environ if env is None else env
    if require_env and not env.get(ENV_ENDPOINT):
        return None
    options.setdefault("capture_content", capture_content_from_env(env))
    options.setdefault("headers", phoenix_headers(env))
    return PhoenixAnnotationSink(
        phoenix_endpoint(env), api_key=(env.get(ENV_API_KEY) or "").strip() or None, **options
    )
