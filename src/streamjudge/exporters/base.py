"""The contract between the processor and the places evaluation results go (Langfuse, Phoenix, console),
and how vendor SDK processors already in a provider are found.

The processor calls :meth:`EvaluationSink.emit` from the judge pool's thread for every judged span. A sink
must return at once (queue and send in the background), must never raise into the caller and must never
block the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from opentelemetry.sdk.trace import SpanProcessor

from streamjudge import _sdk
from streamjudge.results import EvaluationRecord

__all__ = ["EvaluationRecord", "EvaluationSink", "find_span_processors"]


@runtime_checkable
class EvaluationSink(Protocol):
    """Receives evaluation results. Implementations never block and never raise."""

    def emit(self, record: EvaluationRecord) -> None:
        """Queue ``record`` for delivery."""
        ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Deliver everything queued; return False if the deadline passed first."""
        ...

    def shutdown(self) -> None:
        """Flush and release resources."""
        ...


def find_span_processors(root: object, match: Callable[[type], bool]) -> list[SpanProcessor]:
    """The span processors reachable from ``root`` (a provider's active processor, a composite, or
    streamjudge's judge processor and its export path) whose class satisfies ``match``.

    Vendor SDKs (Langfuse, Phoenix) are recognised by class so that they need not be importable.
    """
    found: list[SpanProcessor] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        p = todo.pop()
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        if match(type(p)):
            found.append(p)  # type: ignore[arg-type]
            continue
        todo.extend(_sdk.child_processors(p))  # the SDK's composite processors
        todo.append(getattr(p, "downstream", None))  # the judge processor's export path
    return found
