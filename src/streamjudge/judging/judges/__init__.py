"""Judge registry: a judge name from the settings -> a judge instance.

Framework judges (ragas, deepeval) and LLM clients are imported only when asked for, so a missing or
broken optional package never breaks an application that does not use it.
"""

from __future__ import annotations

import importlib
from typing import Literal

from streamjudge.config import ConfigError, Settings
from streamjudge.judging.base import Judge

Tier = Literal["checkpoint", "final"]

_BUILTIN: dict[str, str] = {
    "local": "streamjudge.judging.judges.local:LocalJudge",
    "llm": "streamjudge.judging.judges.llm:LLMJudge",
    "ragas": "streamjudge.judging.judges.ragas:RagasJudge",
    "deepeval": "streamjudge.judging.judges.deepeval:DeepEvalJudge",
    "model": "streamjudge.judging.judges.model:ModelJudge",
    "cascade": "streamjudge.judging.judges.cascade:CascadeJudge",
}


def create_judge(name: str, settings: Settings, *, tier: Tier = "final") -> Judge:
    """Build the judge called ``name`` (``local``, ``llm``, ``ragas``, ``deepeval``, ``model`` or
    ``module:Class``).

    Each judge class is constructed as ``cls.from_settings(settings, tier=tier)`` when it has that
    classmethod, else ``cls()``. With ``settings.judge_processes`` > 0 a CPU-bound judge (``local``,
    ``model``) is returned wrapped in a :class:`~streamjudge.judging.judges._process.ProcessJudge` that runs
    it in that many worker processes (started now, each building the judge); other judges wait on I/O and
    stay in-process. With ``"auto"`` (the default) the ``local`` judge is returned wrapped in an
    :class:`~streamjudge.judging.judges._offload.AutoProcessJudge`, which starts one worker only once its
    CPU in this process is measured to weigh on the app (on one core too, workers run niced; not under a
    cgroup CPU quota of less than two cores).
    """
    target = _BUILTIN.get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep:
        raise ConfigError(
            f"unknown judge {name!r}: use one of {sorted(_BUILTIN)} or 'package.module:ClassName'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = name if name in ("ragas", "deepeval", "llm", "model") else None
        hint = f" (install it with: pip install 'streamjudge[{extra}]')" if extra else ""
        raise ConfigError(f"judge {name!r} cannot be imported: {exc}{hint}") from exc
    cls = getattr(module, attr)
    processes = settings.judge_processes
    if processes != "auto" and processes > 0:
        from streamjudge.judging.judges._process import PROCESS_JUDGES, JudgeSpec, ProcessJudge

        if name in PROCESS_JUDGES:  # built in the workers only (a model is not loaded here as well)
            return ProcessJudge(JudgeSpec(name, settings, tier), processes=processes)
    factory = getattr(cls, "from_settings", None)
    judge: Judge = factory(settings, tier=tier) if factory is not None else cls()
    if processes == "auto" and name == "local":
        from streamjudge.judging.judges._offload import auto_judge

        return auto_judge(name, settings, tier, judge)
    return judge
