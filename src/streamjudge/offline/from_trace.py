"""Recorded traces -> replay cases: a production incident becomes a regression case.

Reads OTLP JSON (what the collector's ``file`` exporter writes: one ``ExportTraceServiceRequest`` per line,
or one pretty-printed request; ``streamjudge demo`` writes the same form) and the JSON of Jaeger's query API
(``/api/traces/{id}`` or a search result: ``{"data": [{"traceID", "spans": [{"tags": [...]}]}]}``).

Each answer span (``streamjudge.span.type = stream``) becomes one case:

- ``answer``: ``streamjudge.answer`` (recorded when content capture is on), else the span's OpenInference
  ``output.value``. A span without it, or whose text was capped for display (its recorded sha256 does not
  match), is skipped and the reason is reported: a shortened answer would replay as another answer.
- ``question``: ``streamjudge.question``, else the ``input.value`` of the trace's root graph span (its
  ``question`` / ``query`` / ``input`` key, or its ``messages``' last user message).
- ``contexts``: the trace's contexts are registered in process, not copied onto spans, so they are
  recovered from what the trace does carry, in this order: ``streamjudge.contexts`` on the answer span
  (present when the final pass was deferred); else the latest span that ended before the answer's last
  model call started (the call that wrote it: in a ReAct agent the answer span starts with the agent's
  first call, and retrieval runs in a tool between the two; the answer's own start when the trace
  records no model call inside it) and carries retrieved passages — a retriever span's
  ``retrieval.documents.N.document.content`` (OpenInference) or a node's ``output.value`` JSON holding
  documents / strings under ``documents``, ``contexts``, ``context``, ``docs``, ``retrieved`` or
  ``sources`` (LangChain / OpenInference). A later
  list replaces an earlier one, as the instrumentation does (a grader's kept documents replace the
  retriever's). When the span recorded ``streamjudge.contexts.count``, the latest candidate of that size
  is taken.
- ``expect_alert``: true when the stream recorded alerts (``streamjudge.stream.alerts`` > 0), false when
  it was judged without one, absent when it was never judged (sampled out, skipped).
- ``id``: the trace id (with the answer span's id when a trace holds several answers).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamjudge import semconv
from streamjudge.offline.replay import ReplayCase

#: keys of a node's output state that hold retrieved passages (as the LangGraph instrumentation reads them)
CONTEXT_KEYS: tuple[str, ...] = ("documents", "contexts", "context", "docs", "retrieved", "sources")
_RETRIEVAL_PREFIX = "retrieval.documents."
_RETRIEVAL_SUFFIX = ".document.content"
_INPUT_VALUE = "input.value"
_OUTPUT_VALUE = "output.value"
#: what marks a model call: OpenInference's span kind, or the GenAI conventions' operation
_MODEL_KIND = "LLM"
_MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})


class TraceFormatError(ValueError):
    """The file is neither OTLP JSON nor Jaeger JSON; the message says what was expected."""


@dataclass(frozen=True, slots=True)
class TraceSpan:
    """A span of a recorded trace, in a form common to OTLP JSON and Jaeger JSON."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Extracted:
    """One answer span of a trace: the case made of it, or why none could be."""

    trace_id: str
    span_id: str
    case: ReplayCase | None
    #: where the contexts came from (``streamjudge.contexts``, ``retriever span 'X'``, ``output of 'grade'``)
    contexts_from: str = ""
    skipped: str | None = None
    notes: tuple[str, ...] = ()


# --- reading the files ------------------------------------------------------------------------------

def _hex_id(raw: Any) -> str:
    """OTLP JSON ids are hex; protobuf's JSON mapping (MessageToJson) writes them base64."""
    if not isinstance(raw, str) or not raw:
        return ""
    text = raw.strip()
    if len(text) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    try:
        return base64.b64decode(text, validate=True).hex()
    except ValueError:
        return text.lower()


def _any_value(v: Any) -> Any:
    """An OTLP JSON ``AnyValue`` (``{"stringValue": ...}``, ``{"arrayValue": {"values": [...]}}`` ...)."""
    if not isinstance(v, dict) or not v:
        return None
    for key, val in v.items():
        k = key.replace("_", "").lower()
        if k == "stringvalue" or k == "boolvalue":
            return val
        if k == "intvalue":
            return int(val)
        if k == "doublevalue":
            return float(val)
        if k == "arrayvalue":
            return [_any_value(x) for x in (val or {}).get("values", [])]
        if k == "kvlistvalue":
            return {kv.get("key"): _any_value(kv.get("value")) for kv in (val or {}).get("values", [])}
        if k == "bytesvalue":
            return val
    return None


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    return obj.get(camel, obj.get(snake))


