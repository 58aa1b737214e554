"""What a verdict does to a stream: the pure state machine behind every guarded stream.

No spans, no judging service, no threads: windows are registered by hand, verdicts are built by hand, and the
actions that come back are the whole behaviour - which tokens go out and in what order, what the reader is
warned about, and whether the answer is flagged, stopped or regenerated.
"""

from __future__ import annotations

import ast
from pathlib import Path

import streamjudge.judging._stream_state as stream_state
from streamjudge.judging._stream_state import Action, Alert, Regenerate, Release, Stop, StreamState, Unjudged
from streamjudge.results import JobOutcome, Score, SentenceScore, Verdict

# the answer, one window per line: three sentences, the second one invented
TEXT = "The sky is blue. The moon is cheese. Grass is green."
SKY = (0, 16)  # "The sky is blue."
MOON = (17, 36)  # " The moon is cheese." minus its leading space
GRASS = (37, 52)


def tokens(start: int, end: int) -> list[str]:
    """The window ``start..end`` of TEXT as tokens of at most five chars."""
    return [TEXT[i:min(i + 5, end)] for i in range(start, end, 5)]


def passed(index: int, start: int, end: int) -> Verdict:
    score = Score("faithfulness", 1.0, "pass", "", sentences=(SentenceScore(start, end, 1.0, "", "pass"),))
    return Verdict("checkpoint", index, JobOutcome("judged"), (score,), start, end)


def failed(index: int, start: int, end: int, bad: tuple[int, int]) -> Verdict:
    """Checkpoint ``index`` over ``start..end`` in which the sentence ``bad`` failed (the others passed)."""
    sentences = [SentenceScore(bad[0], bad[1], 0.0, "not in the context", "fail")]
    if bad[0] > start:
        sentences.insert(0, SentenceScore(start, bad[0], 1.0, "", "pass"))
    score = Score("faithfulness", 0.5, "fail", "the moon is not cheese", sentences=tuple(sentences))
    return Verdict("checkpoint", index, JobOutcome("judged"), (score,), start, end)


def not_judged(index: int, status: str = "timeout") -> Verdict:
    return Verdict("checkpoint", index, JobOutcome(status))  # type: ignore[arg-type]


def text() -> str:
    return TEXT


def released(actions: list[Action]) -> str:
    return "".join(tok for a in actions if isinstance(a, Release) for tok in a.tokens)


# --- hold-back: what goes out, and when ---------------------------------------------------------------


def test_a_window_that_passed_goes_out_and_the_stream_passes() -> None:
    state = StreamState(hold_back=True)
    state.open(0, 0, SKY[1], tokens(*SKY))
    assert state.verdict == "unjudged"

    actions = state.on_verdict(passed(0, *SKY), text)

    assert released(actions) == "The sky is blue."
    assert state.verdict == "pass" and not state.checkpoints and state.released_end == SKY[1]


def test_windows_go_out_in_order_a_later_pass_waits_for_the_earlier_window() -> None:
    state = StreamState(hold_back=True)
    state.open(0, 0, 36, tokens(0, 36))
    state.open(1, 36, 52, tokens(36, 52))

    assert state.on_verdict(passed(1, 36, 52), text) == []  # window 0 has not gone out yet
    assert released(state.on_verdict(passed(0, 0, 36), text)) == TEXT  # both, in order


def test_each_checkpoint_is_decided_once_and_retracted_ones_not_at_all() -> None:
    state = StreamState(hold_back=True, action="stop")
    state.open(0, 0, SKY[1], tokens(*SKY))
    assert released(state.on_verdict(passed(0, *SKY), text)) == "The sky is blue."

    assert state.on_verdict(failed(0, *SKY, bad=SKY), text) == []  # decided already
    assert state.on_verdict(failed(7, *SKY, bad=SKY), text) == []  # never opened
    assert state.alerts == 0 and state.verdict == "pass"


def test_a_superseded_checkpoint_says_nothing_a_newer_one_covers_its_sentences() -> None:
    state = StreamState()
    state.open(0, 0, 16)
    assert state.on_verdict(not_judged(0, "superseded"), text) == []
    assert state.verdict == "unjudged"


