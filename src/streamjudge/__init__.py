"""streamjudge: live judging of streamed RAG answers, OpenTelemetry-native.

Wrap a token stream with :func:`guard` (or let the instrumentation do it), and every checkpoint of the
answer is judged off the token path while the user reads it.
"""

from streamjudge._version import __version__
from streamjudge.config import ConfigError, Settings, load_settings
from streamjudge.instrumentation import instrument_app
from streamjudge.judging.base import (
    EvalInput,
    Judge,
    JudgeError,
    JudgeResult,
    Score,
    SentenceScore,
    TransientJudgeError,
)
from streamjudge.judging.guard import GuardedStream, RegenerateRequest, StreamEvent, guard
from streamjudge.results import Verdict
from streamjudge.runtime import Runtime, configure, current_runtime, get_runtime

__all__ = [
    "ConfigError",
    "EvalInput",
    "GuardedStream",
    "Judge",
    "JudgeError",
    "JudgeResult",
    "RegenerateRequest",
    "Runtime",
    "Score",
    "SentenceScore",
    "Settings",
    "StreamEvent",
    "TransientJudgeError",
    "Verdict",
    "__version__",
    "configure",
    "current_runtime",
    "get_runtime",
    "guard",
    "instrument_app",
    "load_settings",
]