def spans_from_otlp(request: Mapping[str, Any]) -> list[TraceSpan]:
    """The spans of one OTLP JSON ``ExportTraceServiceRequest`` (camelCase or snake_case keys)."""
    out: list[TraceSpan] = []
    for rs in _get(request, "resourceSpans", "resource_spans") or []:
        for ss in _get(rs, "scopeSpans", "scope_spans") or []:
            for s in ss.get("spans") or []:
                attrs = {kv.get("key"): _any_value(kv.get("value")) for kv in s.get("attributes") or []}
                out.append(TraceSpan(
                    trace_id=_hex_id(_get(s, "traceId", "trace_id")),
                    span_id=_hex_id(_get(s, "spanId", "span_id")),
                    parent_id=_hex_id(_get(s, "parentSpanId", "parent_span_id")),
                    name=str(s.get("name", "")),
                    start_ns=int(_get(s, "startTimeUnixNano", "start_time_unix_nano") or 0),
                    end_ns=int(_get(s, "endTimeUnixNano", "end_time_unix_nano") or 0),
                    attributes=attrs,
                ))
    return out


def _jaeger_id(raw: Any, width: int) -> str:
    # Jaeger writes ids as hex, sometimes without leading zeros
    return str(raw or "").strip().lower().rjust(width, "0") if raw else ""


def _jaeger_tag(tag: Mapping[str, Any]) -> Any:
    value = tag.get("value")
    kind = str(tag.get("type", "string")).lower()
    if kind in ("int64", "int") and value is not None:
        return int(value)
    if kind in ("float64", "float") and value is not None:
        return float(value)
    if kind == "bool" and isinstance(value, str):
        return value.lower() == "true"
    return value


def spans_from_jaeger(doc: Mapping[str, Any]) -> list[TraceSpan]:
    """The spans of a Jaeger query API answer (``{"data": [trace, ...]}``) or of one trace object.

    Jaeger keeps times in microseconds and writes array attributes as JSON strings (read back where an
    array is expected).
    """
    traces = doc.get("data") if "data" in doc else [doc]
    out: list[TraceSpan] = []
    for tr in traces or []:
        for s in tr.get("spans") or []:
            parent = ""
            for ref in s.get("references") or []:
                if str(ref.get("refType", "")).upper() == "CHILD_OF":
                    parent = _jaeger_id(ref.get("spanID"), 16)
                    break
            start_us = int(s.get("startTime") or 0)
            out.append(TraceSpan(
                trace_id=_jaeger_id(s.get("traceID") or tr.get("traceID"), 32),
                span_id=_jaeger_id(s.get("spanID"), 16),
                parent_id=parent,
                name=str(s.get("operationName", "")),
                start_ns=start_us * 1000,
                end_ns=(start_us + int(s.get("duration") or 0)) * 1000,
                attributes={t.get("key"): _jaeger_tag(t) for t in s.get("tags") or []},
            ))
    return out


def _spans_of(doc: Any, where: str) -> list[TraceSpan]:
    if isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc):
        return spans_from_otlp(doc)
    if isinstance(doc, dict) and ("data" in doc or "spans" in doc):
        return spans_from_jaeger(doc)
    if isinstance(doc, list):  # a JSON array of export requests or of Jaeger traces
        return [s for item in doc for s in _spans_of(item, where)]
    raise TraceFormatError(
        f"{where}: neither OTLP JSON (an object with 'resourceSpans', one per line as the collector's file "
        "exporter writes) nor Jaeger JSON (an object with 'data': [{'traceID', 'spans'}], from "
        "/api/traces/ID)"
    )


