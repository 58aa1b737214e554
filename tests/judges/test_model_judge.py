"""The ``model`` judge through its real loading, tokenising, batching and scoring code.

The classifier is the tiny ONNX model of ``tiny_nli`` (built into ``tmp_path`` by each test): it entails a
hypothesis whose content words all occur in the premise. A real model is used where
``STREAMJUDGE_TEST_MODEL_PATH`` names one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytest.importorskip("onnxruntime", reason="the model judge's tests need onnxruntime (streamjudge[model])")
pytest.importorskip("onnx", reason="the tiny test model is built with onnx.helper")

from tiny_nli import build_model_dir, build_slow_model_dir, vocabulary

import streamjudge
from streamjudge import semconv
from streamjudge.config import ConfigError, Settings, load_settings
from streamjudge.judging.base import EvalInput, JudgeError, JudgeResult, Score
from streamjudge.judging.judges import create_judge
from streamjudge.judging.judges.model import ModelJudge
from streamjudge.judging.pool import JobOutcome, JudgeJob, JudgePool

FAITH = semconv.FAITHFULNESS
CONTEXTS = (
    "Paris is the capital of France. Paris has about two million inhabitants.",
    "Bananas are yellow fruit grown in the tropics.",
)
GROUNDED = "Paris is the capital of France."
FABRICATED = "Berlin hosts the Louvre museum."


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return build_model_dir(tmp_path / "tiny-nli")


def make_judge(path: Path, **settings: Any) -> ModelJudge:
    settings.setdefault("model_max_batch_ms", 0.0)
    judge = create_judge("model", Settings(model_path=str(path), **settings))
    assert isinstance(judge, ModelJudge)
    return judge


def judge_once(judge: ModelJudge, item: EvalInput, metrics: Sequence[str] = (FAITH,)) -> JudgeResult:
    async def go() -> JudgeResult:
        try:
            return await judge.evaluate(item, metrics)
        finally:
            await judge.aclose()

    return asyncio.run(go())


def faith(judge: ModelJudge, answer: str, contexts: tuple[str, ...] = CONTEXTS, **kw: Any) -> Score:
    score = judge_once(judge, EvalInput("q", contexts, answer, **kw)).get(FAITH)
    assert score is not None
    return score


# --- scoring -------------------------------------------------------------------------------------


def test_grounded_sentence_scores_high_and_fabricated_one_low(model_dir: Path) -> None:
    answer = f"{GROUNDED} {FABRICATED}"
    score = faith(make_judge(model_dir), answer)

    good, bad = score.sentences
    assert answer[good.start:good.end] == GROUNDED
    assert answer[bad.start:bad.end] == FABRICATED
    assert good.value > 0.9
    assert bad.value < 0.1
    # the share of supported sentences, as the local judge counts it
    assert score.value == 0.5
    assert f'unsupported: "{FABRICATED}"' in score.explanation
    assert 'closest passage: "Paris is the capital of France."' in bad.reason
    assert "1/2 sentences supported (entailment >= 0.5)" in score.explanation


def test_a_fully_grounded_answer_passes_and_labels_pass(model_dir: Path) -> None:
    score = faith(make_judge(model_dir), "Paris is the capital of France. Bananas are yellow fruit.")
    assert score.value == 1.0
    assert score.with_label(0.7).label == "pass"
    assert "unsupported" not in score.explanation


def test_a_sentence_is_supported_by_whichever_context_holds_it(model_dir: Path) -> None:
    # no single passage holds both facts: each sentence finds its own
    score = faith(make_judge(model_dir), "Bananas are grown in the tropics. Paris has two million inhabitants.")
    assert [s.value > 0.9 for s in score.sentences] == [True, True]


def test_sentence_offsets_are_relative_to_the_judged_text_with_a_prefix(model_dir: Path) -> None:
    answer = f"{FABRICATED} {GROUNDED}"
    item = EvalInput("q", CONTEXTS, answer, kind="checkpoint", prefix="Here is what I found. ", offset=22)
    score = judge_once(make_judge(model_dir), item).get(FAITH)
    assert score is not None
    assert [answer[s.start:s.end] for s in score.sentences] == [FABRICATED, GROUNDED]
    shifted = score.with_label(0.7, shift=item.offset)
    assert shifted.label == "fail"
    assert [s.label for s in shifted.sentences] == ["fail", "pass"]


def test_questions_and_filler_count_neither_way(model_dir: Path) -> None:
    score = faith(make_judge(model_dir), f"Here is what I found. {GROUNDED} What is the capital of Germany?")
    assert len(score.sentences) == 1
    assert score.value == 1.0


def test_only_filler_is_skipped_as_no_claims(model_dir: Path) -> None:
    score = faith(make_judge(model_dir), "Here is what I found.")
    assert score.value is None and score.skipped == "no_claims"


def test_a_checkpoint_leaves_an_unfinished_last_sentence_to_the_next_one(model_dir: Path) -> None:
    answer = f"{GROUNDED} Berlin hosts the"
    item = EvalInput("q", CONTEXTS, answer, kind="checkpoint")
    score = judge_once(make_judge(model_dir), item).get(FAITH)
    assert score is not None and len(score.sentences) == 1 and score.value == 1.0
    # the final pass judges all of it
    final = faith(make_judge(model_dir), answer)
    assert len(final.sentences) == 2 and final.value == 0.5


def test_a_pronoun_is_read_with_the_sentence_before_it(model_dir: Path) -> None:
    contexts = ("The Eiffel tower stands in Paris. The Eiffel tower opened in 1889.",)
    alone = faith(make_judge(model_dir), "It opened in 1889.", contexts)
    assert alone.sentences[0].value < 0.1  # "it" is unresolved without the earlier sentence

    after = faith(make_judge(model_dir), "The Eiffel tower stands in Paris. It opened in 1889.", contexts)
    assert [s.value > 0.9 for s in after.sentences] == [True, True]
    assert "read with the sentence before it" in after.sentences[1].reason

    # at a checkpoint the sentence before comes from the prefix, which is not scored again
    item = EvalInput("q", contexts, "It opened in 1889.", kind="checkpoint",
                     prefix="The Eiffel tower stands in Paris. ", offset=34)
    score = judge_once(make_judge(model_dir), item).get(FAITH)
    assert score is not None and len(score.sentences) == 1
    assert score.sentences[0].value > 0.9


def test_the_earlier_sentence_does_not_vouch_for_a_wrong_pronoun_claim(model_dir: Path) -> None:
    contexts = ("The Eiffel tower stands in Paris. The Eiffel tower opened in 1889.",)
    score = faith(make_judge(model_dir), "The Eiffel tower stands in Paris. It opened in 1887.", contexts)
    assert score.sentences[1].value < 0.1
    assert score.value == 0.5


def test_a_long_context_is_split_into_windows_and_the_best_one_counts(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "short", max_position_embeddings=24)
    filler = " ".join(["Bananas are yellow fruit grown in the tropics."] * 6)
    contexts = (f"{filler} The Eiffel tower opened in 1889. {filler}",)
    judge = make_judge(path)
    score = faith(judge, "The Eiffel tower opened in 1889.", contexts)
    assert judge.runtime.spec.max_length == 24
    assert score.sentences[0].value > 0.9
    assert "cut" not in score.explanation
    assert judge.runtime.stats.pairs > 5  # many windows, one of which holds the fact


@pytest.mark.parametrize("width", [4, 11, 24, 100])
@pytest.mark.parametrize("claim", [1, 3, 7, 40])
def test_windows_cover_every_passage_as_long_as_the_claim(width: int, claim: int) -> None:
    from streamjudge.judging.judges._model_runtime import _windows

    span = min(claim, width // 2)
    for n in range(1, 3 * width + 5):
        windows = _windows(n, width, claim)
        assert windows[0][0] == 0 and windows[-1][1] == n
        assert all(b - a == min(width, n) for a, b in windows)
        for start in range(0, n - span + 1):
            assert any(a <= start and start + span <= b for a, b in windows), (n, start)


def test_a_claim_longer_than_half_the_window_is_cut_and_says_so(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "short", max_position_embeddings=24)
    claim = "Paris is the capital of France and Paris has about two million inhabitants and Paris is the capital."
    judge = make_judge(path)
    score = faith(judge, claim)
    assert "cut to fit the model's 24-token window" in score.explanation
    assert "sentence cut by" in score.sentences[0].reason
    assert judge.runtime.stats.truncated_claims == 1


def test_max_length_setting_caps_the_window_and_tokenizer_config_is_read(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "m", max_position_embeddings=514, model_type="roberta",
                           tokenizer_config={"model_max_length": 1e30})
    assert make_judge(path).runtime.spec.max_length == 512  # RoBERTa's 2 offset positions, 1e30 ignored
    path2 = build_model_dir(tmp_path / "m2", tokenizer_config={"model_max_length": 64})
    assert make_judge(path2).runtime.spec.max_length == 64
    assert make_judge(path2, model_max_length=32).runtime.spec.max_length == 32
    assert make_judge(path2, model_max_length=4096).runtime.spec.max_length == 64


def test_a_graph_with_a_static_sequence_length_gets_inputs_padded_to_it(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "static", static_sequence=20)  # config says 128, the graph 20
    judge = make_judge(path)
    filler = " ".join(["Bananas are yellow fruit grown in the tropics."] * 3)
    score = faith(judge, f"{GROUNDED} {FABRICATED}", (f"{filler} Paris is the capital of France.",))
    assert judge.runtime.max_length == 20
    assert [s.value > 0.5 for s in score.sentences] == [True, False]
    assert judge.runtime.stats.pairs > 2  # the context was windowed to the graph's 20 tokens


def test_roberta_style_graph_without_token_type_ids(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "rob", token_types=False)
    score = faith(make_judge(path), f"{GROUNDED} {FABRICATED}")
    assert [s.value > 0.5 for s in score.sentences] == [True, False]


def test_a_prompt_template_model_reads_one_text_with_both_in_it(tmp_path: Path) -> None:
    # HHEM-2.1 style: config.json's prompt puts premise and hypothesis into one text. This template ends
    # with a word of its own, which the tiny model reads as part of the hypothesis
    prompt = "premise : {text1} [SEP] {text2} france"
    path = build_model_dir(tmp_path / "prompted", token_types=False, labels={0: "hallucinated", 1: "consistent"},
                           prompt=prompt, max_position_embeddings=24)
    judge = make_judge(path)
    assert judge.runtime.spec.prompt == prompt
    filler = " ".join(["Bananas are yellow fruit grown in the tropics."] * 4)
    contexts = (f"{filler} Paris is the capital of France. {filler}",)
    score = faith(judge, f"{GROUNDED} {FABRICATED}", contexts)
    assert [s.value > 0.5 for s in score.sentences] == [True, False]
    # the template is what the model reads: without "France" in the context, its own word is unsupported
    alone = faith(make_judge(path), "Bananas are yellow fruit.", ("Bananas are yellow fruit grown in the tropics.",))
    assert alone.sentences[0].value < 0.1


def test_a_prompt_without_both_placeholders_is_a_config_error(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "bad-prompt", prompt="premise: {premise} hypothesis: {hypothesis}")
    with pytest.raises(ConfigError, match=r"'prompt' must be a template holding \{text1\}"):
        make_judge(path)


# --- label mappings ------------------------------------------------------------------------------


def test_single_logit_detector_scores_through_a_sigmoid(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "hhem", labels={0: "LABEL_0"})
    judge = make_judge(path)
    assert judge.runtime.spec.mode == "sigmoid"
    score = faith(judge, f"{GROUNDED} {FABRICATED}")
    good, bad = score.sentences
    assert good.value > 0.9 and bad.value < 0.1


def test_single_logit_named_as_hallucination_is_inverted(tmp_path: Path) -> None:
    # this detector's logit says "hallucinated": high when words are missing
    path = build_model_dir(tmp_path / "hal", labels={0: "hallucinated"}, single_logit_slope=6.0,
                           single_logit_bias=-3.0)
    judge = make_judge(path)
    assert judge.runtime.spec.mode == "sigmoid_inverted"
    score = faith(judge, f"{GROUNDED} {FABRICATED}")
    assert [s.value > 0.5 for s in score.sentences] == [True, False]


def test_consistent_label_of_a_two_class_detector(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "two", labels={0: "inconsistent", 1: "consistent"})
    judge = make_judge(path)
    assert judge.runtime.spec.label == "consistent"
    score = faith(judge, f"{GROUNDED} {FABRICATED}")
    assert [s.value > 0.5 for s in score.sentences] == [True, False]
    assert "(consistent >= 0.5)" in score.explanation


def test_not_entailment_is_not_taken_for_entailment(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "rte", labels={0: "not_entailment", 1: "entailment"})
    judge = make_judge(path)
    assert judge.runtime.spec.positive == 1
    score = faith(judge, f"{GROUNDED} {FABRICATED}")
    assert [s.value > 0.5 for s in score.sentences] == [True, False]


def test_labels_without_an_entailment_like_name_are_a_config_error(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "odd", labels={0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(ConfigError, match=r"none of the labels \['LABEL_0', 'LABEL_1'\] means entailment"):
        make_judge(path)


# --- configuration and loading errors ------------------------------------------------------------


def test_missing_model_path_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="STREAMJUDGE_MODEL_PATH"):
        create_judge("model", Settings())


def test_missing_files_are_named(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "m")
    (path / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"has no tokenizer\.json"):
        make_judge(path)
    path2 = build_model_dir(tmp_path / "no-onnx", onnx_file=False)
    with pytest.raises(ConfigError, match=r"no model\.onnx"):
        make_judge(path2, model_backend="onnx")
    with pytest.raises(ConfigError, match="does not exist"):
        make_judge(tmp_path / "nowhere")


def test_bad_option_values_name_their_variable(model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"model_batch_size=0: expected an integer >= 1 .*STREAMJUDGE_MODEL_BATCH_SIZE"):
        make_judge(model_dir, model_batch_size=0)
    with pytest.raises(ConfigError, match=r"model_backend='tensorflow': .*STREAMJUDGE_MODEL_BACKEND"):
        make_judge(model_dir, model_backend="tensorflow")
    with pytest.raises(ConfigError, match="STREAMJUDGE_MODEL_THREADS"):
        load_settings({"STREAMJUDGE_MODEL_THREADS": "two"})


def test_settings_come_from_the_environment(model_dir: Path) -> None:
    s = load_settings({
        "STREAMJUDGE_JUDGE": "model",
        "STREAMJUDGE_CHECKPOINT_JUDGE": "local",
        "STREAMJUDGE_MODEL_PATH": str(model_dir),
        "STREAMJUDGE_MODEL_BATCH_SIZE": "8",
        "STREAMJUDGE_MODEL_MAX_BATCH_MS": "2.5",
        "STREAMJUDGE_MODEL_THREADS": "2",
    })
    assert (s.model_batch_size, s.model_max_batch_ms, s.model_threads) == (8, 2.5, 2)
    assert create_judge(s.checkpoint_judge_name, s, tier="checkpoint").name == "local"
    judge = create_judge(s.judge, s, tier="final")
    assert judge.name == "model"
    assert isinstance(judge, ModelJudge) and judge.runtime.batch_size == 8
    asyncio.run(judge.aclose())


def test_a_hub_id_without_huggingface_hub_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"needs huggingface_hub .*STREAMJUDGE_MODEL_PATH"):
        create_judge("model", Settings(model_path="someorg/some-nli-model"))


def test_a_model_that_cannot_load_raises_judge_error_and_the_pool_records_it(model_dir: Path) -> None:
    (model_dir / "model.onnx").write_bytes(b"not an onnx graph")
    judge = make_judge(model_dir)
    with pytest.raises(JudgeError, match="ONNX Runtime cannot load"):
        judge_once(judge, EvalInput("q", CONTEXTS, GROUNDED))

    judge2 = make_judge(model_dir)
    outcomes: list[JobOutcome] = []
    done = threading.Event()
    pool = JudgePool(concurrency=1, max_retries=0)
    try:
        pool.submit(JudgeJob(judge2, EvalInput("q", CONTEXTS, GROUNDED), (FAITH,),
                             lambda o: (outcomes.append(o), done.set())))
        assert done.wait(30)
    finally:
        pool.shutdown(5_000)
    assert outcomes[0].status == "error"
    assert "ONNX Runtime cannot load" in (outcomes[0].error or "")


def test_metrics_it_cannot_compute_are_skipped_and_recall_is_scored(model_dir: Path) -> None:
    item = EvalInput("What is the capital?", CONTEXTS, GROUNDED,
                     reference=f"{GROUNDED} Berlin is the capital of Germany.")
    result = judge_once(make_judge(model_dir), item,
                        (FAITH, semconv.ANSWER_RELEVANCY, semconv.CONTEXT_PRECISION, semconv.CONTEXT_RECALL))
    assert [s.name for s in result.scores] == [FAITH, semconv.ANSWER_RELEVANCY, semconv.CONTEXT_PRECISION,
                                               semconv.CONTEXT_RECALL]
    assert result.scores[1].skipped == result.scores[2].skipped == "unsupported_metric"
    recall = result.get(semconv.CONTEXT_RECALL)
    assert recall is not None and recall.value == 0.5 and recall.sentences == ()
    assert "1/2 reference sentences supported" in recall.explanation


def test_no_contexts_and_empty_answer_are_skips(model_dir: Path) -> None:
    judge = make_judge(model_dir)
    assert faith(judge, GROUNDED, contexts=("  ",)).skipped == "no_contexts"
    assert faith(make_judge(model_dir), " ").skipped == "empty_answer"


# --- batching, back-pressure, deadlines ------------------------------------------------------------


def test_concurrent_evaluations_share_batches_and_get_their_own_results(model_dir: Path) -> None:
    answers = [f"{GROUNDED} {FABRICATED}", GROUNDED, FABRICATED, "Bananas are yellow fruit."] * 4
    # 40 pairs (10 sentences x 2 contexts, 4 times) in batches of 8 that wait up to 10 s to fill: all 16
    # requests arrive long before, so every batch is full and mixes requests
    judge = make_judge(model_dir, model_batch_size=8, model_max_batch_ms=10_000.0)
    alone = make_judge(model_dir, model_batch_size=1)

    async def go() -> tuple[list[JudgeResult], list[JudgeResult]]:
        try:
            together = await asyncio.gather(*(judge.evaluate(EvalInput("q", CONTEXTS, a), (FAITH,))
                                              for a in answers))
            one_by_one = [await alone.evaluate(EvalInput("q", CONTEXTS, a), (FAITH,)) for a in answers]
            return list(together), one_by_one
        finally:
            await judge.aclose()
            await alone.aclose()

    together, one_by_one = asyncio.run(go())
    assert judge.runtime.stats.requests == 16
    assert judge.runtime.stats.pairs == 40
    assert judge.runtime.stats.batches == 5
    assert judge.runtime.stats.largest_batch == 8
    assert alone.runtime.stats.largest_batch == 1
    for a, b in zip(together, one_by_one, strict=True):
        assert [s.value for s in a.scores[0].sentences] == pytest.approx([s.value for s in b.scores[0].sentences])
        assert a.scores[0].value == b.scores[0].value


def test_both_tiers_share_one_runtime_until_the_last_closes(model_dir: Path) -> None:
    settings = Settings(judge="model", checkpoint_judge="model", model_path=str(model_dir))
    final = create_judge("model", settings, tier="final")
    checkpoint = create_judge("model", settings, tier="checkpoint")
    assert isinstance(final, ModelJudge) and isinstance(checkpoint, ModelJudge)
    assert final.runtime is checkpoint.runtime
    judge_once(final, EvalInput("q", CONTEXTS, GROUNDED))  # closes `final`
    score = judge_once(checkpoint, EvalInput("q", CONTEXTS, GROUNDED)).get(FAITH)
    assert score is not None and score.value == 1.0
    # all users gone: a new judge gets a fresh runtime
    again = create_judge("model", settings)
    assert isinstance(again, ModelJudge) and again.runtime is not final.runtime
    asyncio.run(again.aclose())


@pytest.fixture
def slow_filling_judge(model_dir: Path) -> Iterator[ModelJudge]:
    # a batch waits up to 60 s to fill, so a first request stays pending for as long as the test needs
    judge = make_judge(model_dir, model_batch_size=1000, model_max_batch_ms=60_000.0, model_queue_size=2)
    yield judge
    asyncio.run(judge.aclose())


async def queued(judge: ModelJudge, claims: int) -> None:
    """Return once ``claims`` claims wait in the judge's runtime (the evaluate task has submitted them)."""
    for _ in range(10_000):
        if judge.runtime.pending_claims == claims:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{judge.runtime.pending_claims} claims pending, expected {claims}")


