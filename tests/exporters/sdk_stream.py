"""The answer the SDK-coexistence apps (``langfuse_sdk_app.py``, ``phoenix_otel_app.py``) stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import streamjudge

CONTEXT = "The company was founded in 1998 in Palo Alto by two graduate students."
# the second sentence is not in the context: its checkpoint fails
ANSWER = "The company was founded in 1998 in Palo Alto. It later expanded to Europe in 2003."


async def _tokens() -> AsyncIterator[str]:
    for word in ANSWER.split(" "):
        yield word + " "
        # as a model's stream does (a read per chunk): the loop runs between tokens, so each sentence is
        # its own checkpoint (a burst with no loop pass in between would share one)
        await asyncio.sleep(0)


def stream_answer() -> None:
    """Stream ANSWER through ``streamjudge.guard`` to the end (events are not needed: the spans tell)."""

    async def consume() -> None:
        async for _event in streamjudge.guard(_tokens(), question="When was it founded?", contexts=[CONTEXT]):
            pass

    asyncio.run(consume())
