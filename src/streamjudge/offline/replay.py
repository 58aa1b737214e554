"""Replay recorded answers through the real guard and judge processor, and compare alerts with expectations.

Each case is streamed in small chunks. The replay source waits for in-flight verdicts before it sends the
next chunk, so every checkpoint is judged (no coalescing) and results do not depend on machine speed.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

import streamjudge
from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.judging.base import Judge
from streamjudge.judging.guard import GuardedStream

#: the fields of a case line
CASE_FIELDS: tuple[str, ...] = ("id", "question", "contexts", "answer", "expect_alert", "reference")
_FORMAT = (
    "expected JSON Lines: one object per line with 'answer', optional 'question', 'contexts' "
    "(list of strings), 'id', 'expect_alert' (true/false), 'reference'"
)


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
    #: each alert: metric, score, threshold, char range of the failing text, the judge's explanation
    alert_details: list[dict[str, Any]] = field(default_factory=list)
    #: the final reconciliation's explanation per metric (or why it was skipped)
    final_explanations: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when the alert expectation (if any) was met."""
        return self.case.expect_alert is None or self.case.expect_alert == self.fired

    @property
    def reason(self) -> str:
        """Why the case fired or stayed quiet, in one line."""
        if self.alert_details:
            first = self.alert_details[0]
            return f"{first['metric']} {first['score']:.2f} < {first['threshold']}: {first['explanation']}"
        if self.fired:
            return self.warnings[0] if self.warnings else "alert"
        faith = self.final.get(semconv.FAITHFULNESS)
        why = self.final_explanations.get(semconv.FAITHFULNESS, "")
        if faith is None:
            return f"no alert; faithfulness not scored ({why or 'skipped'})"
        return f"no alert; final faithfulness {faith:.2f}" + (f": {why}" if why else "")

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
            "reason": self.reason,
            "alert_details": self.alert_details,
            "explanations": self.final_explanations,
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


def load_cases(path: str | Path) -> list[ReplayCase]:
    """Read a JSONL file of cases; raise :class:`CaseError` naming the line of a bad one.

    A file with no case, a JSON array instead of JSON Lines, and a misspelt field (``context`` for
    ``contexts``) are errors that say so.
    """
    cases: list[ReplayCase] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if text.lstrip().startswith("["):
        raise CaseError(
            f"{path}: the file is a JSON array; replay reads JSON Lines, one case object per line "
            f"(convert it with: jq -c '.[]' {path} > cases.jsonl)"
        )
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            pretty = line.strip() in ("{", "}") or line.lstrip().startswith('"')
            hint = "; a case must fit on one line" if pretty else ""
            raise CaseError(f"{path}:{n}: not valid JSON ({msg}){hint}; {_FORMAT}") from None
        if not isinstance(obj, dict):
            raise CaseError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}; {_FORMAT}")
        cases.append(_case(obj, f"{path}:{n}", default_id=str(n)))
    if not cases:
        raise CaseError(f"{path}: no cases in the file; {_FORMAT}")
    return cases


def _case(obj: dict[str, Any], where: str, default_id: str) -> ReplayCase:
    for key in obj:
        if key in CASE_FIELDS:
            continue
        close = difflib.get_close_matches(key, CASE_FIELDS, n=1, cutoff=0.75)
        if close and close[0] not in obj:  # a typo of a field: it would be silently dropped
            raise CaseError(f"{where}: unknown field {key!r} (did you mean {close[0]!r}?)")
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
        # one loop pass first: the guard closes a burst's windows and sends their checkpoints on the loop's
        # next pass, after the chunk went out
        await asyncio.sleep(0)
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
    details: list[dict[str, Any]] = []
    low: float | None = None
    async for ev in stream:
        if ev.type == "warning" and ev.data and ev.data.get("stage") != "preflight":
            warnings.append(ev.text)
            score = ev.data.get("score")
            if isinstance(score, float | int):
                low = float(score) if low is None else min(low, float(score))
            details.append({
                "metric": ev.data.get("metric"), "score": score, "threshold": ev.data.get("threshold"),
                "checkpoint": ev.data.get("checkpoint"), "char_start": ev.data.get("char_start"),
                "char_end": ev.data.get("char_end"),
                "explanation": ev.data.get("explanation") or ev.text,
            })
        elif ev.type == "done":
            summary = dict(ev.data or {})
    final = await asyncio.wrap_future(stream.final)
    scores = {s.name: s.value for s in final.scores} if final is not None else {}
    explanations = (
        {s.name: s.explanation or (f"skipped: {s.skipped}" if s.skipped else "") for s in final.scores}
        if final is not None else {}
    )
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
        alert_details=[d for d in details if isinstance(d["score"], float | int)],
        final_explanations=explanations,
    )


def replay(
    cases: Iterable[ReplayCase],
    settings: Settings,
    *,
    chunk_size: int = 8,
    downstream: SpanProcessor | None = None,
    concurrency: int = 1,
    on_result: Callable[[CaseResult], None] | None = None,
    judge: Judge | None = None,
    checkpoint_judge: Judge | None = None,
) -> list[CaseResult]:
    """Replay ``cases`` with a runtime of their own (action ``flag``: every checkpoint is seen).

    Up to ``concurrency`` cases stream at once (each still waits for its own verdicts, so results do not
    depend on it); ``on_result`` is called with each result as it finishes. Results come back in the
    order of ``cases``. ``judge`` / ``checkpoint_judge``: judge instances instead of the settings' names.
    """
    from streamjudge.runtime import _Discard

    todo = list(cases)
    rt = streamjudge.configure(
        settings.replace(action="flag", preflight_action="warn"),
        downstream=downstream or _Discard(),
        backends_from_env=False,  # an offline run posts no scores to a live backend
        judge=judge,
        checkpoint_judge=checkpoint_judge,
        set_global=False,
    )
    try:

        async def run_all() -> list[CaseResult]:
            gate = asyncio.Semaphore(max(1, concurrency))

            async def one(case: ReplayCase) -> CaseResult:
                async with gate:
                    result = await replay_case(case, chunk_size=chunk_size)
                if on_result is not None:
                    on_result(result)
                return result

            return list(await asyncio.gather(*(one(c) for c in todo)))

        return asyncio.run(run_all())
    finally:
        rt.shutdown()
