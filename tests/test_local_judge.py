"""The local judge: claim-level grounding, the cheap metrics, caching, and robustness to odd input."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.judging.base import METRICS, EvalInput, Judge, JudgeResult, Score
from streamjudge.judging.judges import create_judge
from streamjudge.judging.judges._local_index import ClaimVerdict, ContextIndex
from streamjudge.judging.judges._local_text import Facts
from streamjudge.judging.judges.local import LocalJudge

F = semconv.FAITHFULNESS
CONTEXT = "The company was founded in 1998 in Palo Alto by two graduate students."
QUESTION = "Who founded the company, and when?"


def faith(answer: str, contexts: tuple[str, ...] = (CONTEXT,), kind: str = "answer") -> Score:
    item = EvalInput(QUESTION, contexts, answer, kind=kind)  # type: ignore[arg-type]
    score = LocalJudge().evaluate_sync(item, [F]).get(F)
    assert score is not None
    return score


# --- faithfulness ---------------------------------------------------------------------------------


def test_classic_unsupported_addition_is_caught_and_named() -> None:
    s = faith(CONTEXT + " It later expanded to Europe in 2003.")
    assert s.value is not None and s.value <= 0.5
    assert '"It later expanded to Europe in 2003."' in s.explanation
    missing = s.explanation.split("not in context:", 1)[1]
    for word in ("Europe", "2003", "expanded"):
        assert word in missing


def test_faithful_paraphrase_passes() -> None:
    assert faith("Two graduate students started the company in Palo Alto in 1998.").value == 1.0
    assert faith(CONTEXT).value == 1.0


def test_wrong_year_is_unsupported() -> None:
    s = faith("The company was founded in 1999 in Palo Alto.")
    assert s.value == 0.0
    assert "1999" in s.explanation


def test_negation_mismatch_is_unsupported() -> None:
    s = faith("The company was not founded in Palo Alto.")
    assert s.value == 0.0
    assert "negation" in s.explanation
    negative_context = ("The company was not profitable in its first year.",)
    assert faith("The company was not profitable in its first year.", negative_context).value == 1.0
    assert faith("The company was profitable in its first year.", negative_context).value == 0.0


def test_entity_swap_is_unsupported() -> None:
    s = faith("The company was founded in Berlin in 1998.")
    assert s.value == 0.0
    assert "Berlin" in s.explanation


def test_numbers_compare_by_value() -> None:
    ctx = ("Revenue reached $1,000,000 in 2020, up 12% on the year, with 2,500 staff.",)
    assert faith("Revenue reached $1 million in 2020.", ctx).value == 1.0
    assert faith("Revenue was up 12 percent in 2020.", ctx).value == 1.0
    assert faith("There were 2500 staff in 2020.", ctx).value == 1.0
    assert faith("Revenue was up 15% in 2020.", ctx).value == 0.0
    # rounding to the written precision is not a hallucination; a different figure is
    box = ("Poseidon grossed $ 181,674,817 at the worldwide box office on a budget of $ 160 million.",)
    assert faith("Poseidon grossed $181.7 million worldwide.", box).value == 1.0
    assert faith("Poseidon grossed $190 million worldwide.", box).value == 0.0
    assert faith("Poseidon had a budget of $160,000,000.", box).value == 1.0


def test_dates_are_checked() -> None:
    ctx = ("The treaty was signed on 4 March 1921 in Riga.",)
    assert faith("The treaty was signed in Riga on March 4, 1921.", ctx).value == 1.0
    assert faith("The treaty was signed in Riga in April 1921.", ctx).value == 0.0


def test_clauses_joined_by_and_are_separate_claims() -> None:
    s = faith("The company was founded in 1998 in Palo Alto and it opened an office in Tokyo in 2005.")
    assert s.value == 0.0 and s.sentences[0].verdict == "fail"
    # the supported first claim is not named in the reason, the second one's facts are
    assert "Tokyo" in s.explanation and "Palo Alto" not in s.sentences[0].reason
    # a plain list of names stays one claim
    assert faith("Two graduate students founded the company in Palo Alto.").value == 1.0


def test_clause_separators_match_case_insensitively_with_odd_letters() -> None:
    # "ı" (dotless i) matches "i" case-insensitively: "whıle" still separates two claims
    s = faith("The company was founded in 1998 in Palo Alto, whıle Tokyo Berlin Rome opened in 2005.")
    assert "1998" not in s.sentences[0].reason and "2005" in s.sentences[0].reason, s.explanation


def test_filler_does_not_count() -> None:
    s = faith("Here is what I found. " + CONTEXT + " Let me know if you need more. I hope this helps!")
    assert s.value == 1.0
    assert "0 of 1 sentences unsupported" in s.explanation and len(s.sentences) == 1
    only_filler = faith("Here is what I found. Let me know if you need more.")
    assert only_filler.value is None and only_filler.skipped == "no_claims"


def test_text_is_judged_as_given_an_unterminated_sentence_included() -> None:
    judge = LocalJudge()
    for kind in ("checkpoint", "answer"):
        item = EvalInput(QUESTION, (CONTEXT,), "It was founded in Berlin", kind=kind)  # type: ignore[arg-type]
        s = judge.evaluate_sync(item, [F]).get(F)
        assert s is not None and s.value == 0.0
        assert [(x.start, x.end) for x in s.sentences] == [(0, 24)]


# --- per-sentence scores ----------------------------------------------------------------------------


def test_sentences_are_scored_with_ranges_and_reasons() -> None:
    answer = "Here is what I found. The company was founded in 1998. It later expanded to Lyon in 1887."
    s = faith(answer)
    assert s.value == 0.5
    # the filler sentence carries no claim and is not listed
    assert [answer[x.start : x.end] for x in s.sentences] == [
        "The company was founded in 1998.", "It later expanded to Lyon in 1887."]
    assert [x.value for x in s.sentences] == [1.0, 0.0]
    assert s.sentences[0].reason == ""
    assert s.sentences[1].reason.startswith("number not in context: 1887")
    assert "name not in context: Lyon" in s.sentences[1].reason
    assert s.with_label(0.7).label == "fail"
    assert [x.label for x in s.with_label(0.7, shift=100).sentences] == ["pass", "fail"]
    assert s.with_label(0.7, shift=100).sentences[1].start == 100 + answer.index("It later")


def test_a_sentence_scores_its_own_claims() -> None:
    s = faith("The company was founded in 1998 in Palo Alto; it opened an office in Tokyo in 2005.")
    assert len(s.sentences) == 1 and s.sentences[0].verdict == "fail"
    assert "Tokyo" in s.sentences[0].reason and "Palo Alto" not in s.sentences[0].reason


def test_a_late_fabricated_sentence_in_a_long_answer_fails_the_answer() -> None:
    """The average over ten sentences passes at 0.7; the one invented sentence fails the score."""
    grounded = [
        "The company was founded in 1998.",
        "It was founded in Palo Alto.",
        "Two graduate students founded the company.",
    ]
    answer = " ".join(grounded[k % 3] for k in range(9)) + " It was later sold to Siemens for $4 billion."
    s = faith(answer)
    assert s.value is not None and s.value >= 0.7
    assert s.with_label(0.7).label == "fail"
    (failing,) = s.failing(0.7)
    assert answer[failing.start : failing.end] == "It was later sold to Siemens for $4 billion."
    assert "Siemens" in failing.reason


def test_a_checkpoint_is_scored_on_its_new_sentences_not_the_prefix() -> None:
    judge = LocalJudge()
    prefix = "The company was founded in Berlin in 1975. "  # wrong, but judged at its own checkpoint
    new = "Two graduate students founded it. It is based in Palo Alto."
    item = EvalInput(QUESTION, (CONTEXT,), new, kind="checkpoint", prefix=prefix, offset=len(prefix))
    s = judge.evaluate_sync(item, [F]).get(F)
    assert s is not None and s.value == 1.0
    assert [new[x.start : x.end] for x in s.sentences] == [
        "Two graduate students founded it.", "It is based in Palo Alto."]
    # the prefix is not scored: only what "it" may stand for is read from its last sentence
    alone = judge.evaluate_sync(EvalInput(QUESTION, (CONTEXT,), new, kind="checkpoint"), [F]).get(F)
    assert alone == s


def test_a_leading_pronoun_ties_a_name_to_the_sentence_before() -> None:
    ctx = ("The Eiffel Tower is in Paris. Gustave Eiffel's company built it for the World's Fair.",)
    item = EvalInput(QUESTION, ctx, "It stands in Paris.", kind="checkpoint",
                     prefix="The Eiffel Tower was built for the World's Fair. ")
    s = LocalJudge().evaluate_sync(item, [F]).get(F)
    assert s is not None and s.value == 1.0
    # without an antecedent nothing ties "Paris" to the tower's sentence: a weak signal, not a fail
    bare = LocalJudge().evaluate_sync(EvalInput(QUESTION, ctx, "It was built in Paris."), [F]).get(F)
    assert bare is not None and bare.sentences[0].verdict == "uncertain" and bare.sentences[0].kind == "detached"


def test_context_recall_scores_reference_sentences() -> None:
    item = EvalInput(QUESTION, (CONTEXT,), "x", reference="It was founded in 1998. Its office was in Seattle.")
    s = LocalJudge().evaluate_sync(item, [semconv.CONTEXT_RECALL]).get(semconv.CONTEXT_RECALL)
    assert s is not None and s.value == 0.5
    assert [x.value for x in s.sentences] == [1.0, 0.0]


# --- the kinds of case the previous version got wrong -------------------------------------------------


def test_a_negation_cue_inside_a_quantity_phrase_negates_nothing() -> None:
    ctx = ("The festival drew no fewer than 300 bands to Leeds.",)
    assert faith("The festival drew 300 bands to Leeds.", ctx).value == 1.0
    assert faith("The festival drew no fewer than 300 bands to Leeds.", ("The festival drew 300 bands to Leeds.",)
                 ).value == 1.0
    assert faith("The festival drew not only 300 bands to Leeds.", ctx).value == 1.0
    denied = faith("The festival did not draw 300 bands to Leeds.", ctx)
    assert denied.value == 0.0 and "negation" in denied.explanation
    assert faith("He drives the No. 32 Ford Fusion for the racing team.",
                 ("He drives the No. 32 Ford Fusion for the racing team.",)).value == 1.0


def test_a_negation_word_inside_a_name_negates_nothing() -> None:
    ctx = ("The magazine cover showed Never Shout Never and Hey Monday.",)
    assert faith("The magazine cover showed Hey Monday.", ctx).value == 1.0
    assert faith("The magazine cover did not show Hey Monday.", ctx).value == 0.0


def test_negation_ends_at_the_clause_boundary() -> None:
    ctx = ("The company was not profitable in 1999, but its revenue grew in 2000.",)
    assert faith("Its revenue grew in 2000.", ctx).value == 1.0
    assert faith("The company was not profitable in 1999.", ctx).value == 1.0
    flipped = faith("The company was profitable in 1999.", ctx)
    assert flipped.value == 0.0 and "negation" in flipped.explanation
    semicolon = ("The bridge was not finished in 1920; the tunnel opened in 1921.",)
    assert faith("The tunnel opened in 1921.", semicolon).value == 1.0


def test_a_tie_between_a_negated_and_a_plain_context_clause_is_uncertain() -> None:
    ctx = ("The museum opened its doors in Lyon.", "The museum did not open its doors in Lyon.")
    for claim in ("The museum opened its doors in Lyon.", "The museum did not open its doors in Lyon."):
        s = faith(claim, ctx)
        assert s.sentences[0].verdict == "uncertain" and s.sentences[0].kind == "negation_tie", claim
        assert "negation tie" in s.sentences[0].reason


def test_a_year_moved_to_another_event_is_unsupported() -> None:
    ctx = ("The company was founded in 1998. It opened its Tokyo office in 2004.",)
    assert faith("The company opened its Tokyo office in 2004.", ctx).value == 1.0
    moved = faith("The company opened its Tokyo office in 1998.", ctx)
    assert moved.value == 0.0
    assert moved.sentences[0].reason == "role swap: 1998 is said of founded"


def test_a_name_moved_to_another_role_is_unsupported() -> None:
    ctx = ("The ceremony was chaired by Isabelle Mergault. The film starred Francois Cluzet.",)
    assert faith("The ceremony was chaired by Isabelle Mergault.", ctx).value == 1.0
    moved = faith("The ceremony was chaired by Francois Cluzet.", ctx)
    # a name detached from its role is a weak signal: uncertain (it alerts when strict)
    assert moved.sentences[0].verdict == "uncertain" and "Francois Cluzet" in moved.sentences[0].reason
    # names side by side vouch for nothing: "Columbus, Ohio" is said of the duo, not of the band
    bands = ("The station plays Mumford & Sons and Twenty One Pilots. Twenty One Pilots is a duo from "
             "Columbus, Ohio.",)
    assert faith("Twenty One Pilots is from Columbus, Ohio.", bands).value == 1.0
    assert faith("Mumford & Sons is from Columbus, Ohio.", bands).sentences[0].verdict == "uncertain"


def test_a_number_with_another_unit_of_its_kind_is_unsupported() -> None:
    ctx = ("The adult dose is 5 mg twice a day. The trail is 10 km long. Turnout rose 3% in 2019.",)
    for grounded in ("The adult dose is 5 mg twice a day.", "The trail is 10 kilometres long.",
                     "Turnout rose 3 percent in 2019."):
        assert faith(grounded, ctx).value == 1.0, grounded
    for claim, reason in (("The adult dose is 5 g twice a day.", "5 g (context: mg)"),
                          ("The trail is 10 miles long.", "10 mi (context: km)"),
                          ("Turnout rose 3 points in 2019.", "3 points (context: %)")):
        s = faith(claim, ctx)
        assert s.value == 0.0, claim
        assert "unit differs from the context: " + reason in s.sentences[0].reason


def test_inflections_of_one_word_meet() -> None:
    from streamjudge.judging.judges._local_text import term

    for forms in ("use used uses using", "die died dies dying", "study studies studied studying",
                  "stop stops stopped stopping", "make makes making made", "agree agrees agreed agreeing",
                  "vote votes voted voting", "marry marries married marrying", "win wins won winning"):
        assert len({term(w) for w in forms.split()}) == 1, forms
    ctx = ("The committee used the report and stopped the vote after the chairman died.",)
    assert faith("The committee stops using the report, voting after the chairman's dying.", ctx).value == 1.0


def test_context_documents_joined_without_a_blank_are_separate_sentences() -> None:
    ctx = ("Beyond the Gates is a film released in 2004.Jesus Camp is a documentary released in 2006.",)
    assert faith("Jesus Camp is a documentary released in 2006.", ctx).value == 1.0
    assert faith("Jesus Camp is a documentary released in 2004.", ctx).value == 0.0


def test_assistant_talk_about_the_passage_and_small_counts_are_not_hard_facts() -> None:
    ctx = ("Veeram is a 2014 Tamil action film directed by Siva. Veeram is also a 2016 drama film by Jayaraj.",)
    s = faith("The passage describes two different films called Veeram: a 2014 Tamil action film directed "
              "by Siva and a 2016 drama film by Jayaraj.", ctx)
    assert s.value == 1.0, s.explanation


def test_grounded_example_answers_are_never_flagged() -> None:
    """The example app's corpus and the grounded answers of the other tests pass sentence by sentence;
    the example app's invented sentences fail."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples", "adaptive_rag"))
    try:
        import rag
    finally:
        sys.path.pop(0)
    corpus = tuple(d.page_content for d in rag.CORPUS)
    judge = LocalJudge()
    for doc in corpus:
        for answer in (doc, " ".join(reversed(rag._SENTENCE.split(doc)))):
            s = judge.evaluate_sync(EvalInput("Tell me about it.", corpus, answer), [F]).get(F)
            assert s is not None and s.with_label(0.7).label == "pass", (answer, s)
    for invented in rag._INVENTIONS:
        s = judge.evaluate_sync(EvalInput("Tell me about it.", corpus, invented), [F]).get(F)
        assert s is not None and s.with_label(0.7).label == "fail", invented
    eiffel = ("The Eiffel Tower is in Paris, France. It was completed in 1889 and is 330 metres tall. "
              "Gustave Eiffel's company designed and built it for the 1889 World's Fair.",)
    grounded = ("The Eiffel Tower was completed in 1889. It stands in Paris and is 330 metres tall. "
                "Gustave Eiffel's company built it for the World's Fair.")
    hallucinated = ("The Eiffel Tower was completed in 1925 in Berlin. It is 950 metres tall. "
                    "Thomas Edison designed it for the Olympic Games in Rome.")
    good = judge.evaluate_sync(EvalInput("When?", eiffel, grounded), [F]).get(F)
    bad = judge.evaluate_sync(EvalInput("When?", eiffel, hallucinated), [F]).get(F)
    assert good is not None and good.with_label(0.7).label == "pass" and good.value == 1.0
    assert bad is not None and bad.value == 0.0 and len(bad.failing(0.7)) == 3


