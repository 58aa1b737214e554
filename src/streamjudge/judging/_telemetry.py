"""What a stream writes on its spans: end-of-stream attributes and text under the content-capture policy."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv


def capped(text: str, limit: int) -> str:
    """At most ``limit`` chars: the head and the tail of a longer text around an elision mark."""
    if len(text) <= limit:
        return text
    half = max(1, (limit - 3) // 2)
    return f"{text[:half]} … {text[-half:]}"


def sha256(text: str) -> str:
    """Hex digest of ``text`` (UTF-8): what stands for a text that is not captured."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def text_attributes(
    keys: tuple[str, str, str], text: str, *, capture: bool, limit: int
) -> dict[str, AttributeValue]:
    """``text`` under ``keys`` = (text, length, sha256): the (capped) text when content is captured, its
    length and digest when it is not or when it was capped."""
    key, length_key, sha_key = keys
    out: dict[str, AttributeValue] = {}
    if capture:
        out[key] = capped(text, limit)
    if not capture or len(text) > limit:
        out[length_key] = len(text)
        out[sha_key] = sha256(text)
    return out


ANSWER_KEYS = (semconv.STREAM_ANSWER, semconv.STREAM_ANSWER_LENGTH, semconv.STREAM_ANSWER_SHA256)
CHECKPOINT_KEYS = (semconv.CHECKPOINT_TEXT, semconv.CHECKPOINT_TEXT_LENGTH, semconv.CHECKPOINT_TEXT_SHA256)


def skip_attributes(skips: Mapping[str, int]) -> dict[str, AttributeValue]:
    """Skip counts under static keys (two parallel arrays), never one attribute key per reason."""
    if not skips:
        return {}
    reasons = sorted(skips)
    return {semconv.SKIP_REASONS: reasons, semconv.SKIP_COUNTS: [skips[r] for r in reasons]}


def defer_final(
    span: trace.Span, text: str, question: str | None, contexts: tuple[str, ...] | None,
    reference: str | None, *, capture: bool, limit: int,
) -> None:
    """Leave the final pass to a ``streamjudge worker``: the answer span carries what it needs, once."""
    span.set_attribute(semconv.EVAL_STATUS, "deferred")
    if not capture:
        # the policy wins: a worker cannot judge what was not captured, and says so
        span.set_attribute(semconv.EVAL_SKIP_REASON, "deferred_without_content")
        return
    span.set_attribute(semconv.STREAM_ANSWER, text[:limit])  # whole, not capped for display
    span.set_attribute(semconv.STREAM_CONTEXTS, list(contexts or ()))
    if question is not None:
        span.set_attribute(semconv.STREAM_QUESTION, question)
    if reference is not None:
        span.set_attribute(semconv.STREAM_REFERENCE, reference)
