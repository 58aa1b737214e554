"""Langfuse: traces over its OTLP endpoint, scores through its public scores API.

Langfuse ingests OpenTelemetry spans at ``{host}/api/public/otel/v1/traces`` (Basic auth: public key as
user, secret key as password) and reads its own ``langfuse.*`` attributes from them. It does not read
evaluation results from OTel, so :class:`LangfuseScoreSink` posts the scores to its batch ingestion API
(``POST /api/public/ingestion``, ``score-create`` events) as well, addressed to the judged span
(``traceId`` + ``observationId``).

An application that already traces with the Langfuse SDK (``Langfuse(...)`` / ``get_client()``) exports to
Langfuse through the SDK's own span processor; streamjudge then joins it instead (see
:func:`adopt_langfuse_sdk`): no second exporter, its export filter extended to streamjudge's spans, and
scores sent through the SDK client (:class:`LangfuseClientScoreSink`).

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
import math
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.types import AttributeValue

from streamjudge import _sdk, semconv
from streamjudge._deadline import bounded_millis, current_deadline
from streamjudge._spans import copy_span
from streamjudge._vendors import LANGFUSE_KEYS, is_langfuse_sdk_processor
from streamjudge.exporters._bridge import (
    BridgeSink,
    HttpBridge,
    JsonRequest,
    PartialResult,
    Secret,
    is_transient,
    result_name,
)
from streamjudge.exporters._content import capture_content_from_env, scrub_explanation
from streamjudge.exporters._counting import CountingSpanExporter, counting
from streamjudge.exporters.base import EvaluationRecord, find_span_processors
from streamjudge.results import Score

_logger = logging.getLogger(__name__)

DEFAULT_HOST = "https://cloud.langfuse.com"
OTLP_TRACES_PATH = "/api/public/otel/v1/traces"
SCORES_PATH = "/api/public/scores"
INGESTION_PATH = "/api/public/ingestion"
SCORE_CREATE = "score-create"
# Langfuse takes up to 3.5 MB per ingestion batch; stay well under it, and under a count that keeps one
# request's retry cheap
MAX_EVENTS_PER_BATCH = 200
MAX_BATCH_BYTES = 2_500_000

ENV_PUBLIC_KEY, ENV_SECRET_KEY = LANGFUSE_KEYS
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
        self._sdk_since_ns: int | None = None

    def defer_to_sdk(self) -> None:
        """The Langfuse SDK now exports this process's spans: stop sending those that end from now on
        (the SDK's processor sees them); spans that ended before are still sent, so none is lost."""
        if self._sdk_since_ns is None:
            self._sdk_since_ns = time.time_ns()

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
        since = self._sdk_since_ns
        if since is not None:
            spans = [s for s in spans if (s.end_time or 0) < since]
            if not spans:
                return SpanExportResult.SUCCESS
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

    def shutdown(self, timeout_millis: float | None = None) -> None:  # type: ignore[override]
        """Shut the wrapped exporter down (within ``timeout_millis`` when it takes one)."""
        if timeout_millis is not None and isinstance(self._exporter, CountingSpanExporter):
            self._exporter.shutdown(timeout_millis)
        else:
            self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the wrapped exporter."""
        return self._exporter.force_flush(timeout_millis)

    @property
    def counting(self) -> CountingSpanExporter | None:
        """The exporter that counts this one's failures (None when the wrapped one does not count)."""
        return self._exporter if isinstance(self._exporter, CountingSpanExporter) else None

    def __repr__(self) -> str:
        return f"<LangfuseSpanExporter wrapping {type(self._exporter).__name__}>"


def langfuse_exporter_from_env(
    env: Mapping[str, str] | None = None,
    *,
    trace_name: str | None = None,
    timeout_s: float | None = None,
) -> SpanExporter | None:
    """An OTLP/HTTP exporter to Langfuse with the attribute mapping, or ``None`` when the keys are not set.

    Put it behind a ``BatchSpanProcessor`` like any exporter. Failed exports are counted
    (``streamjudge.export.failures{exporter="langfuse"}``).
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
    return LangfuseSpanExporter(counting(inner, "langfuse"), trace_name=trace_name)


# --- scores --------------------------------------------------------------------------------------------


def score_id(record: EvaluationRecord, score: Score) -> str:
    """A deterministic score id: Langfuse upserts on it, so a retried or re-emitted score is not doubled."""
    key = f"{record.trace_id_hex}:{record.span_id_hex}:{record.judge}:{result_name(record, score)}"
    return str(uuid.uuid5(_SCORE_ID_NAMESPACE, key))


def score_metadata(record: EvaluationRecord, score: Score) -> dict[str, Any]:
    """What a Langfuse score carries besides its value: judge, judged span, label, checkpoint/stream ids."""
    metadata: dict[str, Any] = {
        "judge": record.judge,
        "span_name": record.span_name,
        "span_type": record.span_type,
        "source": semconv.TRACER_NAME,
    }
    if score.label is not None:
        metadata["label"] = score.label
    metadata.update(record.attributes)
    return metadata


def score_body(
    record: EvaluationRecord,
    score: Score,
    *,
    environment: str | None = None,
    capture_content: bool = True,
) -> dict[str, Any]:
    """A Langfuse score (``ScoreBody`` of a ``score-create`` event, the same fields as
    ``CreateScoreRequest``) for one score. Without content capture the comment carries no quoted text."""
    body: dict[str, Any] = {
        "id": score_id(record, score),
        "traceId": record.trace_id_hex,
        "observationId": record.span_id_hex,
        "name": result_name(record, score),
        "value": float(score.value) if score.value is not None else None,
        "dataType": "NUMERIC",
        "metadata": score_metadata(record, score),
    }
    comment = scrub_explanation(score.explanation, capture_content)
    if comment:
        body["comment"] = comment
    if environment:
        body["environment"] = environment
    return body


def score_event(body: Mapping[str, Any], timestamp_ns: int) -> dict[str, Any]:
    """A ``score-create`` ingestion event around ``body``.

    The event id is new for every event (Langfuse deduplicates retried events by it); the score id inside
    stays deterministic, so a score emitted twice is upserted, not doubled.
    """
    return {"id": str(uuid.uuid4()), "timestamp": _iso(timestamp_ns), "type": SCORE_CREATE, "body": body}


def ingestion_requests(events: Sequence[Mapping[str, Any]]) -> list[JsonRequest]:
    """``events`` as ``POST /api/public/ingestion`` requests of at most :data:`MAX_EVENTS_PER_BATCH`
    events and about :data:`MAX_BATCH_BYTES` each."""
    out: list[JsonRequest] = []
    batch: list[Mapping[str, Any]] = []
    size = 0
    for ev in events:
        n = len(json.dumps(ev, separators=(",", ":"), default=str)) + 1
        if batch and (len(batch) >= MAX_EVENTS_PER_BATCH or size + n > MAX_BATCH_BYTES):
            out.append(JsonRequest(INGESTION_PATH, {"batch": batch}, len(batch)))
            batch, size = [], 0
        batch.append(ev)
        size += n
    if batch:
        out.append(JsonRequest(INGESTION_PATH, {"batch": batch}, len(batch)))
    return out


def ingestion_outcome(req: JsonRequest, resp: httpx.Response) -> PartialResult | None:
    """Read Langfuse's ingestion answer (``IngestionResponse``: ``successes`` / ``errors``, each with the
    event ``id`` and a ``status``; HTTP 207 when some events failed). Events that failed with a transient
    status (429, 5xx) are sent again; the others are refused for good."""
    if resp.status_code != 207 and not resp.content:
        return None
    try:
        data = resp.json()
    except ValueError:
        return None
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list) or not errors:
        return None
    by_id = {ev.get("id"): ev for ev in req.body.get("batch", ())}
    retry: list[Any] = []
    refused = 0
    reasons: dict[str, int] = {}
    for err in errors:
        if not isinstance(err, dict):
            continue
        event = by_id.pop(err.get("id"), None)
        if event is None:
            continue
        status = err.get("status")
        if isinstance(status, int) and is_transient(status):
            retry.append(event)
        else:
            refused += 1
            msg = str(err.get("message") or err.get("error") or status)[:80]
            reasons[msg] = reasons.get(msg, 0) + 1
    detail = "; ".join(f"{n}x {m}" for m, n in reasons.items())
    again = JsonRequest(req.path, {"batch": retry}, len(retry)) if retry else None
    return PartialResult(refused, again, detail)


class LangfuseScoreSink(BridgeSink):
    """Sends the scores of evaluation records to Langfuse in the background, batched.

    Scores go as ``score-create`` events to the batch ingestion API (``POST /api/public/ingestion``), up
    to :data:`MAX_EVENTS_PER_BATCH` per request and ``concurrency`` requests in flight; per-event errors of
    a 207 answer are retried (transient) or counted as ``rejected``. Scores without a value (skipped
    metrics) are not sent. ``capture_content=False`` keeps quoted answer text out of score comments.
    See :class:`~streamjudge.exporters._bridge.HttpBridge` for queueing, retry and shutdown semantics.
    """

    def __init__(
        self,
        public_key: str,
        secret_key: str,
        *,
        host: str = DEFAULT_HOST,
        environment: str | None = None,
        capture_content: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **bridge_options: Any,
    ) -> None:
        self._environment = environment
        self._capture = capture_content
        self._bridge = HttpBridge(
            name="langfuse-scores",
            base_url=host,
            build=self._build,
            headers=Secret({"Authorization": basic_auth_header(public_key, secret_key)}),
            transport=transport,
            partial=ingestion_outcome,
            **bridge_options,
        )

    def _build(self, records: Sequence[EvaluationRecord]) -> list[JsonRequest]:
        events = [
            score_event(
                score_body(r, s, environment=self._environment, capture_content=self._capture),
                r.timestamp_ns,
            )
            for r in records
            for s in r.scores
            if s.value is not None and math.isfinite(s.value)
        ]
        return ingestion_requests(events)


def langfuse_score_sink_from_env(
    env: Mapping[str, str] | None = None, **options: Any
) -> LangfuseScoreSink | None:
    """A :class:`LangfuseScoreSink` configured from ``LANGFUSE_*``, or ``None`` when the keys are not set."""
    env = os.environ if env is None else env
    keys = _keys(env)
    if keys is None:
        return None
    options.setdefault("capture_content", capture_content_from_env(env))
    return LangfuseScoreSink(
        *keys,
        host=langfuse_host(env),
        environment=(env.get(ENV_ENVIRONMENT) or None),
        **options,
    )


# --- joining the Langfuse SDK ---------------------------------------------------------------------------

# The Langfuse SDK (v3+) sends spans through its own ``LangfuseSpanProcessor`` and, by default, only those
# from Langfuse, with ``gen_ai.*`` attributes, or from known LLM instrumentation scopes: streamjudge's stream
# and checkpoint spans would be dropped, leaving its evaluator spans without their parents.
_ADOPTED = "__streamjudge_adopted__"


def is_streamjudge_span(span: ReadableSpan) -> bool:
    """Whether ``span`` was made by streamjudge (stream, checkpoint and evaluator spans)."""
    scope = span.instrumentation_scope
    return scope is not None and scope.name == semconv.TRACER_NAME


def should_export_span(span: ReadableSpan) -> bool:
    """A ``should_export_span`` for the Langfuse SDK: its default filter plus streamjudge's spans.

    ``configure()`` installs it on an SDK processor that uses the default filter. With a filter of your
    own, accept streamjudge's spans in it::

        from streamjudge.exporters.langfuse import is_streamjudge_span
        Langfuse(should_export_span=lambda span: mine(span) or is_streamjudge_span(span))
    """
    from langfuse.span_filter import is_default_export_span

    return is_streamjudge_span(span) or is_default_export_span(span)


setattr(should_export_span, _ADOPTED, True)


def langfuse_sdk_processors(processor: object) -> list[SpanProcessor]:
    """The Langfuse SDK span processors reachable from ``processor`` (a provider's active processor or any
    composite of processors), found by class so that the SDK need not be importable."""
    return find_span_processors(processor, is_langfuse_sdk_processor)


def adopt_langfuse_sdk(provider: object) -> list[SpanProcessor]:
    """Let the Langfuse SDK processors of ``provider`` export streamjudge's spans; return the processors.

    A processor on the SDK's default filter gets :func:`should_export_span`. One with a filter of the
    application's own is left alone (the application chose what Langfuse receives), with a log line saying
    how to include streamjudge's spans.
    """
    processors = langfuse_sdk_processors(_sdk.active_processor(provider))
    if not processors:
        return []
    try:
        from langfuse.span_filter import is_default_export_span
    except ImportError:  # an SDK too old to filter exports every span already
        return processors
    for p in processors:
        current = _sdk.vendor_export_filter(p)
        if current is None or getattr(current, _ADOPTED, False) or getattr(p, _ADOPTED, False):
            continue
        setattr(p, _ADOPTED, True)
        if current is is_default_export_span:
            # the SDK keeps the filter in an attribute it reads on every span start and end
            _sdk.set_vendor_export_filter(p, should_export_span)
            _logger.info("streamjudge: the Langfuse SDK processor now also exports streamjudge's spans")
        else:
            _logger.warning(
                "streamjudge: the Langfuse SDK uses the application's should_export_span; "
                "streamjudge's spans reach Langfuse only if it accepts them "
                "(see streamjudge.exporters.langfuse.is_streamjudge_span)"
            )
    return processors


class LangfuseClientScoreSink:
    """Scores through the Langfuse SDK client the application already uses (``Langfuse.create_score``).

    ``create_score`` only queues: the SDK's own thread posts the scores, with the SDK's credentials and
    retries. Score ids are the same deterministic ids as :class:`LangfuseScoreSink`'s, so a score sent by
    both, or twice, is stored once.
    """

    def __init__(self, client: Any, *, capture_content: bool | None = None) -> None:
        self._client = client
        self._capture = capture_content_from_env() if capture_content is None else capture_content
        self._flushing = threading.local()

    @classmethod
    def for_processor(
        cls, processor: SpanProcessor, *, capture_content: bool | None = None
    ) -> LangfuseClientScoreSink | None:
        """The sink for the client that owns an SDK span processor (found by its public key)."""
        try:
            from langfuse import get_client

            client = get_client(public_key=getattr(processor, "public_key", None))
            return cls(client, capture_content=capture_content)
        except Exception as exc:  # no usable client: the app's spans still flow, scores stay on them
            _logger.warning("streamjudge: no Langfuse SDK client for scores (%s)", exc)
            return None

    def emit(self, record: EvaluationRecord) -> None:
        """Queue each score of ``record`` in the SDK client."""
        for score in record.scores:
            if score.value is None:
                continue
            try:
                self._client.create_score(
                    name=result_name(record, score),
                    value=float(score.value),
                    trace_id=record.trace_id_hex,
                    observation_id=record.span_id_hex,
                    score_id=score_id(record, score),
                    data_type="NUMERIC",
                    comment=scrub_explanation(score.explanation, self._capture) or None,
                    metadata=score_metadata(record, score),
                )
            except Exception:  # never raise into the judge pool
                _logger.exception("streamjudge: the Langfuse client refused a score")

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Have the client send what it queued.

        ``Langfuse.flush()`` first flushes the tracer provider, which flushes streamjudge's processor and so
        this sink again: the nested call returns at once.
        """
        if getattr(self._flushing, "active", False):
            return True
        wait_ms = bounded_millis(timeout_millis)
        if wait_ms is not None and current_deadline() is not None:
            # the SDK's flush takes no timeout: under a shutdown deadline run it aside and stop waiting
            # when the deadline passes (the SDK's own atexit flush may still finish it)
            done = threading.Event()
            ok: list[bool] = []

            def run() -> None:
                ok.append(self._flush_now())
                done.set()

            threading.Thread(target=run, name="streamjudge-langfuse-flush", daemon=True).start()
            return done.wait(wait_ms / 1000) and all(ok)
        return self._flush_now()

    def _flush_now(self) -> bool:
        self._flushing.active = True
        try:
            self._client.flush()
            return True
        except Exception:
            _logger.exception("streamjudge: flushing the Langfuse client failed")
            return False
        finally:
            self._flushing.active = False

    def shutdown(self) -> None:
        """Nothing to release: the application owns the client (the SDK flushes it at exit)."""
        return None

    def __repr__(self) -> str:
        return f"LangfuseClientScoreSink({type(self._client).__name__})"
