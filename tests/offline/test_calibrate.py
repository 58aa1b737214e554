"""``streamjudge calibrate`` by strictness: false alarms on grounded cases, catches among the others."""

from __future__ import annotations

import json
from pathlib import Path

from streamjudge import cli
from streamjudge.config import Settings
from streamjudge.offline.calibrate import by_strictness
from streamjudge.offline.replay import ReplayCase

CTX = ("The album was released in May 2004 by Parlophone. The band recorded it in London.",)
CASES = [
    ReplayCase("grounded", "When?", CTX, "The album came out in May 2004.", expect_alert=False),
    ReplayCase("number", "When?", CTX, "The album was released in May 2009.", expect_alert=True),
    # a name the contexts lack: a fail at the default strictness, uncertain when lenient
    ReplayCase("name", "Who?", CTX, "The album was released in May 2004 by Columbia Records.", expect_alert=True),
    # words the contexts lack, and no hard fact: uncertain, so it alerts only when strict
    ReplayCase("words", "How?", CTX, "The band painstakingly orchestrated elaborate arrangements.",
               expect_alert=True),
]


def test_each_strictness_reports_its_false_alarm_and_catch_rates() -> None:
    rows = {r.strictness: r for r in by_strictness(CASES, Settings(judge_processes=0))}
    assert list(rows) == ["lenient", "default", "strict"]
    assert all(r.false_alarm_rate == 0.0 for r in rows.values())
    assert [round(rows[s].catch_rate or 0, 3) for s in rows] == [0.333, 0.667, 1.0]
    assert rows["strict"].counts.balanced_accuracy == 1.0


def test_the_command_prints_the_rates_by_strictness(tmp_path: Path, capsys: object) -> None:
    f = tmp_path / "cases.jsonl"
    f.write_text("".join(json.dumps({"id": c.id, "question": c.question, "contexts": list(c.contexts),
                                     "answer": c.answer, "expect_alert": c.expect_alert}) + "\n"
                         for c in CASES))
    assert cli.main(["calibrate", str(f), "--json", "--csv", str(tmp_path / "cal.csv")]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    rows = [json.loads(line) for line in out.splitlines()]
    by = {r["strictness"]: r for r in rows if "strictness" in r}
    assert by["default"]["false_alarm_rate"] == 0.0 and round(by["default"]["catch_rate"], 3) == 0.667
    assert by["strict"]["catch_rate"] == 1.0 and rows[-1]["summary"] is True
