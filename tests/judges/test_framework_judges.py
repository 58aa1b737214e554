"""ragas and deepeval judges through their real code paths against the scripted server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from judgecases import GOOD, HALLUCINATED, INJECTED, item, run
from scripted_server import ScriptedLLMServer

from streamjudge.config import ConfigError, load_settings
from streamjudge.judging.base import JudgeError, JudgeResult, TransientJudgeError
from streamjudge.judging.judges import create_judge
from streamjudge.judging.judges._prompts import DataFence

pytest.importorskip("ragas", reason="needs the ragas extra: pip install 'streamjudge[ragas]'")
pytest.importorskip("deepeval", reason="needs the deepeval extra: pip install 'streamjudge[deepeval]'")

ALL = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")


class Unfenced(DataFence):
    """What a judge that does not delimit would send."""

    def wrap(self, text: str, source: str) -> str:
        return text

    def rule(self) -> str:
        return ""


def make(name: str, srv: ScriptedLLMServer, provider: str = "openai", **kw: Any) -> Any:
    url = srv.anthropic_base_url if provider == "anthropic" else srv.openai_base_url
    s = load_settings({"EVAL_PROVIDER": provider, "EVAL_MODEL": "judge-model", "EVAL_BASE_URL": url,
                       "EVAL_EMBEDDING_MODEL": "embed-model", "EVAL_TIMEOUT": "5"})
    if not kw:
        return create_judge(name, s)
    from streamjudge.judging.judges.deepeval import DeepEvalJudge
    from streamjudge.judging.judges.ragas import RagasJudge
    cls = RagasJudge if name == "ragas" else DeepEvalJudge
    return cls(s.eval_llm, **kw)



# --- ragas -------------------------------------------------------------------------------------------


def test_ragas_scores_all_metrics_through_llm_factory_and_embeddings(llm_server: ScriptedLLMServer) -> None:
    res = run(make("ragas", llm_server), item(HALLUCINATED, reference=GOOD), ALL)
    assert res.judge == "ragas"
    assert res.get("faithfulness").value == pytest.approx(0.5)
    assert res.get("context_precision").value == pytest.approx(1.0, abs=1e-6)
    assert res.get("context_recall").value == pytest.approx(1.0)
    assert 0.0 < res.get("answer_relevancy").value <= 1.0
    tasks = sorted(set(llm_server.brain.tasks))
    assert tasks == ["ragas.answer_relevance", "ragas.context_precision", "ragas.context_recall",
                     "ragas.nli", "ragas.statements"]
    embeds = llm_server.model_requests("/embeddings")
    assert embeds and all(r["body"]["model"] == "embed-model" for r in embeds)
    assert res.usage.calls == len(llm_server.requests)
    assert res.usage.input_tokens > 0


def test_ragas_faithfulness_takes_two_calls(llm_server: ScriptedLLMServer) -> None:
    res = run(make("ragas", llm_server), item(GOOD))
    assert res.get("faithfulness").value == 1.0
    assert res.usage.calls == 2 == len(llm_server.requests)


def test_ragas_with_anthropic_uses_tool_calls_and_skips_embeddings(llm_server: ScriptedLLMServer) -> None:
    res = run(make("ragas", llm_server, "anthropic"), item(HALLUCINATED),
              ("faithfulness", "answer_relevancy"))
    assert res.get("faithfulness").value == pytest.approx(0.5)
    assert res.get("answer_relevancy").skipped == "no_embeddings"
    assert all(r["body"].get("tools") for r in llm_server.model_requests("/messages"))


@pytest.mark.parametrize(("fault", "retry_after"), [("http:503", None), ("http:429:3", 3.0)])
def test_ragas_transient_errors(llm_server: ScriptedLLMServer, fault: str, retry_after: float | None) -> None:
    llm_server.inject(fault)
    with pytest.raises(TransientJudgeError) as err:
        run(make("ragas", llm_server), item())
    assert err.value.retry_after == retry_after
    assert len(llm_server.requests) == 1  # neither the SDK nor instructor retried it


def test_ragas_timeout_is_transient(llm_server: ScriptedLLMServer) -> None:
    llm_server.inject("hang")
    url = llm_server.openai_base_url
    from streamjudge.judging.judges.ragas import RagasJudge
    s = load_settings({"EVAL_MODEL": "m", "EVAL_BASE_URL": url, "EVAL_TIMEOUT": "0.3"})
    with pytest.raises(TransientJudgeError):
        run(RagasJudge(s.eval_llm), item())


@pytest.mark.parametrize("fault", ["schemaless", "garbage"])
def test_ragas_invalid_output_is_a_final_error(llm_server: ScriptedLLMServer, fault: str) -> None:
    llm_server.inject(fault, fault)
    with pytest.raises(JudgeError) as err:
        run(make("ragas", llm_server), item())
    assert not isinstance(err.value, TransientJudgeError)
    assert len(llm_server.requests) == 2  # one re-ask by instructor, then the error


def test_ragas_one_invalid_answer_is_repaired_by_a_reask(llm_server: ScriptedLLMServer) -> None:
    llm_server.inject("schemaless")
    res = run(make("ragas", llm_server), item())
    assert res.get("faithfulness").value == pytest.approx(0.5)
    assert res.usage.calls == 3


def test_ragas_injection_resistance(llm_server: ScriptedLLMServer) -> None:
    fenced = run(make("ragas", llm_server), item(INJECTED))
    assert fenced.get("faithfulness").value == 0.0
    assert not any(t.endswith(":obeyed") for t in llm_server.brain.tasks)
    unfenced = run(make("ragas", llm_server, fence_factory=Unfenced), item(INJECTED))
    assert unfenced.get("faithfulness").value == 1.0  # without the fence the model obeys


# --- deepeval ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_deepeval_scores_all_metrics_and_rubrics(llm_server: ScriptedLLMServer, provider: str) -> None:
    res = run(make("deepeval", llm_server, provider), item(HALLUCINATED, reference=GOOD),
              (*ALL, "geval_groundedness", "nope"))
    assert res.judge == "deepeval"
    assert res.get("faithfulness").value == pytest.approx(0.5)
    assert res.get("answer_relevancy").value == pytest.approx(0.5)
    assert res.get("context_precision").value == pytest.approx(1 / 3)  # 1 of 3 context statements relevant
    assert res.get("context_recall").value == pytest.approx(1.0)
    assert res.get("geval_groundedness").value == pytest.approx(0.2)
    assert res.get("nope").skipped == "unsupported_metric"
    assert not any(t == "unknown" for t in llm_server.brain.tasks)
    assert res.usage.calls == len(llm_server.requests) == 9


def test_deepeval_scores_a_rubric_configured_by_environment(
    llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    rubrics = tmp_path / "rubrics.json"
    steps = ["Read the answer.", "RUBRIC-STEP-7: no outside facts."]
    rubrics.write_text(json.dumps({"cites_only_context": steps}))
    s = load_settings({"EVAL_PROVIDER": "openai", "EVAL_MODEL": "judge-model",
                       "EVAL_BASE_URL": llm_server.openai_base_url, "STREAMJUDGE_GEVAL_RUBRICS": str(rubrics)})
    judge = create_judge("deepeval", s)
    res = run(judge, item(HALLUCINATED), ("cites_only_context", "geval_groundedness"))
    assert res.get("cites_only_context").value == pytest.approx(0.2)  # the scripted model's low rubric score
    assert res.get("geval_groundedness").value == pytest.approx(0.2)  # the built-in rubric is still there
    assert any("RUBRIC-STEP-7" in json.dumps(r["body"]) for r in llm_server.requests)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"tone": []}', "non-empty list"),
        ('{"tone": ["ok", ""]}', "non-empty list"),
        ("[1, 2]", "expected an object"),
        ("{not json", "not valid JSON"),
        ("/nonexistent/rubrics.json", "cannot read"),
    ],
)
def test_rubric_settings_are_checked(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match="STREAMJUDGE_GEVAL_RUBRICS") as err:
        load_settings({"STREAMJUDGE_GEVAL_RUBRICS": raw})
    assert message in str(err.value)
    inline = load_settings({"STREAMJUDGE_GEVAL_RUBRICS": '{"tone": "Is the tone neutral?"}'})
    assert inline.geval_rubrics == {"tone": ("Is the tone neutral?",)}


def test_deepeval_faithfulness_calls_with_and_without_reason(llm_server: ScriptedLLMServer) -> None:
    assert run(make("deepeval", llm_server), item()).usage.calls == 3
    llm_server.reset()
    res = run(make("deepeval", llm_server, include_reason=True), item())
    assert res.usage.calls == 4
    assert res.get("faithfulness").explanation == "scored by the scripted model"


def test_deepeval_fresh_metric_per_concurrent_call(llm_server: ScriptedLLMServer) -> None:
    judge = make("deepeval", llm_server)

    async def go() -> list[JudgeResult]:
        try:
            return list(await asyncio.gather(*(judge.evaluate(item(GOOD if i % 2 else HALLUCINATED),
                                                              ["faithfulness"]) for i in range(8))))
        finally:
            await judge.aclose()

    results = asyncio.run(go())
    assert [r.get("faithfulness").value for r in results] == [0.5, 1.0] * 4
    assert [r.usage.calls for r in results] == [3] * 8


@pytest.mark.parametrize(("fault", "retry_after"), [("http:500", None), ("http:429:1", 1.0)])
def test_deepeval_transient_errors(llm_server: ScriptedLLMServer, fault: str,
                                   retry_after: float | None) -> None:
    llm_server.inject(fault)
    with pytest.raises(TransientJudgeError) as err:
        run(make("deepeval", llm_server), item())
    assert err.value.retry_after == retry_after


def test_deepeval_schemaless_output_is_a_final_error(llm_server: ScriptedLLMServer) -> None:
    llm_server.inject("schemaless", "schemaless")
    with pytest.raises(JudgeError, match="schema") as err:
        run(make("deepeval", llm_server), item())
    assert not isinstance(err.value, TransientJudgeError)


def test_deepeval_repairs_fenced_json(llm_server: ScriptedLLMServer) -> None:
    llm_server.inject("fenced", "fenced", "fenced")
    assert run(make("deepeval", llm_server), item()).get("faithfulness").value == pytest.approx(0.5)


def test_deepeval_injection_resistance(llm_server: ScriptedLLMServer) -> None:
    fenced = run(make("deepeval", llm_server), item(INJECTED))
    assert fenced.get("faithfulness").value == 0.0
    assert not any(t.endswith(":obeyed") for t in llm_server.brain.tasks)
    unfenced = run(make("deepeval", llm_server, fence_factory=Unfenced), item(INJECTED))
    assert unfenced.get("faithfulness").value == 1.0


def test_deepeval_telemetry_and_dotenv_are_off(llm_server: ScriptedLLMServer) -> None:
    import os

    run(make("deepeval", llm_server), item())
    assert os.environ["DEEPEVAL_TELEMETRY_OPT_OUT"] == "1"
    assert os.environ["DEEPEVAL_DISABLE_DOTENV"] == "1"
    from deepeval.telemetry.client import telemetry_opt_out
    assert telemetry_opt_out()
    assert os.environ["RAGAS_DO_NOT_TRACK"] == "true" or "ragas" not in __import__("sys").modules
