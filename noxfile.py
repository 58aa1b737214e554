"""The compatibility matrix: the suite's fast part against each corner of the supported version ranges.

``make compat`` runs every corner but ``newest`` (``make test`` runs that one, in the main venv);
``nox -s "corner(oldest)"`` one of them; ``nox -l`` lists them. Each corner is its own venv under
``~/.cache/streamjudge/nox`` (outside the repository), kept between runs (pip brings it to the
pins each time), and runs:

- the zero-code smoke check: the example app served under ``opentelemetry-instrument`` with streamjudge's
  distro, answers streamed at it over HTTP and judged (``tests/test_demo.py``'s end-to-end test);
- the unit tests (``-m "not integration"``).

The ranges and the last results are in docs/compatibility.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("STREAMJUDGE_CACHE", Path.home() / ".cache" / "streamjudge"))

nox.options.envdir = str(CACHE / "nox")
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"

_OTEL = ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
         "opentelemetry-exporter-otlp-proto-grpc")
_OTEL_CONTRIB = ("opentelemetry-instrumentation", "opentelemetry-instrumentation-fastapi")


def _otel(sdk: str, contrib: str) -> list[str]:
    return [f"{p}=={sdk}" for p in _OTEL] + [f"{p}=={contrib}" for p in _OTEL_CONTRIB]


# the extras of `make test`, less those whose own pins leave a corner's range (ragas needs langchain-core
# 1.8+; the model judge's ONNX Runtime and the judge frameworks do not touch the instrumented libraries)
_LEAN = "dev,langgraph,fastapi,examples,llm"

#: corner -> (extras, pins); pins are requirements installed with the package, so pip must meet both
CORNERS: dict[str, tuple[str, list[str]]] = {
    # the oldest of every range in pyproject.toml
    "oldest": (_LEAN, [
        *_otel("1.38.0", "0.59b0"),
        "langchain-core==0.3.0", "langgraph==0.2.40", "openinference-instrumentation-langchain==0.1.50",
        "langchain-openai==0.2.0", "fastapi==0.110.0", "starlette==0.36.3", "sse-starlette==1.8.2",
        "httpx==0.27.2",  # also what starlette 0.36's TestClient needs (httpx 0.28 dropped its `app`)
    ]),
    # the SDK minors with the processors' ending hook and span metrics but no random trace-id flag
    "otel-1.41": (_LEAN, _otel("1.41.0", "0.62b0")),
    # an app still on LangChain 0.3: the newest langchain-core 0.3 and LangGraph 0.x, sse-starlette < 2
    # as langserve needs it, with the newest OpenTelemetry
    "langchain-0.3": (_LEAN, [
        "langchain-core>=0.3,<0.4", "langgraph>=0.2,<1", "langchain-openai<0.4", "sse-starlette<2",
    ]),
    # what `make test` installs (its EXTRAS), newest of everything
    "newest": ("dev,langgraph,fastapi,examples,llm,ragas,deepeval,langfuse,phoenix-otel,model", []),
}


@nox.session(python="3.11")
@nox.parametrize("corner", [nox.param(name, id=name) for name in CORNERS])
def corner(session: nox.Session, corner: str) -> None:
    """Install streamjudge at one corner of the version ranges, run the unit tests and the zero-code smoke
    check there."""
    extras, pins = CORNERS[corner]
    session.install("--upgrade", "pip")
    session.install("-e", f"{ROOT}[{extras}]", *pins)
    session.run("python", "-c", _VERSIONS, silent=False)
    pytest = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider")
    # the smoke check first: it is short, and its answer matters even when a unit test fails
    session.run(*pytest, "-m", "integration", "tests/test_demo.py::"
                "test_demo_serves_the_example_app_and_summarises_each_request_from_its_spans")
    session.run(*pytest, "-m", "not integration", *session.posargs)


# prints the versions a corner resolved to, for the matrix in docs/compatibility.md
_VERSIONS = """
from importlib.metadata import PackageNotFoundError, version
for name in ("opentelemetry-sdk", "opentelemetry-instrumentation", "langchain-core", "langgraph",
             "openinference-instrumentation-langchain", "fastapi", "starlette", "sse-starlette"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(f"{name}: not installed")
"""


nox.options.sessions = [f"corner({name})" for name in CORNERS if name != "newest"]
