"""Three-way sentence verdicts of the local judge: fails on hard evidence only, uncertain on weak signals,
strictness and the names policy, and the hand-written RAG cases in tests/data/local_judge_cases.json."""

from __future__ import annotations

import json
import os

import pytest

from streamjudge import semconv
from streamjudge.config import ConfigError, Settings, load_settings
from streamjudge.judging.base import EvalInput, Score
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.results import SentenceScore

F = semconv.FAITHFULNESS
CASES = os.path.join(os.path.dirname(__file__), os.pardir, "data", "local_judge_cases.json")


def judge(context: str | tuple[str, ...], answer: str, strictness: str = "default", **kw: str) -> Score:
    contexts = (context,) if isinstance(context, str) else context
    score = LocalJudge(strictness=strictness, **kw).evaluate_sync(  # type: ignore[arg-type]
        EvalInput("q", contexts, answer), [F]).get(F)
    assert score is not None
    return score.with_label(0.7)


def _cases(group: str) -> list[dict[str, str]]:
    with open(CASES, encoding="utf-8") as f:
        return list(json.load(f)[group])


@pytest.mark.parametrize("case", _cases("grounded"), ids=lambda c: c["answer"][:40])
def test_grounded_paraphrases_never_fail_at_the_default_strictness(case: dict[str, str]) -> None:
    s = judge(tuple(case["contexts"]), case["answer"])
    assert s.label == "pass", s.explanation
    assert all(x.verdict != "fail" for x in s.sentences), s.explanation


@pytest.mark.parametrize("case", _cases("fabricated"), ids=lambda c: c["answer"][:40])
def test_every_fabricated_fact_fails_and_the_reason_names_its_kind(case: dict[str, str]) -> None:
    s = judge(tuple(case["contexts"]), case["answer"])
    assert s.label == "fail", s.explanation
    failing = [x for x in s.sentences if x.verdict == "fail"]
    assert failing and failing[0].kind == case["kind"], s.explanation


def test_common_words_missing_alone_never_fail_a_sentence() -> None:
    s = judge("The lab employs about 300 people.", "Roughly 300 people work at the lab.")
    assert s.sentences[0].verdict == "supported" and s.label == "pass"
    # a sentence made mostly of words the context lacks is uncertain, not failed
    s = judge("The lab employs about 300 people.", "The lab's 300 people collaborate extensively internationally.")
    assert s.sentences[0].verdict == "uncertain" and s.sentences[0].kind == "words"
    assert s.label == "pass"
    assert judge("The lab employs about 300 people.", "The lab's 300 people collaborate extensively "
                 "internationally.", "strict").label == "fail"


def test_a_role_swap_fails_with_a_reason_naming_what_the_number_is_said_of() -> None:
    ctx = "The firm opened the Leeds office in 2012 and the York office in 2016."
    s = judge(ctx, "The firm opened the York office in 2012.")
    assert s.sentences[0].verdict == "fail" and s.sentences[0].reason == "role swap: 2012 is said of Leeds"
    assert judge(ctx, "The firm opened the York office in 2016.").label == "pass"
    assert judge(ctx, "The firm opened the Leeds office in 2012.").label == "pass"


def test_a_negation_in_another_clause_of_the_context_sentence_does_not_fail() -> None:
    ctx = "Take one tablet with water after meals, never more than twice a day."
    assert judge(ctx, "Take one tablet with water after meals.").sentences[0].verdict == "supported"
    ctx = "The drug was approved in the United States in 2019. It is not approved in Japan."
    s = judge(ctx, "The drug is approved in Japan.")
    assert s.sentences[0].verdict == "fail" and s.sentences[0].kind == "negation"


def test_invisible_characters_are_removed_in_answers_and_contexts() -> None:
    assert judge("Apollo 11 landed on the Moon in July 1969.", "It landed in 19\u200b69.").label == "pass"
    assert judge("Apollo 11 landed on the Moon in July 19\u00ad69.", "Apollo 11 landed in 1969.").label == "pass"
    assert judge("The \u202bMoon\u202c landing was in 1969.", "The Moon landing was in 1969.").label == "pass"
    assert judge("Apollo 11 landed on the Moon in July 1969.", "It landed in 19\u200b71.").label == "fail"


def test_a_context_heading_glued_to_a_sentence_does_not_change_its_support() -> None:
    ctx = "Refund Policy\nCustomers may return unused items within 30 days of purchase."
    for answer in ("Refund Policy Customers may return unused items within 30 days of purchase.",
                   "Customers may return unused items within 30 days of purchase.",
                   "Refund Policy\nCustomers may return unused items within 30 days of purchase."):
        s = judge(ctx, answer)
        assert [x.verdict for x in s.sentences] == ["supported"] * len(s.sentences), s.explanation
    assert judge(ctx, "Refund Policy Customers may return unused items within 60 days of purchase.").label == "fail"