def read_spans(path: str | Path) -> list[TraceSpan]:
    """Every span in ``path``: one JSON document (OTLP or Jaeger) or JSON Lines of OTLP requests."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise TraceFormatError(f"{path}: the file is empty")
    try:
        return _spans_of(json.loads(text), str(path))
    except RecursionError:
        raise TraceFormatError(f"{path}: JSON nested too deeply") from None
    except json.JSONDecodeError:
        pass
    spans: list[TraceSpan] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise TraceFormatError(
                f"{path}:{n}: not valid JSON; expected OTLP JSON lines (one export request per line) or one "
                "Jaeger JSON document"
            ) from None
        spans.extend(_spans_of(doc, f"{path}:{n}"))
    return spans


# --- finding the inputs -----------------------------------------------------------------------------

def _passage(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        if isinstance(item.get("kwargs"), dict):  # LangChain's serialised form: {"lc": 1, "kwargs": ...}
            item = item["kwargs"]
        for key in ("page_content", "content", "text"):
            if isinstance(item.get(key), str):
                return str(item[key])
    return None


def _contexts_in(value: Any) -> list[str] | None:
    """Passages under a context-like key of a JSON state (``{"documents": [Document, ...]}``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, dict):
        return None
    for key in CONTEXT_KEYS:
        items = value.get(key)
        if isinstance(items, list):
            texts = [t for t in (_passage(i) for i in items) if t is not None]
            if texts or not items:
                return texts
    return None


def _retrieved(attrs: Mapping[str, Any]) -> list[str] | None:
    found: dict[int, str] = {}
    for key, value in attrs.items():
        if key.startswith(_RETRIEVAL_PREFIX) and key.endswith(_RETRIEVAL_SUFFIX) and isinstance(value, str):
            index = key[len(_RETRIEVAL_PREFIX) : -len(_RETRIEVAL_SUFFIX)]
            if index.isdigit():
                found[int(index)] = value
    return [found[i] for i in sorted(found)] if found else None


def _string_list(value: Any) -> list[str] | None:
    if isinstance(value, str) and value.lstrip().startswith("["):  # Jaeger: arrays as JSON strings
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _candidates(trace: Sequence[TraceSpan], before_ns: int) -> list[tuple[int, str, list[str]]]:
    """(end time, where, passages) of every span that carried retrieved passages before ``before_ns``,
    latest first."""
    found: list[tuple[int, str, list[str]]] = []
    for s in trace:
        if s.end_ns > before_ns or s.attributes.get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM:
            continue
        docs = _retrieved(s.attributes)
        if docs is not None:
            found.append((s.end_ns, f"retriever span {s.name!r} (retrieval.documents)", docs))
            continue
        out = _contexts_in(s.attributes.get(_OUTPUT_VALUE))
        if out is not None:
            found.append((s.end_ns, f"output.value of {s.name!r}", out))
    found.sort(key=lambda t: t[0], reverse=True)
    return found


def _is_model_call(s: TraceSpan) -> bool:
    a = s.attributes
    return (a.get(semconv.OPENINFERENCE_SPAN_KIND) == _MODEL_KIND
            or a.get(semconv.GEN_AI_OPERATION_NAME) in _MODEL_OPERATIONS)


def _contexts_cutoff(span: TraceSpan, trace: Sequence[TraceSpan]) -> int:
    """When the answer's contexts were fixed: the start of the last model call that started while the
    answer span was open (the call that wrote the answer), else the answer span's own start."""
    return max((s.start_ns for s in trace
                if span.start_ns <= s.start_ns <= span.end_ns and _is_model_call(s)), default=span.start_ns)


def _question(span: TraceSpan, trace: Sequence[TraceSpan]) -> str:
    q = span.attributes.get(semconv.STREAM_QUESTION)
    if isinstance(q, str):
        return q
    # the graph's own span: the outermost one with an input (LangGraph's root run)
    by_id = {s.span_id: s for s in trace}
    node: TraceSpan | None = span
    last = ""
    while node is not None:
        value = node.attributes.get(_INPUT_VALUE)
        if isinstance(value, str) and value:
            last = value
        node = by_id.get(node.parent_id)
    if last.startswith("{"):
        try:
            state = json.loads(last)
        except ValueError:
            return last
        if isinstance(state, dict):
            for key in ("question", "query", "input", "q"):
                if isinstance(state.get(key), str):
                    return str(state[key])
            asked = _last_human(state.get("messages"))
            if asked is not None:
                return asked
    return last


_HUMAN = frozenset({"user", "human"})


def _last_human(messages: Any) -> str | None:
    """The text of the last user message of a chat state's ``messages``: ``["user", text]`` pairs,
    ``{"role": "user", "content": text}`` or LangChain's (serialised) ``HumanMessage``."""
    if not isinstance(messages, list):
        return None
    for m in reversed(messages):
        if isinstance(m, list) and len(m) == 2 and m[0] in _HUMAN and isinstance(m[1], str):
            return str(m[1])
        if isinstance(m, dict):
            if isinstance(m.get("kwargs"), dict):
                m = m["kwargs"]
            if (m.get("role") in _HUMAN or m.get("type") in _HUMAN) and isinstance(m.get("content"), str):
                return str(m["content"])
    return None


