"""The Langfuse score bridge against a local server speaking Langfuse's documented ingestion contract.

Contract (Langfuse public API, ``POST /api/public/ingestion``): Basic auth with the public key as user and
the secret key as password; JSON body ``{"batch": [event, ...]}``, each event ``{"id", "timestamp",
"type": "score-create", "body"}`` where ``body`` is a ``ScoreBody`` (the ``CreateScoreRequest`` fields:
required ``name`` and ``value``, and ``id`` (upsert key), ``traceId``, ``observationId``, ``comment``,
``metadata``, ``dataType`` in NUMERIC/CATEGORICAL/BOOLEAN/TEXT/CORRECTION). The answer is an
``IngestionResponse`` (``successes`` / ``errors`` with event ``id`` and ``status``), HTTP 207 when some
events failed; batches are limited to 3.5 MB.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import statistics
import threading
import time

import httpx
import pytest
from opentelemetry import context as otel_context

from exporters._http import Reply, Seen, always, sequence, serve
from streamjudge import semconv
from streamjudge.exporters.base import EvaluationRecord, EvaluationSink
from streamjudge.exporters.langfuse import (
    INGESTION_PATH,
    LangfuseScoreSink,
    langfuse_score_sink_from_env,
)
from streamjudge.judging.base import Score

PK = "pk-lf-test-1234"
SK = "sk-lf-very-secret-5678"
TOKEN = base64.b64encode(f"{PK}:{SK}".encode()).decode()
ALLOWED = {"id", "traceId", "sessionId", "observationId", "datasetRunId", "name", "value", "comment",
           "metadata", "environment", "queueId", "dataType", "configId"}
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "schedule_delay_s": 0.02}


def record(i: int = 1, *, span_type: str = semconv.SPAN_TYPE_STREAM, scores: tuple[Score, ...] | None = None
           ) -> EvaluationRecord:
    return EvaluationRecord(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C + i,
        span_id=0xB7AD6B7169203331 + i,
        span_name=semconv.SPAN_STREAM if span_type == semconv.SPAN_TYPE_STREAM else semconv.SPAN_CHECKPOINT,
        span_type=span_type,
        judge="local",
        scores=scores if scores is not None else (
            Score(semconv.FAITHFULNESS, 0.25, "fail", "claim 'Paris is in Spain' not in context"),
        ),
        timestamp_ns=time.time_ns(),
    )


def scores_of(seen: list[Seen]) -> list[dict[str, object]]:
    """The score bodies of every ingestion request, in the order sent."""
    return [ev["body"] for s in seen if s.path == INGESTION_PATH for ev in s.json()["batch"]]


def sink_for(url: str, **options: object) -> LangfuseScoreSink:
    opts = {**FAST, **options}
    return langfuse_score_sink_from_env(
        {"LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK, "LANGFUSE_HOST": url}, **opts
    )  # type: ignore[return-value]


def assert_no_secret(text: str) -> None:
    assert SK not in text
    assert TOKEN not in text


def test_opt_in_only_with_both_keys() -> None:
    assert langfuse_score_sink_from_env({}) is None
    assert langfuse_score_sink_from_env({"LANGFUSE_PUBLIC_KEY": PK}) is None
    sink = langfuse_score_sink_from_env({"LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK})
    assert isinstance(sink, EvaluationSink)
    assert "cloud.langfuse.com" in repr(sink)
    assert_no_secret(repr(sink))
    sink.shutdown()


def test_scores_are_posted_as_one_ingestion_batch_in_the_documented_shape_with_basic_auth() -> None:
    with serve(always(Reply(200, b'{"successes": [], "errors": []}'))) as srv:
        sink = sink_for(srv.url)
        rec = record(scores=(
            Score(semconv.FAITHFULNESS, 0.25, "fail", "claim not in context"),
            Score(semconv.ANSWER_RELEVANCY, 0.9, "pass"),
            Score(semconv.CONTEXT_RECALL, None, skipped="no_reference"),  # nothing to send
        ))
        sink.emit(rec)
        assert sink.force_flush(5_000)
        seen = srv.wait_for(1)
        sink.shutdown()
    (req,) = seen
    assert req.path == INGESTION_PATH
    assert req.headers["authorization"] == f"Basic {TOKEN}"
    assert req.headers["content-type"].startswith("application/json")
    events = req.json()["batch"]
    assert len(events) == 2
    for ev in events:
        assert set(ev) == {"id", "timestamp", "type", "body"}
        assert ev["type"] == "score-create" and ev["timestamp"].endswith("Z")
    assert len({ev["id"] for ev in events}) == 2
    bodies = {b["name"]: b for b in scores_of(seen)}
    faith = bodies["faithfulness"]
    assert set(faith) <= ALLOWED
    assert faith["traceId"] == rec.trace_id_hex and len(faith["traceId"]) == 32
    assert faith["observationId"] == rec.span_id_hex and len(faith["observationId"]) == 16
    assert faith["value"] == 0.25 and faith["dataType"] == "NUMERIC"
    assert faith["comment"] == "claim not in context"
    assert faith["metadata"]["judge"] == "local" and faith["metadata"]["label"] == "fail"
    assert "comment" not in bodies["answer_relevancy"]
    assert faith["id"] != bodies["answer_relevancy"]["id"]
    assert sink.stats.sent_items == 2 and sink.stats.dropped_total == 0


def test_checkpoint_scores_are_named_apart_from_the_final_pass() -> None:
    with serve(always(Reply(200))) as srv:
        sink = sink_for(srv.url)
        sink.emit(record(span_type=semconv.SPAN_TYPE_CHECKPOINT))
        assert sink.force_flush(5_000)
        seen = srv.wait_for(1)
        sink.shutdown()
    assert [b["name"] for b in scores_of(seen)] == ["checkpoint.faithfulness"]


def test_500_then_success_is_retried_with_the_same_idempotency_id() -> None:
    with serve(sequence(Reply(500, b"boom"), Reply(502), Reply(200))) as srv:
        sink = sink_for(srv.url)
        sink.emit(record())
        assert sink.force_flush(5_000)
        seen = srv.wait_for(3)
        sink.shutdown()
    assert len({s.body for s in seen}) == 1  # byte-identical retries: same id, Langfuse upserts
    assert sink.stats.sent_items == 1 and sink.stats.retries == 2 and sink.stats.dropped_total == 0


def test_429_retry_after_is_honoured() -> None:
    with serve(sequence(Reply(429, headers={"Retry-After": "1"}), Reply(200))) as srv:
        sink = sink_for(srv.url)  # own backoff would retry after ~10 ms
        sink.emit(record())
        assert sink.force_flush(5_000)
        first, second = srv.wait_for(2)
        sink.shutdown()
    assert second.at - first.at >= 0.9
    assert sink.stats.sent_items == 1


def test_401_logs_once_disables_and_never_leaks_the_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with serve(always(Reply(401, b'{"message": "Invalid credentials"}'))) as srv:
        sink = sink_for(srv.url, log_interval_s=0.0)
        for i in range(5):
            sink.emit(record(i))
        assert sink.force_flush(5_000)
        for i in range(5, 8):
            sink.emit(record(i))  # after the rejection: dropped without a request
        time.sleep(0.1)
        n_requests = len(srv.seen)
        sink.shutdown()
    assert n_requests <= 5  # the batch in flight when 401 arrived, nothing after
    assert sink.stats.disabled
    assert sink.stats.dropped["auth_rejected"] == 8
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "credentials were rejected" in errors[0].getMessage()
    lost = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert lost and "auth_rejected=" in lost[-1]
    assert_no_secret(caplog.text)
    assert_no_secret(repr(sink) + repr(sink._bridge) + repr(sink._bridge._headers) + str(sink.stats))


def test_emit_never_blocks_and_memory_stays_bounded_while_the_backend_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    with serve(always(Reply(200, hang=release))) as srv:
        sink = sink_for(srv.url, max_queue=100, max_batch=10, request_timeout_s=30.0)
        sink.emit(record(0))
        srv.wait_for(1)  # the worker is now stuck on a hanging request
        durations = []
        for i in range(1, 2001):
            t0 = time.perf_counter()
            sink.emit(record(i))
            durations.append(time.perf_counter() - t0)
        stats = sink.stats
        assert stats.queued_records <= 100
        # besides the queue, at most `concurrency` (4) batches of 10 are taken by the worker
        assert stats.dropped["queue_full"] >= 2000 - 100 - 4 * 10
        t0 = time.monotonic()
        sink.shutdown(timeout_millis=300)  # must not wait for the hanging server
        shutdown_s = time.monotonic() - t0
        release.set()
    # microseconds, not the 30 s the server hangs; the tail is GIL hand-offs with the worker/server threads
    assert statistics.median(durations) < 50e-6, statistics.median(durations)
    assert sorted(durations)[int(len(durations) * 0.99)] < 1e-3
    assert max(durations) < 0.25, max(durations)
    assert shutdown_s < 2.0
    final = sink.stats
    assert final.sent_items == 0
    assert final.dropped_total == 2001  # every record is accounted for: nothing silently lost
    lost = [r.getMessage() for r in caplog.records if "were not delivered" in r.getMessage()]
    assert sum(int(m.split()[1]) for m in lost) == 2001


def test_backend_down_gives_up_after_bounded_retries(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = sink_for(f"http://127.0.0.1:{port}", max_retries=2, log_interval_s=0.0)
    sink.emit(record())
    assert sink.force_flush(5_000)
    sink.shutdown()
    assert sink.stats.retries == 2
    assert sink.stats.dropped == {"retries_exhausted": 1}
    assert any("retries_exhausted=1" in r.getMessage() for r in caplog.records)


def test_client_errors_are_not_retried() -> None:
    with serve(always(Reply(400, b'{"message": "bad value"}'))) as srv:
        sink = sink_for(srv.url)
        sink.emit(record())
        assert sink.force_flush(5_000)
        sink.shutdown()
        assert len(srv.seen) == 1
    assert sink.stats.dropped == {"rejected": 1}


def test_the_bridge_own_http_calls_are_not_traced() -> None:
    flags: list[object] = []

    class Spy(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            flags.append(otel_context.get_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY))
            return httpx.Response(200, json={"id": "x"})

    sink = LangfuseScoreSink(PK, SK, host="http://127.0.0.1:9", transport=Spy(), **FAST)
    sink.emit(record())
    assert sink.force_flush(5_000)
    sink.shutdown()
    assert flags == [True]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_delivers_with_its_own_worker() -> None:
    with serve(always(Reply(200))) as srv:
        sink = sink_for(srv.url)
        sink.emit(record(1))
        assert sink.force_flush(5_000)
        pid = os.fork()
        if pid == 0:  # child: the parent's worker thread does not exist here
            code = 1
            try:
                sink.emit(record(2))
                code = 0 if sink.force_flush(5_000) and sink.stats.sent_items == 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        seen = srv.wait_for(2)
        sink.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0
    assert {b["traceId"] for b in scores_of(seen)} == {record(1).trace_id_hex, record(2).trace_id_hex}