def test_sentence_verdicts_are_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sentence judged once (at a checkpoint) is not verified again (in the final pass, or in a
    running text that repeats it)."""
    calls: list[Facts] = []
    original = ContextIndex._verify

    def counting(self: ContextIndex, facts: Facts, antecedent: frozenset[str] = frozenset()) -> ClaimVerdict:
        calls.append(facts)
        return original(self, facts, antecedent)

    monkeypatch.setattr(ContextIndex, "_verify", counting)
    judge = LocalJudge()
    sentences = [
        "The company was founded in 1998.",
        "It is based in Palo Alto.",
        "Two graduate students founded it.",
        "It later expanded to Europe in 2003.",
    ]
    text = ""
    per_checkpoint = []
    for s in sentences:
        text = f"{text} {s}".strip()
        before = len(calls)
        judge.evaluate_sync(EvalInput(QUESTION, (CONTEXT,), text, kind="checkpoint"), [F])
        per_checkpoint.append(len(calls) - before)
    assert per_checkpoint == [1, 1, 1, 1]


def test_deterministic_across_instances_and_hash_seeds() -> None:
    answer = CONTEXT + " It later expanded to Europe, Japan and Brazil in 2003, hiring 500 people."
    item = EvalInput(QUESTION, (CONTEXT, "Unrelated text about Berlin."), answer, reference="Founded 1998.")
    a = LocalJudge().evaluate_sync(item, METRICS)
    b = LocalJudge().evaluate_sync(item, METRICS)
    assert a == b
    code = (
        "from streamjudge.judging.judges.local import LocalJudge;"
        "from streamjudge.judging.base import EvalInput, METRICS;"
        f"print(LocalJudge().evaluate_sync(EvalInput({QUESTION!r}, ({CONTEXT!r}, 'Unrelated text about "
        f"Berlin.'), {answer!r}, reference='Founded 1998.'), METRICS))"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout)
    assert len(outputs) == 1
    assert repr(a) + "\n" in outputs


_TRICKY_RUNNING_TEXT = (
    "Here is what I found:\n- The company was founded in 1998.\n- Based in Palo Alto\n\nHistory\n"
    "It was founded by two graduate students, e.g. Dr. Page and Mr. Brin... It grew fast! Did it? "
    "Revenue rose to $1.2 bn. in 2004. 3. items were sold; sales fell but staff grew and offices opened. "
    "a) first item\n  2) second item. It was not founded in Berlin. 公司成立于1998年。它很好。"
)


def test_a_shared_judge_gives_the_verdicts_of_a_fresh_one() -> None:
    """Checkpoints of a tricky text (list markers, headings, abbreviations, decimals, CJK), cut anywhere
    and judged with their prefix on one judge, get exactly what a fresh judge gives: the verdict and
    analysis caches never change a score, a sentence or an explanation."""
    contexts = (CONTEXT, "Revenue was $1.2 billion in 2004. The company was not founded in Berlin.")
    judge = LocalJudge()
    text = _TRICKY_RUNNING_TEXT
    metrics = [F, semconv.CONTEXT_RECALL]
    for cut in range(0, len(text), 7):
        for end in (cut + 40, len(text)):
            new = text[cut:end]
            for kind in ("checkpoint", "answer"):
                item = EvalInput(QUESTION, contexts, new, kind=kind, reference=new,  # type: ignore[arg-type]
                                 prefix=text[:cut], offset=cut)
                assert judge.evaluate_sync(item, metrics) == LocalJudge().evaluate_sync(item, metrics), new


@settings(max_examples=60, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            [*"aZ1. -\n?!:;3'\"e)公。", " and ", " but ", "Dr.", " Palo Alto", " 1998", " was not",
             " founded", "\n- ", "\n2. ", "...", "ﬁ", "\u00a0", " It"]
        ),
        max_size=40,
    ).map("".join),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_sentence_ranges_are_pieces_of_the_judged_text(text: str, cuts: list[int]) -> None:
    judge = LocalJudge()
    bounds = sorted({0, *(min(c, len(text)) for c in cuts), len(text)})
    for a, b in itertools.pairwise(bounds):
        item = EvalInput(QUESTION, (CONTEXT,), text[a:b], kind="checkpoint", prefix=text[:a], offset=a)
        s = judge.evaluate_sync(item, [F]).get(F)
        assert s is not None and s == LocalJudge().evaluate_sync(item, [F]).get(F)
        last = 0
        for x in s.sentences:
            piece = item.answer[x.start : x.end]
            assert piece and piece == piece.strip() and x.start >= last, (item.answer, s.sentences)
            last = x.end
        # a score has a value exactly when some sentence holds a checkable claim
        assert (s.value is None) == (not s.sentences)


def test_checkpoint_cost_does_not_grow_with_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint analyses its new sentences only, however long the text before them."""
    from streamjudge.judging.judges import _local_index, _local_text

    analysed_chars: list[int] = []
    analyze = _local_text.analyze

    def counting_analyze(text: str, sentence_start: bool = True) -> Facts:
        analysed_chars.append(len(text))
        return analyze(text, sentence_start)

    monkeypatch.setattr(_local_index, "analyze", counting_analyze)
    monkeypatch.setattr(_local_text, "analyze", counting_analyze)
    judge = LocalJudge()
    judge.evaluate_sync(EvalInput(QUESTION, (CONTEXT,), "", kind="preflight"), [semconv.CONTEXT_PRECISION])
    sentence = "Office {k} in Palo Alto opened in 1998, and it hired {k} graduate students there. "
    prefix = ""
    chars = []
    for k in range(0, 200, 2):
        new = sentence.format(k=k) + sentence.format(k=k + 1)
        analysed_chars.clear()
        item = EvalInput(QUESTION, (CONTEXT,), new, kind="checkpoint", prefix=prefix, offset=len(prefix))
        judge.evaluate_sync(item, [F])
        chars.append(sum(analysed_chars))
        prefix += new
    # each checkpoint analyses its two new sentences (twice: clause weights, then the claims)
    assert max(chars) <= 2 * 2 * (len(sentence) + 4), chars