def _expectation(attrs: Mapping[str, Any]) -> tuple[bool | None, str]:
    alerts = attrs.get(semconv.STREAM_ALERTS)
    verdict = attrs.get(semconv.STREAM_VERDICT)
    status = attrs.get(semconv.EVAL_STATUS)
    if isinstance(alerts, int | float) and alerts > 0:
        return True, f"{int(alerts)} alert(s), verdict {verdict}"
    if status in (None, "judged", "deferred") and alerts is not None:
        return False, f"no alert, verdict {verdict}"
    return None, f"not judged when recorded ({status or 'no verdict'})"


def extract(spans: Iterable[TraceSpan]) -> list[Extracted]:
    """One :class:`Extracted` per answer span in ``spans``, in start order."""
    traces: dict[str, list[TraceSpan]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    out: list[Extracted] = []
    for trace_id, trace in traces.items():
        answers = sorted(
            (s for s in trace if s.attributes.get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM),
            key=lambda s: s.start_ns,
        )
        for span in answers:
            case_id = trace_id if len(answers) == 1 else f"{trace_id}/{span.span_id}"
            out.append(_extract_one(span, trace, case_id))
    out.sort(key=lambda e: next((s.start_ns for s in traces[e.trace_id] if s.span_id == e.span_id), 0))
    return out


def _extract_one(span: TraceSpan, trace: Sequence[TraceSpan], case_id: str) -> Extracted:
    a = span.attributes
    notes: list[str] = []

    def skipped(why: str) -> Extracted:
        return Extracted(span.trace_id, span.span_id, None, skipped=why)

    answer = a.get(semconv.STREAM_ANSWER)
    if not isinstance(answer, str):
        answer = a.get(_OUTPUT_VALUE)
    if not isinstance(answer, str) or not answer:
        return skipped("no answer text on the span (recorded with content capture off: "
                       "STREAMJUDGE_CAPTURE_CONTENT=false)")
    digest = a.get(semconv.STREAM_ANSWER_SHA256)
    if isinstance(digest, str) and hashlib.sha256(answer.encode()).hexdigest() != digest:
        length = a.get(semconv.STREAM_ANSWER_LENGTH)
        return skipped(f"the answer on the span was shortened for display ({len(answer)} of {length} chars; "
                       "raise STREAMJUDGE_MAX_TEXT_CHARS or defer the final pass to record it whole)")
    if int(a.get(semconv.STREAM_REGENERATIONS) or 0) > 0:
        notes.append("the answer was regenerated: the recorded text is the corrected one")

    count = a.get(semconv.STREAM_CONTEXT_COUNT)
    want = int(count) if isinstance(count, int | float) else None
    contexts: list[str] | None = _string_list(a.get(semconv.STREAM_CONTEXTS))
    source = semconv.STREAM_CONTEXTS if contexts is not None else ""
    if contexts is None:
        found = _candidates(trace, _contexts_cutoff(span, trace))
        pick = next((c for c in found if want is None or len(c[2]) == want), found[0] if found else None)
        if pick is not None:
            source, contexts = pick[1], pick[2]
            if want is not None and len(contexts) != want:
                notes.append(f"the span says {want} context(s) were judged; found {len(contexts)} in the "
                             "trace")
        elif want:
            notes.append(f"the span says {want} context(s) were judged, none is recorded in the trace")
    expect, why = _expectation(a)
    notes.append(why)
    reference = a.get(semconv.STREAM_REFERENCE)
    case = ReplayCase(
        id=case_id,
        question=_question(span, trace),
        contexts=tuple(contexts or ()),
        answer=answer,
        expect_alert=expect,
        reference=reference if isinstance(reference, str) else None,
    )
    return Extracted(span.trace_id, span.span_id, case, contexts_from=source or "none found",
                     notes=tuple(notes))


def case_json(case: ReplayCase) -> dict[str, Any]:
    """``case`` as one line of a replay cases file."""
    obj: dict[str, Any] = {"id": case.id, "question": case.question, "contexts": list(case.contexts),
                           "answer": case.answer}
    if case.expect_alert is not None:
        obj["expect_alert"] = case.expect_alert
    if case.reference is not None:
        obj["reference"] = case.reference
    return obj


def cases_from_files(paths: Iterable[str | Path]) -> Iterator[Extracted]:
    """Every answer span of the trace files ``paths``."""
    spans: list[TraceSpan] = []
    for p in paths:
        spans.extend(read_spans(p))
    yield from extract(spans)
