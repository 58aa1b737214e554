"""Langfuse: traces over its OTLP endpoint, scores through its public scores API.

Langfuse ingests OpenTelemetry spans at ``{host}/api/public/otel/v1/traces`` (Basic auth: public key as
user, secret key as password) and reads its own ``langfuse.*`` attributes from them. It does not read
evaluation results from OTel, so :class:`LangfuseScoreSink` posts every score to ``POST /api/public/scores``
as well, addressed to the judged span (``traceId`` + ``observationId``).

Both are opt-in: the ``*_from_env`` factories return ``None`` unless ``LANGFUSE_PUBLIC_KEY`` and
``LANGFUSE_SECRET_KEY`` are set. ``LANGFUSE_HOST`` (or ``LANGFUSE_BASE_URL``) selects the server, default
Langfuse Cloud.

:class:`LangfuseSpanExporter` rewrites attributes for the Langfuse exporter only; every other backend sees
streamjudge's spans unchanged:

==========================  ===========================================================================
our span                    Langfuse
==========================  ===========================================================================
stream span                 observation type ``generation``; input = question, output = answer (when
                            content capture is on); completion start time = start + time to first token;
                            usage ``output`` = streamed tokens (unless ``gen_ai.usage.*`` is present);
                            level ``WARNING`` when the stream raised alerts or failed
checkpoint span             observation type ``span``; output = the running text; ``WARNING`` if it failed
evaluator span              observation type ``evaluator``
``session.id`` / LangGraph  ``langfuse.session.id`` on every span of the trace (the thread/conversation id,
``thread_id`` metadata      also taken from openinference's ``metadata`` JSON)
root span                   ``langfuse.trace.name`` when a ``trace_name`` is configured (otherwise
                            Langfuse names the trace after the root span, e.g. ``POST /chat``)
==========================  ===========================================================================
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv
from streamjudge._spans import copy_span
from streamjudge.exporters._bridge import BridgeSink, HttpBridge, JsonRequest, Secret, result_name
from streamjudge.exporters.base import EvaluationRecord
from streamjudge.judging.base import Score

_logger = logging.getLogger(__name__)

DEFAULT_HOST = "https://cloud.langfuse.com"
OTLP_TRACES_PATH = "/api/public/otel/v1/traces"
SCORES_PATH = "/api/public/scores"

ENV_PUBLIC_KEY = "LANGFUSE_PUBLIC_KEY"
ENV_SECRET_KEY = "LANGFUSE_SECRET_KEY"
ENV_HOST = "LANGFUSE_HOST"
ENV_BASE_URL = "LANGFUSE_BASE_URL"
ENV_ENVIRONMENT = "LANGFUSE_TRACING_ENVIRONMENT"

# Langfuse's OTel attribute names (langfuse-python ``LangfuseOtelSpanAttributes``)
LF_TRACE_NAME = "langfuse.trace.name"
LF_SESSION_ID = "langfuse.session.id"
LF_OBSERVATION_TYPE = "langfuse.observation.type"
LF_INPUT = "langfuse.observation.input"
LF_OUTPUT = "langfuse.observation.output"
LF_LEVEL = "langfuse.observation.level"
LF_STATUS_MESSAGE = "langfuse.observation.status_message"
LF_COMPLETION_START_TIME = "langfuse.observation.completion_start_time"
LF_USAGE_DETAILS = "langfuse.observation.usage_details"
# Langfuse's real-time (v4) ingestion path for direct OTLP exporters
INGESTION_VERSION_HEADER = "x-langfuse-ingestion-version"
INGESTION_VERSION = "4"

# where a conversation/thread id may sit in openinference's ``metadata`` JSON attribute
_METADATA_ATTR = "metadata"
_SESSION_METADATA_KEYS = ("session_id", "thread_id", "conversation_id")
_GEN_AI_USAGE_PREFIX = "gen_ai.usage."

_SCORE_ID_NAMESPACE = uuid.UUID("6f0d3c59-64a8-4b8e-9b8e-5f6a2c1d7e10")


def basic_auth_header(public_key: str, secret_key: str) -> str:
    """``Authorization`` header value for Langfuse's Basic auth (public key : secret key)."""
    token = base64.b64encode(f"{public_key}:{secret_key}".encode()).decode("ascii")
    return f"Basic {token}"


def langfuse_host(env: Mapping[str, str]) -> str:
    """The Langfuse base URL from ``LANGFUSE_HOST`` / ``LANGFUSE_BASE_URL`` (default Langfuse Cloud)."""
    host = env.get(ENV_HOST) or env.get(ENV_BASE_URL) or DEFAULT_HOST
    return host.strip().rstrip("/")


