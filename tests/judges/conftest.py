"""Fixtures for the LLM judge tests: one scripted LLM server on 127.0.0.1 per test module."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from scripted_server import ScriptedLLMServer


@pytest.fixture(scope="module")
def _server() -> Iterator[ScriptedLLMServer]:
    srv = ScriptedLLMServer().start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def llm_server(_server: ScriptedLLMServer) -> ScriptedLLMServer:
    _server.reset()
    return _server