def test_a_full_queue_is_a_skip_not_an_exception(slow_filling_judge: ModelJudge) -> None:
    judge = slow_filling_judge

    async def go() -> tuple[Score | None, BaseException | None]:
        first = asyncio.ensure_future(judge.evaluate(EvalInput("q", CONTEXTS, f"{GROUNDED} {FABRICATED}"),
                                                     (FAITH,)))
        await queued(judge, 2)
        second = await judge.evaluate(EvalInput("q", CONTEXTS, GROUNDED), (FAITH,))
        first.cancel()
        err = None
        try:
            await first
        except asyncio.CancelledError as exc:
            err = exc
        return second.get(FAITH), err

    score, err = asyncio.run(go())
    assert score is not None and score.skipped == "model_queue_full" and score.value is None
    assert "STREAMJUDGE_MODEL_QUEUE_SIZE=2" in score.explanation
    assert isinstance(err, asyncio.CancelledError)


def test_a_cancelled_evaluation_gives_its_queue_places_back(slow_filling_judge: ModelJudge) -> None:
    judge = slow_filling_judge
    freed = threading.Event()

    async def go() -> Score | None:
        task = asyncio.ensure_future(judge.evaluate(EvalInput("q", CONTEXTS, f"{GROUNDED} {GROUNDED}"),
                                                    (FAITH,)))
        await queued(judge, 2)
        task.cancel()  # what the pool's per-call timeout does
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(2000):  # the worker drops the pairs once woken
            if judge.runtime.pending_claims == 0:
                freed.set()
                break
            await asyncio.sleep(0.005)
        return None

    asyncio.run(go())
    assert freed.is_set()
    assert judge.runtime.stats.batches == 0  # the cancelled pairs never ran


