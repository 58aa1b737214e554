"""``streamjudge worker``: deferred final passes, judged behind the collector's ``load_balancing`` exporter.

An application with ``STREAMJUDGE_FINAL_PASS=deferred`` judges its checkpoints live and leaves the final
pass to workers: its answer span says ``deferred`` and carries question, contexts and answer. The collector
routes every span of a trace to one worker by trace id; the worker holds the trace until its answer has been
judged (with the same settings, judges and pool as in-process judging) and exports it onward, the answer
span enriched with ``gen_ai.evaluation.result`` events and score attributes. See ``deploy/README.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamjudge.worker.worker import Worker, WorkerOptions, is_deferred_answer

__all__ = ["Worker", "WorkerOptions", "is_deferred_answer"]


def __getattr__(name: str) -> Any:
    # the command line imports this package for its options only: the worker (SDK, exporters, judges)
    # loads on first use
    if name in __all__:
        from streamjudge.worker import worker

        return getattr(worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
