"""Arize Phoenix: traces over OTLP, evaluation results as span annotations.

Phoenix receives OTLP/HTTP at ``{PHOENIX_COLLECTOR_ENDPOINT}/v1/traces`` and stores annotations posted to
``POST /v1/span_annotations`` (body ``{"data": [SpanAnnotationData, ...]}``: ``span_id``, ``name``,
``annotator_kind`` LLM/CODE/HUMAN, ``result`` {label, score, explanation}, ``metadata``, ``identifier``).
Annotations are sent asynchronously (``sync=false``): Phoenix queues them and attaches them once the span
has arrived, so a score may be posted before its span is exported. ``identifier`` makes a retried
annotation an upsert rather than a duplicate.

Opt-in like Langfuse: the factories return ``None`` unless ``PHOENIX_COLLECTOR_ENDPOINT`` is set, or build
for the loopback default (``http://127.0.0.1:6006``) when asked with ``require_env=False``.
``PHOENIX_API_KEY``, when set, is sent as a bearer token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from streamjudge.exporters._bridge import BridgeSink, HttpBridge, JsonRequest, Secret, result_name
from streamjudge.exporters._content import capture_content_from_env, scrub_explanation
from streamjudge.exporters._counting import counting
from streamjudge.exporters.base import EvaluationRecord, find_span_processors
from streamjudge.results import Score

DEFAULT_ENDPOINT = "http://127.0.0.1:6006"
OTLP_TRACES_PATH = "/v1/traces"
SPAN_ANNOTATIONS_PATH = "/v1/span_annotations"
ENV_ENDPOINT = "PHOENIX_COLLECTOR_ENDPOINT"
ENV_API_KEY = "PHOENIX_API_KEY"

#: judges that score with a language model; every other judge is deterministic code
LLM_JUDGES = frozenset({"llm", "ragas", "deepeval", "openai", "anthropic"})
ANNOTATION_IDENTIFIER_PREFIX = "streamjudge"
_MAX_ANNOTATIONS_PER_REQUEST = 100


def phoenix_endpoint(env: Mapping[str, str]) -> str:
    """Phoenix's base URL (``PHOENIX_COLLECTOR_ENDPOINT`` without a trailing ``/v1/traces``)."""
    raw = (env.get(ENV_ENDPOINT) or DEFAULT_ENDPOINT).strip().rstrip("/")
    return raw.removesuffix(OTLP_TRACES_PATH)


def _auth(env: Mapping[str, str]) -> dict[str, str]:
    key = (env.get(ENV_API_KEY) or "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


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

    exporter = OTLPSpanExporter(
        endpoint=phoenix_endpoint(env) + OTLP_TRACES_PATH, headers=_auth(env), timeout=timeout_s
    )
    return counting(exporter, "phoenix")


def phoenix_otel_processors(processor: object) -> list[SpanProcessor]:
    """The span processors of ``phoenix.otel`` (``register()``'s exporter) reachable from ``processor``."""
    return find_span_processors(processor, lambda cls: cls.__module__.startswith("phoenix.otel"))


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
        capture_content: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **bridge_options: Any,
    ) -> None:
        self._capture = capture_content
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._bridge = HttpBridge(
            name="phoenix-annotations",
            base_url=endpoint.rstrip("/").removesuffix(OTLP_TRACES_PATH),
            build=self._build,
            headers=Secret(headers),
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
    return PhoenixAnnotationSink(
        phoenix_endpoint(env), api_key=(env.get(ENV_API_KEY) or None), **options
    )