def _keys(env: Mapping[str, str]) -> tuple[str, str] | None:
    pk = (env.get(ENV_PUBLIC_KEY) or "").strip()
    sk = (env.get(ENV_SECRET_KEY) or "").strip()
    return (pk, sk) if pk and sk else None


# --- spans ---------------------------------------------------------------------------------------------


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _session_from_metadata(raw: AttributeValue | None) -> str | None:
    if not isinstance(raw, str) or len(raw) > 65_536 or not raw.startswith("{"):
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    for key in _SESSION_METADATA_KEYS:
        v = meta.get(key)
        if isinstance(v, str | int) and str(v):
            return str(v)
    return None


def session_id_of(attributes: Mapping[str, AttributeValue]) -> str | None:
    """The conversation/thread id a span carries: ``session.id``, else LangGraph's ``thread_id`` metadata."""
    sid = attributes.get(LF_SESSION_ID) or attributes.get(semconv.SESSION_ID)
    if isinstance(sid, str | int) and str(sid):
        return str(sid)
    return _session_from_metadata(attributes.get(_METADATA_ATTR))


def langfuse_attributes(span: ReadableSpan, *, trace_name: str | None = None) -> dict[str, AttributeValue]:
    """The Langfuse attributes to add to ``span`` (its own attributes are kept; these win on conflict)."""
    attrs = span.attributes or {}
    out: dict[str, AttributeValue] = {}
    kind = attrs.get(semconv.SPAN_TYPE)
    if kind == semconv.SPAN_TYPE_STREAM:
        out[LF_OBSERVATION_TYPE] = "generation"
        question = attrs.get(semconv.STREAM_QUESTION)
        if isinstance(question, str):
            out[LF_INPUT] = question
        answer = attrs.get(semconv.STREAM_ANSWER)
        if isinstance(answer, str):
            out[LF_OUTPUT] = answer
        ttft = attrs.get(semconv.STREAM_TTFT_MS)
        if isinstance(ttft, int | float) and not isinstance(ttft, bool) and span.start_time:
            out[LF_COMPLETION_START_TIME] = _iso(span.start_time + int(ttft * 1_000_000))
        tokens = attrs.get(semconv.STREAM_TOKENS)
        has_usage = any(k.startswith(_GEN_AI_USAGE_PREFIX) for k in attrs)
        if isinstance(tokens, int) and not isinstance(tokens, bool) and not has_usage:
            out[LF_USAGE_DETAILS] = json.dumps({"output": tokens})
        alerts = attrs.get(semconv.STREAM_ALERTS)
        verdict = attrs.get(semconv.STREAM_VERDICT)
        failed = attrs.get(semconv.EVAL_PASSED) is False
        if (isinstance(alerts, int) and alerts > 0) or failed:
            out[LF_LEVEL] = "WARNING"
            out[LF_STATUS_MESSAGE] = f"verdict={verdict}, alerts={alerts}"
    elif kind == semconv.SPAN_TYPE_CHECKPOINT:
        out[LF_OBSERVATION_TYPE] = "span"
        text = attrs.get(semconv.CHECKPOINT_TEXT)
        if isinstance(text, str):
            out[LF_OUTPUT] = text
        if attrs.get(semconv.EVAL_PASSED) is False:
            out[LF_LEVEL] = "WARNING"
            out[LF_STATUS_MESSAGE] = "checkpoint failed its evaluation"
    elif kind == semconv.SPAN_TYPE_EVALUATOR:
        out[LF_OBSERVATION_TYPE] = "evaluator"
    if trace_name and (span.parent is None or span.parent.is_remote):
        out[LF_TRACE_NAME] = trace_name
    return out


class LangfuseSpanExporter(SpanExporter):
    """Wraps the exporter that sends to Langfuse and adds Langfuse's attributes to copies of the spans.

    The session id of a trace is remembered (bounded, least recently used) so that spans exported after
    the one that carried it get ``langfuse.session.id`` too.
    """

    def __init__(
        self, exporter: SpanExporter, *, trace_name: str | None = None, max_traces: int = 4096
    ) -> None:
        self._exporter = exporter
        self._trace_name = trace_name
        self._max_traces = max_traces
        self._sessions: OrderedDict[int, str] = OrderedDict()
        self._lock = threading.Lock()

    def _session(self, span: ReadableSpan, attrs: Mapping[str, AttributeValue]) -> str | None:
        trace_id = span.context.trace_id if span.context is not None else 0
        sid = session_id_of(attrs)
        with self._lock:
            if sid is not None:
                self._sessions[trace_id] = sid
                self._sessions.move_to_end(trace_id)
                while len(self._sessions) > self._max_traces:
                    self._sessions.popitem(last=False)
                return sid
            return self._sessions.get(trace_id)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export Langfuse-mapped copies of ``spans`` through the wrapped exporter."""
        mapped: list[ReadableSpan] = []
        # first pass: learn the session ids this batch carries (a child may precede its root)
        for span in spans:
            self._session(span, span.attributes or {})
        for span in spans:
            try:
                attrs = dict(span.attributes or {})
                extra = langfuse_attributes(span, trace_name=self._trace_name)
                sid = self._session(span, attrs)
                if sid is not None:
                    extra[LF_SESSION_ID] = sid
                if extra:
                    attrs.update(extra)
                    mapped.append(copy_span(span, attrs))
                else:
                    mapped.append(span)
            except Exception:  # a mapping problem must not lose the span
                _logger.debug("langfuse mapping failed for span %s", span.name, exc_info=True)
                mapped.append(span)
        return self._exporter.export(mapped)

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the wrapped exporter."""
        return self._exporter.force_flush(timeout_millis)

    def __repr__(self) -> str:
        return f"<LangfuseSpanExporter wrapping {type(self._exporter).__name__}>"


