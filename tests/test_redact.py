"""Secrets never reach span attributes or logs through error texts (``streamjudge._redact``)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from streamjudge._redact import MASK, redact, register_secret
from streamjudge.config import load_settings
from streamjudge.exporters import _bridge
from streamjudge.judging.base import EvalInput, JudgeError
from streamjudge.judging.judges.llm import LLMJudge

KEY = "key-ab12cd34ef56"  # no recognisable shape: only its name in the environment gives it away


@pytest.mark.parametrize("name", ["EVAL_API_KEY", "EVAL_CHECKPOINT_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
                                  "LANGFUSE_SECRET_KEY", "LANGFUSE_PUBLIC_KEY", "PHOENIX_API_KEY"])
def test_the_values_of_known_credentials_are_removed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "abcd5")
    assert redact("Incorrect key provided: abcd5.") == f"Incorrect key provided: {MASK}."


@pytest.mark.parametrize("name", ["MY_DB_PASSWORD", "GITHUB_TOKEN", "APP_SECRET", "SERVICE_KEY"])
def test_values_of_secret_looking_variables_are_removed_from_8_chars(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "hunter2hunter2")
    monkeypatch.setenv("SHORT_KEY", "1024")  # a size, not a secret
    assert redact("login hunter2hunter2 failed, size 1024") == f"login {MASK} failed, size 1024"


def test_a_changed_environment_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVAL_API_KEY", "first-key-value")
    assert redact("first-key-value") == MASK
    monkeypatch.setenv("EVAL_API_KEY", "second-key-value")
    assert redact("first-key-value second-key-value") == f"first-key-value {MASK}"


def test_a_secret_containing_another_is_removed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A_TOKEN", "abcdefgh")
    monkeypatch.setenv("B_TOKEN", "abcdefgh-and-more")
    assert redact("x abcdefgh-and-more y abcdefgh") == f"x {MASK} y {MASK}"


def test_langfuse_basic_auth_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "lf-public")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "lf-secret")
    header = base64.b64encode(b"lf-public:lf-secret").decode()
    assert header not in redact(f"rejected authorization {header}")


@pytest.mark.parametrize(("text", "kept"), [
    ("Authorization: Bearer eyJhbGciOi.JIUzI1Ni-Isx_y", "Authorization: Bearer "),
    ("authorization: bearer abcdefgh12345678", "authorization: bearer "),
    ("Authorization: Basic cGstbGYtMTIzNDpzay1sZi01Njc4", "Authorization: Basic "),
    ("Incorrect API key provided: sk-proj-AbCdEf0123456789.", "Incorrect API key provided: "),
    ("invalid x-api-key sk-ant-api03-AbCdEf0123456789", "invalid x-api-key "),
    ("keys pk-lf-1234abcd and sk-lf-5678efgh", "keys "),
    ("GET /v1/models?api_key=zzzz9999&x=1", "GET /v1/models?api_key="),
    ('{"password": "tr0ub4dor"}', '{"password": "'),
    ("access_token=abc.def.ghi", "access_token="),
])
def test_credential_shapes_are_removed_whatever_their_origin(text: str, kept: str) -> None:
    out = redact(text)
    assert out.startswith(kept) and MASK in out
    assert not any(part in out for part in ("eyJ", "12345678", "cGst", "AbCdEf", "1234abcd", "5678efgh",
                                            "zzzz9999", "tr0ub4dor", "abc.def"))


@pytest.mark.parametrize("text", [
    "HTTP 500: upstream connect error or disconnect/reset before headers",
    "basic authentication failed; unexpected token in JSON at position 3; the secret is out",
    "POST https://cloud.langfuse.com/api/public/otel/v1/traces: 413 Request Entity Too Large",
    "task-0123456789 finished; desk-abcdefghij",
    "",
])
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_registered_secrets_are_removed() -> None:
    register_secret("set-in-code-0001")
    register_secret("short")  # too short to be taken for a secret
    assert redact("set-in-code-0001 short") == f"{MASK} short"


# --- the judge clients ---------------------------------------------------------------------------------
class _EchoGateway(BaseHTTPRequestHandler):
    """A gateway that rejects every request with a 401 quoting the request's credentials."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps({"error": {"message": f"invalid credentials: {self.headers.get('authorization')} "
                                                f"/ x-api-key={self.headers.get('x-api-key')}",
                                     "type": "authentication_error"}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_judge_error_does_not_carry_the_key_a_gateway_echoed(
    monkeypatch: pytest.MonkeyPatch, gateway: str, provider: str
) -> None:
    monkeypatch.setenv("EVAL_API_KEY", KEY)
    url = gateway + ("" if provider == "anthropic" else "/v1")
    settings = load_settings({"EVAL_PROVIDER": provider, "EVAL_MODEL": "m", "EVAL_BASE_URL": url,
                              "EVAL_API_KEY": KEY})
    judge = LLMJudge.from_settings(settings)
    item = EvalInput(question="Q?", answer="The answer.", contexts=("The answer.",))

    async def run() -> None:
        try:
            await judge.evaluate(item, ["faithfulness"])
        finally:
            await judge.aclose()

    with pytest.raises(JudgeError) as err:
        asyncio.run(run())
    text = str(err.value)
    assert "401" in text and "invalid credentials" in text  # the error still says what went wrong
    assert KEY not in text and MASK in text


