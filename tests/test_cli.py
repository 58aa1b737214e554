"""`streamjudge replay`: the recorded-stream regression harness, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).parent.parent / "examples" / "replay" / "cases.jsonl"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamjudge.cli", "replay", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_table_and_exit_status_zero_when_every_expectation_holds() -> None:
    p = run(str(CASES))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "founded-europe" in p.stdout and "PASS" in p.stdout and "FAIL" not in p.stdout


def test_json_lines_carry_first_alert_char_and_final_scores() -> None:
    p = run(str(CASES), "--json")
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    cases, summary = lines[:-1], lines[-1]
    assert summary["summary"] is True and summary["cases"] == len(cases) == 5
    europe = next(c for c in cases if c["id"] == "founded-europe")
    answer = json.loads(CASES.read_text().splitlines()[1])["answer"]
    assert europe["fired"] is True
    # the end offset of the first failing checkpoint: the sentence with the unsupported claim
    assert answer[: europe["first_alert_char"]].endswith("Europe in 2003.")
    assert set(europe["final"]) == {"faithfulness", "answer_relevancy", "context_precision", "context_recall"}
    grounded = next(c for c in cases if c["id"] == "founded-grounded")
    assert grounded["fired"] is False and grounded["first_alert_char"] is None


def test_a_failed_expectation_exits_one(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({
        "id": "wrongly-expected", "question": "When was it founded?",
        "contexts": ["The company was founded in 1998."],
        "answer": "The company was founded in 1998.", "expect_alert": True,
    }) + "\n")
    p = run(str(f))
    assert p.returncode == 1 and "FAIL" in p.stdout


def test_threshold_option_changes_the_verdict(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({
        "question": "When was it founded?", "contexts": ["The company was founded in 1998 in Palo Alto."],
        "answer": "The company was founded in 1998 in Palo Alto; it later moved to Europe in 2003.",
    }) + "\n")
    strict = json.loads(run(str(f), "--json", "--threshold", "0.9").stdout.splitlines()[0])
    lax = json.loads(run(str(f), "--json", "--threshold", "0.2").stdout.splitlines()[0])
    assert strict["fired"] is True and lax["fired"] is False


def test_bad_lines_get_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text('{"answer": "fine"}\n{not json\n')
    p = run(str(f))
    assert p.returncode == 2 and "c.jsonl:2" in p.stderr
    f.write_text('{"answer": "x", "contexts": "one context", "question": "q"}\n{"contexts": []}\n')
    p = run(str(f))
    assert p.returncode == 2 and "'answer' must be a string" in p.stderr


def test_empty_contexts_and_answer_are_recorded_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"question": "", "contexts": [], "answer": ""}) + "\n"
                 + json.dumps({"question": "q", "contexts": [], "answer": "Something. Else."}) + "\n")
    p = run(str(f), "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert rows[0]["fired"] is False and rows[-1]["cases"] == 2


def test_multi_checkpoint_answers_replay_without_waiting_out_deadlines(tmp_path: Path) -> None:
    # the replay source waits for each checkpoint's verdict; it must not wait for the guard to take it in
    # (which happens only at the next token): that deadlocked until a 30 s deadline per checkpoint
    f = tmp_path / "c.jsonl"
    answer = " ".join(f"The company was founded in {1990 + i} in Palo Alto." for i in range(6))
    f.write_text(json.dumps({"question": "When?", "contexts": ["The company was founded in 1998 in Palo Alto."],
                             "answer": answer, "expect_alert": True}) + "\n")
    p = subprocess.run([sys.executable, "-m", "streamjudge.cli", "replay", str(f), "--json"],
                       capture_output=True, text=True, timeout=25, check=False)
    row = json.loads(p.stdout.splitlines()[0])
    assert row["checkpoints"] >= 3 and row["fired"] is True


def test_calibrate_finds_a_threshold_that_separates_the_cases() -> None:
    p = subprocess.run([sys.executable, "-m", "streamjudge.cli", "calibrate", str(CASES), "--json"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    summary = rows[-1]
    assert summary["summary"] is True and summary["cases"] == 5
    assert summary["best_balanced_accuracy"] == 1.0
    best = summary["best_threshold"]
    # at the best threshold every expected alert fires and no grounded case does
    row = next(r for r in rows[:-1] if r["threshold"] == best)
    assert (row["tp"], row["fp"], row["fn"]) == (3, 0, 0)
    # at 0 nothing fires
    assert rows[0]["threshold"] == 0.0 and rows[0]["tp"] == rows[0]["fp"] == 0
