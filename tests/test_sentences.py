"""The sentence buffer, construct by construct, and the checkpoint window policy.

Every example is checked twice: split at once, and fed one character at a time (the worst chunking).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjudge import sentences as sentences_module
from streamjudge.sentences import CheckpointPolicy, Sentence, SentenceBuffer, split_sentences


def sentences(text: str, max_sentence_chars: int = 1000) -> list[str]:
    """The sentence texts of ``text``; asserts that char-by-char streaming gives the very same result."""
    whole = split_sentences(text, max_sentence_chars)
    buffer = SentenceBuffer(max_sentence_chars)
    streamed: list[Sentence] = []
    for ch in text:
        streamed.extend(buffer.feed(ch))
    streamed.extend(buffer.flush())
    assert streamed == whole
    for s in whole:
        assert text[s.start : s.end] == s.text
    return [s.text for s in whole]


# --- plain prose ---------------------------------------------------------------------------------------
def test_sentences_end_at_stops_followed_by_a_capital() -> None:
    assert sentences("The sky is blue. Grass is green! Is it? Yes.") == [
        "The sky is blue.",
        "Grass is green!",
        "Is it?",
        "Yes.",
    ]


def test_a_stop_followed_by_lowercase_does_not_end_the_sentence() -> None:
    assert sentences('"Why?" she asked. Wow! that was fast.') == [
        '"Why?" she asked.',
        "Wow! that was fast.",
    ]


def test_final_sentence_without_a_stop_is_flushed_at_end_of_stream() -> None:
    buffer = SentenceBuffer()
    assert buffer.feed("First one. Then an unfinished") == (Sentence("First one.", 0, 10),)
    assert buffer.feed(" thought") == ()
    assert buffer.flush() == (Sentence("Then an unfinished thought", 11, 37),)


# --- abbreviations -------------------------------------------------------------------------------------
def test_titles_never_end_a_sentence() -> None:
    assert sentences("Dr. Smith met Mr. and Mrs. Jones. Prof. Lee lives on St. Mark's Place.") == [
        "Dr. Smith met Mr. and Mrs. Jones.",
        "Prof. Lee lives on St. Mark's Place.",
    ]


def test_latin_abbreviations_continue_the_sentence() -> None:
    assert sentences("Use fruit, e.g. The apple, i.e. a pome. Red vs. Blue is fun. Done.") == [
        "Use fruit, e.g. The apple, i.e. a pome.",
        "Red vs. Blue is fun.",
        "Done.",
    ]


def test_etc_ends_a_sentence_before_a_capital_and_not_before_lowercase() -> None:
    assert sentences("Apples, pears, etc. are sold. We sell apples, pears, etc. The shop opens at 9.") == [
        "Apples, pears, etc. are sold.",
        "We sell apples, pears, etc.",
        "The shop opens at 9.",
    ]


def test_number_abbreviations_continue_before_a_number() -> None:
    assert sentences("See No. 5 and Fig. 3 from Jan. 15 on pp. 12. It was cold in Jan. The end.") == [
        "See No. 5 and Fig. 3 from Jan. 15 on pp. 12.",
        "It was cold in Jan.",
        "The end.",
    ]


def test_company_abbreviations_end_only_before_a_sentence_opener() -> None:
    assert sentences("Acme Inc. CEO Jane Doe spoke. She praised Widgets Ltd. The deal closed.") == [
        "Acme Inc. CEO Jane Doe spoke.",
        "She praised Widgets Ltd.",
        "The deal closed.",
    ]


def test_dotted_acronyms_continue_into_names_and_end_before_openers() -> None:
    assert sentences("The U.S. Army and the U.K. Navy met. They met in the U.S. The talks went well.") == [
        "The U.S. Army and the U.K. Navy met.",
        "They met in the U.S.",
        "The talks went well.",
    ]


def test_initials_are_not_sentence_ends() -> None:
    assert sentences("J. R. R. Tolkien wrote it. It sold well.") == [
        "J. R. R. Tolkien wrote it.",
        "It sold well.",
    ]


# --- numbers, URLs ---------------------------------------------------------------------------------------
def test_decimals_versions_and_prices_do_not_split() -> None:
    assert sentences("Pi is 3.14. Install v1.2.3 for $1.5 today. The population was 1,234.") == [
        "Pi is 3.14.",
        "Install v1.2.3 for $1.5 today.",
        "The population was 1,234.",
    ]


def test_urls_and_emails_do_not_split() -> None:
    assert sentences("Open https://example.com/a.b?x=1 now. Mail john.doe@example.org. Thanks!") == [
        "Open https://example.com/a.b?x=1 now.",
        "Mail john.doe@example.org.",
        "Thanks!",
    ]


def test_citation_markers_after_the_stop_belong_to_the_sentence() -> None:
    assert sentences("The sky is blue.[1] Grass is green.[2][3] Water is wet [4]. Done.") == [
        "The sky is blue.[1]",
        "Grass is green.[2][3]",
        "Water is wet [4].",
        "Done.",
    ]


# --- ellipses, quotes, brackets --------------------------------------------------------------------------
def test_ellipsis_ends_a_sentence_only_before_whitespace_and_a_capital() -> None:
    assert sentences("Wait... what happened? Wait... Then it ended… And so… on it went.") == [
        "Wait... what happened?",
        "Wait...",
        "Then it ended…",
        "And so… on it went.",
    ]


@pytest.mark.parametrize("closer", ['"', ")", "]", "’", "”", "»", "'", "**"])
def test_closing_quotes_and_brackets_after_the_stop_stay_with_the_sentence(closer: str) -> None:
    assert sentences(f"He said x.{closer} Then he left.") == [f"He said x.{closer}", "Then he left."]


def test_quoted_sentence_followed_by_a_new_one() -> None:
    assert sentences('He said "yes." Then he left. (It was late.) Next.') == [
        'He said "yes."',
        "Then he left.",
        "(It was late.)",
        "Next.",
    ]


# --- lines and blocks ------------------------------------------------------------------------------------
def test_numbered_list_items_are_units_and_the_number_is_not_a_sentence() -> None:
    assert sentences("Steps:\n1. First\n2. Second item. It has two sentences.\n3. Third") == [
        "Steps:",
        "1. First",
        "2. Second item.",
        "It has two sentences.",
        "3. Third",
    ]


def test_bullets_are_units() -> None:
    assert sentences("Fruit:\n- Apples\n* Pears\n+ Plums\n• Figs") == [
        "Fruit:",
        "- Apples",
        "* Pears",
        "+ Plums",
        "• Figs",
    ]


def test_blank_line_is_a_paragraph_break_and_a_single_line_break_is_a_soft_wrap() -> None:
    assert sentences("A title without a stop\n\nThis line is\nwrapped softly. Next one") == [
        "A title without a stop",
        "This line is\nwrapped softly.",
        "Next one",
    ]


def test_headings_quotes_and_table_rows_are_their_own_lines() -> None:
    assert sentences("## Overview\nThe film grossed $181M.\n> A quote\n| a | b |\n| 1 | 2 |") == [
        "## Overview",
        "The film grossed $181M.",
        "> A quote",
        "| a | b |",
        "| 1 | 2 |",
    ]


def test_code_fence_is_one_unit() -> None:
    text = "Run this:\n```python\nx = 3.14. \nprint(x)  # Done. Really!\n```\nAfter the code. Fine."
    assert sentences(text) == [
        "Run this:",
        "```python\nx = 3.14. \nprint(x)  # Done. Really!\n```",
        "After the code.",
        "Fine.",
    ]


def test_unclosed_code_fence_is_flushed_as_one_unit() -> None:
    assert sentences("Code:\n```\na. B. c.\nD.") == ["Code:", "```\na. B. c.\nD."]


def test_inline_backticks_are_not_fences() -> None:
    assert sentences("Call `f.x()` here. Use ``` to open a block. Done.") == [
        "Call `f.x()` here.",
        "Use ``` to open a block.",
        "Done.",
    ]


# --- other scripts ---------------------------------------------------------------------------------------
def test_cjk_stops_need_no_whitespace() -> None:
    assert sentences("今天天气很好。我们去公园吧！好的？他说：「好。」然后走了") == [
        "今天天气很好。",
        "我们去公园吧！",
        "好的？",
        "他说：「好。」",
        "然后走了",
    ]


def test_mixed_scripts() -> None:
    assert sentences("Paris est belle. Привет мир. Das ist gut。東京は大きい。 Ελληνικά εδώ.") == [
        "Paris est belle.",
        "Привет мир.",
        "Das ist gut。",
        "東京は大きい。",
        "Ελληνικά εδώ.",
    ]


# --- run-ons ---------------------------------------------------------------------------------------------
def test_run_on_is_force_split_at_the_last_whitespace() -> None:
    assert sentences("alpha beta gamma delta epsilon", max_sentence_chars=12) == [
        "alpha beta",
        "gamma delta",
        "epsilon",
    ]


def test_run_on_without_whitespace_is_cut_at_the_limit() -> None:
    assert sentences("abcdefghijklmnopqrstuvwxyz", max_sentence_chars=10) == [
        "abcdefghij",
        "klmnopqrst",
        "uvwxyz",
    ]


class _Counting:
    """Stands in for a compiled pattern of the buffer; counts the characters its searches examined."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self._pattern = pattern
        self.chars = 0

    def _count(self, m: re.Match[str] | None, s: str, pos: int, endpos: int) -> re.Match[str] | None:
        self.chars += (m.end() if m is not None else min(endpos, len(s))) - pos
        return m

    def search(self, s: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self._count(self._pattern.search(s, pos, endpos), s, pos, endpos)

    def match(self, s: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self._count(self._pattern.match(s, pos, endpos), s, pos, endpos)


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Characters examined by the buffer's scanner so far (a quadratic buffer re-reads its tail)."""
    counters = []
    for name in ("_CANDIDATE", "_NONSPACE", "_LAST_SPACE"):
        counter = _Counting(getattr(sentences_module, name))
        monkeypatch.setattr(sentences_module, name, counter)
        counters.append(counter)
    return lambda: sum(c.chars for c in counters)


def test_a_one_megabyte_token_is_split_in_linear_time(scanned: Callable[[], int]) -> None:
    text = ("word " * 199 + "end") * 1000  # 1 MB, one token, no stop at all
    buffer = SentenceBuffer(max_sentence_chars=1000)
    out = buffer.feed(text) + buffer.flush()
    assert len(text) == 998_000
    assert all(len(s.text) <= 1000 for s in out)
    assert "".join(s.text for s in out).replace(" ", "") == text.replace(" ", "")
    assert scanned() <= 3 * len(text)  # measured 2x (candidates, then the last space of each cut)
    no_space = SentenceBuffer(max_sentence_chars=1000)
    assert len(no_space.feed("x" * 1_000_000) + no_space.flush()) == 1000
    assert scanned() <= 3 * len(text) + 3 * 1_000_000


def test_one_char_tokens_with_many_stops_stay_linear(scanned: Callable[[], int]) -> None:
    # 210 kB, a candidate every few chars; two sentences per repeat ("ok. v1.2": lowercase, no end)
    text = "It is Dr. Smith. Yes... ok. v1.2 is 3.14! " * 5000
    buffer = SentenceBuffer()
    count = 0
    for ch in text:
        count += len(buffer.feed(ch))
    count += len(buffer.flush())
    assert count == 10000
    assert scanned() <= len(text)  # measured len / 3: most stops are decided without a search


def test_a_dotted_word_too_long_for_an_abbreviation_ends_the_sentence() -> None:
    dotted = "a." * 25  # 50 chars: beyond the look-behind for abbreviations, unlike "a.a.a."
    assert sentences(f"See {dotted} Army units. Done.") == [f"See {dotted}", "Army units.", "Done."]
    assert sentences("See a.a.a. Army units. Done.") == ["See a.a.a. Army units.", "Done."]


# --- the streaming contract -------------------------------------------------------------------------------
def test_the_decision_waits_for_lookahead_and_emits_as_soon_as_it_can() -> None:
    buffer = SentenceBuffer()
    assert buffer.feed("Pi is 3.") == ()  # "3." could be "3.14" or a sentence end
    assert buffer.feed("14") == ()
    assert buffer.feed(". ") == ()  # "14. " waits for the next character
    assert buffer.feed("Dr.") == (Sentence("Pi is 3.14.", 0, 11),)
    assert buffer.feed(" ") == ()  # "Dr. " waits too ...
    assert buffer.feed("Smith came.") == ()  # ... and never ends a sentence before a name
    assert buffer.feed("\n") == (Sentence("Dr. Smith came.", 12, 27),)
    assert buffer.flush() == ()


def test_running_text_and_offsets() -> None:
    buffer = SentenceBuffer()
    tokens = ["  Hello", " world", ".", " How", " are", " you", "?"]
    out: list[Sentence] = []
    for token in tokens:
        out.extend(buffer.feed(token))
        assert buffer.text() == "".join(tokens[: tokens.index(token) + 1])
    out.extend(buffer.flush())
    assert buffer.length == len(buffer.text()) == 27
    assert out == [Sentence("Hello world.", 2, 14), Sentence("How are you?", 15, 27)]


def test_empty_token_returns_nothing() -> None:
    buffer = SentenceBuffer()
    assert buffer.feed("") == ()
    assert buffer.feed("Hi.") == ()
    assert buffer.feed("") == ()
    assert buffer.flush() == (Sentence("Hi.", 0, 3),)
    assert buffer.text() == "Hi."


def test_bytes_are_rejected_with_a_hint() -> None:
    with pytest.raises(TypeError, match="decode bytes first"):
        SentenceBuffer().feed(b"Hello.")  # type: ignore[arg-type]


def test_feeding_after_flush_starts_a_new_segment() -> None:
    buffer = SentenceBuffer()
    buffer.feed("One two")
    assert buffer.flush() == (Sentence("One two", 0, 7),)
    assert buffer.feed(" three. Four") == (Sentence("three.", 8, 14),)
    assert buffer.flush() == (Sentence("Four", 15, 19),)


def test_max_sentence_chars_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SentenceBuffer(0)


# --- properties ------------------------------------------------------------------------------------------
FRAGMENTS = [
    "Dr.", " Smith", "3.14", " e.g.", " the", "U.S.", " The", " Army", "...", "…", " what", " What", "!", "?",
    "\n", "\n\n", "1.", " First", "- ", "* ", "```", "```py", "\n```\n", '"', "”", ")", "’", "»", "。", "！",
    "？", "「好。」", "[1]", "[2", " ", "  ", "\t", "https://example.com/a.b?x=1", " john.doe@example.org.",
    "J.", " R.", " Tolkien", "Inc.", " CEO", "No.", " 5", "word", " x", "A", "b", ".", "#", "## H", "|", ">",
    "`", "12", "\r\n", "Привет.", " 東京", "v1.2.3",
]  # fmt: skip

texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)),
    max_size=40,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=texts, max_chars=st.sampled_from([1000, 40, 12, 3]), data=st.data())
