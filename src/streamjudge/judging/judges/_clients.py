"""Async chat clients for the LLM judges: OpenAI-compatible and Anthropic.

One job each: send a system + user prompt, get text back (JSON mode when the server supports it), map
every failure to :class:`~streamjudge.judging.base.TransientJudgeError` or
:class:`~streamjudge.judging.base.JudgeError`, and account the usage.

- The SDKs' own retries are off (``max_retries=0``): the judge pool retries transient errors with its own
  bounded backoff, so retries are never multiplied.
- Usage is read from every HTTP response body by an httpx response hook and added to the
  :class:`UsageMeter` of the current context (:func:`metering`). The hook sits under the SDK, so calls that
  ragas or deepeval make through the same client are counted as well, and concurrent evaluations never
  mix their counts (each runs in its own context).
- A reply is read with a byte cap (:data:`MAX_REPLY_BYTES`, on the bytes after decompression too): a
  larger one fails that call (:class:`ReplyTooLarge`, a judge error) before it costs memory or parsing.
- The SDKs are imported when a client is built, not when this module is imported.
"""

from __future__ import annotations

import contextlib
import contextvars
import email.utils
import importlib
import json
import re
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from streamjudge._redact import redact, redact_http_client_logs, register_secret
from streamjudge.config import ConfigError, JudgeLLMSettings
from streamjudge.judging.base import JudgeError, TransientJudgeError, Usage

#: Longest excerpt of a model answer quoted in an error message.
RAW_EXCERPT_CHARS = 200
#: Largest reply body read from a judge LLM (decompressed). A verdict for ``max_tokens`` output tokens is
#: a few KB; a larger body is a broken or hostile endpoint.
MAX_REPLY_BYTES = 1024 * 1024

_OPENAI_PROVIDERS = ("openai", "openai_compatible", "vllm", "ollama", "llamacpp", "lmstudio")
_ANTHROPIC_PROVIDERS = ("anthropic",)


# --- usage accounting --------------------------------------------------------------------------------


@dataclass(slots=True)
class UsageMeter:
    """Mutable usage counter for one evaluation; read it as :class:`Usage` with :meth:`snapshot`."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def snapshot(self) -> Usage:
        """The counts so far."""
        return Usage(self.calls, self.input_tokens, self.output_tokens, self.cost_usd)


_METER: contextvars.ContextVar[UsageMeter | None] = contextvars.ContextVar("streamjudge_judge_usage",
                                                                             default=None)


@contextlib.contextmanager
def metering() -> Iterator[UsageMeter]:
    """Count the model calls made in this context (and in tasks started from it) into a new meter."""
    meter = UsageMeter()
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


@dataclass(frozen=True, slots=True)
class Pricing:
    """USD per million tokens; zero when unknown (then only a provider-reported cost is counted)."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


def _usage_from_body(body: Mapping[str, Any]) -> tuple[int, int, float | None]:
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0, None
    # OpenAI: prompt_tokens/completion_tokens; Anthropic: input_tokens/output_tokens (+ cache reads)
    inp = usage.get("prompt_tokens")
    if inp is None:
        inp = (usage.get("input_tokens") or 0) + (usage.get("cache_read_input_tokens") or 0) + (
            usage.get("cache_creation_input_tokens") or 0)
    out = usage.get("completion_tokens")
    if out is None:
        out = usage.get("output_tokens") or 0
    reported = usage.get("cost")  # some gateways (OpenRouter, LiteLLM proxy) report the price
    cost = float(reported) if isinstance(reported, int | float) else None
    return int(inp or 0), int(out or 0), cost


class ReplyTooLarge(JudgeError):
    """A judge LLM's reply was over :data:`MAX_REPLY_BYTES` (that call fails; nothing more is read)."""


def _too_large(limit: int) -> ReplyTooLarge:
    return ReplyTooLarge(f"judge LLM: reply too large (over {limit} bytes)")


