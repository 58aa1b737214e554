"""mkdocs hook: a page that is not in mkdocs.yml's nav still appears in the site's navigation, under "More".

A page added to docs/ is then never hidden; moving it into the section where it belongs is a one-line edit
of mkdocs.yml. A nav entry whose page does not exist still fails the strict build.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: folders of docs/ that hold no pages (excluded from the build in mkdocs.yml)
_NOT_PAGES = ("hooks",)


def _paths(entries: Any) -> Iterator[str]:
    """Every page path named anywhere in a nav (nested sections included)."""
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from _paths(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from _paths(value)


def missing_from_nav(docs_dir: Path, nav: Any) -> list[str]:
    """The Markdown pages under ``docs_dir`` that ``nav`` does not name, sorted."""
    named = set(_paths(nav))
    pages = (p.relative_to(docs_dir).as_posix() for p in docs_dir.rglob("*.md"))
    return sorted(p for p in pages if p not in named and p.split("/")[0] not in _NOT_PAGES)


def on_config(config: Any) -> Any:
    """Append the pages the nav leaves out as a "More" section."""
    nav = config["nav"]
    if nav:
        extra = missing_from_nav(Path(config["docs_dir"]), nav)
        if extra:
            nav.append({"More": extra})
    return config
