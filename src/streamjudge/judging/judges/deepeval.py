"""The ``deepeval`` judge: deepeval 4 metrics scored with ``a_measure``.

FaithfulnessMetric (faithfulness), AnswerRelevancyMetric (answer relevancy), ContextualRelevancyMetric
(context precision: deepeval's reference-free context metric), ContextualRecallMetric (context recall,
only with a reference) and GEval rubrics (metrics named after the rubric).

- A fresh metric instance per call: deepeval metrics keep state on the instance, and sharing one across
  concurrent tasks mixes their verdicts.
- Only ``a_measure``: sync ``measure()`` applies nest_asyncio to the running loop, globally.
- The model is a :class:`DeepEvalBaseLLM` subclass backed by our async chat client (JSON mode, repair,
  error mapping, usage); deepeval's own provider classes are never built.
- deepeval is imported when the judge is built; its telemetry and its ``.env`` loading are switched off
  before that.

Injection resistance: the judge fences the question, answer, contexts and reference; the model wrapper
puts the fence rule in every system prompt and fences the claims, truths and statements deepeval extracts
before they come back into the next prompt.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from streamjudge import semconv
from streamjudge.config import JudgeLLMSettings, Settings
from streamjudge.judging.base import EvalInput, JudgeError, JudgeResult, Score, TransientJudgeError
from streamjudge.judging.judges._clients import (
    ChatClient,
    make_chat_client,
    map_error,
    metering,
    parse_json_object,
)
from streamjudge.judging.judges._prompts import DataFence
from streamjudge.judging.judges.llm import llm_settings_for, skip_reason

Tier = Literal["checkpoint", "final"]

#: GEval rubrics available by default: metric name -> evaluation steps (given, so deepeval does not spend
#: a model call generating them).
DEFAULT_RUBRICS: Mapping[str, tuple[str, ...]] = {
    "geval_groundedness": (
        "Read the retrieval context and the actual output.",
        "Check every factual statement of the actual output against the retrieval context.",
        "Penalise statements the retrieval context does not support or contradicts.",
        "Give a high score only when all statements are supported.",
    ),
}

# schema class name -> (field holding text extracted from untrusted input, source label for the fence)
_REFENCE: dict[str, tuple[str, str]] = {
    "Claims": ("claims", "claim"),
    "Truths": ("truths", "truth"),
    "Statements": ("statements", "statement"),
}


def _quiet_deepeval() -> None:
    # forced before import: deepeval reads these when its settings module loads
    os.environ["DEEPEVAL_TELEMETRY_OPT_OUT"] = "1"
    os.environ["DEEPEVAL_DISABLE_DOTENV"] = "1"
    os.environ.setdefault("ERROR_REPORTING", "NO")


def _model_class() -> type:
    from deepeval.models import DeepEvalBaseLLM

    class StreamjudgeDeepEvalLLM(DeepEvalBaseLLM):  # type: ignore[misc,no-untyped-call]
        """deepeval model backed by streamjudge's async chat client; one per evaluation (holds the fence)."""

        def __init__(self, client: ChatClient, fence: DataFence) -> None:
            self.client = client
            self.fence = fence
            super().__init__(model=client.model)

        def load_model(self, *args: Any, **kwargs: Any) -> Any:
            return self.client

        def get_model_name(self, *args: Any, **kwargs: Any) -> str:
            return str(self.client.model)

        def generate(self, *args: Any, **kwargs: Any) -> str:
            raise JudgeError("the deepeval judge is async only; synchronous generate() is not used")

        async def a_generate(self, prompt: str, schema: Any = None, **kwargs: Any) -> Any:
            system = ("You are a careful evaluator that answers in JSON.\n" + self.fence.rule())
            text = await self.client.complete(system, str(prompt), json_mode=True)
            if schema is None:
                return text
            data = parse_json_object(text)
            try:
                result = schema.model_validate(data)
            except Exception as exc:  # pydantic ValidationError: the model ignored the schema
                raise JudgeError(
                    f"judge LLM answer does not follow deepeval's {schema.__name__} schema: "
                    f"keys {sorted(data)[:8]}"
                ) from exc
            refence = _REFENCE.get(schema.__name__)
            if refence:
                field, source = refence
                setattr(result, field, [self.fence.wrap(str(s), source) for s in getattr(result, field)])
            return result

    return StreamjudgeDeepEvalLLM