class _CappedStream:
    """A response body stream that fails once more than ``limit`` bytes came (after decompression for
    gzip/deflate, measured by inflating alongside in bounded steps)."""

    def __init__(self, inner: Any, limit: int, encoding: str) -> None:
        self.inner = inner
        self.limit = limit
        self.raw = 0
        self.inflated = 0
        self.inflate = zlib.decompressobj(47 if encoding == "gzip" else 15) if encoding else None

    async def __aiter__(self) -> Any:
        async for chunk in self.inner:
            self.raw += len(chunk)
            if self.raw > self.limit:
                raise _too_large(self.limit)
            if self.inflate is not None:
                self._count_inflated(chunk)
            yield chunk

    def _count_inflated(self, chunk: bytes) -> None:
        assert self.inflate is not None
        data = chunk
        while data:
            out = self.inflate.decompress(data, self.limit + 1 - self.inflated)
            self.inflated += len(out)
            if self.inflated > self.limit:
                raise _too_large(self.limit)
            data = self.inflate.unconsumed_tail

    async def aclose(self) -> None:
        await self.inner.aclose()


def _cap_reply(response: Any, limit: int) -> None:
    """Refuse a reply declared larger than ``limit``; cap the bytes of any other as they are read."""
    declared = response.headers.get("content-length", "")
    if declared.strip().isdigit() and int(declared) > limit:
        raise _too_large(limit)
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("identity",):
        encoding = ""
    if encoding not in ("", "gzip", "deflate"):
        raise ReplyTooLarge(f"judge LLM: reply in an encoding not asked for ({encoding!r})")
    response.stream = _capped_class(type(response))(response.stream, limit, encoding)


_CAPPED: dict[type, type] = {}


def _capped_class(response_type: type) -> type:
    # the response checks that its stream is its own library's AsyncByteStream (httpx or httpx2)
    cls = _CAPPED.get(response_type)
    if cls is None:
        base = importlib.import_module(response_type.__module__.split(".")[0]).AsyncByteStream
        cls = _CAPPED[response_type] = type("CappedStream", (_CappedStream, base), {})
    return cls


def _usage_hook(pricing: Pricing) -> Any:
    async def on_response(response: httpx.Response) -> None:
        _cap_reply(response, MAX_REPLY_BYTES)  # before anyone reads the body
        meter = _METER.get()
        if meter is None:
            return
        meter.calls += 1
        if response.status_code >= 400:
            return
        if "json" not in response.headers.get("content-type", ""):
            return
        try:
            await response.aread()
            body = json.loads(response.content)
        except ReplyTooLarge:
            raise
        except Exception:  # the SDK reports a broken body; accounting only skips its tokens
            return
        if not isinstance(body, Mapping):
            return
        inp, out, reported = _usage_from_body(body)
        meter.input_tokens += inp
        meter.output_tokens += out
        meter.cost_usd += reported if reported is not None else pricing.cost(inp, out)

    return on_response


# --- error mapping -----------------------------------------------------------------------------------

_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000.0)
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(raw)
        return max(0.0, when.timestamp() - time.time())
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def map_error(exc: BaseException, *, where: str = "judge LLM") -> JudgeError:
    """Turn an SDK / httpx / framework exception into a judge error the pool understands.

    Frameworks (instructor, ragas, deepeval) wrap SDK errors, so the cause chain is searched for the
    first error that carries an HTTP status or is a timeout / connection failure.
    """
    if isinstance(exc, JudgeError):
        return exc
    for e in _chain(exc):  # one of ours under the SDK's wrapping (a reply over the cap)
        if isinstance(e, JudgeError):
            return e
    for e in _chain(exc):
        status = getattr(e, "status_code", None)
        response = getattr(e, "response", None)
        if isinstance(status, int):
            headers = getattr(response, "headers", None)
            msg = f"{where}: HTTP {status}: {_excerpt(str(e))}"
            if status in _TRANSIENT_STATUS or status >= 500:
                return TransientJudgeError(msg, retry_after=_retry_after(headers))
            return JudgeError(msg)
        name = type(e).__name__
        # httpx and httpx2 (newer SDKs) have the same exception names but different classes
        mro = {c.__name__ for c in type(e).__mro__}
        if isinstance(e, TimeoutError) or mro & {"TimeoutException", "APITimeoutError"}:
            return TransientJudgeError(f"{where}: timed out ({name})")
        if isinstance(e, ConnectionError) or mro & {"TransportError", "APIConnectionError"}:
            return TransientJudgeError(f"{where}: connection failed ({name}: {_excerpt(str(e))})")
    return JudgeError(f"{where}: {type(exc).__name__}: {_excerpt(str(exc))}")