def test_claims_past_their_deadline_are_skipped_before_they_run(model_dir: Path) -> None:
    runtime_judge = make_judge(model_dir)
    late = ModelJudge(runtime_judge.runtime, timeout_s=-1.0)  # every deadline is already over
    score = judge_once(late, EvalInput("q", CONTEXTS, GROUNDED)).get(FAITH)
    assert score is not None and score.skipped == "model_timeout"
    assert runtime_judge.runtime.stats.pairs == 0
    asyncio.run(runtime_judge.aclose())


def test_a_batch_running_past_every_deadline_in_it_is_stopped(tmp_path: Path) -> None:
    # ~4 s of MatMuls uninterrupted; the claims' deadline is 0.3 s after they are queued
    path = build_slow_model_dir(tmp_path / "slow", nodes=150)
    judge = make_judge(path, judge_timeout_s=0.3)
    judge.runtime.preload()  # loaded before the clock starts, so the batch starts before the deadline
    score = judge_once(judge, EvalInput("q", CONTEXTS, GROUNDED)).get(FAITH)
    assert score is not None and score.skipped == "model_timeout"
    assert "was stopped" in score.explanation  # stopped midway, not dropped before it ran
    assert judge.runtime.stats.batches == 0


def test_shutdown_fails_pending_claims_with_a_judge_error(slow_filling_judge: ModelJudge) -> None:
    judge = slow_filling_judge

    async def go() -> None:
        task = asyncio.ensure_future(judge.evaluate(EvalInput("q", CONTEXTS, GROUNDED), (FAITH,)))
        await queued(judge, 1)
        await asyncio.to_thread(judge.runtime.shutdown)
        with pytest.raises(JudgeError, match="shut down before the claims were scored"):
            await task

    asyncio.run(go())