class DeepEvalJudge:
    """Judge with deepeval metrics. Build it with :meth:`from_settings`.

    ``include_reason`` adds deepeval's reason-generation call to each metric (one more model call).
    ``rubrics`` maps GEval metric names to evaluation steps.
    """

    name = "deepeval"

    def __init__(self, llm: JudgeLLMSettings, *, include_reason: bool = False,
                 rubrics: Mapping[str, Sequence[str]] | None = None,
                 fence_factory: Callable[[], DataFence] = DataFence) -> None:
        _quiet_deepeval()
        try:
            import deepeval.metrics as dm
            from deepeval.test_case import LLMTestCase, SingleTurnParams
        except Exception as exc:  # a broken optional install must not break the app: say what to do
            raise JudgeError(
                f"deepeval cannot be imported ({exc}); pip install 'streamjudge[deepeval]'"
            ) from exc
        self._dm = dm
        self._test_case = LLMTestCase
        self._params = SingleTurnParams
        self._model_cls = _model_class()
        self._fence_factory = fence_factory
        self.include_reason = include_reason
        self.rubrics: dict[str, tuple[str, ...]] = {
            k: tuple(v) for k, v in (DEFAULT_RUBRICS if rubrics is None else rubrics).items()}
        self.client = make_chat_client(llm)

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier = "final") -> DeepEvalJudge:
        """A judge on the checkpoint or final judge-LLM settings, with the configured GEval rubrics."""
        return cls(llm_settings_for(settings, tier), rubrics={**DEFAULT_RUBRICS, **settings.geval_rubrics})

    def _metric(self, metric: str, model: Any) -> Any:
        dm = self._dm
        common = {"model": model, "include_reason": self.include_reason, "async_mode": True,
                  "verbose_mode": False}
        if metric == semconv.FAITHFULNESS:
            return dm.FaithfulnessMetric(**common)
        if metric == semconv.ANSWER_RELEVANCY:
            return dm.AnswerRelevancyMetric(**common)
        if metric == semconv.CONTEXT_PRECISION:
            return dm.ContextualRelevancyMetric(**common)
        if metric == semconv.CONTEXT_RECALL:
            return dm.ContextualRecallMetric(**common)
        p = self._params
        return dm.GEval(name=metric, evaluation_steps=list(self.rubrics[metric]), model=model,
                        evaluation_params=[p.INPUT, p.ACTUAL_OUTPUT, p.RETRIEVAL_CONTEXT],
                        async_mode=True, verbose_mode=False)

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item``; one fresh deepeval metric per requested metric, run concurrently."""
        wanted = list(dict.fromkeys(metrics))
        fence = self._fence_factory()
        model = self._model_cls(self.client, fence)
        test_case = self._test_case(
            input=fence.wrap(item.question, "question"),
            actual_output=fence.wrap(item.answer, "answer"),
            retrieval_context=[fence.wrap(c, f"context {i}") for i, c in enumerate(item.contexts, 1)],
            expected_output=fence.wrap(item.reference, "reference") if item.reference else None,
        )
        scores: dict[str, Score] = {}
        runs: dict[str, Any] = {}
        for metric in wanted:
            known = metric in semconv_metrics() or metric in self.rubrics
            reason = skip_reason(metric, item) if metric in semconv_metrics() else None
            if metric in self.rubrics and not item.answer.strip():
                reason = "no_answer"
            if not known:
                scores[metric] = Score(metric, None, skipped="unsupported_metric")
            elif reason:
                scores[metric] = Score(metric, None, skipped=reason)
            else:
                runs[metric] = self._metric(metric, model)
        with metering() as meter:
            results = await asyncio.gather(
                *(m.a_measure(test_case, _show_indicator=False) for m in runs.values()),
                return_exceptions=True)
        errors: list[JudgeError] = []
        for (metric, m), res in zip(runs.items(), results, strict=True):
            if isinstance(res, asyncio.CancelledError):
                raise res
            if isinstance(res, BaseException):
                err = map_error(res, where="deepeval")
                if isinstance(err, TransientJudgeError):
                    raise err from res
                errors.append(err)
                scores[metric] = Score(metric, None, skipped=f"judge_error: {err}"[:300])
                continue
            value = getattr(m, "score", res)
            if value is None:
                scores[metric] = Score(metric, None, skipped="no_score")
                continue
            scores[metric] = Score(metric, min(1.0, max(0.0, float(value))),
                                   explanation=str(getattr(m, "reason", "") or "deepeval")[:300])
        if errors and len(errors) == len(runs):
            raise errors[0]
        return JudgeResult(self.name, tuple(scores[m] for m in wanted), meter.snapshot())

    async def aclose(self) -> None:
        """Close the chat client."""
        await self.client.aclose()


def semconv_metrics() -> tuple[str, ...]:
    """The standard metrics this judge maps onto deepeval metrics."""
    return (semconv.FAITHFULNESS, semconv.ANSWER_RELEVANCY, semconv.CONTEXT_PRECISION, semconv.CONTEXT_RECALL)