def _excerpt(text: str, limit: int = RAW_EXCERPT_CHARS) -> str:
    # error bodies end up in span attributes: secrets out (a gateway's 401 may echo the key), before the
    # cut, which would leave a secret's head unrecognisable
    text = redact(" ".join(text[: limit * 20].split()))
    return text if len(text) <= limit else text[:limit] + "…"


# --- JSON repair -------------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_TRAILING_COMMA = re.compile(r",(\s*[\]}])")


def _first_object(text: str) -> str | None:
    """The first balanced ``{...}`` in ``text`` (string-aware), or ``None``."""
    start = text.find("{")
    while start != -1:
        depth = 0
        in_str = False
        esc = False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i + 1]
        # unbalanced from here: a truncated answer; try to close it
        tail = text[start:].rstrip()
        return tail + "}" * max(depth, 0) if depth > 0 and not in_str else None
    return None


def parse_json_object(text: str | None) -> dict[str, Any]:
    """Parse a model's JSON answer, repairing the usual damage.

    Strips code fences and prose around the object, takes the first JSON object, and removes trailing
    commas. What that cannot mend (single quotes, unquoted keys, missing commas, comments, Python
    literals, a cut-off answer) goes through ``json-repair`` when it is installed (it comes with the
    ``llm`` extra). Raises :class:`JudgeError` with a truncated excerpt of the raw answer when nothing
    usable remains.
    """
    if not text or not text.strip():
        raise JudgeError("judge LLM returned an empty answer")
    candidates: list[str] = [text.strip()]
    fenced = _FENCE.search(text)
    if fenced:
        candidates.append(fenced.group(1).strip())
    obj = _first_object(fenced.group(1) if fenced else text)
    if obj:
        candidates.append(obj)
    for cand in candidates:
        for attempt in (cand, _TRAILING_COMMA.sub(r"\1", cand)):
            try:
                value = json.loads(attempt)
            except (ValueError, RecursionError):  # json.loads recurses on deep nesting
                continue
            if isinstance(value, dict):
                return value
    repaired = _repair(fenced.group(1) if fenced else text)
    if repaired is not None:
        return repaired
    raise JudgeError(f"judge LLM answer is not a JSON object: {_excerpt(text)!r}")


def _repair(text: str) -> dict[str, Any] | None:
    """The first object in ``text`` as ``json-repair`` mends it; None without the package or an object."""
    start = text.find("{")
    if start == -1:
        return None
    try:
        import json_repair
    except ImportError:
        return None
    try:
        value = json_repair.loads(text[start:])
    except (ValueError, RecursionError, TypeError, IndexError):
        return None
    if isinstance(value, list):  # prose after the object can make it a list of the pieces found
        value = next((v for v in value if isinstance(v, dict)), None)
    return value if isinstance(value, dict) and value else None


# --- clients -----------------------------------------------------------------------------------------


class ChatClient(Protocol):
    """What the judges need from a chat model."""

    model: str

    async def complete(self, system: str, user: str, *, json_mode: bool = True,
                       max_tokens: int = 1024) -> str:
        """The model's text answer to one system + user prompt."""
        ...

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        ...