def test_a_context_is_analysed_once_per_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamjudge.judging.judges._local_index import ContextPart

    analysed: list[str] = []
    original = ContextPart.of.__func__  # type: ignore[attr-defined]

    def counting(cls: type[ContextPart], context: str) -> ContextPart:
        analysed.append(context)
        return original(cls, context)  # type: ignore[no-any-return]

    monkeypatch.setattr(ContextPart, "of", classmethod(counting))
    judge = LocalJudge()
    other = "Unrelated text about Berlin."
    for contexts, expected in (((CONTEXT, CONTEXT), 1.0), ((CONTEXT, other), 1.0), ((other,), 0.0)):
        s = judge.evaluate_sync(EvalInput(QUESTION, contexts, CONTEXT), [F]).get(F)
        assert s is not None and s.value == expected
    assert analysed == [CONTEXT, other]


# --- skips ----------------------------------------------------------------------------------------


def test_skips_say_why() -> None:
    judge = LocalJudge()

    def skipped(item: EvalInput, metric: str) -> str | None:
        s = judge.evaluate_sync(item, [metric]).get(metric)
        assert s is not None
        if s.skipped is not None:
            assert s.value is None
        return s.skipped

    assert skipped(EvalInput(QUESTION, (CONTEXT,), ""), F) == "empty_answer"
    assert skipped(EvalInput(QUESTION, (CONTEXT,), " \n\t "), F) == "empty_answer"
    assert skipped(EvalInput(QUESTION, (), "Some answer."), F) == "no_contexts"
    assert skipped(EvalInput(QUESTION, ("", "  "), "Some answer."), F) == "no_contexts"
    assert skipped(EvalInput(QUESTION, (), "", kind="preflight"), semconv.CONTEXT_PRECISION) == "no_contexts"
    assert skipped(EvalInput("", (CONTEXT,), ""), semconv.CONTEXT_PRECISION) == "empty_question"
    assert skipped(EvalInput("  ", (CONTEXT,), "x"), semconv.ANSWER_RELEVANCY) == "empty_question"
    assert skipped(EvalInput(QUESTION, (CONTEXT,), ""), semconv.ANSWER_RELEVANCY) == "empty_answer"
    assert skipped(EvalInput(QUESTION, (CONTEXT,), "x"), semconv.CONTEXT_RECALL) == "no_reference"
    blank_reference = EvalInput(QUESTION, (CONTEXT,), "x", reference=" ")
    assert skipped(blank_reference, semconv.CONTEXT_RECALL) == "no_reference"
    assert skipped(EvalInput(QUESTION, (CONTEXT,), "x"), "toxicity") == "unsupported_metric"


