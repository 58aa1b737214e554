"""mkdocs hook: pages that exist get a nav entry even when mkdocs.yml does not name them.

- A page other work is adding (:data:`PLACES`) joins its section, after the page named, once its file
  exists; until then the nav does not mention it (a nav entry without its page fails the strict build).
- Any other page left out of mkdocs.yml's nav is listed under "More", so a page added to docs/ is never
  hidden; moving it where it belongs is a one-line edit of mkdocs.yml.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: folders of docs/ that hold no pages (excluded from the build in mkdocs.yml)
_NOT_PAGES = ("hooks",)

#: page -> (nav section, title, the page it follows)
PLACES: dict[str, tuple[str, str, str]] = {
    "app-shapes.md": ("Use it", "App shapes", "library.md"),
    "app-shapes-langchain.md": ("Use it", "LangChain chains", "app-shapes.md"),
    "judges.md": ("Understand", "Judges", "concepts.md"),
    "stream-core.md": ("Understand", "The stream core", "how-it-works.md"),
    "privacy.md": ("Run it", "Privacy", "operations.md"),
    "compatibility.md": ("Run it", "Compatibility", "reliability.md"),
}


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


def _place(nav: list[Any], page: str) -> bool:
    """Put ``page`` into its section of ``nav`` after the page it follows; False when there is no such
    section."""
    section, title, after = PLACES[page]
    for entry in nav:
        if isinstance(entry, dict) and isinstance(entry.get(section), list):
            items = entry[section]
            at = next((i + 1 for i, item in enumerate(items) if after in _paths(item)), len(items))
            items.insert(at, {title: page})
            return True
    return False


def on_config(config: Any) -> Any:
    """Place the known pages that exist; list the rest of the left-out pages under "More"."""
    nav = config["nav"]
    if nav:
        missing = missing_from_nav(Path(config["docs_dir"]), nav)
        # in PLACES' order, so a page follows one placed just before it
        placed = {p for p in PLACES if p in missing and _place(nav, p)}
        extra = [p for p in missing if p not in placed]
        if extra:
            nav.append({"More": extra})
    return config
