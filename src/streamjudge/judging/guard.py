"""The live guard: wraps a token stream, sends each checkpoint to the judging service, acts on verdicts.

Tokens go out as soon as they arrive (stream-first) or once their window passed (hold-back). Verdicts come
back from the judge pool's thread into a per-stream inbox; the stream checks one boolean before each
yield and only then does any work. Nothing on the token path waits for a judge.

The parts: :mod:`._windows` (sentence buffer, window policy, the open window's tokens), :mod:`._actions`
(what a verdict means: the failing sentences), :mod:`._session` (one stream's orchestration) and
:mod:`._drivers` (``async for`` / ``for`` and the end-of-stream wait).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from streamjudge.judging._backend import StreamBackend, default_backend, on_stream_start
from streamjudge.judging._drivers import (
    AsyncWaker,
    GuardedStream,
    SourceStep,
    end_wait,
    set_fast_paths,
    settle,
    settle_sync,
    wait_step,
)
from streamjudge.judging._session import (
    GuardSession,
    RegenerateCallback,
    RegenerateRequest,
    StreamEvent,
    TokenSource,
)

if TYPE_CHECKING:
    from streamjudge.config import Settings

__all__ = [
    "AsyncWaker",
    "GuardSession",
    "GuardedStream",
    "RegenerateCallback",
    "RegenerateRequest",
    "SourceStep",
    "StreamEvent",
    "TokenSource",
    "default_settings",
    "end_wait",
    "guard",
    "on_stream_start",
    "set_fast_paths",
    "settle",
    "settle_sync",
    "wait_step",
]


def default_settings() -> Settings | None:
    """The settings a stream gets when none are given (the process's), or None when unconfigured."""
    try:
        return default_backend().settings
    except RuntimeError:
        return None


def guard(
    tokens: TokenSource,
    *,
    question: str | None = None,
    contexts: Sequence[str] | None = None,
    reference: str | None = None,
    settings: Settings | None = None,
    runtime: StreamBackend | None = None,
    regenerate: RegenerateCallback | None = None,
    name: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
    context: Context | None = None,
) -> GuardedStream:
    """Watch a token stream while it is written.

    ``tokens`` is any async or sync iterable of text tokens (``str``; ``bytes`` are decoded as UTF-8,
    split characters included; ``None`` and empty tokens are skipped and counted). Iterate the result
    with ``async for`` (or ``for`` for a sync source) to receive :class:`StreamEvent`s: every token at
    once (stream-first) plus ``warning`` / ``retract`` / ``stop`` / ``done`` events. A ``warning`` names
    the failing sentences (``data["sentences"]``: char ranges, score and reason each).

    The stream starts (its span, its inputs, the sampling decision) while the source works on its first
    token, on the loop's next pass (or a later one when many streams begin at once: each pass runs a slice
    of their starts). Tokens that come before it (a source's tokens at hand) go out first, and
    ``GuardedStream.session.span`` is None until it ran. Either way the stream's span is the child of the
    span current when iteration began, and its start time is that moment.

    ``question`` / ``contexts`` default to what instrumentation registered for the current trace.
    ``regenerate`` is called with a :class:`RegenerateRequest` when the action is ``regenerate`` and
    must return the new token source. ``settings`` override the runtime's for this stream, thresholds
    included.
    """
    session = GuardSession(
        question=question,
        contexts=contexts,
        reference=reference,
        settings=settings,
        runtime=runtime,
        regenerate=regenerate,
        name=name,
        attributes=attributes,
        context=context,
    )
    return GuardedStream(tokens, session)
