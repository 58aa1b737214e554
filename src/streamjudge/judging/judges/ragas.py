"""The ``ragas`` judge: ragas 0.4 ``ragas.metrics.collections`` metrics scored with ``ascore``.

Faithfulness, ContextPrecisionWithoutReference, AnswerRelevancy (needs embeddings) and ContextRecall (only
with a reference). The LLM goes through ragas' own interface (``llm_factory``, instructor underneath)
around one shared async SDK client; embeddings through ragas' modern embeddings interface against the same
endpoint's ``/v1/embeddings``.

ragas is imported when the judge is built, never when streamjudge is imported. Its telemetry is switched
off first: it sends a synchronous POST from inside the event loop otherwise.

Injection resistance: ragas' prompts embed the answer as plain JSON, so the judge fences the question,
answer, contexts and reference itself, puts the fence rule in front of every prompt, and fences the
statements ragas extracts from the answer before they come back into the next prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

from streamjudge import semconv
from streamjudge.config import JudgeLLMSettings, Settings
from streamjudge.judging.base import EvalInput, JudgeError, JudgeResult, Score, TransientJudgeError
from streamjudge.judging.judges._clients import (
    AnthropicChatClient,
    OpenAIChatClient,
    make_chat_client,
    map_error,
    metering,
)
from streamjudge.judging.judges._prompts import DataFence
from streamjudge.judging.judges.llm import llm_settings_for, skip_reason

Tier = Literal["checkpoint", "final"]

DEFAULT_EMBEDDING_MODEL = "text-embedding-3-small"
#: instructor re-asks the model once when its answer does not match the schema
REASKS = 1


def _quiet_ragas() -> None:
    # forced, not defaulted: ragas' tracker posts synchronously from inside the event loop
    os.environ["RAGAS_DO_NOT_TRACK"] = "true"


def _fenced_llm_class() -> type:
    """A ragas LLM that delegates to ``llm_factory``'s LLM and keeps untrusted text fenced."""
    from ragas.llms.base import InstructorBaseRagasLLM

    class FencedRagasLLM(InstructorBaseRagasLLM):  # type: ignore[misc]
        def __init__(self, inner: Any, fence: DataFence) -> None:
            self.inner = inner
            self.fence = fence

        def generate(self, prompt: str, response_model: Any) -> Any:
            raise JudgeError("the ragas judge is async only; synchronous generate() is not used")

        async def agenerate(self, prompt: str, response_model: Any) -> Any:
            result = await self.inner.agenerate(f"{self.fence.rule()}\n\n{prompt}", response_model)
            if type(result).__name__ == "StatementGeneratorOutput":
                # extracted statements are derived from the answer: still untrusted in the next prompt
                result.statements = [self.fence.wrap(s, "statement") for s in result.statements]
            return result

    return FencedRagasLLM


