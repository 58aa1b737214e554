"""Replay recorded answers through the real guard and judge processor, and compare alerts with expectations.

Each case is streamed in small chunks. The replay source waits for in-flight verdicts before it sends the
next chunk, so every checkpoint is judged (no coalescing) and results do not depend on machine speed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

import streamjudge
from streamjudge.config import Settings
from streamjudge.judging.guard import GuardedStream


class CaseError(ValueError):
    """A line of the cases file cannot be used; the message names the line."""


@dataclass(frozen=True, slots=True)
class ReplayCase:
    """One recorded answer."""

    id: str
    question: str
    contexts: tuple[str, ...]
    answer: str
    expect_alert: bool | None = None
    reference: str | None = None


@dataclass(slots=True)
class CaseResult:
    """What the guard did with one case."""

    case: ReplayCase
    fired: bool
    first_alert_char: int | None
    final: dict[str, float | None]
    alerts: int
    checkpoints: int
    verdict: str
    elapsed_ms: float
    warnings: list[str] = field(default_factory=list)
    #: lowest faithfulness score a checkpoint got below the replay's threshold (None: none was below)
    min_failing_score: float | None = None

    @property
    def passed(self) -> bool:
        """True when the alert expectation (if any) was met."""
        return self.case.expect_alert is None or self.case.expect_alert == self.fired

    def to_json(self) -> dict[str, Any]:
        """The JSON line printed by ``streamjudge replay --json``."""
        return {
            "id": self.case.id,
            "expect_alert": self.case.expect_alert,
            "fired": self.fired,
            "first_alert_char": self.first_alert_char,
            "final": self.final,
            "alerts": self.alerts,
            "checkpoints": self.checkpoints,
            "verdict": self.verdict,
            "passed": self.passed,
        }


def load_cases(path: str | Path) -> list[ReplayCase]:
    """Read a JSONL file of cases; raise :class:`CaseError` naming the line of a bad one."""
    cases: list[ReplayCase] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CaseError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise CaseError(f"{path}:{n}: expected a JSON object")
            cases.append(_case(obj, f"{path}:{n}", default_id=str(n)))
    return cases


def _case(obj: dict[str, Any], where: str, default_id: str) -> ReplayCase:
    answer = obj.get("answer")
    if not isinstance(answer, str):
        raise CaseError(f"{where}: 'answer' must be a string")
    contexts = obj.get("contexts", [])
    if isinstance(contexts, str):
        contexts = [contexts]
    if not isinstance(contexts, list) or not all(isinstance(c, str) for c in contexts):
        raise CaseError(f"{where}: 'contexts' must be a list of strings")
    question = obj.get("question", "")
    if not isinstance(question, str):
        raise CaseError(f"{where}: 'question' must be a string")
    expect = obj.get("expect_alert")
    if expect is not None and not isinstance(expect, bool):
        raise CaseError(f"{where}: 'expect_alert' must be true, false or absent")
    reference = obj.get("reference")
    return ReplayCase(
        id=str(obj.get("id", default_id)),
        question=question,
        contexts=tuple(contexts),
        answer=answer,
        expect_alert=expect,
        reference=reference if isinstance(reference, str) else None,
    )


async def _chunks(text: str, size: int, stream: list[GuardedStream]) -> AsyncIterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]
        # let every closed checkpoint get its verdict before the next chunk: deterministic replays. The
        # guard takes verdicts in (and `outstanding` down) only between tokens, so wait for the verdict to
        # be posted, not for it to be taken
        session = stream[0].session
        deadline = time.monotonic() + 30.0
        while session.outstanding and not session.has_events and time.monotonic() < deadline:
            await asyncio.sleep(0.0005)


async def replay_case(case: ReplayCase, *, chunk_size: int = 8) -> CaseResult:
    """Stream one case through the configured runtime and collect what happened."""
    holder: list[GuardedStream] = []
    stream = streamjudge.guard(
        _chunks(case.answer, chunk_size, holder),
        question=case.question,
        contexts=case.contexts,
        reference=case.reference,
    )
    holder.append(stream)
    t0 = time.perf_counter()
    summary: dict[str, Any] = {}
    warnings: list[str] = []
    low: float | None = None
    async for ev in stream:
        if ev.type == "warning" and ev.data and ev.data.get("stage") != "preflight":
            warnings.append(ev.text)
            score = ev.data.get("score")
            if isinstance(score, float | int):
                low = float(score) if low is None else min(low, float(score))
        elif ev.type == "done":
            summary = dict(ev.data or {})
    final = await asyncio.wrap_future(stream.final)
    scores = {s.name: s.value for s in final.scores} if final is not None else {}
    return CaseResult(
        case=case,
        fired=int(summary.get("alerts", 0)) > 0,
        first_alert_char=summary.get("first_alert_char"),
        final=scores,
        alerts=int(summary.get("alerts", 0)),
        checkpoints=int(summary.get("checkpoints", 0)),
        verdict=str(summary.get("verdict", "")),
        elapsed_ms=(time.perf_counter() - t0) * 1000,
        warnings=warnings,
        min_failing_score=low,
    )


def replay(
    cases: Iterable[ReplayCase],
    settings: Settings,
    *,
    chunk_size: int = 8,
    downstream: SpanProcessor | None = None,
) -> list[CaseResult]:
    """Replay ``cases`` with a runtime of their own (action ``flag``: every checkpoint is seen)."""
    from streamjudge.runtime import _Discard

    rt = streamjudge.configure(
        settings.replace(action="flag", preflight_action="warn"),
        downstream=downstream or _Discard(),
        set_global=False,
    )
    try:

        async def run_all() -> list[CaseResult]:
            return [await replay_case(c, chunk_size=chunk_size) for c in cases]

        return asyncio.run(run_all())
    finally:
        rt.shutdown()
