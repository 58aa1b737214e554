"""`streamjudge replay`: the recorded-stream regression harness, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_strictness_option_changes_the_verdict(tmp_path: Path) -> None:
    # the local judge's sentences carry verdicts: a fabricated year fails at any threshold, and a sentence
    # it is only uncertain about (words the context lacks) alerts when strict
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({
        "question": "When was it founded?", "contexts": ["The company was founded in 1998 in Palo Alto."],
        "answer": "The company was founded in 1998 in Palo Alto; the founders painstakingly orchestrated "
                  "elaborate negotiations.",
    }) + "\n")
    strict = json.loads(run(str(f), "--json", "--strictness", "strict").stdout.splitlines()[0])
    default = json.loads(run(str(f), "--json", "--threshold", "0.9").stdout.splitlines()[0])
    assert strict["fired"] is True and default["fired"] is False
    f.write_text(json.dumps({
        "question": "When was it founded?", "contexts": ["The company was founded in 1998 in Palo Alto."],
        "answer": "The company was founded in 1998 in Palo Alto; it later moved to Europe in 2003.",
    }) + "\n")
    lax = json.loads(run(str(f), "--json", "--threshold", "0.2", "--strictness", "lenient").stdout.splitlines()[0])
    assert lax["fired"] is True


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


def test_calibrate_finds_a_threshold_that_separates_the_cases(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "streamjudge.cli", "calibrate", str(CASES), "--json",
                        "--csv", str(tmp_path / "cal.csv")],
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


# --- the command itself --------------------------------------------------------------------------

TESTS = Path(__file__).parent


def sj(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m streamjudge ...`` with the tests folder importable (for judges of the tests)."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), full.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "streamjudge", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=full, cwd=cwd)


def test_version_and_python_dash_m() -> None:
    from streamjudge import __version__

    p = sj("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"streamjudge {__version__}"
    assert "replay" in sj("--help").stdout and "demo" in sj("--help").stdout


def _marker_cases(tmp_path: Path) -> Path:
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps({"id": "marked", "question": "q", "contexts": ["The sky is blue."],
                    "answer": "The sky is blue. HALLUCINATED sentence here.", "expect_alert": True}) + "\n"
        + json.dumps({"id": "clean", "question": "q", "contexts": ["The sky is blue."],
                      "answer": "The sky is blue.", "expect_alert": False}) + "\n"
    )
    return f


def test_the_judge_comes_from_STREAMJUDGE_JUDGE_and_is_printed(tmp_path: Path) -> None:
    f = _marker_cases(tmp_path)
    # the test judge fails a text with the marker word, which the local judge does not know about
    p = sj("replay", str(f), "--json", env={"STREAMJUDGE_JUDGE": "_fakes:KeywordJudge"})
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert {r["id"]: r["fired"] for r in rows[:-1]} == {"marked": True, "clean": False}
    assert rows[-1]["judge"] == rows[-1]["checkpoint_judge"] == "_fakes:KeywordJudge"
    assert "judge=_fakes:KeywordJudge" in p.stderr
    # --judge wins over the variable
    p = sj("replay", str(f), "--json", "--judge", "LOCAL", env={"STREAMJUDGE_JUDGE": "_fakes:KeywordJudge"})
    assert json.loads(p.stdout.splitlines()[-1])["judge"] == "local"


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"STREAMJUDGE_JUDGE": "llm", "EVAL_MODEL": "", "OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""}, (),
         "the final judge 'llm' (from STREAMJUDGE_JUDGE) cannot be used"),
        ({}, ("--judge", "nosuch.module:Judge"), "judge 'nosuch.module:Judge' (from --judge) cannot be used"),
        ({}, ("--judge", "ragass"), "--judge='ragass': expected local, model, llm, ragas, deepeval"),
        ({"STREAMJUDGE_ACTION": "bogus"}, (), "STREAMJUDGE_ACTION='bogus': expected one of flag, regenerate, stop"),
    ],
)
def test_a_judge_or_setting_that_cannot_be_used_exits_two(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    f = _marker_cases(tmp_path)
    for command in ("replay", "calibrate"):
        p = sj(command, str(f), *args, env=env, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert message in p.stderr and "Traceback" not in p.stderr
        assert not p.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no cases in the file"),
        ("\n\n", "no cases in the file"),
        ('[{"answer": "a"}, {"answer": "b"}]', "the file is a JSON array; replay reads JSON Lines"),
        ('{"answer": "a", "context": ["x"]}\n', "c.jsonl:1: unknown field 'context' (did you mean 'contexts'?)"),
        ('{"answer": "a", "expected_alert": true}\n', "unknown field 'expected_alert' (did you mean 'expect_alert'?)"),
        ('{\n  "answer": "a"\n}\n', "c.jsonl:1: not valid JSON"),
        ('"just a string"\n', "c.jsonl:1: expected a JSON object, got str"),
    ],
)
def test_a_cases_file_that_cannot_be_read_says_why(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(content)
    p = sj("replay", str(f))
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "JSON Lines" in p.stderr or "did you mean" in p.stderr


def test_a_missing_cases_file_exits_two(tmp_path: Path) -> None:
    p = sj("replay", str(tmp_path / "nope.jsonl"))
    assert p.returncode == 2 and "nope.jsonl: no such file" in p.stderr


def test_other_fields_are_allowed(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"answer": "The sky is blue.", "contexts": ["The sky is blue."], "notes": "x",
                             "source": "ticket 12"}) + "\n")
    assert sj("replay", str(f)).returncode == 0


def test_table_has_a_reason_and_summary_balanced_accuracy() -> None:
    p = sj("replay", str(CASES))
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["id", "expect", "fired", "first@", "faith", "chkpt", "result", "reason"]
    europe = next(line for line in lines if line.startswith("founded-europe"))
    assert "faithfulness 0.50 < 0.7" in europe and "unsupported" in europe
    grounded = next(line for line in lines if line.startswith("founded-grounded"))
    assert "no alert; final faithfulness 1.00" in grounded
    assert "balanced accuracy=1.0" in lines[-1] and "judge=local" in lines[-1]
    # not a terminal: no progress indicator on stderr
    assert "replaying:" not in p.stderr


def test_json_rows_explain_each_alert() -> None:
    p = sj("replay", str(CASES), "--json")
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    europe = next(r for r in rows if r.get("id") == "founded-europe")
    (alert,) = europe["alert_details"]
    assert alert["metric"] == "faithfulness" and alert["score"] == 0.5 and alert["threshold"] == 0.7
    assert "Europe in 2003" in alert["explanation"] and alert["char_end"] == europe["first_alert_char"]
    assert europe["reason"].startswith("faithfulness 0.50 < 0.7")
    assert set(europe["explanations"]) == set(europe["final"])
    summary = rows[-1]
    assert summary["balanced_accuracy"] == 1.0 and summary["true_negatives"] == 2


def test_fail_under_decides_the_exit_status_by_balanced_accuracy(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    lines = [json.loads(line) for line in CASES.read_text().splitlines()]
    lines[0]["expect_alert"] = True  # one wrong expectation: recall 3/4, specificity 1/1 -> 0.875
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert sj("replay", str(f)).returncode == 1
    assert sj("replay", str(f), "--fail-under", "0.8").returncode == 0
    p = sj("replay", str(f), "--fail-under", "0.9")
    assert p.returncode == 1 and "balanced accuracy 0.875 is below --fail-under 0.9" in p.stderr


def test_progress_is_drawn_on_a_terminal_only(tmp_path: Path) -> None:
    import pty

    f = tmp_path / "c.jsonl"
    f.write_text(CASES.read_text())
    code = ("import sys, streamjudge.cli as c; sys.exit(c.main(['replay', sys.argv[1]]))")
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-c", code, str(f)], stdout=subprocess.PIPE, stderr=slave,
                           text=True, timeout=120, check=False)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(master)
    assert p.returncode == 0
    assert b"replaying: 0/5 cases done" in err and b"\x1b[K" in err
    assert "replaying" not in p.stdout  # rows on stdout stay clean


def test_calibrate_writes_a_csv_and_says_when_there_is_no_chart(tmp_path: Path) -> None:
    import csv
    import importlib.util

    p = sj("calibrate", str(CASES), "--csv", str(tmp_path / "cal.csv"))
    assert p.returncode == 0, p.stderr
    with (tmp_path / "cal.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["threshold", "tp", "fp", "fn", "tn", "precision", "recall", "specificity",
                             "balanced_accuracy"]
    assert rows[0]["threshold"] == "0.0000" and rows[0]["tp"] == "0" and rows[0]["recall"] == "0.0000"
    assert max(float(r["balanced_accuracy"]) for r in rows if r["balanced_accuracy"]) == 1.0
    assert f"wrote {tmp_path / 'cal.csv'}" in p.stderr
    if importlib.util.find_spec("matplotlib") is None:
        assert "no chart (matplotlib is not installed" in p.stderr
        assert not (tmp_path / "cal.png").exists()
    else:
        assert (tmp_path / "cal.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_writes_into_the_working_directory_by_default(tmp_path: Path) -> None:
    p = sj("calibrate", str(CASES), cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "streamjudge-calibration.csv").exists()
