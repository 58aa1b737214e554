"""A griffe extension for the API reference: the package's docstrings use Sphinx roles
(``:func:`guard```, ``:class:`~streamjudge.Settings```), which Markdown would show as written; each becomes
inline code with the name alone."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


class SphinxRoles(Extension):
    """Rewrites Sphinx roles and double-backtick literals in every docstring to Markdown code."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        doc = getattr(obj, "docstring", None)
        if doc is not None:
            text = _ROLE.sub(lambda m: f"`{m.group(1).split('.')[-1]}`", doc.value)
            doc.value = _LITERAL.sub(r"`\1`", text)
