"""Generated reference pages: the settings (from ``streamjudge.config``'s option table), the command line
(from its argument parser) and the telemetry names (from ``streamjudge.semconv``).

An mkdocs hook: before every build it writes the pages under ``docs/reference/`` whose text changed, so
the site always documents the code it was built from. Run it as a script to write them by hand
(``python docs/hooks/reference.py``); ``tests/test_docs_reference.py`` fails when the checked-in pages are
stale or a variable the package reads is missing from the settings page.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
TELEMETRY_PAGE = ROOT / "docs" / "reference" / "telemetry.md"
SEMCONV = ROOT / "src" / "streamjudge" / "semconv.py"
#: the collector configurations whose ``${env:NAME:-default}`` variables the settings page lists
COLLECTOR_CONFIGS = ("otel-config.yaml", "collector/*.yaml")

#: variables the package reads that are not streamjudge options, beside ``config.BORROWED_VARIABLES`` (the
#: ones the settings read as defaults): (variable, what streamjudge does with it). The OpenTelemetry SDK
#: reads many more ``OTEL_*`` variables itself; these are the ones streamjudge's own code reads.
OTHER_READ: tuple[tuple[str, str], ...] = (
    ("OTEL_TRACES_EXPORTER", "Set to `otlp` by streamjudge's distro when unset (as opentelemetry-distro "
     "does)."),
    ("OTEL_METRICS_EXPORTER", "Likewise `otlp` when unset; `none` turns off `streamjudge worker`'s metrics."),
    ("OTEL_LOGS_EXPORTER", "Likewise `otlp` when unset."),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "`grpc` (the SDK's default under `opentelemetry-instrument`) or "
     "`http/protobuf` (`streamjudge worker`'s default)."),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "The same for traces only."),
    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "The same for metrics only."),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "Where OTLP goes (the SDK reads it); `streamjudge demo --offline` also "
     "exports its spans over OTLP/HTTP when it is set."),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "The same for traces only."),
    ("OTEL_BSP_SCHEDULE_DELAY", "`streamjudge worker` exports every 200 ms unless this is set."),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "`streamjudge worker` queues 65,536 spans unless this is set."),
    ("LANGFUSE_PUBLIC_KEY", "With `LANGFUSE_SECRET_KEY`: spans to Langfuse's OTLP endpoint and scores to "
     "its ingestion API."),
    ("LANGFUSE_SECRET_KEY", "See `LANGFUSE_PUBLIC_KEY` (redacted from everything streamjudge exports)."),
    ("LANGFUSE_HOST", "Langfuse's address (default its cloud)."),
    ("LANGFUSE_BASE_URL", "The same, as newer Langfuse SDKs name it."),
    ("LANGFUSE_TRACING_ENVIRONMENT", "The environment of the scores streamjudge sends."),
    ("PHOENIX_COLLECTOR_ENDPOINT", "Spans to Phoenix over OTLP and scores as span annotations."),
    ("PHOENIX_API_KEY", "Sent as `authorization: Bearer ...` to Phoenix."),
    ("PHOENIX_CLIENT_HEADERS", "Headers for Phoenix (`k=v,k2=v2`, URL-encoded values)."),
    ("PHOENIX_PROJECT_NAME", "The Phoenix project (`openinference.project.name` on spans sent to Phoenix)."),
    ("PHOENIX_PROJECT", "The same, as newer `phoenix.otel` names it."),
    ("STREAMJUDGE_WORKER_BEARER_TOKEN", "`streamjudge worker`: the token exports to it must carry "
     "(`Authorization: Bearer ...`; `--bearer-token-file` takes precedence). Unset: no token asked."),
    ("STREAMJUDGE_JAEGER", "`make demo-ui`: the Jaeger binary (default: the one `make jaeger` builds)."),
)

#: variables streamjudge sets for libraries it drives (read by those libraries, not by streamjudge)
SET_FOR_OTHERS: tuple[tuple[str, str], ...] = (
    ("RAGAS_DO_NOT_TRACK", "`true` before ragas is imported: no telemetry POST from inside the event loop."),
    ("DEEPEVAL_TELEMETRY_OPT_OUT", "`1` before deepeval is imported: no telemetry."),
    ("DEEPEVAL_DISABLE_DOTENV", "`1`: deepeval loads no `.env` file into the process."),
    ("ERROR_REPORTING", "`NO` unless set: deepeval reports no errors home."),
    ("OTEL_SERVICE_NAME", "`make demo` / `make demo-ui`: the example app's service name."),
    ("EXAMPLE_LLM_MODEL", "`make demo` removes it from the example app's environment, so the app uses its "
     "deterministic offline model."),
    ("EXAMPLE_HOST", "`make demo`: the example app's address (loopback)."),
    ("EXAMPLE_PORT", "`make demo`: the example app's port (a free one)."),
    ("EXAMPLE_TOKEN_DELAY_MS", "`make demo`: the example model's delay per token."),
    ("PHOENIX_PORT", "`make demo-ui VIEWER=phoenix`: the Phoenix server's port (loopback)."),
    ("PHOENIX_GRPC_PORT", "Likewise, its OTLP/gRPC port."),
    ("PHOENIX_HOST", "Likewise, `127.0.0.1`."),
    ("PHOENIX_WORKING_DIR", "Likewise, a temporary directory."),
    ("PHOENIX_TELEMETRY_ENABLED", "Likewise, `false`."),
    ("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "Likewise, `false`."),
)

#: variables of the project's test and benchmark harness (not read by the package)
HARNESS: tuple[tuple[str, str], ...] = (
    ("STREAMJUDGE_OTELCOL", "The collector binary the integration tests start (default: "
     "`make -s collector`)."),
    ("STREAMJUDGE_PROMETHEUS", "The `prometheus` binary."),
    ("STREAMJUDGE_PROMTOOL", "The `promtool` binary."),
    ("STREAMJUDGE_ALERTMANAGER", "The Alertmanager binary."),
    ("STREAMJUDGE_AMTOOL", "The `amtool` binary."),
    ("STREAMJUDGE_PHOENIX_PYTHON", "The Python of Phoenix's own venv (default: `make -s phoenix`)."),
    ("STREAMJUDGE_TEST_MODEL_PATH", "A real NLI model directory for the model judge's tests and benchmark."),
)

_ENV_REF = re.compile(r"\$\{env:([A-Z][A-Z0-9_]*)(?::-([^}]*))?\}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _option_rows(options: Iterable[Any]) -> list[str]:
    rows = ["| variable | type | default | accepts | what it does |", "|---|---|---|---|---|"]
    for opt in options:
        text = opt.default_text
        default = "—" if opt.kind == "secret" or text in ("unset", "none") else f"`{text}`"
        field = f" (`Settings.{opt.field}`)" if opt.field and "." not in opt.field else ""
        rows.append(f"| `{opt.var}` | {opt.type_name} | {_cell(default)} | {_cell(opt.accepts)} | "
                    f"{_cell(opt.doc)}{field} |")
    return rows


def _pairs(pairs: Iterable[tuple[str, str]]) -> list[str]:
    rows = ["| variable | what |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(what)} |" for name, what in pairs]
    return rows


def collector_variables(root: Path = ROOT) -> dict[str, tuple[str, list[str]]]:
    """``${env:NAME:-default}`` references of the collector configurations: name -> (default, files)."""
    found: dict[str, tuple[str, list[str]]] = {}
    paths = sorted({p for pattern in COLLECTOR_CONFIGS for p in root.glob(pattern)})
    for path in paths:
        rel = path.relative_to(root).as_posix()
        # comments show examples (a header of your own), not what the configuration reads
        text = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                         if not line.lstrip().startswith("#"))
        for m in _ENV_REF.finditer(text):
            name, default = m.group(1), m.group(2) or ""
            prev = found.get(name)
            files = prev[1] if prev else []
            if rel not in files:
                files.append(rel)
            found[name] = (prev[0] if prev else default, files)
    return dict(sorted(found.items()))


def settings_page() -> str:
    """The settings reference, from ``streamjudge.config``'s option table."""
    from streamjudge import config

    llm_final = [o for o in config.LLM_OPTIONS if not o.var.startswith("EVAL_CHECKPOINT_")]
    llm_checkpoint = [o for o in config.LLM_OPTIONS if o.var.startswith("EVAL_CHECKPOINT_")]
    out = [
        "# Settings reference",
        "",
        "<!-- generated by docs/hooks/reference.py from streamjudge.config: do not edit by hand -->",
        "",
        "Every option is an environment variable and, for `STREAMJUDGE_*` options, a field of",
        "`streamjudge.Settings` (set in code with `streamjudge.load_settings(field=value)` or",
        "`Settings(...)`). Choice values are accepted in any case (`STOP`, `Hold-Back`). A value that",
        "cannot be used is an error naming the variable and what it accepts; under",
        "`opentelemetry-instrument` the application keeps running and one log line says which variables",
        "kept their default. A `STREAMJUDGE_*` variable that is not an option, and a metric name no judge",
        "scores, are reported once each with the closest known name.",
        "",
        f"## streamjudge options ({len(config.OPTIONS)})",
        "",
        *_option_rows(config.OPTIONS),
        "",
        f"## Process-wide options ({len(config.PROCESS_OPTIONS)})",
        "",
        *_option_rows(config.PROCESS_OPTIONS),
        "",
        f"## The judge LLM ({len(llm_final)} + {len(llm_checkpoint)})",
        "",
        "`EVAL_*` configure the LLM of the `llm`, `ragas` and `deepeval` judges, independent of the",
        "application's own LLM; `EVAL_CHECKPOINT_*` a cheaper one for checkpoints, each falling back to",
        "its `EVAL_*` value. With no `EVAL_*` variable at all, the application's `OPENAI_*` (or",
        "`ANTHROPIC_*`) keys are used.",
        "",
        *_option_rows(llm_final),
        "",
        *_option_rows(llm_checkpoint),
        "",
        "## Other variables streamjudge reads",
        "",
        *_pairs((*config.BORROWED_VARIABLES.items(), *OTHER_READ)),
        "",
        "Besides these, the values of every variable whose name ends in `_KEY`, `_TOKEN`, `_SECRET` or",
        "`_PASSWORD` are redacted from the text streamjudge exports (error messages on spans, log lines).",
        "",
        "## Variables streamjudge sets",
        "",
        "For the libraries it drives, before they are imported (read by them, not by streamjudge):",
        "",
        *_pairs(SET_FOR_OTHERS),
        "",
        "## The collector configurations",
        "",
        "Read by the OpenTelemetry Collector, not by the Python package: `${env:NAME:-default}` in "
        "`otel-config.yaml` and `collector/*.yaml`.",
        "",
        "| variable | default | in |",
        "|---|---|---|",
        *[f"| `{name}` | {_cell(f'`{d}`' if d else '—')} | {', '.join(f'`{f}`' for f in files)} |"
          for name, (d, files) in collector_variables().items()],
        "",
        "## The test and benchmark harness",
        "",
        *_pairs(HARNESS),
        "",
    ]
    return "\n".join(out)


