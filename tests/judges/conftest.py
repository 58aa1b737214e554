"""Fixtures for the LLM judge tests: a scripted LLM server on 127.0.0.1, one per test.

One per test (not per module): a framework may leave a request in flight when a sibling call fails, and
that request must not consume the next test's injected fault.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from scripted_server import ScriptedLLMServer


@pytest.fixture
def llm_server() -> Iterator[ScriptedLLMServer]:
    srv = ScriptedLLMServer().start()
    try:
        yield srv
    finally:
        srv.stop()
