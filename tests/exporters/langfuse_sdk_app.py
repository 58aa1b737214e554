"""An application that traces with the Langfuse SDK and streams one answer through streamjudge.

Run as a script, in its own process (one global tracer provider per process)::

    python langfuse_sdk_app.py VARIANT BASE_URL

- ``sdk_first``: ``Langfuse()`` from ``LANGFUSE_*`` variables, then ``streamjudge.configure()``;
- ``streamjudge_first``: the other way round (the SDK joins the provider streamjudge installed);
- ``sdk_in_code``: ``Langfuse(public_key=..., secret_key=..., base_url=...)``, no ``LANGFUSE_*`` variables.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

from langfuse import Langfuse

import streamjudge
from streamjudge.config import Settings

CONTEXT = "The company was founded in 1998 in Palo Alto by two graduate students."
# the second sentence is not in the context: its checkpoint fails
ANSWER = "The company was founded in 1998 in Palo Alto. It later expanded to Europe in 2003."


async def tokens() -> AsyncIterator[str]:
    for word in ANSWER.split(" "):
        yield word + " "


def main(variant: str, base_url: str) -> None:
    settings = Settings(window_sentences=1)
    if variant == "sdk_in_code":
        client = Langfuse(public_key="pk-lf-code", secret_key="sk-lf-code", base_url=base_url)
        rt = streamjudge.configure(settings)
    elif variant == "sdk_first":
        client = Langfuse()
        rt = streamjudge.configure(settings)
    elif variant == "streamjudge_first":
        rt = streamjudge.configure(settings)
        client = Langfuse()
    else:
        raise SystemExit(f"unknown variant {variant!r}")

    async def stream() -> None:
        async for _event in streamjudge.guard(tokens(), question="When was it founded?", contexts=[CONTEXT]):
            pass

    asyncio.run(stream())
    assert rt.force_flush(10_000)
    client.flush()
    client.shutdown()
    rt.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
