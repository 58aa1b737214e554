"""The cascade judge: the local judge decides what it can, the strong judge (here the ``llm`` judge through
the real OpenAI client against the scripted server) only the sentences the local judge is uncertain about."""

from __future__ import annotations

from typing import Any

from judgecases import run
from scripted_server import ScriptedLLMServer

from streamjudge.config import load_settings
from streamjudge.judging.base import EvalInput
from streamjudge.judging.judges import create_judge
from streamjudge.judging.judges.cascade import CascadeJudge
from streamjudge.judging.judges.llm import LLMJudge
from streamjudge.judging.judges.local import LocalJudge

CTX = ("The Eiffel Tower is in Paris. Gustave Eiffel's company built it for the World's Fair of 1889.",)
GROUNDED = "The Eiffel Tower is in Paris."
# with nothing before it for "it" to stand for, "Paris" is not tied to the building: a detached name
UNCERTAIN = "It was built in Paris."
FABRICATED = "The tower was built in 1925."  # a number the contexts lack: a fail


def settings(srv: ScriptedLLMServer, **extra: str) -> Any:
    return load_settings({"EVAL_PROVIDER": "openai", "EVAL_MODEL": "judge-model",
                          "EVAL_BASE_URL": srv.openai_base_url, **extra})


def cascade(srv: ScriptedLLMServer, **kw: Any) -> CascadeJudge:
    return CascadeJudge(LocalJudge(), LLMJudge.from_settings(settings(srv)), **kw)


def test_only_the_uncertain_sentences_reach_the_strong_judge(llm_server: ScriptedLLMServer) -> None:
    judge = cascade(llm_server)
    answer = f"{UNCERTAIN} {GROUNDED} {FABRICATED}"
    res = run(judge, EvalInput("Where is it?", CTX, answer))
    faith = res.get("faithfulness")
    assert faith is not None
    reqs = llm_server.model_requests("/chat/completions")
    assert len(reqs) == 1 and res.usage.calls == 1
    sent = reqs[0]["body"]["messages"][-1]["content"]
    assert UNCERTAIN in sent and FABRICATED not in sent and "[2]" not in sent  # one numbered sentence
    by_text = {answer[s.start : s.end]: s for s in faith.sentences}
    assert (by_text[GROUNDED].verdict, by_text[GROUNDED].tier) == ("supported", "local")
    # the scripted model finds "built" and "Paris" in the passages: supported, decided by the llm tier
    assert (by_text[UNCERTAIN].verdict, by_text[UNCERTAIN].tier) == ("supported", "llm")
    assert (by_text[FABRICATED].verdict, by_text[FABRICATED].tier) == ("fail", "local")
    labelled = faith.with_label(0.7)
    assert labelled.label == "fail" and [s.label for s in labelled.sentences] == ["pass", "pass", "fail"]
    assert "1 sentence(s) escalated to llm, 1 verdict(s) changed" in faith.explanation
    assert judge.stats.escalated_calls == 1 and judge.stats.escalated_sentences == 1
    assert judge.stats.sentences == 3 and res.judge == "cascade"


def test_an_answer_the_local_judge_is_sure_about_costs_no_strong_call(llm_server: ScriptedLLMServer) -> None:
    judge = cascade(llm_server)
    res = run(judge, EvalInput("Where is it?", CTX, f"{GROUNDED} {FABRICATED}"))
    assert llm_server.model_requests("/chat/completions") == [] and res.usage.calls == 0
    assert {s.tier for s in res.get("faithfulness").sentences} == {"local"}  # type: ignore[union-attr]
    assert judge.stats.calls_saved == 1.0


def test_confirming_fails_sends_them_to_the_strong_judge_too(llm_server: ScriptedLLMServer) -> None:
    judge = cascade(llm_server, confirm_fails=True)
    answer = f"{GROUNDED} {FABRICATED}"
    res = run(judge, EvalInput("When?", CTX, answer))
    (sent,) = llm_server.model_requests("/chat/completions")
    assert FABRICATED in sent["body"]["messages"][-1]["content"]
    fabricated = res.get("faithfulness").sentences[1]  # type: ignore[union-attr]
    assert (fabricated.verdict, fabricated.tier, fabricated.alert) == ("fail", "llm", True)
    assert "local: number not in context: 1925" in fabricated.reason


def test_a_strong_judge_that_cannot_tell_leaves_the_sentence_uncertain(llm_server: ScriptedLLMServer) -> None:
    def cannot_tell(body: dict[str, Any]) -> dict[str, Any] | None:
        return {"json": {"claims": [{"claim": "built in Paris", "sentence": 1, "verdict": "cannot_tell",
                                     "reason": "the passage does not say where"}]}}

    llm_server.app_responder = cannot_tell
    for strictness, alert in (("default", False), ("strict", True)):
        judge = cascade(llm_server, strictness=strictness)
        faith = run(judge, EvalInput("Where?", CTX, UNCERTAIN)).get("faithfulness")
        assert faith is not None
        (s,) = faith.sentences
        assert (s.verdict, s.tier, s.alert) == ("uncertain", "llm", alert)
        assert "does not say where" in s.reason
        assert faith.with_label(0.7).label == ("fail" if alert else "pass")


def test_a_failing_strong_judge_keeps_the_local_verdicts_and_says_so(llm_server: ScriptedLLMServer) -> None:
    llm_server.inject("garbage")
    faith = run(cascade(llm_server), EvalInput("Where?", CTX, f"{UNCERTAIN} {GROUNDED}")).get("faithfulness")
    assert faith is not None
    assert [(s.verdict, s.tier) for s in faith.sentences] == [("uncertain", "local"), ("supported", "local")]
    assert "escalation to llm failed" in faith.explanation
    assert faith.with_label(0.7).label == "pass"