def test_a_checkpoint_nobody_judged_goes_out_fail_open_and_says_why() -> None:
    state = StreamState(hold_back=True)
    state.open(0, 0, SKY[1], tokens(*SKY))

    actions = state.on_verdict(not_judged(0, "timeout"), text)

    assert actions == [Unjudged("timeout"), Release(tokens(*SKY))]
    assert state.verdict == "unjudged"


def test_windows_nothing_will_judge_and_the_stream_end_release_what_is_held_in_order() -> None:
    state = StreamState(hold_back=True)
    state.open(0, 0, 16, tokens(0, 16))
    state.open(1, 16, 36, tokens(16, 36))
    state.open(2, 36, 52, tokens(36, 52))

    assert state.pass_unjudged(1) == []  # waits for window 0
    assert "".join(state.release_all()) == TEXT


# --- a failing sentence: flag, stop, regenerate -------------------------------------------------------


def test_flag_warns_and_lets_the_answer_go_on() -> None:
    state = StreamState(hold_back=True, action="flag")
    state.open(0, 0, 36, tokens(0, 36))

    actions = state.on_verdict(failed(0, 0, 36, bad=MOON), text)

    assert [type(a) for a in actions] == [Alert, Release]
    alert = actions[0]
    assert isinstance(alert, Alert) and alert.action == "flag" and alert.reason is None
    assert released(actions) == TEXT[:36]  # flagging withholds nothing
    assert state.verdict == "flagged" and state.alerts == 1 and state.first_alert_char == MOON[1]


def test_stop_in_hold_back_releases_the_passing_sentences_before_the_failing_one_and_nothing_after() -> None:
    state = StreamState(hold_back=True, action="stop")
    state.open(0, 0, 36, tokens(0, 36))
    state.open(1, 36, 52, tokens(36, 52))

    actions = state.on_verdict(failed(0, 0, 36, bad=MOON), text)

    # up to the grounded sentence's end (the fallback brings its own separator), then the warning, then stop
    assert [type(a) for a in actions] == [Release, Alert, Stop]
    assert released(actions) == "The sky is blue."
    state.stop()
    assert state.verdict == "stopped" and state.released_end == SKY[1]
    assert state.on_verdict(passed(1, 36, 52), text) == []  # a later window never goes out
    assert state.release_all() == []


def test_stop_in_stream_first_releases_nothing_it_never_held_anything() -> None:
    state = StreamState(action="stop")
    state.open(0, 0, 36, tokens(0, 36))
    actions = state.on_verdict(failed(0, 0, 36, bad=MOON), text)
    assert [type(a) for a in actions] == [Alert, Stop]


def test_regenerate_continues_after_the_passed_prefix_and_retracts_what_was_shown_past_it() -> None:
    state = StreamState(action="regenerate", can_regenerate=True)
    state.open(0, 0, 36)

    actions = state.on_verdict(failed(0, 0, 36, bad=MOON), text)

    # the client saw all of TEXT (stream-first); the accepted prefix ends at the grounded sentence
    assert actions[-1] == Regenerate(keep=SKY[1], shown=len(TEXT), checkpoint=0)
    assert state.verdict == "regenerated"


def test_regenerate_in_hold_back_retracts_only_what_was_released() -> None:
    state = StreamState(hold_back=True, action="regenerate", can_regenerate=True)
    state.open(0, 0, 36, tokens(0, 36))

    actions = state.on_verdict(failed(0, 0, 36, bad=MOON), text)

    assert released(actions) == "The sky is blue."
    assert actions[-1] == Regenerate(keep=SKY[1], shown=SKY[1], checkpoint=0)  # nothing to retract


def test_the_prefix_kept_is_contiguous_from_the_start_whatever_order_verdicts_came_in() -> None:
    state = StreamState(action="regenerate", can_regenerate=True)
    state.open(0, 0, 16)
    state.open(1, 16, 36)
    state.open(2, 36, 52)
    state.on_verdict(passed(2, 36, 52), text)  # passed, but not contiguous with the start yet

    actions = state.on_verdict(failed(0, 0, 16, bad=SKY), text)

    assert actions[-1] == Regenerate(keep=0, shown=len(TEXT), checkpoint=0)


