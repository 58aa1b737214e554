"""``streamjudge.sentences.split_units``: the units a judge compares claims with in a whole document."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamjudge.sentences import split_sentences, split_units


def texts(doc: str) -> list[str]:
    units = split_units(doc)
    assert all(doc[u.start : u.end] == u.text for u in units)
    return [u.text for u in units]


def test_headings_list_items_and_table_rows_are_units_of_their_own() -> None:
    doc = ("# Plans\nRefund Policy\nCustomers may return items. Dr. Smith approves refunds.\n"
           "- Support by email\n2. Refunds in 30 days\n\n| Plan | Price |\n|---|---|\n| Pro | $25 |\n")
    assert texts(doc) == ["Plans", "Refund Policy", "Customers may return items.", "Dr. Smith approves refunds.",
                          "Support by email", "Refunds in 30 days", "Plan | Price", "Pro | $25"]


def test_a_soft_wrapped_sentence_stays_one_unit() -> None:
    assert texts("The company was founded by John\nSmith in 1998. It grew.") == [
        "The company was founded by John\nSmith in 1998.", "It grew."]


def test_a_line_of_prose_splits_as_the_stream_does() -> None:
    line = "It opened in 1889. It is 330 m tall; e.g. taller than most."
    assert split_units(line) == split_sentences(line)


@given(st.text(alphabet=st.sampled_from("ab .|-#\n\t1A"), max_size=60))
def test_every_unit_is_a_piece_of_the_text(doc: str) -> None:
    for u in split_units(doc):
        assert doc[u.start : u.end] == u.text and u.text.strip() == u.text and u.text