# --- the other metrics ----------------------------------------------------------------------------


def test_context_precision_rewards_relevant_contexts_ranked_first() -> None:
    relevant = CONTEXT
    noise = ("The weather in Oslo was mild last winter.", "Bananas are rich in potassium.")
    judge = LocalJudge()

    def cp(contexts: tuple[str, ...]) -> float:
        item = EvalInput(QUESTION, contexts, "", kind="preflight")
        score = judge.evaluate_sync(item, [semconv.CONTEXT_PRECISION]).get(semconv.CONTEXT_PRECISION)
        assert score is not None and score.value is not None
        return score.value

    first = cp((relevant, *noise))
    last = cp((*noise, relevant))
    none = cp(noise)
    assert first > last > none
    assert first >= 0.9
    assert none == 0.0


def test_answer_relevancy() -> None:
    judge = LocalJudge()

    def ar(answer: str) -> float:
        s = judge.evaluate_sync(EvalInput(QUESTION, (CONTEXT,), answer), [semconv.ANSWER_RELEVANCY])
        score = s.get(semconv.ANSWER_RELEVANCY)
        assert score is not None and score.value is not None
        return score.value

    on_topic = ar("Two graduate students founded the company in 1998.")
    off_topic = ar("Bananas are rich in potassium.")
    refusal = ar("I'm sorry, I cannot answer that from the provided documents.")
    assert on_topic == 1.0
    assert off_topic < on_topic
    assert refusal == 0.0


