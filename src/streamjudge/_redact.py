"""Secrets out of text that leaves the process: span attributes, log lines, error messages.

A judge endpoint or a backend that rejects a request often echoes it: a gateway's 401 body may quote the
``Authorization`` header, a proxy's error the URL with ``?api_key=``. Such text reaches span attributes
(``streamjudge.eval.skip_reason``) and logs, which are exported to third parties. :func:`redact` removes

* the values of the credentials streamjudge knows by name (:data:`SECRET_ENV_VARS`, from 4 characters:
  shorter ones are placeholders such as ``x`` for a local server), of every environment
  variable whose name ends in ``_KEY`` / ``_TOKEN`` / ``_SECRET`` / ``_PASSWORD`` (values of at least
  :data:`MIN_SECRET_CHARS` characters: shorter ones are flags and sizes, not secrets), and of the secrets
  registered with :func:`register_secret` (keys passed in code rather than the environment);
* what looks like a credential whatever its origin: ``Bearer``/``Basic`` authorization values, OpenAI /
  Anthropic / Langfuse style keys (``sk-...``, ``pk-lf-...``), ``api_key=...``-style assignments and the
  password of a URL (``https://user:password@host``).

HTTP clients log the URLs they call: :func:`redact_http_client_logs` puts a filter on httpx's loggers so
that a judge endpoint with credentials in its URL does not write them to the app's logs at INFO level.

It is meant for error paths; when nothing matches it costs a few substring searches (~5 us for 300 chars).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
from typing import Any, Final

__all__ = [
    "MASK", "MIN_SECRET_CHARS", "SECRET_ENV_VARS", "RedactingFilter", "redact", "redact_http_client_logs",
    "register_secret",
]

#: what a removed secret is replaced with
MASK: Final = "[REDACTED]"
#: the shortest environment value taken for a secret (by name suffix) or registered
MIN_SECRET_CHARS: Final = 8
#: credentials streamjudge reads or forwards, redacted from 4 characters on
SECRET_ENV_VARS: Final = (
    "EVAL_API_KEY",
    "EVAL_CHECKPOINT_API_KEY",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "LANGFUSE_SECRET_KEY",
    "LANGFUSE_PUBLIC_KEY",
    "PHOENIX_API_KEY",
)
_SECRET_SUFFIXES: Final = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")

# group 1 (if any) is kept: it names the secret, the rest of the match is the secret
_PATTERN: Final = re.compile(
    r"(?i:(\bbearer\s+))[A-Za-z0-9._~+/\-]{8,}=*"  # an Authorization header's value
    r"|(\bBasic\s+)[A-Za-z0-9+/]{12,}={0,2}"
    r"|\b(?:sk|rk)-[A-Za-z0-9_\-]{8,}|\bpk-lf-[A-Za-z0-9_\-]{4,}"  # OpenAI, Anthropic, Langfuse keys
    r"|(?i:(\b(?:api[_-]?key|access[_-]?token|auth[_-]?token|secret|password|passwd)[\"']?\s*[:=]\s*[\"']?))"
    r"[^\s\"'&,;}]{4,}"  # api_key=..., "secret": "..."
)

# the password of a URL's user info; group 1 (scheme, user and colon) is kept
_URL_PASSWORD: Final = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:)[^\s/?#@]+@")

# a match of _PATTERN contains one of these (lowercased): the regex only runs on text that has one
_TRIGGERS: Final = ("bearer", "basic", "sk-", "rk-", "pk-lf-", "api", "token", "secret", "passw")

_registered: set[str] = set()
_lock = threading.Lock()
# (copy of the raw environment, number of registered secrets, the secrets derived from both)
_cache: tuple[dict[Any, Any], int, list[str]] | None = None


def register_secret(value: str | None) -> None:
    """Redact ``value`` from now on (a key handed to a client in code, not through the environment)."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value)


def _known_secrets() -> list[str]:
    global _cache
    # the environment is read again whenever it changed (apps and tests set keys after import); comparing
    # CPython's raw mapping behind os.environ with a copy is ~50x cheaper than decoding every variable
    raw = getattr(os.environ, "_data", None)
    cached = _cache
    if cached is not None and raw is not None and cached[0] == raw and cached[1] == len(_registered):
        return cached[2]
    env = os.environ
    values = {v for name in SECRET_ENV_VARS if len(v := env.get(name, "")) >= 4}
    values.update(v for name, v in env.items()
                  if len(v) >= MIN_SECRET_CHARS and name.endswith(_SECRET_SUFFIXES))
    public, secret = env.get("LANGFUSE_PUBLIC_KEY"), env.get("LANGFUSE_SECRET_KEY")
    if public and secret:  # Langfuse's Basic auth header, as a gateway would echo it
        values.add(base64.b64encode(f"{public}:{secret}".encode()).decode())
    with _lock:
        values.update(_registered)
        count = len(_registered)
    # longest first: a secret that contains another is removed whole
    secrets = sorted(values, key=len, reverse=True)
    if raw is not None:
        _cache = (dict(raw), count, secrets)
    return secrets


def _mask(m: re.Match[str]) -> str:
    return (m.group(1) or m.group(2) or m.group(3) or "") + MASK


def redact(text: str) -> str:
    """``text`` with every known or recognisable secret replaced by :data:`MASK`."""
    if not text:
        return text
    for value in _known_secrets():
        if value in text:
            text = text.replace(value, MASK)
    lower = text.lower()
    if any(t in lower for t in _TRIGGERS):
        text = _PATTERN.sub(_mask, text)
    if "://" in text and "@" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + "@", text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record on with :func:`redact` applied to its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: leave it to the handler
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_FILTER: Final = RedactingFilter()
#: the loggers of the HTTP clients the judge SDKs use; httpx logs every request's URL at INFO level
HTTP_CLIENT_LOGGERS: Final = ("httpx", "httpx2")


def redact_http_client_logs(*names: str) -> None:
    """Filter the loggers ``names`` (default :data:`HTTP_CLIENT_LOGGERS`) through :func:`redact`; once each.

    A filter runs only for records its logger is enabled for, so it costs nothing while they stay below
    INFO (Python's default WARNING)."""
    for name in names or HTTP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
