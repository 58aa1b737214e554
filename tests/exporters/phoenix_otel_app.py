"""An application traced with ``phoenix.otel.register()`` that streams one answer through streamjudge.

Run as a script, in its own process (one global tracer provider per process)::

    python phoenix_otel_app.py VARIANT PHOENIX_URL

- ``register_in_code``: ``register(endpoint=...)``, no ``PHOENIX_COLLECTOR_ENDPOINT``;
- ``register_from_env``: ``register()`` reading ``PHOENIX_COLLECTOR_ENDPOINT`` (which streamjudge reads too).
"""

from __future__ import annotations

import sys

from opentelemetry import trace
from phoenix.otel import register
from sdk_stream import stream_answer  # next to this script

import streamjudge
from streamjudge.config import Settings


def main(variant: str, url: str) -> None:
    if variant == "register_in_code":
        provider = register(endpoint=f"{url}/v1/traces", protocol="http/protobuf", verbose=False)
    elif variant == "register_from_env":
        provider = register(protocol="http/protobuf", verbose=False)
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    rt = streamjudge.configure(Settings(window_sentences=1))
    with trace.get_tracer("app").start_as_current_span("app.request"):  # the app's own span
        stream_answer()
    assert rt.force_flush(10_000)
    provider.force_flush()
    rt.shutdown()
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