def test_context_recall() -> None:
    judge = LocalJudge()

    def cr(reference: str) -> float:
        item = EvalInput(QUESTION, (CONTEXT,), "x", reference=reference)
        score = judge.evaluate_sync(item, [semconv.CONTEXT_RECALL]).get(semconv.CONTEXT_RECALL)
        assert score is not None and score.value is not None
        return score.value

    assert cr("Two graduate students founded the company in 1998.") == 1.0
    assert cr("It was founded in 1998. Its first office was in Seattle.") == 0.5


# --- interface, concurrency, robustness ------------------------------------------------------------


def test_async_and_sync_agree_and_protocol() -> None:
    judge = create_judge("local", Settings(judge_processes=0), tier="checkpoint")
    assert isinstance(judge, LocalJudge) and isinstance(judge, Judge)
    answer = CONTEXT + " It later expanded to Europe in 2003."
    item = EvalInput(QUESTION, (CONTEXT,), answer, reference=CONTEXT)
    sync = judge.evaluate_sync(item, METRICS)

    async def run() -> JudgeResult:
        try:
            return await judge.evaluate(item, METRICS)
        finally:
            await judge.aclose()

    result = asyncio.run(run())
    assert result == sync
    assert result.judge == "local"
    assert [s.name for s in result.scores] == list(METRICS)
    # large inputs go through a worker thread and still agree
    big = EvalInput(QUESTION, (CONTEXT * 2000,), item.answer)
    assert asyncio.run(LocalJudge().evaluate(big, [F])) == LocalJudge().evaluate_sync(big, [F])