def test_the_cascade_is_built_from_settings(llm_server: ScriptedLLMServer) -> None:
    s = settings(llm_server, STREAMJUDGE_JUDGE="cascade", STREAMJUDGE_CASCADE_JUDGE="llm",
                 STREAMJUDGE_CASCADE_CONFIRM_FAILS="true", STREAMJUDGE_STRICTNESS="strict",
                 STREAMJUDGE_JUDGE_PROCESSES="0")
    judge = create_judge(s.judge, s)
    assert isinstance(judge, CascadeJudge)
    assert judge.strong.name == "llm" and judge.cheap.name == "local"
    assert judge.confirm_fails and judge.strictness == "strict"
    res = run(judge, EvalInput("Where?", CTX, GROUNDED))
    assert res.get("faithfulness").value == 1.0  # type: ignore[union-attr]


def test_the_llm_judge_alone_gives_three_way_sentence_verdicts(llm_server: ScriptedLLMServer) -> None:
    def verdicts(body: dict[str, Any]) -> dict[str, Any] | None:
        return {"json": {"claims": [
            {"claim": "a", "sentence": 1, "verdict": "supported", "reason": "-"},
            {"claim": "b", "sentence": 2, "verdict": "cannot tell", "reason": "vague"},
            {"claim": "c", "sentence": 3, "verdict": "contradicted", "reason": "the year differs"},
        ]}}

    llm_server.app_responder = verdicts
    answer = f"{GROUNDED} {UNCERTAIN} {FABRICATED}"
    for strictness in ("default", "strict"):
        judge = LLMJudge.from_settings(settings(llm_server, STREAMJUDGE_STRICTNESS=strictness))
        faith = run(judge, EvalInput("q", CTX, answer)).get("faithfulness")
        assert faith is not None
        assert [(s.verdict, s.tier) for s in faith.sentences] == [
            ("supported", "llm"), ("uncertain", "llm"), ("fail", "llm")]
        assert [s.alert for s in faith.sentences] == [False, strictness == "strict", True]
        assert "1 the model cannot tell" in faith.explanation


def test_the_model_judge_reads_its_probability_as_a_band() -> None:
    from streamjudge.judging.judges.model import band_verdict

    assert [band_verdict(p) for p in (0.05, 0.29, 0.3, 0.49, 0.5, 0.97)] == [
        "fail", "fail", "uncertain", "uncertain", "supported", "supported"]


def test_a_model_as_the_strong_tier_decides_by_its_probability_band(tmp_path: Any) -> None:
    import pytest

    pytest.importorskip("onnxruntime", reason="the model judge needs onnxruntime (streamjudge[model])")
    pytest.importorskip("onnx", reason="the tiny test model is built with onnx.helper")
    from tiny_nli import build_model_dir

    from streamjudge.config import Settings

    path = build_model_dir(tmp_path / "tiny-nli")
    s = Settings(judge="cascade", cascade_judge="model", model_path=str(path), model_max_batch_ms=0.0,
                 judge_processes=0)
    judge = create_judge("cascade", s)
    assert isinstance(judge, CascadeJudge) and judge.strong.name == "model"
    ctx = ("Paris is the capital of France. Paris has about two million inhabitants.",)
    # words the context lacks, no hard fact: uncertain for the local judge; the tiny model does not entail it
    vague = "Paris is the bustling cosmopolitan capital of France."
    answer = f"Paris is the capital of France. {vague}"
    faith = run(judge, EvalInput("q", ctx, answer)).get("faithfulness")
    assert faith is not None
    first, second = faith.sentences
    assert (first.verdict, first.tier) == ("supported", "local")
    assert (second.verdict, second.tier, second.alert) == ("fail", "model", True)
    assert "local: content words not in context" in second.reason
    assert judge.stats.escalated_sentences == 1 and judge.stats.sentences == 2


def test_a_claim_without_its_sentence_still_fails_the_llm_judges_score(llm_server: ScriptedLLMServer) -> None:
    def unnumbered(body: dict[str, Any]) -> dict[str, Any] | None:
        return {"json": {"claims": [
            {"claim": "a", "sentence": 1, "verdict": "supported", "reason": "-"},
            {"claim": "b", "verdict": "unsupported", "reason": "names no sentence"},
        ]}}

    llm_server.app_responder = unnumbered
    judge = LLMJudge.from_settings(settings(llm_server))
    faith = run(judge, EvalInput("q", CTX, GROUNDED)).get("faithfulness")
    assert faith is not None and faith.value == 0.5
    assert faith.sentences[0].verdict == "supported" and faith.sentences[0].alert is None
    assert faith.with_label(0.7).label == "fail"  # the threshold still labels the value


def test_a_sentence_the_strong_judge_says_nothing_about_keeps_the_local_verdict(
    llm_server: ScriptedLLMServer,
) -> None:
    def only_the_first(body: dict[str, Any]) -> dict[str, Any] | None:
        return {"json": {"claims": [{"claim": "a", "sentence": 1, "verdict": "supported", "reason": "-"}]}}

    llm_server.app_responder = only_the_first
    vague = "The tower painstakingly orchestrated elaborate ceremonies."
    faith = run(cascade(llm_server), EvalInput("q", CTX, f"{UNCERTAIN} {vague}")).get("faithfulness")
    assert faith is not None
    assert [(s.verdict, s.tier) for s in faith.sentences] == [("supported", "llm"), ("uncertain", "local")]
    assert "1 it said nothing about kept" in faith.explanation
