"""The matrix's premise, checked on the local judge directly: it fails the invented sentence, only it."""

from __future__ import annotations

from matrix._kit import DOCS, search
from matrix.conftest import AFTER, ANSWER, CONTINUATION, FABRICATED, GROUNDED, QUESTION
from streamjudge import semconv
from streamjudge.judging.base import EvalInput
from streamjudge.judging.judges.local import LocalJudge


def _failing(answer: str) -> list[str]:
    contexts = tuple(search(QUESTION))
    score = LocalJudge().evaluate_sync(EvalInput(QUESTION, contexts, answer, kind="answer"),
                                       [semconv.FAITHFULNESS]).get(semconv.FAITHFULNESS)
    assert score is not None and score.sentences
    return [answer[s.start: s.end] for s in score.sentences if s.value is not None and s.value < 0.5]


def test_the_retriever_finds_the_one_passage() -> None:
    assert search(QUESTION) == [DOCS[0]]


def test_the_invented_sentence_fails_and_only_it() -> None:
    assert _failing(f"{GROUNDED} {FABRICATED}") == [FABRICATED]  # the first window
    assert _failing(ANSWER) == [FABRICATED]


def test_what_the_guard_may_deliver_passes() -> None:
    assert _failing(GROUNDED + CONTINUATION) == []
    assert _failing(f"{GROUNDED} {AFTER}") == []