def test_concurrent_threads_agree_with_serial() -> None:
    judge = LocalJudge(index_cache_size=2, claim_cache_size=8)
    items = [
        EvalInput(QUESTION, (CONTEXT, f"Context {k} mentions Berlin."), f"{CONTEXT} Office {k} is in Berlin.")
        for k in range(12)
    ]
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in items]
    results: dict[int, list[JudgeResult]] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            results[n] = [judge.evaluate_sync(it, METRICS) for _ in range(5) for it in items]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got in results.values():
        assert got == expected * 5


@settings(max_examples=150, deadline=None)
@given(
    question=st.text(max_size=80),
    contexts=st.lists(st.text(max_size=200), max_size=3),
    answer=st.text(max_size=300),
    reference=st.none() | st.text(max_size=100),
)
def test_never_raises_on_arbitrary_text(
    question: str, contexts: list[str], answer: str, reference: str | None
) -> None:
    item = EvalInput(question, tuple(contexts), answer, reference=reference)
    result = LocalJudge().evaluate_sync(item, METRICS)
    assert len(result.scores) == len(METRICS)
    for s in result.scores:
        assert s.skipped != "error", s.explanation
        assert (s.value is None) == (s.skipped is not None)


def test_odd_unicode_and_non_english() -> None:
    judge = LocalJudge()
    odd = "\ud800\u200b\ufeff Ⅻ ﬁ x\u0301 \x00 🙂. 公司成立于1998年。 Die Firma wurde 1998 gegründet."
    result = judge.evaluate_sync(EvalInput(odd, (odd,), odd, reference=odd), METRICS)
    assert all(s.skipped != "error" for s in result.scores)
    zh_context = ("公司成立于1998年。",)
    zh = judge.evaluate_sync(EvalInput("公司何时成立?", zh_context, "公司成立于1998年。"), [F])
    assert zh.scores[0].value == 1.0
    zh_wrong = judge.evaluate_sync(EvalInput("公司何时成立?", zh_context, "公司成立于2005年。"), [F])
    assert zh_wrong.scores[0].value == 0.0