def _http_client(sdk_package: str, settings: JudgeLLMSettings, pricing: Pricing) -> Any:
    """An async HTTP client of the kind the SDK expects (newer openai/anthropic SDKs use ``httpx2``)."""
    base = importlib.import_module(f"{sdk_package}._base_client")
    mod = getattr(base, "httpx2", None) or getattr(base, "httpx", None) or httpx
    redact_http_client_logs(mod.__name__)  # it logs each URL at INFO: a password in EVAL_BASE_URL too
    return mod.AsyncClient(
        timeout=mod.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s)),
        limits=mod.Limits(max_connections=64, max_keepalive_connections=16),
        # the reply cap measures what it inflates: no encoding it cannot (br, zstd)
        headers={"Accept-Encoding": "gzip, deflate"},
        event_hooks={"response": [_usage_hook(pricing)]},
    )


def _warm_up(resource: Any, response_model: Any, sample: Mapping[str, Any]) -> None:
    """Do at judge creation what the SDK would do in its first call.

    The first call imports the SDK's resource modules (``sdk.chat`` alone is ~500 modules), httpcore's
    asyncio backend (anyio) and builds the pydantic schemas of the response models: ~90 ms and more of
    Python work holding the GIL on the judge pool's thread, which stalls the app's event loop (and its
    token stream) mid-answer. Judges are created at configure time, before any stream. ``resource`` is
    the SDK resource the client calls (accessing it imports it); ``response_model`` is constructed once
    from ``sample``, which builds the schemas of it and its nested models. Failures are ignored: this only
    moves work, it changes nothing.
    """
    with contextlib.suppress(Exception):
        importlib.import_module("anyio._backends._asyncio")
    with contextlib.suppress(Exception):
        importlib.import_module("concurrent.futures.thread")  # asyncio's resolver thread pool
    with contextlib.suppress(Exception):
        # as the SDKs build a response: without validation, one nested model class at a time
        response_model.construct(**sample)
    del resource


def _looks_like_json_mode_rejection(exc: BaseException, markers: tuple[str, ...]) -> bool:
    status = getattr(exc, "status_code", None)
    if status not in (400, 422):
        return False
    text = str(exc).lower()
    body = getattr(exc, "body", None)
    if body is not None:
        text += " " + json.dumps(body, default=str).lower()
    return any(m in text for m in markers)


class OpenAIChatClient:
    """Any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI, vLLM, Ollama, llama.cpp, LM Studio).

    JSON mode (``response_format={"type": "json_object"}``) is tried first; when the server rejects it
    with a 400/422 that mentions it, the call is repeated without it and JSON mode stays off for this
    client (the prompt already asks for JSON, and the answer is repaired and parsed either way).
    """

    def __init__(self, settings: JudgeLLMSettings, *, pricing: Pricing | None = None) -> None:
        import openai  # lazy: the SDK is only needed when an LLM judge is used

        if not settings.model:
            raise ConfigError("the LLM judge needs a model: set EVAL_MODEL (or EVAL_CHECKPOINT_MODEL)")
        self.model: str = settings.model
        self.pricing = pricing or Pricing()
        register_secret(settings.api_key)  # a key set in code is redacted from error texts too
        self.json_mode_supported: bool | None = None  # None = not tried yet
        self._http = _http_client("openai", settings, self.pricing)
        self.sdk = openai.AsyncOpenAI(
            api_key=settings.api_key or "not-needed",  # local servers accept any key
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
            http_client=self._http,
        )
        _warm_up(self.sdk.chat.completions, openai.types.chat.ChatCompletion, {
            "id": "warm-up", "object": "chat.completion", "created": 0, "model": self.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "{}"}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })

    async def complete(self, system: str, user: str, *, json_mode: bool = True,
                       max_tokens: int = 1024) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        use_json = json_mode and self.json_mode_supported is not False
        try:
            try:
                resp = await self._create(messages, use_json, max_tokens)
            except Exception as exc:
                if use_json and _looks_like_json_mode_rejection(exc, ("response_format", "json")):
                    self.json_mode_supported = False
                    resp = await self._create(messages, False, max_tokens)
                else:
                    raise
            else:
                if use_json:
                    self.json_mode_supported = True
        except Exception as exc:
            raise map_error(exc) from exc
        if not getattr(resp, "choices", None):
            raise JudgeError("judge LLM returned no choices")
        content = resp.choices[0].message.content
        if content is None:
            raise JudgeError("judge LLM returned no text (refusal or tool call)")
        return str(content)

    async def _create(self, messages: list[dict[str, str]], use_json: bool, max_tokens: int) -> Any:
        kwargs: dict[str, Any] = {}
        if use_json:
            kwargs["response_format"] = {"type": "json_object"}
        return await self.sdk.chat.completions.create(
            model=self.model, messages=messages, temperature=0, max_tokens=max_tokens,  # type: ignore[arg-type]
            **kwargs,
        )

    async def aclose(self) -> None:
        await self.sdk.close()


