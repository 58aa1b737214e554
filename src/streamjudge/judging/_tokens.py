"""What counts as a token's text: ``str`` as it is, ``bytes`` decoded incrementally (a character split
across chunks included), LangChain message chunks by their ``content``; anything else is skipped, counted."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any


class TokenText:
    """Turns tokens into text for one stream; the ``skip(what, reason)`` given with a token records what
    could not be used of it."""

    # no callback is kept here: the session owning this object would pass its own method, a reference
    # cycle that only the cyclic GC frees (with every object of the finished stream)
    __slots__ = ("_decoder", "skipped")

    def __init__(self) -> None:
        self._decoder: codecs.IncrementalDecoder | None = None
        self.skipped = 0  # tokens that carried no text at all

    def text(self, token: Any, skip: Callable[[str, str], None]) -> str | None:
        """The text of ``token`` (possibly empty), or None when it carries none; ``skip`` is told why a
        token was changed or dropped."""
        if isinstance(token, str):
            try:
                token.encode("utf-8")
                return token
            except UnicodeEncodeError:  # lone surrogates: OTLP needs valid UTF-8
                skip("token", "invalid_unicode")
                return token.encode("utf-8", "replace").decode("utf-8")
        if isinstance(token, bytes | bytearray | memoryview):
            if self._decoder is None:
                self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            text = self._decoder.decode(bytes(token))
            if "\ufffd" in text:
                skip("token", "invalid_utf8")
            return text
        if token is None:
            self.skipped += 1
            return None
        content = getattr(token, "content", None)  # LangChain message chunks
        if isinstance(content, str):
            return self.text(content, skip) if content else None
        self.skipped += 1
        skip("token", f"non_text_token:{type(token).__name__}")
        return None

    def tail(self) -> str:
        """End of the stream: the bytes of an unfinished character, decoded (replacement character)."""
        return self._decoder.decode(b"", final=True) if self._decoder is not None else ""
