"""OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is the default of capture_content; ours wins when set."""

from __future__ import annotations

import pytest

from streamjudge import config
from streamjudge.config import load_settings
from streamjudge.exporters._content import capture_content_from_env

GENAI = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@pytest.mark.parametrize(("value", "captured"), [
    ("true", True), ("True", True), ("1", True), ("SPAN_ONLY", True), ("span_and_event", True),
    ("false", False), ("0", False), ("NO_CONTENT", False), ("EVENT_ONLY", False), ("", True),
])
def test_the_genai_switch_is_the_default(value: str, captured: bool) -> None:
    env = {GENAI: value}
    assert load_settings(env).capture_content is captured
    # the score and annotation bridges follow the same policy as the spans
    assert capture_content_from_env(env) is captured


@pytest.mark.parametrize(("ours", "genai", "captured"), [
    ("true", "false", True), ("false", "true", False), ("off", "SPAN_AND_EVENT", False), ("on", "NO_CONTENT", True),
])
def test_streamjudge_capture_content_wins_when_set(ours: str, genai: str, captured: bool) -> None:
    env = {"STREAMJUDGE_CAPTURE_CONTENT": ours, GENAI: genai}
    assert load_settings(env).capture_content is captured
    assert capture_content_from_env(env) is captured


def test_neither_set_captures() -> None:
    assert load_settings({}).capture_content is True
    assert capture_content_from_env({}) is True


def test_an_unreadable_genai_value_warns_once_and_captures(caplog: pytest.LogCaptureFixture) -> None:
    config._warned.discard(f"var:{GENAI}")
    env = {GENAI: "maybe"}
    with caplog.at_level("WARNING", logger="streamjudge.config"):
        assert load_settings(env).capture_content is True
        assert load_settings(env).capture_content is True
    lines = [r.getMessage() for r in caplog.records if GENAI in r.getMessage()]
    assert len(lines) == 1 and "STREAMJUDGE_CAPTURE_CONTENT" in lines[0]


def test_an_override_in_code_wins_over_both() -> None:
    assert load_settings({GENAI: "false"}, capture_content=True).capture_content is True


@pytest.mark.parametrize("genai", ["false", "NO_CONTENT"])
def test_an_unreadable_streamjudge_value_falls_back_to_the_genai_switch(genai: str) -> None:
    # a typo in our switch must not turn capture on against the GenAI switch the user set to off
    env = {"STREAMJUDGE_CAPTURE_CONTENT": "fasle", GENAI: genai}
    assert config.load_settings_or_default(env=env).capture_content is False
    assert capture_content_from_env(env) is False
    assert config.load_settings_or_default(env={"STREAMJUDGE_CAPTURE_CONTENT": "fasle"}).capture_content is True