class AnthropicChatClient:
    """Anthropic Messages API (``/v1/messages``) or a compatible server.

    JSON is obtained by prefilling the assistant turn with ``{``; models that refuse a prefilled
    assistant turn get the plain prompt instead (remembered per client).
    """

    def __init__(self, settings: JudgeLLMSettings, *, pricing: Pricing | None = None) -> None:
        import anthropic  # lazy

        if not settings.model:
            raise ConfigError("the LLM judge needs a model: set EVAL_MODEL (or EVAL_CHECKPOINT_MODEL)")
        self.model: str = settings.model
        self.pricing = pricing or Pricing()
        register_secret(settings.api_key)  # a key set in code is redacted from error texts too
        self.prefill_supported: bool | None = None
        self._http = _http_client("anthropic", settings, self.pricing)
        self.sdk = anthropic.AsyncAnthropic(
            api_key=settings.api_key or "not-needed",
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
            http_client=self._http,
        )
        _warm_up(self.sdk.messages, anthropic.types.Message, {
            "id": "warm-up", "type": "message", "role": "assistant", "model": self.model,
            "content": [{"type": "text", "text": "{}"}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        })

    async def complete(self, system: str, user: str, *, json_mode: bool = True,
                       max_tokens: int = 1024) -> str:
        prefill = json_mode and self.prefill_supported is not False
        try:
            try:
                text = await self._create(system, user, prefill, max_tokens)
            except Exception as exc:
                if prefill and _looks_like_json_mode_rejection(exc, ("prefill", "assistant", "final")):
                    self.prefill_supported = False
                    text = await self._create(system, user, False, max_tokens)
                else:
                    raise
            else:
                if prefill:
                    self.prefill_supported = True
        except Exception as exc:
            raise map_error(exc) from exc
        return text

    async def _create(self, system: str, user: str, prefill: bool, max_tokens: int) -> str:
        messages: list[dict[str, str]] = [{"role": "user", "content": user}]
        if prefill:
            messages.append({"role": "assistant", "content": "{"})
        # no temperature: recent SDKs and models no longer accept it on messages.create
        resp = await self.sdk.messages.create(
            model=self.model, system=system, messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
        text = "".join(getattr(b, "text", "") for b in resp.content)
        return "{" + text if prefill else text

    async def aclose(self) -> None:
        await self.sdk.close()


def provider_kind(settings: JudgeLLMSettings) -> str:
    """``"openai"`` or ``"anthropic"`` for a judge LLM setting; raises :class:`ConfigError` otherwise."""
    provider = (settings.provider or "openai").strip().lower().replace("-", "_")
    if provider in _OPENAI_PROVIDERS:
        return "openai"
    if provider in _ANTHROPIC_PROVIDERS:
        return "anthropic"
    raise ConfigError(
        f"EVAL_PROVIDER={settings.provider!r} is not supported: use openai, openai_compatible or anthropic"
    )


def make_chat_client(settings: JudgeLLMSettings) -> OpenAIChatClient | AnthropicChatClient:
    """A chat client for ``settings`` (provider, model, base URL, key, timeout, prices)."""
    pricing = Pricing(settings.input_cost_per_mtok, settings.output_cost_per_mtok)
    if provider_kind(settings) == "anthropic":
        return AnthropicChatClient(settings, pricing=pricing)
    return OpenAIChatClient(settings, pricing=pricing)
