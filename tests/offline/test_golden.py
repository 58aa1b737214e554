"""The golden-set harness on the example app's own graph (examples/adaptive_rag/rag.py:build_graph)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from streamjudge import cli
from streamjudge.offline import golden

ROOT = Path(__file__).resolve().parents[2]
APP = f"{ROOT / 'examples' / 'adaptive_rag' / 'rag.py'}:build_graph"
# a JSON array (the sdist carries tests/*.json); JSON Lines is read the same way (see below)
GOLDEN = ROOT / "tests" / "data" / "golden_adaptive_rag.json"

sys.path.insert(0, str(ROOT / "examples" / "adaptive_rag"))
import rag  # noqa: E402


def _run(tmp_path: Path, name: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    code = cli.main(["golden", str(GOLDEN), "--app", APP, "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_items_run_through_the_apps_graph_and_are_scored_against_the_reference(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, doc = _run(tmp_path, "a")
    assert code == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err  # no progress bar when stderr is not a terminal
    items = {i["id"]: i for i in doc["items"]}
    assert list(items) == [i["id"] for i in json.loads(GOLDEN.read_text())]

    # the answer is the graph's own, the contexts what its grader kept (what the live judge sees)
    graph = rag.build_graph()
    for item in items.values():
        state = asyncio.run(graph.ainvoke({"question": item["question"]}))
        assert item["answer"] == state["answer"]
        assert item["contexts"] == [d.page_content for d in state["documents"]]
        assert item["error"] is None

    # the extractive offline generator is faithful; only the question outside the corpus misses its reference
    assert all(i["scores"]["faithfulness"] == 1.0 for i in items.values())
    assert items["reef-uncovered"]["scores"]["context_recall"] == 0.0
    assert items["reef-uncovered"]["labels"]["context_recall"] == "fail"
    assert "James Cook" in items["reef-uncovered"]["explanations"]["context_recall"]
    assert all(items[k]["scores"]["context_recall"] == 1.0 for k in items if k != "reef-uncovered")
    assert all(i["scores"]["context_precision"] is not None for i in items.values())

    summary = doc["summary"]
    assert summary["metrics"]["context_recall"]["mean"] == pytest.approx(0.8)
    assert summary["by_tag"]["not-in-corpus"]["context_recall"]["mean"] == 0.0
    # the printed table: one row per item and the means
    table = captured.out.splitlines()
    assert table[0].split()[:5] == ["id", "tag", "faith", "recall", "precis"]
    assert any(line.startswith("reef-uncovered") and " 0.00 " in line for line in table)
    assert any(line.startswith("mean") and "0.80" in line for line in table)


def test_compare_prints_the_deltas_of_two_runs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _run(tmp_path, "a")
    # run B: the same graph told to hallucinate (through the RunnableConfig the app reads)
    code, doc_b = _run(tmp_path, "b", "--config", '{"configurable": {"hallucinate": true}}')
    assert code == 0
    assert all(i["scores"]["faithfulness"] < 1.0 for i in doc_b["items"])
    capsys.readouterr()
    chart = tmp_path / "cmp.png"
    assert cli.main(["golden", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                     "--chart", str(chart)]) == 0
    out, err = capsys.readouterr()
    faith = next(line for line in out.splitlines() if line.startswith("faithfulness"))
    a, b, delta = faith.split()[1:]
    assert float(a) == 1.0 and float(b) < 1.0 and float(delta) == pytest.approx(float(b) - 1.0, abs=0.01)
    assert float(next(line for line in out.splitlines() if line.startswith("context_recall")).split()[3]) == 0.0
    assert "per item (B-A)" in out
    assert any(line.strip().startswith("eiffel-height") and "-" in line for line in out.splitlines())
    c = golden.compare(golden.read_run(tmp_path / "a.json"), golden.read_run(tmp_path / "b.json"))
    assert c.items["danube"]["faithfulness"][2] is not None and c.items["danube"]["faithfulness"][2] < 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no chart (matplotlib is not installed" in err and not chart.exists()
    else:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_wrong_answer_key_is_reported_per_item_and_fails_the_run(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, doc = _run(tmp_path, "x", "--answer-key", "reply")
    assert code == 1
    assert all("no answer in the final state" in i["error"] and "answer" in i["error"] for i in doc["items"])
    assert "--answer-key" in doc["items"][0]["error"]


def test_the_input_key_is_configurable(tmp_path: Path) -> None:
    app = tmp_path / "qapp.py"
    app.write_text(
        "import rag\n"
        "from langgraph.graph import StateGraph, START, END\n"
        "from typing import TypedDict\n"
        "class S(TypedDict, total=False):\n    query: str\n    question: str\n    answer: str\n"
        "def build():\n"
        "    inner = rag.build_graph()\n"
        "    async def run(s: S) -> S:\n"
        "        out = await inner.ainvoke({'question': s['query']})\n"
        "        return {'answer': out['answer']}\n"
        "    g = StateGraph(S)\n    g.add_node('run', run)\n    g.add_edge(START, 'run')\n    g.add_edge('run', END)\n"
        "    return g  # not compiled: the harness compiles a builder\n"
    )
    items = golden.load_golden(GOLDEN)[:1]
    from streamjudge.config import Settings
    from streamjudge.judging.judges import create_judge

    settings = Settings()
    results = golden.run_golden(items, golden.load_factory(f"{app}:build"),
                                golden.GoldenRun(settings, input_key="query"),
                                judge=create_judge("local", settings))
    assert results[0].error is None
    assert results[0].answer.startswith("The Eiffel Tower")
    assert results[0].contexts  # registered by the inner graph's grade node in the same trace


@pytest.mark.parametrize(("text", "message"), [
    ("", "no items"),
    ('{"reference": "x"}\n', "'question' must be a non-empty string"),
    ('{"question": "a", "id": 1}\n{"question": "b", "id": 1}\n', "duplicate ids"),
    ("[1]", "expected an object"),
    ("{not json\n", ":1: not valid JSON"),
])
def test_golden_file_errors_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "g.jsonl"
    p.write_text(text)
    with pytest.raises(golden.GoldenError, match=message):
        golden.load_golden(p)


def test_cli_errors_exit_2_with_what_to_fix(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["golden", str(GOLDEN), "--app", "no_such_module_xyz:build"]) == 2
    assert "cannot import no_such_module_xyz" in capsys.readouterr().err
    assert cli.main(["golden", str(GOLDEN), "--app", f"{APP}x"]) == 2
    assert "has no 'build_graphx'" in capsys.readouterr().err
    assert cli.main(["golden", str(GOLDEN)]) == 2
    assert "--app module:build_graph" in capsys.readouterr().err
    assert cli.main(["golden", "--compare", str(GOLDEN), str(GOLDEN)]) == 2
    assert "not a golden run" in capsys.readouterr().err


def test_json_lines_and_the_reference_aliases(tmp_path: Path) -> None:
    p = tmp_path / "g.jsonl"
    p.write_text('{"question": "q1", "expected_answer": "a1", "tag": "t"}\n\n{"question": "q2", "ground_truth": "a2"}\n')
    assert golden.load_golden(p) == [golden.GoldenItem("1", "q1", "a1", "t"), golden.GoldenItem("2", "q2", "a2")]
