"""The LLM judge's client does its one-time work when the judge is created, not in its first call.

The first SDK call used to import the SDK's resource modules and httpcore's async backend and build the
pydantic schemas of the response models: ~90 ms of Python holding the GIL on the judge pool's thread,
which stalled the app's token stream. Checked in a fresh interpreter (imports are once per process) by
what happens during the first call: no module imported, no response model completed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[2])
from scripted_server import ScriptedLLMServer
from streamjudge.config import load_settings
from streamjudge.judging.base import EvalInput
from streamjudge.judging.judges.llm import LLMJudge

provider = sys.argv[1]


def incomplete_models():
    import pydantic
    out = set()
    for name, module in list(sys.modules.items()):
        if name.startswith(provider + ".types") and module is not None:
            for value in vars(module).values():
                if isinstance(value, type) and issubclass(value, pydantic.BaseModel) \
                        and not value.__dict__.get("__pydantic_complete__", True):
                    out.add(value.__module__ + "." + value.__qualname__)
    return out


srv = ScriptedLLMServer().start()
try:
    url = srv.anthropic_base_url if provider == "anthropic" else srv.openai_base_url
    judge = LLMJudge.from_settings(load_settings({"EVAL_PROVIDER": provider, "EVAL_MODEL": "m",
                                                  "EVAL_BASE_URL": url}))
    modules, models = set(sys.modules), incomplete_models()
    item = EvalInput(question="How tall is it?", answer="It is 330 metres tall.",
                     contexts=("The tower is 330 metres tall.",))

    async def first_call():
        try:
            return await judge.evaluate(item, ["faithfulness"])
        finally:
            await judge.aclose()

    result = asyncio.run(first_call())
    print(json.dumps({
        "judged": result.get("faithfulness").value is not None,
        "imported": sorted(set(sys.modules) - modules),
        "built": sorted(models - incomplete_models()),
    }))
finally:
    srv.stop()
"""


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_first_call_imports_nothing_and_builds_no_model(provider: str) -> None:
    here = Path(__file__).resolve().parent
    proc = subprocess.run([sys.executable, "-c", _PROBE, provider, str(here)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["judged"]
    assert report["imported"] == []  # e.g. openai.resources.chat, anyio._backends._asyncio
    assert report["built"] == []  # e.g. ChatCompletionMessage, TextBlock
