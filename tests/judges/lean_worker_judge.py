"""A judge for a worker process that reports what the worker had imported when it was built (imported by
the worker by name: this module imports nothing of streamjudge but the judge's types)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from streamjudge.judging.base import EvalInput, JudgeResult, Score


class ModulesJudge:
    """Scores ``sdk_at_build`` 1.0 when the OpenTelemetry SDK was loaded as the worker built this judge, and
    ``whole_package`` 1.0 when a name the package's ``__init__`` defines can be imported from it after."""

    name = "modules"

    def __init__(self) -> None:
        self._sdk_at_build = "opentelemetry.sdk.trace" in sys.modules

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        from streamjudge import StreamEvent, guard  # names of the package's __init__, not submodules

        whole = callable(guard) and StreamEvent.__name__ == "StreamEvent"
        return JudgeResult(self.name, (
            Score("sdk_at_build", 1.0 if self._sdk_at_build else 0.0),
            Score("whole_package", 1.0 if whole else 0.0),
        ))

    async def aclose(self) -> None:
        pass