def langfuse_exporter_from_env(
    env: Mapping[str, str] | None = None,
    *,
    trace_name: str | None = None,
    timeout_s: float | None = None,
) -> SpanExporter | None:
    """An OTLP/HTTP exporter to Langfuse with the attribute mapping, or ``None`` when the keys are not set.

    Put it behind a ``BatchSpanProcessor`` like any exporter.
    """
    env = os.environ if env is None else env
    keys = _keys(env)
    if keys is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    headers = {
        "Authorization": basic_auth_header(*keys),
        INGESTION_VERSION_HEADER: INGESTION_VERSION,
    }
    inner = OTLPSpanExporter(
        endpoint=langfuse_host(env) + OTLP_TRACES_PATH, headers=headers, timeout=timeout_s
    )
    return LangfuseSpanExporter(inner, trace_name=trace_name)


# --- scores --------------------------------------------------------------------------------------------


def score_id(record: EvaluationRecord, score: Score) -> str:
    """A deterministic score id: Langfuse upserts on it, so a retried or re-emitted score is not doubled."""
    key = f"{record.trace_id_hex}:{record.span_id_hex}:{record.judge}:{result_name(record, score)}"
    return str(uuid.uuid5(_SCORE_ID_NAMESPACE, key))


def score_body(record: EvaluationRecord, score: Score, *, environment: str | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /api/public/scores`` for one score (``CreateScoreRequest``)."""
    metadata: dict[str, Any] = {
        "judge": record.judge,
        "span_name": record.span_name,
        "span_type": record.span_type,
        "source": semconv.TRACER_NAME,
    }
    if score.label is not None:
        metadata["label"] = score.label
    metadata.update(record.attributes)
    body: dict[str, Any] = {
        "id": score_id(record, score),
        "traceId": record.trace_id_hex,
        "observationId": record.span_id_hex,
        "name": result_name(record, score),
        "value": float(score.value) if score.value is not None else None,
        "dataType": "NUMERIC",
        "metadata": metadata,
    }
    if score.explanation:
        body["comment"] = score.explanation
    if environment:
        body["environment"] = environment
    return body


class LangfuseScoreSink(BridgeSink):
    """Posts each score of each evaluation record to Langfuse's scores API in the background.

    One request per score (the scores API takes one score per call; Langfuse's batch ingestion endpoint is
    deprecated), ``concurrency`` requests in flight. Scores without a value (skipped metrics) are not sent.
    See :class:`~streamjudge.exporters._bridge.HttpBridge` for queueing, retry and shutdown semantics.
    """

    def __init__(
        self,
        public_key: str,
        secret_key: str,
        *,
        host: str = DEFAULT_HOST,
        environment: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **bridge_options: Any,
    ) -> None:
        self._environment = environment
        self._bridge = HttpBridge(
            name="langfuse-scores",
            base_url=host,
            build=self._build,
            headers=Secret({"Authorization": basic_auth_header(public_key, secret_key)}),
            transport=transport,
            **bridge_options,
        )

    def _build(self, records: Sequence[EvaluationRecord]) -> list[JsonRequest]:
        return [
            JsonRequest(SCORES_PATH, score_body(r, s, environment=self._environment), 1)
            for r in records
            for s in r.scores
            if s.value is not None
        ]


def langfuse_score_sink_from_env(
    env: Mapping[str, str] | None = None, **options: Any
) -> LangfuseScoreSink | None:
    """A :class:`LangfuseScoreSink` configured from ``LANGFUSE_*``, or ``None`` when the keys are not set."""
    env = os.environ if env is None else env
    keys = _keys(env)
    if keys is None:
        return None
    return LangfuseScoreSink(
        *keys,
        host=langfuse_host(env),
        environment=(env.get(ENV_ENVIRONMENT) or None),
        **options,
    )
