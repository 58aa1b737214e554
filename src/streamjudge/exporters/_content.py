"""The content-capture policy for what leaves through the score and annotation bridges.

With ``STREAMJUDGE_CAPTURE_CONTENT=false`` spans carry a length and a hash instead of the answer text,
but a judge's explanation quotes the claims it could not support (``claim 'Paris is in Spain' not in
context``): sent as a Langfuse score comment or a Phoenix annotation explanation, it would export the
answer after all. :func:`scrub_explanation` keeps the structural part of an explanation and nothing
quoted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from streamjudge.config import capture_content_from_env as _settings_policy

ENV_CAPTURE_CONTENT = "STREAMJUDGE_CAPTURE_CONTENT"

# characters that open quoted text in explanations: ASCII and typographic quotes, backticks, guillemets
_QUOTES = "'\"`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a"
# an apostrophe inside a word (``isn't``, ``model's``) quotes nothing
_QUOTE_START = re.compile(rf"(?<![A-Za-z0-9])[{re.escape(_QUOTES)}]|[\"`\u201c\u201e\u00ab\u2039]")
_TRAILING = " \t\r\n:;,-\u2013\u2014(["


def scrub_explanation(text: str | None, capture: bool) -> str | None:
    """``text`` as it may leave the process under the content-capture policy.

    With ``capture`` on, ``text`` unchanged. Off: everything from the first opening quote character on is
    dropped (``"2/3 claims supported; unsupported: 'Paris is in Spain'"`` becomes ``"2/3 claims
    supported; unsupported"``), and None when nothing structural is left. Apostrophes inside words are not
    quotes. The processor may apply the same function to the explanation it puts on span events.
    """
    if capture or not text:
        return text
    m = _QUOTE_START.search(text)
    kept = text if m is None else text[: m.start()]
    kept = kept.rstrip(_TRAILING)
    return kept or None


def capture_content_from_env(env: Mapping[str, str] | None = None) -> bool:
    """``STREAMJUDGE_CAPTURE_CONTENT``, for sinks built from the environment; unset, the default of the
    settings (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``, else on), so the sinks and the spans
    follow one policy."""
    return _settings_policy(os.environ if env is None else env)