def test_any_chunking_gives_the_same_sentences_as_splitting_at_once(
    text: str, max_chars: int, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=len(text) + 1)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    buffer = SentenceBuffer(max_chars)
    streamed: list[Sentence] = []
    for chunk in chunks:
        streamed.extend(buffer.feed(chunk))
    streamed.extend(buffer.flush())
    assert streamed == split_sentences(text, max_chars)
    assert buffer.text() == text and buffer.length == len(text)


def test_a_stop_run_across_the_run_on_cut_is_decided_as_when_split_at_once() -> None:
    # "..." straddles the cut at 1000: the part after the cut starts a new sentence, whose stops are
    # decided afresh, however the text was chunked (a "\r1" token used to leave "." and "1" joined)
    text = "a" * 998 + "..." + "\r1"
    buffer = SentenceBuffer()
    streamed = [*buffer.feed("a" * 998 + "..."), *buffer.feed("\r1"), *buffer.flush()]
    assert streamed == split_sentences(text)
    assert [s.text for s in streamed] == ["a" * 998 + "..", ".", "1"]
    assert sentences(text) == ["a" * 998 + "..", ".", "1"]


STOP_FRAGMENTS = [f for f in FRAGMENTS if any(c in f for c in ".!?…。！？\n")]


def test_chunk_boundaries_at_every_position_around_the_run_on_cut_give_the_same_sentences() -> None:
    # exhaustive over a stop construct just before / across / after the limit, one more fragment after
    # it, and chunk boundaries at every position around the cut (hypothesis rarely hits one exact split)
    limit = 12
    for head in ("a" * 14, " a." * 5):
        for reach in range(limit - 3, limit + 1):
            for stop in STOP_FRAGMENTS:
                for after in [*FRAGMENTS, "\r1"]:
                    text = head[:reach] + stop + after
                    whole = split_sentences(text, limit)
                    for c in range(reach - 2, len(text)):
                        for d in (c + 1, len(text)):
                            buffer = SentenceBuffer(limit)
                            streamed = [*buffer.feed(text[:c]), *buffer.feed(text[c:d]), *buffer.feed(text[d:])]
                            assert [*streamed, *buffer.flush()] == whole, (text, c, d)


