"""Judges for worker processes in tests, named by ``STREAMJUDGE_JUDGE=worker_judges:ClassName``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from streamjudge.results import EvalInput, JudgeResult


class HangingJudge:
    """A judge whose call never comes back within a test (a stuck LLM endpoint): only the pool's
    shutdown deadline ends it."""

    name = "hanging"

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        return None