def test_regenerate_without_a_model_to_reprompt_flags_and_says_why() -> None:
    state = StreamState(action="regenerate", can_regenerate=False)
    state.open(0, 0, 36)
    alert, *rest = state.on_verdict(failed(0, 0, 36, bad=MOON), text)
    assert isinstance(alert, Alert) and (alert.action, alert.reason) == ("flag", "no_regenerate_callback")
    assert rest == [] and state.verdict == "flagged"


def test_after_the_last_regeneration_allowed_a_failure_stops_the_answer() -> None:
    state = StreamState(action="regenerate", can_regenerate=True, max_regenerations=1)
    state.open(0, 0, 36)
    assert isinstance(state.on_verdict(failed(0, 0, 36, bad=MOON), text)[-1], Regenerate)

    state.restart(prefix_chars=SKY[1], next_index=1)
    state.open(1, SKY[1], 40)
    actions = state.on_verdict(failed(1, SKY[1], 40, bad=(17, 40)), text)

    assert [type(a) for a in actions] == [Alert, Stop]
    alert = actions[0]
    assert isinstance(alert, Alert) and (alert.action, alert.reason) == ("stop", "max_regenerations")
    assert state.regenerations == 1 and state.alerts == 2


def test_a_regeneration_forgets_the_retracted_windows_and_keeps_the_accepted_prefix() -> None:
    state = StreamState(hold_back=True, action="regenerate", can_regenerate=True, max_regenerations=2)
    state.open(0, 0, 36, tokens(0, 36))
    state.open(1, 36, 52, tokens(36, 52))
    state.on_verdict(failed(0, 0, 36, bad=MOON), text)

    state.restart(prefix_chars=SKY[1], next_index=2)

    assert state.on_verdict(passed(1, 36, 52), text) == []  # a verdict on retracted text
    state.open(2, SKY[1], 30, [" Grass is green."])
    assert released(state.on_verdict(passed(2, SKY[1], 30), text)) == " Grass is green."
    # the regenerated text passed from the prefix on: a failure after it keeps all of it
    state.open(3, 30, 45, ["x"])
    assert state.on_verdict(failed(3, 30, 45, bad=(30, 45)), lambda: "a" * 45)[-1] == Regenerate(30, 30, 3)


def test_the_first_failure_fixes_the_kept_prefix_passes_that_arrive_after_it_do_not_move_it() -> None:
    state = StreamState(action="regenerate", can_regenerate=True, max_regenerations=5)
    state.open(0, 0, 16)
    state.open(1, 16, 36)
    state.open(2, 36, 52)
    assert state.on_verdict(failed(1, 16, 36, bad=MOON), text)[-1] == Regenerate(0, len(TEXT), 1)

    state.on_verdict(passed(0, *SKY), text)  # came late: the continuation starts from nothing all the same
    assert state.on_verdict(failed(2, 36, 52, bad=GRASS), text)[-1] == Regenerate(0, len(TEXT), 2)


def test_skipped_checks_count_failures_as_passes() -> None:
    state = StreamState(hold_back=True, action="stop")
    state.open(0, 0, 36, tokens(0, 36))
    actions = state.on_verdict(failed(0, 0, 36, bad=MOON), text, quiet=True)
    assert released(actions) == TEXT[:36] and state.verdict == "pass" and state.alerts == 0


def test_a_joined_window_extends_its_checkpoint() -> None:
    state = StreamState(hold_back=True)
    state.open(0, 0, 16, tokens(0, 16))
    state.extend(0, 36)
    state.checkpoints[0].tokens = tokens(0, 36)
    assert released(state.on_verdict(passed(0, 0, 36), text)) == TEXT[:36]
    assert state.released_end == 36


def test_a_closed_stream_holds_nothing_and_waits_for_nothing() -> None:
    state = StreamState(hold_back=True)
    state.open(0, 0, 16, tokens(0, 16))
    state.close()
    assert not state.checkpoints and state.released_end is None
    assert state.on_verdict(passed(0, 0, 16), text) == []


def test_the_state_machine_needs_no_spans_threads_clock_or_event_loop() -> None:
    tree = ast.parse(Path(stream_state.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    forbidden = ("opentelemetry", "threading", "asyncio", "concurrent", "time")
    assert not {m for m in imported if m.split(".")[0] in forbidden}, imported
