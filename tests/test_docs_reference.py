"""The generated reference pages match the code, and every variable the package reads is documented.

The settings page (docs/reference/settings.md) is written from ``streamjudge.config``'s option table by
docs/hooks/reference.py; a variable read anywhere else in the package must be listed there by hand. These
tests find the variables two ways: every environment-variable name written in the package's source, and
every name ``load_settings`` asks an environment for (names built at run time, such as ``EVAL_CHECKPOINT_*``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from streamjudge import config

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "streamjudge"

#: the families of environment variables the package deals in (a name written in its source with one of
#: these prefixes is a variable it reads or sets)
ENV_PREFIXES = ("STREAMJUDGE_", "EVAL_", "OTEL_", "LANGFUSE_", "PHOENIX_", "OPENAI_", "ANTHROPIC_", "RAGAS_",
                "DEEPEVAL_")
_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env_key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _reads_in(tree: ast.AST) -> Iterator[str]:
    """Names passed to ``*.get`` / ``getenv`` / ``setdefault`` / ``pop`` or subscripted on ``*environ`` /
    ``env``: environment look-ups whatever the variable's prefix."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("get", "getenv", "setdefault", "pop"):
                key = _env_key(node.args[0])
                if key and _NAME.fullmatch(key):
                    target = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
                    if name == "getenv" or "environ" in target or target in ("env", "environ"):
                        yield key
        elif isinstance(node, ast.Subscript):
            target = ast.unparse(node.value)
            key = _env_key(node.slice)
            if key and _NAME.fullmatch(key) and ("environ" in target or target == "env"):
                yield key


def variables_in_source() -> dict[str, str]:
    """Every environment variable the package's source names: variable -> the file naming it first."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            key = _env_key(node)
            if key and _NAME.fullmatch(key) and key.startswith(ENV_PREFIXES):
                found.setdefault(key, rel)
        for key in _reads_in(tree):
            found.setdefault(key, rel)
    return found


class _RecordingEnv(dict[str, str]):
    """An environment that remembers every name asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)


def variables_asked_at_run_time() -> set[str]:
    env = _RecordingEnv()
    config.load_settings(env)
    config.capture_content_from_env(env)
    for opt in config.PROCESS_OPTIONS:
        config.option_from_env(opt.var, env)
    return {name for name in env.asked if _NAME.fullmatch(name)}


def _documented(page: str) -> set[str]:
    return set(re.findall(r"`([A-Z][A-Z0-9_]*)`", page))


def test_the_generated_pages_are_up_to_date() -> None:
    gen = _generator()
    for path, text in gen.pages().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is stale: run `python docs/hooks/reference.py` (or `make docs`)")


def test_every_option_is_in_the_settings_reference_with_its_default_and_range() -> None:
    page = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for opt in config.all_options():
        assert opt.var in rows, opt.var
        assert opt.accepts.replace("|", "\\|") in rows[opt.var], opt.var
    threshold = rows["STREAMJUDGE_THRESHOLD"]
    assert "`0.7`" in threshold and "from 0 to 1" in threshold


def test_every_variable_the_package_reads_is_in_the_settings_reference() -> None:
    documented = _documented((ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8"))
    in_source = variables_in_source()
    at_run_time = variables_asked_at_run_time()
    assert len(in_source) > 40 and len(at_run_time) > 60  # the scan itself still finds what it should
    missing = {name: where for name, where in in_source.items() if name not in documented}
    missing.update({name: "asked by load_settings" for name in at_run_time - documented})
    assert not missing, f"variables read but not in docs/reference/settings.md: {missing}"


def test_the_scan_finds_reads_whatever_their_prefix() -> None:
    tree = ast.parse("import os\nos.environ.get('MY_FLAG')\nenv['OTHER_ONE']\nos.getenv('THIRD_VAR')\n"
                     "d.get('NOT_ENV_KEY')\n")
    assert sorted(_reads_in(tree)) == ["MY_FLAG", "OTHER_ONE", "THIRD_VAR"]


def test_every_variable_listed_by_hand_is_still_used() -> None:
    gen = _generator()
    text = "\n".join(p.read_text(encoding="utf-8") for p in (*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
                                                            *(ROOT / "benchmarks").rglob("*.py"))
                     if p.name != "test_docs_reference.py")
    for name, _what in (*gen.OTHER_READ, *gen.SET_FOR_OTHERS, *gen.HARNESS):
        assert name in text, f"{name} is documented but nothing reads or sets it any more"


def test_a_page_left_out_of_the_nav_is_placed_or_listed_under_more(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("nav_hook", ROOT / "docs" / "hooks" / "nav.py")
    assert spec and spec.loader
    nav_hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nav_hook)
    for rel in ("index.md", "library.md", "offline.md", "a/out.md", "new.md", "judges.md", "hooks/notes.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("# x\n")
    nav = [{"Home": "index.md"}, {"Use it": [{"Library": "library.md"}, {"Offline": "offline.md"}]}]
    config = {"docs_dir": str(tmp_path), "nav": nav}
    nav_hook.on_config(config)
    # judges.md's section is not in this nav, app-shapes.md does not exist: neither is placed
    assert nav[1] == {"Use it": [{"Library": "library.md"}, {"Offline": "offline.md"}]}
    assert nav[-1] == {"More": ["a/out.md", "judges.md", "new.md"]}
    (tmp_path / "app-shapes.md").write_text("# x\n")
    (tmp_path / "app-shapes-langchain.md").write_text("# x\n")  # follows app-shapes.md, sorts before it
    nav = [{"Use it": [{"Library": "library.md"}, {"Offline": "offline.md"}]}]
    nav_hook.on_config({"docs_dir": str(tmp_path), "nav": nav})
    assert [next(iter(e.values())) for e in nav[0]["Use it"]] == [
        "library.md", "app-shapes.md", "app-shapes-langchain.md", "offline.md"]