def test_a_key_given_in_code_is_redacted_as_well(gateway: str) -> None:
    in_code = "code-only-key-777"
    settings = load_settings({"EVAL_MODEL": "m", "EVAL_BASE_URL": gateway + "/v1", "EVAL_API_KEY": in_code})
    judge = LLMJudge.from_settings(settings)  # the environment does not have it

    async def run() -> None:
        try:
            await judge.evaluate(EvalInput(question="Q?", answer="A.", contexts=("A.",)), ["faithfulness"])
        finally:
            await judge.aclose()

    with pytest.raises(JudgeError) as err:
        asyncio.run(run())
    assert in_code not in str(err.value)


def test_the_http_bridge_redacts_a_rejected_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-bridge-secret")
    response = httpx.Response(400, text="bad request from key sk-lf-bridge-secret")
    assert _bridge._short(response) == f"bad request from key {MASK}"


class _HalfBrokenClient:
    """Answers the answer-relevancy prompt; fails the faithfulness prompt with an error quoting the key."""

    model = "m"

    async def complete(self, system: str, user: str, *, json_mode: bool = True, max_tokens: int = 1024) -> str:
        if "claims" in system:
            raise JudgeError(f"upstream said: invalid key {KEY}")
        return json.dumps({"statements": [{"statement": "s", "relevant": True}], "noncommittal": False})

    async def aclose(self) -> None:
        pass


def test_a_metric_skipped_on_a_judge_error_does_not_carry_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVAL_API_KEY", KEY)
    item = EvalInput(question="Q?", answer="The answer.", contexts=("The answer.",))
    result = asyncio.run(LLMJudge(_HalfBrokenClient()).evaluate(item, ["faithfulness", "answer_relevancy"]))
    faith = result.get("faithfulness")
    assert faith is not None and faith.skipped is not None and faith.skipped.startswith("judge_error: ")
    assert KEY not in faith.skipped and MASK in faith.skipped  # the skip reason becomes a span attribute


@pytest.mark.parametrize(("text", "out"), [
    ("POST https://judge:s3cr3t-pw@llm.internal/v1/chat/completions 401",
     f"POST https://judge:{MASK}@llm.internal/v1/chat/completions 401"),
    ("connect to redis://:hunter2@cache:6379/0 failed", f"connect to redis://:{MASK}@cache:6379/0 failed"),
    ("http://127.0.0.1:8080/v1/x@y", "http://127.0.0.1:8080/v1/x@y"),  # a port, then a path: no password
    ("mail me at bob@example.com via https://example.com", "mail me at bob@example.com via https://example.com"),
])
def test_the_password_of_a_url_is_removed(text: str, out: str) -> None:
    assert redact(text) == out


def test_httpx_logs_a_judge_url_without_its_password(gateway: str, caplog: pytest.LogCaptureFixture) -> None:
    # httpx logs every request's URL at INFO; a password in EVAL_BASE_URL must not reach the app's logs
    password = "pw-in-the-url-4242"
    url = gateway.replace("http://", f"http://judge:{password}@") + "/v1"
    settings = load_settings({"EVAL_MODEL": "m", "EVAL_BASE_URL": url, "EVAL_API_KEY": "x"})
    judge = LLMJudge.from_settings(settings)

    async def run() -> None:
        try:
            await judge.evaluate(EvalInput(question="Q?", answer="A.", contexts=("A.",)), ["faithfulness"])
        finally:
            await judge.aclose()

    with caplog.at_level(logging.INFO), pytest.raises(JudgeError):
        asyncio.run(run())
    requests = [r.getMessage() for r in caplog.records if r.getMessage().startswith("HTTP Request:")]
    assert requests and all(f"judge:{MASK}@127.0.0.1" in line for line in requests), requests
    assert password not in caplog.text
