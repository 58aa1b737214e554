"""What counts as a token's text: ``str`` as it is, ``bytes`` decoded incrementally (a character split
across chunks included), LangChain message chunks by their ``content``; anything else is skipped, counted."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any


class TokenText:
    """Turns tokens into text for one stream; ``skip(what, reason)`` records what could not be used."""

    __slots__ = ("_decoder", "_skip", "skipped")

    def __init__(self, skip: Callable[[str, str], None]) -> None:
        self._decoder: codecs.IncrementalDecoder | None = None
        self._skip = skip
        self.skipped = 0  # tokens that carried no text at all

    def text(self, token: Any) -> str | None:
        """The text of ``token`` (possibly empty), or None when it carries none."""
        if isinstance(token, str):
            try:
                token.encode("utf-8")
                return token
            except UnicodeEncodeError:  # lone surrogates: OTLP needs valid UTF-8
                self._skip("token", "invalid_unicode")
                return token.encode("utf-8", "replace").decode("utf-8")
        if isinstance(token, bytes | bytearray | memoryview):
            if self._decoder is None:
                self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            text = self._decoder.decode(bytes(token))
            if "\ufffd" in text:
                self._skip("token", "invalid_utf8")
            return text
        if token is None:
            self.skipped += 1
            return None
        content = getattr(token, "content", None)  # LangChain message chunks
        if isinstance(content, str):
            return self.text(content) if content else None
        self.skipped += 1
        self._skip("token", f"non_text_token:{type(token).__name__}")
        return None

    def tail(self) -> str:
        """End of the stream: the bytes of an unfinished character, decoded (replacement character)."""
        return self._decoder.decode(b"", final=True) if self._decoder is not None else ""