def _work_of_judgement(n_sentences: int) -> int:
    """How many Python and C function calls judging ``n_sentences`` (as answer, context and reference)
    takes: a deterministic measure of work, unlike a clock on a shared machine."""
    sentence = "The company opened office number {k} in Palo Alto in 1998 and hired {k} engineers there. "
    text = "".join(sentence.format(k=k) for k in range(n_sentences))
    item = EvalInput(QUESTION, (text,), text, reference=text[:50_000])
    judge = LocalJudge()
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += 1

    sys.setprofile(count)
    try:
        result = judge.evaluate_sync(item, METRICS)
    finally:
        sys.setprofile(None)
    assert all(s.skipped != "error" for s in result.scores)
    return calls


def test_huge_input_stays_near_linear() -> None:
    small = _work_of_judgement(300)  # ~27 KB
    large = _work_of_judgement(3_300)  # ~300 KB answer and context: 11 times as much text
    # linear work gives a ratio near 11, quadratic work ~120
    assert large / small < 16, (small, large)


def test_single_huge_sentence_and_repetitive_text() -> None:
    judge = LocalJudge()
    blob = "word and other " * 20_000  # no sentence end, an "and" every three words
    caps = "Alpha Beta Gamma " * 20_000
    for answer in (blob, caps, "1,000 2.5 million 3% " * 15_000):
        result = judge.evaluate_sync(EvalInput("What?", (blob,), answer), METRICS)
        assert all(s.skipped != "error" for s in result.scores)


# --- bit-identical results ------------------------------------------------------------------------
# tests/data/local_judge_golden.json holds, per (contexts, answer) pair below, a digest of repr() of all
# the judge's results on it, all on one judge (recorded with the per-sentence judge): no refactoring or
# cache may change a single score, sentence or explanation. A deliberate change of verdicts re-records it
# (``PYTHONPATH=src python tests/test_local_judge.py --record``) and says so in its commit.

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "local_judge_golden.json")
_GOLDEN_CONTEXTS: tuple[tuple[str, ...], ...] = (
    (CONTEXT,),
    ("Revenue reached $1,000,000 in 2020, up 12% on the year, with 2,500 staff.",),
    ("Poseidon grossed $ 181,674,817 at the worldwide box office on a budget of $ 160 million.",),
    ("The treaty was signed on 4 March 1921 in Riga.",),
    ("The company was not profitable in its first year.",),
    (CONTEXT, "Unrelated text about Berlin."),
    ("公司成立于1998年。",),
)
_GOLDEN_ANSWERS: tuple[str, ...] = (
    CONTEXT + " It later expanded to Europe in 2003.",
    "Two graduate students started the company in Palo Alto in 1998.",
    "The company was founded in 1999 in Palo Alto.",
    "The company was not founded in Palo Alto.",
    "The company was not profitable in its first year.",
    "The company was profitable in its first year.",
    "The company was founded in Berlin in 1998.",
    "Revenue reached $1 million in 2020. Revenue was up 12 percent in 2020. There were 2500 staff in 2020.",
    "Revenue was up 15% in 2020.",
    "Poseidon grossed $181.7 million worldwide. Poseidon grossed $190 million worldwide.",
    "Poseidon had a budget of $160,000,000.",
    "The treaty was signed in Riga on March 4, 1921. The treaty was signed in Riga in April 1921.",
    "The company was founded in 1998 in Palo Alto and it opened an office in Tokyo in 2005.",
    "Here is what I found. " + CONTEXT + " Let me know if you need more. I hope this helps!",
    "Here is what I found. Let me know if you need more.",
    CONTEXT + " It later expanded to Europe, Japan and Brazil in 2003, hiring 500 people.",
    "I'm sorry, I cannot answer that from the provided documents.",
    "Bananas are rich in potassium.",
    "公司成立于1998年。公司成立于2005年。",
    "Key facts:\n- Founded in 1998.\n- Based in Palo Alto\n\nSummary\nIt was founded by two students. "
    "Did it grow? It e.g. hired 3. people... It \"opened\" offices! Dr. Smith led it; sales rose",
    "\ud800\u200b\ufeff Ⅻ ﬁ x\u0301 \x00 🙂. 公司成立于1998年。 Die Firma wurde 1998 gegründet.",
)


def _golden_digests() -> dict[str, str]:
    """Per (contexts, answer) pair: a digest of repr() of the answer judged on every metric, then of it
    as a running text (checkpoint) cut after every whitespace run, all on one judge."""
    judge = LocalJudge()
    out: dict[str, str] = {}
    for c, contexts in enumerate(_GOLDEN_CONTEXTS):
        for a, answer in enumerate(_GOLDEN_ANSWERS):
            item = EvalInput(QUESTION, contexts, answer, reference=answer[:60])
            results = [repr(judge.evaluate_sync(item, METRICS))]
            cuts = [i for i in range(1, len(answer)) if answer[i - 1].isspace() and not answer[i].isspace()]
            for cut in [*cuts, len(answer)]:
                item = EvalInput(QUESTION, contexts, answer[:cut], kind="checkpoint")
                results.append(repr(judge.evaluate_sync(item, [F])))
            digest = hashlib.sha256("\n".join(results).encode("utf-8", "surrogatepass")).hexdigest()
            out[f"contexts {c}, answer {a}"] = digest[:20]
    return out


def test_results_are_bit_identical_to_the_recorded_ones() -> None:
    with open(GOLDEN, encoding="utf-8") as f:
        expected = json.load(f)
    got = _golden_digests()
    assert got.keys() == expected.keys()
    differ = [k for k in got if got[k] != expected[k]]
    assert not differ, f"results changed for: {differ}"


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(_golden_digests(), f, indent=1, sort_keys=True)
        f.write("\n")


