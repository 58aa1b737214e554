"""The golden-set harness: each item's question through the app's own compiled LangGraph graph, scored.

A golden file holds items (``question``, ``reference`` — the expected answer —, optional ``id`` and
``tag``), as JSON Lines or one JSON array. The app's graph factory (``module:build_graph``) is imported and
called once; each question is run with ``graph.ainvoke({input_key: question})``, under streamjudge's
LangGraph instrumentation, so the contexts are exactly what the live judge would see: what the
instrumentation registered for the item's trace (retriever runs, node outputs under ``documents`` /
``contexts`` ...), unless ``contexts_key`` names the final state's key to read instead. The answer is the
final state's ``answer_key``. Each item is scored on faithfulness, context recall and context precision
(with the reference) by the configured judge; live checkpoint judging is off during the run (the streams
are sampled out), so the judge sees each item once.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.judging.base import EvalInput, Judge

#: the metrics scored by default
DEFAULT_METRICS: tuple[str, ...] = (semconv.FAITHFULNESS, semconv.CONTEXT_RECALL, semconv.CONTEXT_PRECISION)
#: the fields of a golden item (``expected``, ``expected_answer``, ``ground_truth``: read as ``reference``)
ITEM_FIELDS: tuple[str, ...] = ("id", "question", "reference", "tag")
_REFERENCE_ALIASES: tuple[str, ...] = ("reference", "expected", "expected_answer", "ground_truth")
#: keys of a final state tried for the answer when the answer key is absent
_ANSWER_KEYS: tuple[str, ...] = ("answer", "generation", "response", "output", "final_answer")
_CONTEXT_KEYS: tuple[str, ...] = ("documents", "contexts", "context", "docs", "retrieved", "sources")
_FORMAT = ("expected JSON Lines (or a JSON array) of objects with 'question', 'reference' (the expected "
           "answer), optional 'id' and 'tag'")


class GoldenError(ValueError):
    """The golden file, the app or its graph cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class GoldenItem:
    """One question with its expected answer."""

    id: str
    question: str
    reference: str | None = None
    tag: str | None = None


@dataclass(slots=True)
class ItemResult:
    """What the graph answered for one item and how it scored."""

    item: GoldenItem
    answer: str = ""
    contexts: tuple[str, ...] = ()
    scores: dict[str, float | None] = field(default_factory=dict)
    labels: dict[str, str | None] = field(default_factory=dict)
    explanations: dict[str, str] = field(default_factory=dict)
    elapsed_ms: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """One item of the ``--json`` file."""
        return {
            "id": self.item.id, "tag": self.item.tag, "question": self.item.question,
            "reference": self.item.reference, "answer": self.answer, "contexts": list(self.contexts),
            "scores": self.scores, "labels": self.labels, "explanations": self.explanations,
            "elapsed_ms": round(self.elapsed_ms, 1), "error": self.error,
        }


def load_golden(path: str | Path) -> list[GoldenItem]:
    """Read a golden file (JSON Lines or a JSON array); :class:`GoldenError` names a bad line."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    objs: list[tuple[str, Any]] = []
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise GoldenError(f"{path}: not valid JSON; {_FORMAT}") from None
        objs = [(f"{path}[{i}]", o) for i, o in enumerate(data)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                objs.append((f"{path}:{n}", json.loads(line)))
            except (ValueError, RecursionError):
                raise GoldenError(f"{path}:{n}: not valid JSON; {_FORMAT}") from None
    items: list[GoldenItem] = []
    for i, (where, obj) in enumerate(objs, 1):
        if not isinstance(obj, dict):
            raise GoldenError(f"{where}: expected an object; {_FORMAT}")
        question = obj.get("question")
        if not isinstance(question, str) or not question.strip():
            raise GoldenError(f"{where}: 'question' must be a non-empty string")
        reference = next((obj[k] for k in _REFERENCE_ALIASES if isinstance(obj.get(k), str)), None)
        tag = obj.get("tag")
        items.append(GoldenItem(str(obj.get("id", i)), question, reference,
                                None if tag is None else str(tag)))
    if not items:
        raise GoldenError(f"{path}: no items in the file; {_FORMAT}")
    ids = [it.id for it in items]
    dupes = sorted({x for x in ids if ids.count(x) > 1})
    if dupes:
        raise GoldenError(f"{path}: duplicate ids {dupes}: ids pair items across runs in --compare")
    return items


def load_factory(spec: str) -> Callable[[], Any]:
    """``module:attr`` or ``path/to/file.py:attr``: the app's graph factory (or compiled graph).

    The current directory and a file's own directory are importable, as ``uvicorn`` does it, so an app's
    sibling imports (``import rag``) work.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise GoldenError(f"--app {spec!r}: expected module:build_graph or path/to/app.py:build_graph")
    if target.endswith(".py") or "/" in target:
        path = Path(target).resolve()
        if not path.is_file():
            raise GoldenError(f"--app {spec!r}: {target} does not exist")
        sys.path.insert(0, str(path.parent))
        spec_obj = importlib.util.spec_from_file_location(path.stem, path)
        if spec_obj is None or spec_obj.loader is None:
            raise GoldenError(f"--app {spec!r}: cannot import {target}")
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[path.stem] = module
        spec_obj.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise GoldenError(f"--app {spec!r}: cannot import {target} ({exc}); run from the directory that "
                              "holds it or give its path (path/to/app.py:build_graph)") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise GoldenError(f"--app {spec!r}: {target} has no {attr!r}")
    return obj if callable(obj) and not hasattr(obj, "ainvoke") else (lambda: obj)


