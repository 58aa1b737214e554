"""An application traced with ``phoenix.otel.register()`` that streams one answer through streamjudge.

Run as a script, in its own process (one global tracer provider per process)::

    python phoenix_otel_app.py VARIANT PHOENIX_URL

- ``register_in_code``: ``register(endpoint=...)``, no ``PHOENIX_COLLECTOR_ENDPOINT``;
- ``register_from_env``: ``register()`` reading ``PHOENIX_COLLECTOR_ENDPOINT`` (which streamjudge reads too).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

from opentelemetry import trace
from phoenix.otel import register

import streamjudge
from streamjudge.config import Settings

CONTEXT = "The company was founded in 1998 in Palo Alto by two graduate students."
ANSWER = "The company was founded in 1998 in Palo Alto. It later expanded to Europe in 2003."


async def tokens() -> AsyncIterator[str]:
    for word in ANSWER.split(" "):
        yield word + " "


def main(variant: str, url: str) -> None:
    if variant == "register_in_code":
        provider = register(endpoint=f"{url}/v1/traces", protocol="http/protobuf", verbose=False)
    elif variant == "register_from_env":
        provider = register(protocol="http/protobuf", verbose=False)
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    rt = streamjudge.configure(Settings(window_sentences=1))
    with trace.get_tracer("app").start_as_current_span("app.request"):  # the app's own span

        async def stream() -> None:
            async for _event in streamjudge.guard(
                tokens(), question="When was it founded?", contexts=[CONTEXT]
            ):
                pass

        asyncio.run(stream())
    assert rt.force_flush(10_000)
    provider.force_flush()
    rt.shutdown()
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
