"""The score bridge batches, reads Langfuse's 207 multi-status answers, and respects the shutdown deadline.

Issue 10 #14: one request per score with 4 in flight saturated at ~27 scores/s against a backend with
100 ms latency (~6 streams/s). Issue 10 #13: shutdown had no overall deadline.
"""

from __future__ import annotations

import json
import math
import threading
import time

from exporters._http import Reply, Script, Seen, always, serve
from exporters.test_langfuse_scores import FAST, record, scores_of, sink_for
from streamjudge import semconv
from streamjudge._deadline import shutdown_deadline
from streamjudge.exporters.langfuse import INGESTION_PATH, MAX_EVENTS_PER_BATCH
from streamjudge.exporters.phoenix import PhoenixAnnotationSink
from streamjudge.judging.base import Score

THREE = (
    Score(semconv.FAITHFULNESS, 0.5, "fail", "1/2 claims supported"),
    Score(semconv.ANSWER_RELEVANCY, 0.9, "pass"),
    Score(semconv.CONTEXT_PRECISION, 0.8, "pass"),
)


def slow(latency_s: float) -> Script:
    def script(_seen: Seen, _i: int) -> Reply:
        time.sleep(latency_s)
        return Reply(200, b'{"successes": [], "errors": []}')

    return script


def test_many_scores_go_in_few_requests_and_all_arrive() -> None:
    n_records = 400  # 1,200 scores
    with serve(slow(0.1)) as srv:
        sink = sink_for(srv.url, max_queue=4096)
        for i in range(n_records):
            sink.emit(record(i, scores=THREE))
        assert sink.force_flush(60_000)
        seen = list(srv.seen)
        sink.shutdown()
    bodies = scores_of(seen)
    assert len(bodies) == 3 * n_records
    assert len({(b["observationId"], b["name"]) for b in bodies}) == 3 * n_records
    assert all(len(s.json()["batch"]) <= MAX_EVENTS_PER_BATCH for s in seen)
    # one request per score would be 1,200 requests (12 s of latency at 4 in flight)
    assert len(seen) <= math.ceil(3 * n_records / 64) + 4, len(seen)
    assert sink.stats.sent_items == 3 * n_records and sink.stats.dropped_total == 0


def test_a_207_answer_retries_only_the_transiently_failed_events_and_drops_the_refused() -> None:
    def script(seen: Seen, i: int) -> Reply:
        if i > 0:
            return Reply(200, b'{"successes": [], "errors": []}')
        events = seen.json()["batch"]
        by_name = {ev["body"]["name"]: ev["id"] for ev in events}
        answer = {
            "successes": [{"id": by_name["context_precision"], "status": 201}],
            "errors": [
                {"id": by_name["faithfulness"], "status": 400, "message": "Invalid request data"},
                {"id": by_name["answer_relevancy"], "status": 500, "message": "Internal error"},
            ],
        }
        return Reply(207, json.dumps(answer).encode())

    with serve(script) as srv:
        sink = sink_for(srv.url)
        sink.emit(record(1, scores=THREE))
        assert sink.force_flush(5_000)
        seen = srv.wait_for(2)
        sink.shutdown()
    first, second = seen[:2]
    assert len(first.json()["batch"]) == 3
    (again,) = second.json()["batch"]
    assert again["body"]["name"] == "answer_relevancy"
    retried = next(ev for ev in first.json()["batch"] if ev["body"]["name"] == "answer_relevancy")
    assert again == retried  # the same event id: Langfuse deduplicates it if the first one did land
    assert len(seen) == 2
    stats = sink.stats
    assert stats.sent_items == 2 and stats.retries == 1
    assert stats.dropped == {"rejected": 1}


def test_a_207_whose_transient_errors_persist_counts_them_as_retries_exhausted() -> None:
    def script(seen: Seen, _i: int) -> Reply:
        errors = [{"id": ev["id"], "status": 503} for ev in seen.json()["batch"]]
        return Reply(207, json.dumps({"successes": [], "errors": errors}).encode())

    with serve(script) as srv:
        sink = sink_for(srv.url, max_retries=2)
        sink.emit(record(1, scores=THREE))
        assert sink.force_flush(5_000)
        sink.shutdown()
        assert len(srv.seen) == 3
    assert sink.stats.sent_items == 0 and sink.stats.dropped == {"retries_exhausted": 3}


def test_shutdown_honours_the_process_deadline_against_a_backend_that_never_answers() -> None:
    never = threading.Event()  # the server holds every request until the test ends
    with serve(always(Reply(200, hang=never))) as srv:
        langfuse = sink_for(srv.url, request_timeout_s=30.0)  # its own shutdown timeout: 5 s
        phoenix = PhoenixAnnotationSink(srv.url, request_timeout_s=30.0, **FAST)
        for i in range(5):
            langfuse.emit(record(i))
            phoenix.emit(record(i))
        srv.wait_for(2)  # both workers are now stuck on a hanging request
        t0 = time.monotonic()
        with shutdown_deadline(0.5):
            assert not langfuse.force_flush(30_000)
            langfuse.shutdown()
            phoenix.shutdown()
        took = time.monotonic() - t0
        never.set()
    # without the shared deadline: 30 s of flush, then 5 s + 5 s of shutdown
    assert took < 3.0, took
    assert langfuse.stats.dropped_total == 5 and phoenix.stats.dropped_total == 5


def test_flush_without_a_deadline_still_waits_for_slow_deliveries() -> None:
    with serve(slow(0.3)) as srv:
        sink = sink_for(srv.url)
        sink.emit(record(1))
        assert sink.force_flush(10_000)
        sink.shutdown()
        assert [s.path for s in srv.seen] == [INGESTION_PATH]
    assert sink.stats.sent_items == 1



def test_draining_a_runtime_is_bounded_by_the_deadline_against_an_unresponsive_langfuse() -> None:
    """The whole runtime, as the SIGTERM drain shuts it down: 14.9 s against an unresponsive Langfuse
    before (the bridge's own 5 s + 1 s, then each exporter's timeouts)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import streamjudge
    from streamjudge._shutdown import drain
    from streamjudge.config import Settings

    never = threading.Event()
    with serve(always(Reply(200, hang=never))) as srv:
        sink = sink_for(srv.url, request_timeout_s=30.0)
        rt = streamjudge.configure(
            Settings(), exporter=InMemorySpanExporter(), sinks=[sink], backends_from_env=False, set_global=False
        )
        for i in range(3):
            sink.emit(record(i))
        srv.wait_for(1)
        t0 = time.monotonic()
        finished = drain(rt, 1.0, global_providers=False)
        took = time.monotonic() - t0
        never.set()
    assert finished and took < 2.0, (finished, took)
    assert sink.stats.dropped == {"shutdown": 3}


def test_a_slow_request_holds_back_neither_later_records_nor_a_truthful_flush() -> None:
    release = threading.Event()

    def script(_seen: Seen, i: int) -> Reply:
        return Reply(200, hang=release if i == 0 else None)

    with serve(script) as srv:
        sink = sink_for(srv.url, request_timeout_s=30.0)
        sink.emit(record(1))
        srv.wait_for(1)  # the first batch is stuck on the server
        sink.emit(record(2))
        srv.wait_for(2, timeout=5.0)  # sent meanwhile (another request in flight), not after the first
        # record 2 was delivered, record 1 was not: a flush must not report success
        assert not sink.force_flush(300)
        release.set()
        assert sink.force_flush(5_000)
        sink.shutdown()
    assert sink.stats.sent_items == 2