# --- optional paths ---------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="torch and transformers are not installed (the torch backend is optional)")
def test_torch_backend_scores_a_transformers_model(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    path = build_model_dir(tmp_path / "bert", onnx_file=False)
    config = BertConfig(vocab_size=len(vocabulary()), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128, num_labels=3,
                        id2label={0: "contradiction", 1: "neutral", 2: "entailment"},
                        label2id={"contradiction": 0, "neutral": 1, "entailment": 2})
    BertForSequenceClassification(config).save_pretrained(str(path))
    judge = make_judge(path, model_backend="torch")
    score = faith(judge, f"{GROUNDED} {FABRICATED}")
    assert len(score.sentences) == 2
    assert all(0.0 <= s.value <= 1.0 for s in score.sentences)  # random weights: only the path is tested


REAL_MODEL = os.environ.get("STREAMJUDGE_TEST_MODEL_PATH")


@pytest.mark.skipif(not REAL_MODEL, reason="STREAMJUDGE_TEST_MODEL_PATH names no real NLI/HHEM model directory")
def test_a_real_model_tells_grounded_from_fabricated() -> None:
    judge = create_judge("model", Settings(model_path=REAL_MODEL))
    assert isinstance(judge, ModelJudge)
    contexts = ("The Eiffel Tower in Paris was completed in 1889 and is 330 metres tall.",)
    item = EvalInput("q", contexts, "The Eiffel Tower was completed in 1889. It is located in Berlin.")
    score = judge_once(judge, item).get(FAITH)
    assert score is not None and len(score.sentences) == 2
    grounded, fabricated = score.sentences
    assert grounded.value > fabricated.value
    assert fabricated.value < 0.5


def test_tiers_local_on_checkpoints_and_the_model_on_the_final_pass(model_dir: Path) -> None:
    exporter = InMemorySpanExporter()
    settings = load_settings({
        "STREAMJUDGE_CHECKPOINT_JUDGE": "local",
        "STREAMJUDGE_JUDGE": "model",
        "STREAMJUDGE_MODEL_PATH": str(model_dir),
        "STREAMJUDGE_FINAL_METRICS": "faithfulness",
    })
    rt = streamjudge.configure(settings, downstream=SimpleSpanProcessor(exporter), set_global=False)

    async def words() -> Any:
        for w in f"{GROUNDED} {FABRICATED}".split(" "):
            yield w + " "
            await asyncio.sleep(0.002)

    async def go() -> list[Any]:
        return [ev async for ev in streamjudge.guard(words(), question="q", contexts=list(CONTEXTS))]

    try:
        events = asyncio.run(go())
        assert rt.force_flush(10_000)
        spans = exporter.get_finished_spans()
    finally:
        rt.shutdown()
    assert events[-1].type == "done"
    judges = {s.name: s.attributes.get(semconv.EVAL_JUDGE) for s in spans if semconv.EVAL_JUDGE in s.attributes}
    assert judges == {semconv.SPAN_CHECKPOINT: "local", semconv.SPAN_STREAM: "model"}
    final = next(s for s in spans if s.name == semconv.SPAN_STREAM)
    assert final.attributes["streamjudge.eval.faithfulness.score"] == 0.5
    assert final.attributes["streamjudge.eval.faithfulness.label"] == "fail"


def test_an_unusable_model_setting_falls_back_to_the_local_judge_not_a_crash(tmp_path: Path) -> None:
    settings = Settings(judge="model", model_path=str(tmp_path / "missing"))
    rt = streamjudge.configure(settings, downstream=SimpleSpanProcessor(InMemorySpanExporter()),
                               set_global=False)
    try:
        assert rt.judge_for("answer").name == "local"
    finally:
        rt.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_worker_process_rebuilds_the_runtime(model_dir: Path) -> None:
    judge = make_judge(model_dir)
    item = EvalInput("q", CONTEXTS, f"{GROUNDED} {FABRICATED}")
    parent = asyncio.run(judge.evaluate(item, (FAITH,))).scores[0].value
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker thread and session are gone
        try:
            value = asyncio.run(judge.evaluate(item, (FAITH,))).scores[0].value
            os.write(write, repr(value).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        got = os.read(read, 100).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
        asyncio.run(judge.aclose())
    assert parent == 0.5
    assert got == "0.5"


_HUB_SCRIPT = """
import asyncio, sys
from streamjudge.config import ConfigError, Settings
from streamjudge.judging.base import EvalInput
from streamjudge.judging.judges import create_judge
try:
    judge = create_judge("model", Settings(model_path=sys.argv[1]))
except ConfigError as exc:
    print("ConfigError:", exc)
    raise SystemExit(0)
item = EvalInput("q", ("Paris is the capital of France.",), "Paris is the capital of France.")
print(judge.runtime.spec.directory)
print(asyncio.run(judge.evaluate(item, ["faithfulness"])).scores[0].value)
"""


@pytest.mark.skipif(importlib.util.find_spec("huggingface_hub") is None, reason="huggingface_hub is not installed")
def test_a_hub_id_is_resolved_through_snapshot_download(tmp_path: Path) -> None:
    import subprocess

    # a hub cache holding the tiny model, read by huggingface_hub itself in offline mode (no network here)
    repo = tmp_path / "hub" / "models--someorg--tiny-nli"
    revision = "0123456789abcdef0123456789abcdef01234567"
    build_model_dir(repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def run(model_id: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _HUB_SCRIPT, model_id], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        return out.stdout.strip().splitlines()

    directory, value = run("someorg/tiny-nli")
    assert directory == str(repo / "snapshots" / revision)
    assert value == "1.0"
    (message,) = run("someorg/not-cached")
    assert message.startswith("ConfigError: STREAMJUDGE_MODEL_PATH='someorg/not-cached': cannot fetch model")
