"""``STREAMJUDGE_CAPTURE_CONTENT=false`` keeps answer text out of score comments and annotation
explanations (issue 10 #12): a judge's explanation quotes the claims it could not support."""

from __future__ import annotations

import asyncio

import pytest

from exporters._http import Reply, always, serve
from exporters.test_langfuse_scores import FAST, PK, SK, record, scores_of
from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.exporters._content import capture_content_from_env, scrub_explanation
from streamjudge.exporters.langfuse import LangfuseScoreSink, langfuse_score_sink_from_env
from streamjudge.exporters.phoenix import PhoenixAnnotationSink, annotation, phoenix_annotation_sink_from_env
from streamjudge.judging.base import EvalInput, Score
from streamjudge.judging.judges import create_judge

ANSWER = "The Eiffel Tower is 330 metres tall. It was painted gold by Napoleon in 1740."
CONTEXT = "The Eiffel Tower is 330 metres tall and was completed in 1889 for the World's Fair."


def local_explanation() -> str:
    judge = create_judge("local", Settings())
    item = EvalInput(question="How tall is the Eiffel Tower?", contexts=(CONTEXT,), answer=ANSWER)
    result = asyncio.run(judge.evaluate(item, [semconv.FAITHFULNESS]))
    (score,) = result.scores
    assert score.explanation
    return score.explanation


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("1/2 claims supported; unsupported: \"It was painted gold\" (not in context: gold)",
         "1/2 claims supported; unsupported"),
        ("claim 'Paris is in Spain' not in context", "claim"),
        ("the answer isn't grounded", "the answer isn't grounded"),  # an apostrophe quotes nothing
        ("2/2 claims supported", "2/2 claims supported"),
        ("\u201cGold\u201d is not in the sources", None),
        ("", ""),
        (None, None),
    ],
)
def test_scrub_keeps_the_structure_and_drops_quoted_text(text: str | None, scrubbed: str | None) -> None:
    assert scrub_explanation(text, capture=False) == scrubbed
    assert scrub_explanation(text, capture=True) == text


def test_the_local_judges_explanation_loses_the_answer_text() -> None:
    explanation = local_explanation()
    assert "painted gold" in explanation  # what would leave the process
    scrubbed = scrub_explanation(explanation, capture=False)
    assert scrubbed is not None and scrubbed.startswith("1 of 2 sentences unsupported")
    for word in ("painted", "gold", "Napoleon", "1740"):
        assert word not in scrubbed


def test_langfuse_comments_carry_no_quoted_text_with_capture_off() -> None:
    explanation = local_explanation()
    rec = record(1, scores=(Score(semconv.FAITHFULNESS, 0.5, "fail", explanation),))
    with serve(always(Reply(200))) as srv:
        off = LangfuseScoreSink(PK, SK, host=srv.url, capture_content=False, **FAST)
        on = LangfuseScoreSink(PK, SK, host=srv.url, **FAST)
        off.emit(rec)
        assert off.force_flush(5_000)
        on.emit(rec)
        assert on.force_flush(5_000)
        seen = srv.wait_for(2)
        off.shutdown()
        on.shutdown()
    first, second = scores_of(seen)
    assert first["comment"] == "1 of 2 sentences unsupported, 0 uncertain"
    assert second["comment"] == explanation  # capture on: unchanged


def test_phoenix_explanations_carry_no_quoted_text_with_capture_off() -> None:
    explanation = local_explanation()
    rec = record(1, scores=(Score(semconv.FAITHFULNESS, 0.5, "fail", explanation),))
    assert annotation(rec, rec.scores[0], capture_content=False)["result"]["explanation"] == (
        "1 of 2 sentences unsupported, 0 uncertain"
    )
    with serve(always(Reply(200))) as srv:
        sink = PhoenixAnnotationSink(srv.url, capture_content=False, **FAST)
        sink.emit(rec)
        assert sink.force_flush(5_000)
        (req,) = srv.wait_for(1)
        sink.shutdown()
    (data,) = req.json()["data"]
    assert "gold" not in req.body.decode()
    assert data["result"] == {"score": 0.5, "label": "fail",
                              "explanation": "1 of 2 sentences unsupported, 0 uncertain"}


def test_sinks_from_env_follow_streamjudge_capture_content() -> None:
    env = {
        "LANGFUSE_PUBLIC_KEY": PK,
        "LANGFUSE_SECRET_KEY": SK,
        "PHOENIX_COLLECTOR_ENDPOINT": "http://127.0.0.1:6006",
        "STREAMJUDGE_CAPTURE_CONTENT": "false",
    }
    assert capture_content_from_env(env) is False
    assert capture_content_from_env({}) is True
    langfuse = langfuse_score_sink_from_env(env)
    phoenix = phoenix_annotation_sink_from_env(env)
    assert langfuse is not None and phoenix is not None
    assert langfuse._capture is False and phoenix._capture is False
    langfuse.shutdown()
    phoenix.shutdown()


def test_the_langfuse_sdk_client_sink_scrubs_comments_and_its_flush_keeps_the_deadline() -> None:
    """Scores through the application's Langfuse SDK client (``create_score``): the comment follows the
    policy too, and the SDK's flush, which takes no timeout, is not waited for past a shutdown deadline."""
    pytest.importorskip("langfuse")
    import json
    import subprocess
    import sys
    import textwrap
    import threading

    release = threading.Event()
    script = textwrap.dedent(
        """
        import json, sys, time
        from langfuse import Langfuse
        from streamjudge import semconv
        from streamjudge._deadline import shutdown_deadline
        from streamjudge.exporters.base import EvaluationRecord
        from streamjudge.exporters.langfuse import LangfuseClientScoreSink
        from streamjudge.judging.base import Score

        client = Langfuse(public_key="pk-lf-c", secret_key="sk-lf-c", base_url=sys.argv[1])
        sink = LangfuseClientScoreSink(client, capture_content=False)
        explanation = '1/2 claims supported; unsupported: "It was painted gold" (not in context: gold)'
        sink.emit(EvaluationRecord(0x1234, 0x5678, "stream", "stream", "local",
                                   (Score("faithfulness", 0.5, "fail", explanation),), time.time_ns()))
        t0 = time.monotonic()
        with shutdown_deadline(0.5):
            ok = sink.force_flush()
        print(json.dumps({"ok": ok, "took": time.monotonic() - t0}), flush=True)
        sys.stdin.readline()  # the test releases the server
        client.flush()
        client.shutdown()
        """
    )
    with serve(lambda _seen, _i: Reply(200, b"{}", hang=release)) as srv:
        proc = subprocess.Popen([sys.executable, "-c", script, srv.url], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            first = json.loads(proc.stdout.readline())
            release.set()
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=60)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        bodies = b"".join(s.body for s in srv.seen).decode()
    assert first["ok"] is False and first["took"] < 2.0, first
    assert "1/2 claims supported; unsupported" in bodies
    assert "gold" not in bodies
