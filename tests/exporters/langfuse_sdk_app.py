"""An application that traces with the Langfuse SDK and streams one answer through streamjudge.

Run as a script, in its own process (one global tracer provider per process)::

    python langfuse_sdk_app.py VARIANT BASE_URL

- ``sdk_first``: ``Langfuse()`` from ``LANGFUSE_*`` variables, then ``streamjudge.configure()``;
- ``streamjudge_first``: the other way round (the SDK joins the provider streamjudge installed);
- ``sdk_in_code``: ``Langfuse(public_key=..., secret_key=..., base_url=...)``, no ``LANGFUSE_*`` variables.
"""

from __future__ import annotations

import sys

from langfuse import Langfuse
from sdk_stream import stream_answer  # next to this script

import streamjudge
from streamjudge.config import Settings


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

    stream_answer()
    assert rt.force_flush(10_000)
    client.flush()
    client.shutdown()
    rt.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