def test_a_chain_of_pronoun_sentences_still_refers_to_the_named_subject() -> None:
    # "It is in Paris." after "It was completed in 1889..." is about the tower of the first sentence: the
    # context's sentence naming Paris names the tower, so the grounded sentence is not underlined
    contexts = ("The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889 for the World's Fair.",)
    prefix = "The Eiffel Tower is 330 metres tall. It was completed in 1889 for the World's Fair."
    judge = LocalJudge()
    ok = judge.evaluate_sync(EvalInput("q", contexts, " It is in Paris.", "checkpoint", prefix=prefix), [F])
    assert ok.scores[0].value == 1.0, ok.scores[0].explanation
    whole = judge.evaluate_sync(EvalInput("q", contexts, prefix + " It is in Paris."), [F])
    assert whole.scores[0].value == 1.0, whole.scores[0].explanation
    bad = judge.evaluate_sync(EvalInput("q", contexts, " It is in Lyon.", "checkpoint", prefix=prefix), [F])
    assert bad.scores[0].value == 0.0


def test_a_context_sentence_that_names_its_subject_by_a_definite_description_supports_claims_about_it() -> None:
    # "The tower is 330 metres tall." after "The Eiffel Tower is in Paris." is about the Eiffel Tower
    contexts = ("The Eiffel Tower is in Paris. The tower is 330 metres tall.",)
    judge = LocalJudge()
    ok = judge.evaluate_sync(EvalInput("q", contexts, "The Eiffel Tower is 330 metres tall."), [F])
    assert ok.scores[0].value == 1.0, ok.scores[0].explanation
    # ... but a name it does not share a word with is still detached from it
    bad = judge.evaluate_sync(EvalInput("q", ("The Eiffel Tower is in Paris. The bridge is 330 metres long.",),
                                        "The Eiffel Tower is 330 metres long."), [F])
    assert bad.scores[0].sentences[0].verdict == "uncertain", bad.scores[0].explanation


def test_the_checkpoint_and_final_tiers_share_one_index_of_a_context_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # both tiers judge the same contexts: the final pass must find the index (and the sentence verdicts)
    # its checkpoints built, not index every context set a second time
    from streamjudge.judging.judges import _local_index

    built: list[tuple[str, ...]] = []
    real_init = _local_index.ContextIndex.__init__

    def counting(self: ContextIndex, contexts: tuple[str, ...], *args: object, **kwargs: object) -> None:
        built.append(tuple(contexts))
        real_init(self, contexts, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_local_index.ContextIndex, "__init__", counting)
    s = Settings()
    checkpoint = create_judge("local", s, tier="checkpoint")
    final = create_judge("local", s, tier="final")
    # contexts no other test indexed in this process (the cache is the process's)
    ctx = (f"The plant in Lyon opened in 1994 and employs 300 people. [{os.getpid()} {id(built)}]",)
    first = asyncio.run(checkpoint.evaluate(EvalInput("q", ctx, "The plant opened in 1994."), ["faithfulness"]))
    whole = asyncio.run(final.evaluate(EvalInput("q", ctx, "The plant opened in 1994. It employs 300 people."),
                                       ["faithfulness"]))
    assert first.scores[0].value == 1.0 and whole.scores[0].value == 1.0
    assert built == [ctx]
    # closing one tier keeps the cache for the other
    asyncio.run(checkpoint.aclose())
    asyncio.run(checkpoint.aclose())  # twice is once
    asyncio.run(final.evaluate(EvalInput("q", ctx, "It employs 300 people."), ["faithfulness"]))
    assert built == [ctx]
    asyncio.run(final.aclose())
    # a judge built on its own keeps a cache of its own
    alone = LocalJudge()
    asyncio.run(alone.evaluate(EvalInput("q", ctx, "The plant opened in 1994."), ["faithfulness"]))
    assert built[1:] == [ctx]


def test_the_shared_index_cache_is_freed_when_its_last_judge_closes() -> None:
    from streamjudge.judging.judges import local

    shared = local._SharedIndexes()
    a, b = shared.acquire(), shared.acquire()
    assert a is b
    a.get(("The sky is blue.",))
    shared.release()
    assert len(a) == 1  # one judge still uses it
    shared.release()
    assert len(a) == 0  # the last one closed: freed
    assert shared.acquire() is not a  # the next judge starts a new one


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_held_the_index_cache_can_still_judge() -> None:
    # a gunicorn-style fork from a parent that judged: the lock the parent's pool thread held at fork time
    # would stay held forever in the child
    import signal

    judge = LocalJudge()
    ctx = ("The sky is blue.",)
    assert judge.evaluate_sync(EvalInput("q", ctx, "The sky is blue."), ["faithfulness"]).scores[0].value == 1.0
    cache = judge._indexes
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with cache._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the holder thread does not exist here
        signal.alarm(5)  # a deadlock ends the child with SIGALRM
        try:
            r = judge.evaluate_sync(EvalInput("q", ctx, "The sky is blue."), ["faithfulness"])
            os._exit(0 if r.scores[0].value == 1.0 else 2)
        except BaseException:
            os._exit(3)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