# text that reaches the run-on limit: filler of about the limit's length, then the fragments, so that the
# forced cut falls on every construct
@st.composite
def _texts_at_the_cut(draw: st.DrawFn) -> tuple[str, int]:
    max_chars = draw(st.sampled_from([1000, 40, 12, 3]))
    filler = draw(st.sampled_from(["a", "ab ", "x.", " "]))
    reach = draw(st.integers(max(0, max_chars - 8), max_chars + 2))
    head = (filler * (reach // len(filler) + 1))[:reach]
    return head + draw(st.sampled_from(STOP_FRAGMENTS)) + draw(texts), max_chars


@settings(max_examples=400, deadline=None)
@given(case=_texts_at_the_cut(), data=st.data())
def test_any_chunking_around_the_run_on_cut_gives_the_same_sentences(
    case: tuple[str, int], data: st.DataObject
) -> None:
    text, max_chars = case
    # chunk boundaries anywhere, and most of them close to the limit, where the cut happens
    near = st.integers(min(len(text), max(0, max_chars - 6)), min(len(text), max_chars + 10))
    cuts = sorted(data.draw(st.sets(st.one_of(near, st.integers(0, len(text))), max_size=12)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    buffer = SentenceBuffer(max_chars)
    streamed: list[Sentence] = []
    for chunk in chunks:
        streamed.extend(buffer.feed(chunk))
    streamed.extend(buffer.flush())
    assert streamed == split_sentences(text, max_chars)
    assert all(s.end - s.start <= max_chars for s in streamed)


@settings(max_examples=400, deadline=None)
@given(text=texts, max_chars=st.sampled_from([1000, 40, 12, 3]))
def test_sentences_cover_the_text_in_order_without_overlap(text: str, max_chars: int) -> None:
    position = 0
    for s in split_sentences(text, max_chars):
        assert s.text and s.text == s.text.strip()
        assert text[s.start : s.end] == s.text
        assert s.start >= position and text[position : s.start].strip() == ""
        assert s.end - s.start <= max_chars
        position = s.end
    assert text[position:].strip() == ""


@settings(max_examples=100, deadline=None)
@given(text=texts)
def test_one_char_chunks_give_the_same_sentences(text: str) -> None:
    sentences(text)


FAITHBENCH = Path(__file__).resolve().parents[2] / "shared" / "benchdata" / "faithbench-dev"


def _word_tokens(text: str) -> list[str]:
    """LLM-like chunks as in benchmarks/run.py: a word and its trailing space, long words cut at 6 chars."""
    out: list[str] = []
    for word in re.findall(r"[^ ]* |[^ ]+$", text):
        while len(word) > 8:
            out.append(word[:6])
            word = word[6:]
        out.append(word)
    return out


def test_faithbench_summaries_stream_to_the_same_sentences_as_split_at_once() -> None:
    files = sorted(FAITHBENCH.glob("batch_*.json"))
    if not files:
        pytest.skip(f"FaithBench dev split not found in {FAITHBENCH} (benchmark data is not in the repo)")
    summaries = [s["summary"] for f in files for s in json.loads(f.read_text())["samples"]]
    assert len(summaries) == 250
    for text in summaries:
        whole = split_sentences(text)
        assert "".join(_word_tokens(text)) == text
        for chunks in (list(text), _word_tokens(text)):
            buffer = SentenceBuffer()
            streamed: list[Sentence] = []
            for chunk in chunks:
                streamed.extend(buffer.feed(chunk))
            streamed.extend(buffer.flush())
            assert streamed == whole
            assert buffer.text() == text


# --- checkpoint window policy ------------------------------------------------------------------------------
def _sentence(start: int, length: int) -> Sentence:
    return Sentence("x" * length, start, start + length)


def test_checkpoint_closes_after_two_sentences_by_default() -> None:
    policy = CheckpointPolicy()
    closes = [policy.add(_sentence(i * 20, 19)) for i in range(5)]
    assert closes == [False, True, False, True, False]
    assert policy.pending == 1


def test_checkpoint_closes_early_once_the_window_reaches_the_char_limit() -> None:
    policy = CheckpointPolicy(sentences=3, chars=100)
    assert policy.add(_sentence(0, 150)) is True  # one long sentence fills the window on its own
    assert policy.add(_sentence(151, 40)) is False
    assert policy.add(_sentence(192, 60)) is True  # 151..252 spans 101 chars
    assert policy.add(_sentence(253, 10)) is False
    assert policy.add(_sentence(264, 10)) is False
    assert policy.add(_sentence(275, 10)) is True  # third sentence


def test_every_n_sentences_ignores_length() -> None:
    policy = CheckpointPolicy(chars=10, every=3)
    closes = [policy.add(_sentence(i * 500, 499)) for i in range(7)]
    assert closes == [False, False, True, False, False, True, False]


def test_every_sentence() -> None:
    policy = CheckpointPolicy(sentences=1)
    assert all(policy.add(_sentence(i * 10, 5)) for i in range(4))


def test_reset_forgets_the_open_window() -> None:
    policy = CheckpointPolicy()
    policy.add(_sentence(0, 5))
    policy.reset()
    assert policy.pending == 0
    assert policy.add(_sentence(6, 5)) is False


@pytest.mark.parametrize("kwargs", [{"sentences": 0}, {"chars": 0}, {"every": -1}])
def test_checkpoint_policy_rejects_bad_settings(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        CheckpointPolicy(**kwargs)


def test_policy_on_a_real_stream() -> None:
    buffer = SentenceBuffer()
    policy = CheckpointPolicy(sentences=2, chars=200)
    checkpoints: list[str] = []
    text = "It rained. Dr. Who came. The U.S. Army left. We stayed home."
    for token in re.findall(r"\S+\s*", text):
        for sentence in buffer.feed(token):
            if policy.add(sentence):
                checkpoints.append(buffer.text()[: sentence.end])
    for sentence in buffer.flush():
        if policy.add(sentence):
            checkpoints.append(buffer.text()[: sentence.end])
    assert checkpoints == [
        "It rained. Dr. Who came.",
        "It rained. Dr. Who came. The U.S. Army left. We stayed home.",
    ]
