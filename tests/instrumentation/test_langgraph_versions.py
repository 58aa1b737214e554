"""What differs between the LangGraph versions of the supported range (docs/compatibility.md)."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

from streamjudge.instrumentation._langgraph import _is_node_run


def _run(name: str, node: str) -> SimpleNamespace:
    return SimpleNamespace(id=uuid4(), name=name, parent_run_id=None,
                           extra={"metadata": {"langgraph_node": node}})


def test_langgraphs_own_start_run_is_no_node_of_the_app() -> None:
    # LangGraph 0.2 reports its __start__ step as a run like any node's
    tracer = SimpleNamespace(run_map={})
    assert _is_node_run(tracer, _run("__start__", "__start__")) is None
    assert _is_node_run(tracer, _run("retrieve", "retrieve")) == "retrieve"