def cli_page() -> str:
    """The command line reference, from ``streamjudge.cli``'s argument parser."""
    import argparse
    import os

    from streamjudge import cli

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fixed, so the page is stable
    try:
        parser = cli.build_parser()
        out = [
            "# Command line",
            "",
            "<!-- generated by docs/hooks/reference.py from streamjudge.cli: do not edit by hand -->",
            "",
            "`streamjudge` (or `python -m streamjudge`). What each command is for:",
            "[Offline tools](../offline.md).",
            "",
            "```text",
            parser.format_help().rstrip(),
            "```",
            "",
        ]
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, sub in subparsers.choices.items():
            out += [f"## streamjudge {name}", ""]
            if name == "demo":  # its options belong to streamjudge.demo, which parses them itself
                out += ["Options: `streamjudge demo --help`. See",
                        "[Getting started](../getting-started.md).", ""]
                continue
            out += ["```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


_SECTION = re.compile(r"^# --- (.+?) -+$")
_CONSTANT = re.compile(r'^([A-Z][A-Z0-9_]*): Final = "([^"]*)"\s*(?:#\s*(.*))?$')
_LITERAL = re.compile(r"``([^`]+)``")


def _md(text: str) -> str:
    """A docstring's or comment's text as a Markdown table cell (reST literals as code)."""
    return _cell(_LITERAL.sub(lambda m: f"`{m.group(1)}`", text))


def _templates(source: str) -> dict[int, tuple[str, str]]:
    """Functions that build a name (``score_attribute``): first line -> (name pattern, docstring)."""
    import ast

    found: dict[int, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and isinstance(node.body[-1], ast.Return):
            ret = node.body[-1].value
            if isinstance(ret, ast.JoinedStr):
                pattern = "".join(str(p.value) if isinstance(p, ast.Constant) else f"<{ast.unparse(p.value)}>"
                                  for p in ret.values if isinstance(p, ast.Constant | ast.FormattedValue))
                found[node.lineno] = (pattern, " ".join((ast.get_docstring(node) or "").split()))
    return found


def telemetry_page() -> str:
    """Every name streamjudge writes on telemetry, from ``semconv.py``: its sections, constants (with the
    comments beside them) and the functions that build names."""
    source = SEMCONV.read_text(encoding="utf-8")
    templates = _templates(source)
    out = [
        "# Telemetry names",
        "",
        "<!-- generated by docs/hooks/reference.py from streamjudge/semconv.py: do not edit by hand -->",
        "",
        "Every span, attribute, event and metric name streamjudge writes, and the values it gives them. The",
        "`gen_ai.evaluation.*` names follow the OpenTelemetry GenAI semantic conventions for evaluation",
        "results; the `streamjudge.*` names are streamjudge's. In code they are constants of",
        "`streamjudge.semconv`.",
    ]
    header = ["| name or value | constant | note |", "|---|---|---|"]
    note: list[str] = []
    for lineno, line in enumerate(source.splitlines(), start=1):
        if (section := _SECTION.match(line)) is not None:
            title = section.group(1)
            out += ["", f"## {title[0].upper()}{title[1:]}", "", *header]
            note = []
        elif lineno in templates:
            pattern, doc = templates[lineno]
            func = line.split()[1].split("(")[0]
            out.append(f"| `{pattern}` | `{func}()` | {_md(doc)} |")
        elif line.startswith("#"):
            note.append(line.lstrip("#:").strip())
        elif (const := _CONSTANT.match(line)) is not None:
            what = " ".join([*note, const.group(3) or ""]).strip()
            if not out[-1].startswith("|"):  # a constant before any section, or after a paragraph
                out += ["", *header]
            out.append(f"| `{const.group(2)}` | `{const.group(1)}` | {_md(what)} |")
            note = []
        elif not line.strip():
            note = []
    out.append("")
    return "\n".join(out)


def pages() -> Mapping[Path, str]:
    """Every generated page and its text."""
    return {SETTINGS_PAGE: settings_page(), CLI_PAGE: cli_page(), TELEMETRY_PAGE: telemetry_page()}


def write() -> list[Path]:
    """Write the pages whose text changed; the paths written."""
    written = []
    for path, text in pages().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def on_pre_build(config: Any) -> None:
    """mkdocs hook: the generated pages, up to date before the build reads them."""
    write()


if __name__ == "__main__":
    for p in write():
        print(p.relative_to(ROOT))