class RagasJudge:
    """Judge with ragas' collection metrics.

    Build it with :meth:`from_settings`. ``strictness`` is the number of questions ragas' answer
    relevancy generates (one model call each).
    """

    name = "ragas"

    def __init__(self, llm: JudgeLLMSettings, *, strictness: int = 3,
                 fence_factory: Callable[[], DataFence] = DataFence) -> None:
        _quiet_ragas()
        try:
            from ragas.embeddings.base import embedding_factory
            from ragas.llms.base import llm_factory
            from ragas.metrics import collections as rc
        except Exception as exc:  # a broken optional install must not break the app: say what to do
            raise JudgeError(f"ragas cannot be imported ({exc}); pip install 'streamjudge[ragas]'") from exc
        self._rc = rc
        self._fence_factory = fence_factory
        self.strictness = strictness
        self.client: OpenAIChatClient | AnthropicChatClient = make_chat_client(llm)
        provider = "anthropic" if isinstance(self.client, AnthropicChatClient) else "openai"
        # one instructor-patched LLM around the one shared SDK client; the SDK does not retry (the pool does)
        # max_retries is instructor's re-ask on an answer that fails the schema (one repair attempt);
        # transport errors are not retried here: the pool does that
        self._llm = llm_factory(self.client.model, provider=provider, client=self.client.sdk,
                                max_retries=REASKS)
        if provider == "anthropic":
            # ragas sends temperature/top_p, which recent Anthropic SDKs no longer accept
            sdk: Any = self.client.sdk
            inner: Any = self._llm
            accepted = inspect.signature(sdk.messages.create).parameters
            for arg in ("temperature", "top_p"):
                if arg not in accepted:
                    inner.model_args.pop(arg, None)
        self._fenced = _fenced_llm_class()
        self._embeddings: Any = None
        if provider == "openai":
            self._embeddings = embedding_factory(
                "openai", model=llm.embedding_model or DEFAULT_EMBEDDING_MODEL, client=self.client.sdk,
                interface="modern",
            )

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier = "final") -> RagasJudge:
        """A judge on the checkpoint or final judge-LLM settings."""
        return cls(llm_settings_for(settings, tier))

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item``; metrics run concurrently, each with fresh ragas metric objects."""
        wanted = list(dict.fromkeys(metrics))
        fence = self._fence_factory()
        llm = self._fenced(self._llm, fence)
        question = fence.wrap(item.question, "question")
        answer = fence.wrap(item.answer, "answer")
        contexts = [fence.wrap(c, f"context {i}") for i, c in enumerate(item.contexts, 1)]
        reference = fence.wrap(item.reference or "", "reference")
        rc = self._rc
        scores: dict[str, Score] = {}
        runs: dict[str, Any] = {}
        for metric in wanted:
            reason = skip_reason(metric, item)
            if metric == semconv.CONTEXT_PRECISION and not reason and not item.answer.strip():
                reason = "no_answer"  # ragas' reference-free context precision judges against the answer
            if reason:
                scores[metric] = Score(metric, None, skipped=reason)
            elif metric == semconv.FAITHFULNESS:
                runs[metric] = rc.Faithfulness(llm=llm).ascore(
                    user_input=question, response=answer, retrieved_contexts=contexts)
            elif metric == semconv.CONTEXT_PRECISION:
                runs[metric] = rc.ContextPrecisionWithoutReference(llm=llm).ascore(
                    user_input=question, response=answer, retrieved_contexts=contexts)
            elif metric == semconv.ANSWER_RELEVANCY:
                if self._embeddings is None:
                    scores[metric] = Score(metric, None, skipped="no_embeddings")
                    continue
                runs[metric] = rc.AnswerRelevancy(llm=llm, embeddings=self._embeddings,
                                                  strictness=self.strictness).ascore(
                    user_input=question, response=answer)
            elif metric == semconv.CONTEXT_RECALL:
                runs[metric] = rc.ContextRecall(llm=llm).ascore(
                    user_input=question, retrieved_contexts=contexts, reference=reference)
            else:
                scores[metric] = Score(metric, None, skipped="unsupported_metric")
        with metering() as meter:
            results = await asyncio.gather(*runs.values(), return_exceptions=True)
        errors: list[JudgeError] = []
        for metric, res in zip(runs, results, strict=True):
            if isinstance(res, asyncio.CancelledError):
                raise res
            if isinstance(res, BaseException):
                err = map_error(res, where="ragas")
                if isinstance(err, TransientJudgeError):
                    raise err from res
                errors.append(err)
                scores[metric] = Score(metric, None, skipped=f"judge_error: {err}"[:300])
                continue
            value = float(getattr(res, "value", res))
            if math.isnan(value):
                scores[metric] = Score(metric, None, skipped="no_statements")
            else:
                scores[metric] = Score(metric, min(1.0, max(0.0, value)), explanation="ragas")
        if errors and len(errors) == len(runs):
            raise errors[0]
        return JudgeResult(self.name, tuple(scores[m] for m in wanted), meter.snapshot())

    async def aclose(self) -> None:
        """Close the shared SDK client."""
        await self.client.aclose()