async def build_graph(factory: Callable[[], Any]) -> Any:
    """Call the factory (awaiting it if it is async) and compile a builder it returns."""
    graph = factory()
    if inspect.isawaitable(graph):
        graph = await graph
    if not hasattr(graph, "ainvoke") and hasattr(graph, "compile"):
        graph = graph.compile()
    if not hasattr(graph, "ainvoke"):
        raise GoldenError(f"the app's factory returned {type(graph).__name__}, not a compiled LangGraph "
                          "graph (nothing with ainvoke)")
    return graph


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    content = getattr(value, "content", None)  # an AIMessage
    if isinstance(content, str):
        return content
    if isinstance(value, list) and value:  # a messages list: the last one
        return _text(value[-1])
    return None


def answer_of(state: Any, key: str | None) -> str | None:
    """The answer in a final state: ``state[key]``, else the first of the usual keys (or the last message)."""
    if not isinstance(state, Mapping):
        return _text(state)
    for k in ((key,) if key else _ANSWER_KEYS) + (("messages",) if not key else ()):
        if k in state:
            found = _text(state[k])
            if found is not None:
                return found
    return None


def _passage(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    text = getattr(item, "page_content", None)
    if isinstance(text, str):
        return text
    if isinstance(item, Mapping):
        for k in ("page_content", "content", "text"):
            if isinstance(item.get(k), str):
                return str(item[k])
    return None


def contexts_of(state: Any, key: str | None) -> tuple[str, ...] | None:
    """Passages in a final state under ``key`` (or the usual context keys)."""
    if not isinstance(state, Mapping):
        return None
    for k in (key,) if key else _CONTEXT_KEYS:
        items = state.get(k)
        if isinstance(items, list | tuple):
            return tuple(t for t in (_passage(i) for i in items) if t is not None)
        if isinstance(items, str):
            return (items,)
    return None


@dataclass
class GoldenRun:
    """How to run the items: the graph's state keys, the judge, the metrics."""

    settings: Settings
    input_key: str = "question"
    answer_key: str | None = None
    contexts_key: str | None = None
    metrics: tuple[str, ...] = DEFAULT_METRICS
    concurrency: int = 4
    config: Mapping[str, Any] | None = None


async def _one(graph: Any, item: GoldenItem, run: GoldenRun, judge: Judge, rt: Any) -> ItemResult:
    result = ItemResult(item)
    t0 = time.perf_counter()
    try:
        with rt.tracer.start_as_current_span("streamjudge.golden.item") as span:
            config = dict(run.config or {})
            # a graph compiled with a checkpointer needs a thread id: one per item, so items share no state
            config["configurable"] = {"thread_id": f"streamjudge-golden-{item.id}",
                                      **(config.get("configurable") or {})}
            state = await graph.ainvoke({run.input_key: item.question}, config)
            trace_id = span.get_span_context().trace_id
        answer = answer_of(state, run.answer_key)
        if answer is None:
            keys = ", ".join(sorted(map(str, state))) if isinstance(state, Mapping) else type(state).__name__
            raise GoldenError(f"no answer in the final state (keys: {keys}); name its key with --answer-key")
        contexts = contexts_of(state, run.contexts_key) if run.contexts_key else None
        if contexts is None:
            inputs = rt.contexts.get(trace_id)
            contexts = inputs.contexts if inputs is not None and inputs.contexts is not None else None
        if contexts is None:
            contexts = contexts_of(state, None) or ()
        result.answer, result.contexts = answer, tuple(contexts)
        judged = await judge.evaluate(
            EvalInput(question=item.question, contexts=result.contexts, answer=answer, kind="answer",
                      reference=item.reference),
            run.metrics,
        )
        for s in judged.scores:
            labelled = s.with_label(run.settings.threshold_for(s.name))
            result.scores[s.name] = labelled.value
            result.labels[s.name] = labelled.label
            result.explanations[s.name] = s.explanation or (f"skipped: {s.skipped}" if s.skipped else "")
    except GoldenError as exc:
        result.error = str(exc)
    except Exception as exc:  # one broken item must not lose the run: it is reported in its row
        result.error = f"{type(exc).__name__}: {exc}"
    result.elapsed_ms = (time.perf_counter() - t0) * 1000
    return result


def run_golden(
    items: Sequence[GoldenItem],
    factory: Callable[[], Any],
    run: GoldenRun,
    *,
    judge: Judge,
    on_result: Callable[[ItemResult], None] | None = None,
) -> list[ItemResult]:
    """Run every item through the graph ``factory`` builds and score it; results in item order."""
    import streamjudge
    from streamjudge.instrumentation import StreamJudgeInstrumentor
    from streamjudge.runtime import _Discard

    # live judging off (every stream sampled out) — the contexts are still registered per trace
    rt = streamjudge.configure(
        run.settings.replace(sample_rate=0.0, preflight=False, final_reconcile=False),
        downstream=_Discard(), backends_from_env=False, set_global=False,
    )
    instrumentor = StreamJudgeInstrumentor()
    ours = not instrumentor.is_instrumented_by_opentelemetry
    if ours:
        instrumentor.instrument(tracer_provider=rt.tracer_provider)
    try:

        async def all_items() -> list[ItemResult]:
            graph = await build_graph(factory)
            gate = asyncio.Semaphore(max(1, run.concurrency))

            async def one(item: GoldenItem) -> ItemResult:
                async with gate:
                    r = await _one(graph, item, run, judge, rt)
                if on_result is not None:
                    on_result(r)
                return r

            return list(await asyncio.gather(*(one(i) for i in items)))

        return asyncio.run(all_items())
    finally:
        if ours:
            instrumentor.uninstrument()
        rt.shutdown()


# --- summaries and comparison -------------------------------------------------------------------------

def summarise(results: Sequence[ItemResult], metrics: Sequence[str]) -> dict[str, Any]:
    """Mean, count and passes per metric, overall and per tag."""

    def stats(rs: Sequence[ItemResult]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in metrics:
            values = [r.scores[m] for r in rs if r.scores.get(m) is not None]
            out[m] = {
                "mean": round(statistics.fmean(values), 4) if values else None,  # type: ignore[arg-type]
                "scored": len(values),
                "passed": sum(1 for r in rs if r.labels.get(m) == "pass"),
            }
        return out

    tags = sorted({r.item.tag for r in results if r.item.tag is not None})
    return {
        "items": len(results),
        "errors": sum(1 for r in results if r.error),
        "metrics": stats(results),
        "by_tag": {t: stats([r for r in results if r.item.tag == t]) for t in tags},
    }


def write_json(path: str | Path, results: Sequence[ItemResult], *, metrics: Sequence[str], app: str,
               golden: str, judge: str) -> Path:
    """The run as one JSON document (what ``--compare`` reads)."""
    doc = {
        "streamjudge_golden": 1, "app": app, "golden": golden, "judge": judge, "metrics": list(metrics),
        "summary": summarise(results, metrics), "items": [r.to_json() for r in results],
    }
    out = Path(path)
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    return out


def read_run(path: str | Path) -> dict[str, Any]:
    """A run written by :func:`write_json`."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GoldenError(f"{path}: no such file") from None
    except (ValueError, RecursionError):
        raise GoldenError(f"{path}: not valid JSON") from None
    if not isinstance(doc, dict) or "items" not in doc or "summary" not in doc:
        raise GoldenError(f"{path}: not a golden run (write one with: streamjudge golden FILE --app ... "
                          "--json OUT)")
    return doc


@dataclass(frozen=True, slots=True)
class Comparison:
    """B minus A: per metric (means) and per item (scores), items paired by id."""

    metrics: tuple[str, ...]
    means: dict[str, tuple[float | None, float | None, float | None]]  # metric -> (a, b, b - a)
    items: dict[str, dict[str, tuple[float | None, float | None, float | None]]]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]


def _delta(a: Any, b: Any) -> float | None:
    return round(b - a, 4) if isinstance(a, int | float) and isinstance(b, int | float) else None


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> Comparison:
    """Compare two runs read by :func:`read_run`."""
    metrics = tuple(dict.fromkeys([*a.get("metrics", []), *b.get("metrics", [])]))
    sa, sb = a["summary"]["metrics"], b["summary"]["metrics"]
    means = {}
    for m in metrics:
        ma, mb = (sa.get(m) or {}).get("mean"), (sb.get(m) or {}).get("mean")
        means[m] = (ma, mb, _delta(ma, mb))
    ia = {str(i["id"]): i for i in a["items"]}
    ib = {str(i["id"]): i for i in b["items"]}
    items = {}
    for key in ia.keys() & ib.keys():
        items[key] = {m: (ia[key]["scores"].get(m), ib[key]["scores"].get(m),
                          _delta(ia[key]["scores"].get(m), ib[key]["scores"].get(m))) for m in metrics}
    order = [k for k in ia if k in items]
    return Comparison(metrics, means, {k: items[k] for k in order},
                      tuple(k for k in ia if k not in ib), tuple(k for k in ib if k not in ia))


def write_compare_chart(c: Comparison, path: str | Path, labels: tuple[str, str]) -> Path | None:
    """Mean per metric of both runs as grouped bars (PNG); None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    xs = range(len(c.metrics))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for offset, (label, idx) in zip((-0.2, 0.2), ((labels[0], 0), (labels[1], 1)), strict=True):
        values = [c.means[m][idx] for m in c.metrics]
        ax.bar([x + offset for x in xs], [float("nan") if v is None else v for v in values], width=0.4,
               label=label)
    ax.set_xticks(list(xs), list(c.metrics))
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean score")
    ax.set_title("streamjudge golden --compare")
    ax.legend(loc="best")
    ax.grid(axis="y", alpha=0.3)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