def test_table_rows_and_list_items_are_units_of_their_own() -> None:
    ctx = "Plans\n| Plan | Price |\n|---|---|\n| Basic | $10 |\n| Pro | $25 |\n- Support by email\n- Refunds in 30 days"
    assert judge(ctx, "The Pro plan costs $25.").sentences[0].verdict == "supported"
    # a list number in the answer is no claim of a number
    s = judge(ctx, "1. The Basic plan costs $10.\n2. Refunds are given in 30 days.")
    assert [x.verdict for x in s.sentences] == ["supported", "supported"], s.explanation


def test_names_are_matched_through_acronyms_demonyms_and_hyphenation() -> None:
    assert judge("The National Aeronautics and Space Administration was founded in 1958.",
                 "NASA was founded in 1958.").label == "pass"
    assert judge("The wine comes from France.", "It is a French wine.").label == "pass"
    assert judge("The company was founded in Canada in 1999.", "It is a Canadian company.").label == "pass"
    assert judge("The Canadian company was founded in 1999.", "It is a Canada-based firm.").label == "pass"
    assert judge("The drink was made by Coca-Cola.", "The drink was made by Coca Cola.").label == "pass"
    assert judge("NASA was founded in 1958.", "The National Aeronautics and Space Administration was founded "
                 "in 1958.").label == "pass"
    # a title beside a known name is no unknown name
    assert judge("Barack Obama signed the act in 2010.", "President Obama signed the act.").label == "pass"
    assert judge("Barack Obama signed the act in 2010.", "President Clinton signed the act.").label == "fail"
    assert judge("The wine comes from France.", "It is a Spanish wine.").label == "fail"


def test_strictness_decides_what_uncertain_sentences_and_absent_names_do() -> None:
    ctx = "The album was released in May 2004 by Parlophone."
    answer = "The album was released in May 2004 by Columbia Records."
    assert judge(ctx, answer).label == "fail"
    lenient = judge(ctx, answer, "lenient")
    assert lenient.sentences[0].verdict == "uncertain" and lenient.label == "pass"
    assert judge(ctx, answer, names_absent="uncertain").label == "pass"
    assert judge(ctx, answer, "lenient", names_absent="fail").label == "fail"
    # numbers fail at every strictness
    assert judge(ctx, "The album was released in May 2009.", "lenient").label == "fail"
    with pytest.raises(ValueError):
        LocalJudge(strictness="loose")  # type: ignore[arg-type]


def test_the_sentence_carries_its_verdict_tier_and_kind_and_labels_by_its_alert() -> None:
    s = judge("The lab employs about 300 people.", "The lab employs 450 people. The lab employs 300 people.")
    first, second = s.sentences
    assert (first.verdict, first.kind, first.tier, first.alert, first.label) == ("fail", "number", "local", True,
                                                                                  "fail")
    assert (second.verdict, second.tier, second.alert, second.label) == ("supported", "local", False, "pass")
    # a judge's alert decision labels the sentence whatever the threshold; the average does not overrule it
    uncertain = SentenceScore(0, 5, 0.5, "weak", verdict="uncertain", alert=False)
    score = Score(F, 0.5, sentences=(uncertain,)).with_label(0.9)
    assert score.label == "pass" and score.sentences[0].label == "pass" and not score.failing(0.9)
    # a sentence without a verdict is labelled by the threshold, as before
    plain = Score(F, 0.5, sentences=(SentenceScore(0, 5, 0.5),)).with_label(0.7)
    assert plain.label == "fail" and plain.sentences[0].label == "fail"


def test_settings_read_strictness_and_the_names_policy_from_the_environment() -> None:
    s = load_settings({"STREAMJUDGE_STRICTNESS": "Strict", "STREAMJUDGE_NAMES_ABSENT": "uncertain"})
    assert s.strictness == "strict" and s.names_absent == "uncertain"
    j = LocalJudge.from_settings(s)
    assert j.policy.strictness == "strict" and j.policy.names_absent == "uncertain"
    assert LocalJudge.from_settings(Settings(strictness="lenient")).policy.names_absent == "uncertain"
    with pytest.raises(ConfigError, match="STRICTNESS"):
        load_settings({"STREAMJUDGE_STRICTNESS": "loose"})
    with pytest.raises(ConfigError):
        Settings(names_absent="maybe")  # type: ignore[arg-type]


def test_number_words_in_the_contexts_do_not_break_the_role_swap_check() -> None:
    # "two" is a number word (an int, not a float, in the tables): its segment is read like any other
    ctx = "The Leeds office opened in 2012, and the York office opened in 2016 with two staff."
    s = judge(ctx, "The York office opened in 2012.")
    assert s.skipped is None and s.sentences[0].kind == "role_swap", s.explanation


def test_a_hedged_number_matches_the_contexts_within_its_hedge() -> None:
    ctx = "The trial enrolled 1,247 patients in 2019."
    for answer in ("The trial enrolled more than 1,200 patients.", "The trial enrolled about 1,250 patients.",
                   "The trial enrolled no fewer than 1,200 patients.", "It enrolled under 1,300 patients."):
        assert judge(ctx, answer).label == "pass", answer
    for answer in ("The trial enrolled about 2,000 patients.", "The trial enrolled fewer than 1,000 patients.",
                   "The trial enrolled more than 1,300 patients.", "The trial enrolled patients around 2017."):
        assert judge(ctx, answer).sentences[0].kind == "number", answer
