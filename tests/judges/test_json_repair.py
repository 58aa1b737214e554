"""Damaged JSON from a judge model is mended (``json-repair``), through the real LLM judge's code path."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from judgecases import item, run
from scripted_server import ScriptedLLMServer

from streamjudge.config import load_settings
from streamjudge.judging.base import JudgeError
from streamjudge.judging.judges._clients import parse_json_object
from streamjudge.judging.judges.llm import LLMJudge

VERDICTS = {"verdicts": [{"claim": "Paris is the capital.", "verdict": "supported", "reason": "stated"},
                         {"claim": "Berlin hosts the Louvre.", "verdict": "unsupported", "reason": "absent"}]}


def single_quotes(obj: dict[str, Any]) -> str:
    return repr(obj)  # Python's repr: single quotes, True/False/None


def unquoted_keys(obj: dict[str, Any]) -> str:
    return re.sub(r'"(\w+)":', r"\1:", json.dumps(obj))


def trailing_commas(obj: dict[str, Any]) -> str:
    return re.sub(r"([\]}\"\d])(\n\s*[\]}])", r"\1,\2", json.dumps(obj, indent=2))


def truncated(obj: dict[str, Any]) -> str:
    # the model ran out of tokens before closing the list and the object
    return json.dumps(obj).rstrip("]}")


def fenced_with_comments(obj: dict[str, Any]) -> str:
    body = json.dumps(obj, indent=2).replace("{\n", "{\n  // the verdicts\n", 1)
    return f"Here is my evaluation:\n```json\n{body}\n```\nLet me know if you need more."


def missing_commas(obj: dict[str, Any]) -> str:
    return json.dumps(obj).replace('", "', '" "')


DAMAGE: dict[str, Callable[[dict[str, Any]], str]] = {
    "single quotes": single_quotes,
    "unquoted keys": unquoted_keys,
    "trailing commas": trailing_commas,
    "truncated object": truncated,
    "code fence with a comment": fenced_with_comments,
    "missing commas": missing_commas,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_judge_answers_parse_to_the_intended_object(damage: str) -> None:
    raw = DAMAGE[damage](VERDICTS)
    with pytest.raises(ValueError):
        json.loads(raw)  # really damaged
    assert parse_json_object(raw) == VERDICTS


@pytest.mark.parametrize("damage", ["single quotes", "unquoted keys", "truncated object", "missing commas"])
def test_without_json_repair_the_same_answers_are_rejected(damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "json_repair", None)  # import fails
    with pytest.raises(JudgeError, match="not a JSON object"):
        parse_json_object(DAMAGE[damage](VERDICTS))


@pytest.mark.parametrize("raw", ["I am sorry, I cannot evaluate that.", "[1, 2, 3]", "{" * 50_000,
                                 '{"a": ' * 20_000])
def test_what_holds_no_object_is_still_an_error(raw: str) -> None:
    with pytest.raises(JudgeError):
        parse_json_object(raw)


def test_the_first_object_wins_over_prose_around_it() -> None:
    assert parse_json_object("Sure: {'score': 1, 'ok': True} and also {'other': 2}") == {"score": 1, "ok": True}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_the_llm_judge_scores_from_a_damaged_answer(llm_server: ScriptedLLMServer, damage: str) -> None:
    brain = llm_server.brain
    honest = brain.answer
    brain.answer = lambda text: DAMAGE[damage](honest(text))  # type: ignore[method-assign]
    s = load_settings({"EVAL_PROVIDER": "openai", "EVAL_MODEL": "judge-model",
                       "EVAL_BASE_URL": llm_server.openai_base_url})
    res = run(LLMJudge.from_settings(s), item())
    faith = res.get("faithfulness")
    assert faith is not None and faith.value == pytest.approx(0.5) and "Louvre" in faith.explanation
