"""A final-pass judge that takes ``SLOW_JUDGE_SECONDS`` (default 60) per answer: the judgement is still
running when the process is told to stop. Checkpoints use the local judge (``STREAMJUDGE_CHECKPOINT_JUDGE``).

Used as ``STREAMJUDGE_JUDGE=instrumentation.slow_judge:SlowJudge`` with ``tests`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from streamjudge.judging.base import EvalInput, JudgeResult, Score


class SlowJudge:
    name = "slow"

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        await asyncio.sleep(float(os.environ.get("SLOW_JUDGE_SECONDS", "60")))
        return JudgeResult(self.name, tuple(Score(m, 1.0, "pass") for m in metrics))

    async def aclose(self) -> None:
        return None
