"""Settings: environment variables -> one typed, immutable object.

This is the only module that reads ``os.environ`` for streamjudge's own options. Standard ``OTEL_*``
variables are read by the OpenTelemetry SDK itself; judge-LLM settings (``EVAL_*``) are parsed here too so
that every option has one documented place.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streamjudge import semconv

Action = Literal["flag", "regenerate", "stop"]
Mode = Literal["stream_first", "hold_back"]
PreflightAction = Literal["none", "warn", "skip_checks", "stop"]
FinalPass = Literal["local", "deferred"]

_ACTIONS: tuple[str, ...] = ("flag", "regenerate", "stop")
_MODES: tuple[str, ...] = ("stream_first", "hold_back")
_PREFLIGHT_ACTIONS: tuple[str, ...] = ("none", "warn", "skip_checks", "stop")
_FINAL_PASSES: tuple[str, ...] = ("local", "deferred")

DEFAULT_FALLBACK = (
    "I'm not confident the rest of this answer is supported by the sources, so I stopped here."
)
DEFAULT_REGENERATE_INSTRUCTION = (
    "Continue the answer using only facts stated in the provided context. Do not add names, numbers, "
    "dates or events that the context does not contain; say so if the context does not cover something."
)

#: the app's frames that end an answer: ``event:NAME`` (an SSE event name), ``data:TEXT`` (an SSE frame's
#: whole data), ``type:NAME`` (the ``type`` field of a JSON line or WebSocket message)
DEFAULT_TERMINAL_FRAMES: tuple[str, ...] = ("event:done", "event:end", "data:[DONE]", "type:done")
TERMINAL_FRAME_KINDS: tuple[str, ...] = ("event", "data", "type")


class ConfigError(ValueError):
    """An option has a value streamjudge cannot use. The message names the variable and what is allowed."""


@dataclass(frozen=True, slots=True)
class JudgeLLMSettings:
    """Where an LLM judge sends its calls. Independent of the application's own LLM."""

    provider: str | None = None  # "openai" | "openai_compatible" | "anthropic"
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = dataclasses.field(default=None, repr=False)  # never printed
    timeout_s: float = 30.0
    # prices in USD per million tokens, for the cost in ``JudgeResult.usage`` (0 = unknown)
    input_cost_per_mtok: float = 0.0
    output_cost_per_mtok: float = 0.0
    # embedding model on the same endpoint (ragas answer relevancy); None = the framework's default
    embedding_model: str | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """All streamjudge options. Build with :func:`load_settings` (env) or directly (code)."""

    # which judge scores checkpoints (fast tier) and the final answer (record of truth)
    judge: str = "local"
    checkpoint_judge: str | None = None  # falls back to ``judge``
    # a score below its threshold fails; ``thresholds`` overrides per metric
    threshold: float = 0.7
    thresholds: Mapping[str, float] = field(default_factory=dict)
    action: Action = "flag"
    mode: Mode = "stream_first"
    max_regenerations: int = 1
    fallback_message: str = DEFAULT_FALLBACK
    regenerate_instruction: str = DEFAULT_REGENERATE_INSTRUCTION
    # checkpoint window: close a checkpoint after N sentences or M characters, whichever first;
    # ``checkpoint_every`` > 0 instead closes one at every N-th sentence regardless of length
    window_sentences: int = 2
    window_chars: int = 200
    checkpoint_every: int = 0
    checkpoint_metrics: tuple[str, ...] = (semconv.FAITHFULNESS,)
    # GEval rubrics for the deepeval judge: metric name -> evaluation steps (added to the built-in ones);
    # a rubric is scored when its name is in ``final_metrics`` / ``checkpoint_metrics``
    geval_rubrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    final_metrics: tuple[str, ...] = (
        semconv.FAITHFULNESS,
        semconv.ANSWER_RELEVANCY,
        semconv.CONTEXT_PRECISION,
        semconv.CONTEXT_RECALL,
    )
    # pre-flight gate on the retrieved contexts, before the first token
    preflight: bool = True
    preflight_threshold: float = 0.2
    preflight_action: PreflightAction = "warn"
    preflight_wait_s: float = 0.05
    final_reconcile: bool = True
    # where the final pass runs: in this process, or in `streamjudge worker` processes behind the collector
    # (the answer span then carries question, contexts and answer once, and says `deferred`)
    final_pass: FinalPass = "local"
    # how long the guard waits at end of stream for verdicts still in flight (off the token path)
    end_wait_s: float = 2.0
    # judge pool
    sample_rate: float = 1.0
    concurrency: int = 4
    queue_size: int = 256
    judge_timeout_s: float = 30.0
    max_retries: int = 2
    retry_backoff_s: float = 0.2
    per_stream_budget: int = 64
    global_budget_per_minute: int = 0  # 0 = unlimited
    # most of one core's time the judge pool's thread may use (local judge, callbacks); 0 = no cap
    judge_cpu_share: float = 0.15
    # seconds the idle judge pool keeps polling (1 ms ticks) for the next job before it sleeps. Off by
    # default: measured, it no longer lowered time to alert (2.8-3.0 ms p50 either way) and under load each
    # tick takes the GIL from request handling (9% fewer requests/s at saturation with 0.05)
    judge_linger_s: float = 0.0
    # worker processes for a CPU-bound judge (`local`, `model`): judging runs on other cores instead of
    # taking the app's GIL; 0 = in the judge pool's thread. LLM judges wait on the network and stay in-process
    judge_processes: int = 0
    hold_timeout_s: float = 60.0  # longest a judged span is held for its scores before export
    # judge inputs over this many chars (contexts of a stream, a final answer) are not judged: a recorded
    # skip instead of seconds of judge time and memory
    max_judge_input_chars: int = 2_000_000
    # text queued for judging across all streams, in chars (a bound by size, beside the count bound)
    max_queue_chars: int = 64_000_000
    # content capture: off -> spans carry length + sha256 instead of the text
    capture_content: bool = True
    # texts on spans are capped (head … tail) so a runaway answer cannot blow up exporter memory
    max_text_attribute_chars: int = 16_384
    # LangGraph / streaming instrumentation
    answer_nodes: tuple[str, ...] = ("generate",)
    sse_token_field: str | None = None  # JSON path (dot separated) of the token in SSE data payloads
    # the app's frames that end an answer, held back until the guard's last events are sent
    terminal_frames: tuple[str, ...] = DEFAULT_TERMINAL_FRAMES
    # judge LLMs (final pass, and a cheaper one for checkpoints that falls back to it)
    eval_llm: JudgeLLMSettings = field(default_factory=JudgeLLMSettings)
    checkpoint_llm: JudgeLLMSettings = field(default_factory=JudgeLLMSettings)

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ConfigError(f"action must be one of {_ACTIONS}, got {self.action!r}")
        if self.mode not in _MODES:
            raise ConfigError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.final_pass not in _FINAL_PASSES:
            raise ConfigError(f"final_pass must be one of {_FINAL_PASSES}, got {self.final_pass!r}")
        if self.preflight_action not in _PREFLIGHT_ACTIONS:
            raise ConfigError(
                f"preflight_action must be one of {_PREFLIGHT_ACTIONS}, got {self.preflight_action!r}"
            )
        for name in ("threshold", "sample_rate", "preflight_threshold"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be within [0, 1], got {v!r}")
        for name in ("concurrency", "queue_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.judge_processes < 0:
            raise ConfigError(f"judge_processes must be >= 0, got {self.judge_processes!r}")
        if self.window_sentences < 1 or self.window_chars < 1:
            raise ConfigError("window_sentences and window_chars must be >= 1")
        for spec in self.terminal_frames:
            kind, sep, value = spec.partition(":")
            if not sep or kind.strip() not in TERMINAL_FRAME_KINDS or not value.strip():
                raise ConfigError(
                    f"terminal_frames: {spec!r} is not event:NAME, data:TEXT or type:NAME "
                    "(STREAMJUDGE_TERMINAL_FRAMES=none turns holding back off)"
                )

    @property
    def checkpoint_judge_name(self) -> str:
        """The judge for checkpoints (the fast tier); ``judge`` when not set separately."""
        return self.checkpoint_judge or self.judge

    def threshold_for(self, metric: str) -> float:
        """The pass threshold of ``metric``."""
        return self.thresholds.get(metric, self.threshold)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


# --- environment parsing ---------------------------------------------------------------------------

_PREFIX = "STREAMJUDGE_"


def _bool(var: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{var}={raw!r}: expected true/false")


def _float(var: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{var}={raw!r}: expected a number") from None


def _int(var: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{var}={raw!r}: expected an integer") from None


def _count(var: str, raw: str) -> int:
    n = _int(var, raw)
    if n < 0:
        raise ConfigError(f"{var}={raw!r}: expected 0 or more")
    return n


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _thresholds(var: str, raw: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in _csv(raw):
        name, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"{var}: expected metric=value pairs, got {part!r}")
        out[name.strip()] = _float(var, value.strip())
    return out


def _rubrics(var: str, raw: str) -> dict[str, tuple[str, ...]]:
    """Inline JSON (``{"tone": ["step", ...]}``) or the path of a JSON file holding that object."""
    text = raw.strip()
    if not text.startswith(("{", "[")):
        try:
            with open(os.path.expanduser(text), encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(f"{var}: cannot read the rubrics file {raw!r} ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{var}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{var}: expected an object of rubric name -> list of evaluation steps")
    out: dict[str, tuple[str, ...]] = {}
    for name, steps in data.items():
        if isinstance(steps, str):
            steps = [steps]
        if (
            not name.strip()
            or not isinstance(steps, list)
            or not steps
            or not all(isinstance(x, str) and x.strip() for x in steps)
        ):
            raise ConfigError(f"{var}: rubric {name!r} needs a non-empty list of non-empty evaluation steps")
        out[name.strip()] = tuple(x.strip() for x in steps)
    return out


def _terminal_frames(var: str, raw: str) -> tuple[str, ...]:
    # "none" says "hold nothing back" (an empty variable means "default", like every other option)
    return () if raw.strip().lower() == "none" else _csv(raw)


# field name -> (env suffix, parser)
_ENV_FIELDS: dict[str, tuple[str, Any]] = {
    "judge": ("JUDGE", None),
    "checkpoint_judge": ("CHECKPOINT_JUDGE", None),
    "threshold": ("THRESHOLD", _float),
    "thresholds": ("THRESHOLDS", _thresholds),
    "action": ("ACTION", None),
    "mode": ("MODE", None),
    "max_regenerations": ("MAX_REGENERATIONS", _int),
    "fallback_message": ("FALLBACK_MESSAGE", None),
    "window_sentences": ("CHECKPOINT_SENTENCES", _int),
    "window_chars": ("CHECKPOINT_CHARS", _int),
    "checkpoint_every": ("CHECKPOINT_EVERY", _int),
    "checkpoint_metrics": ("CHECKPOINT_METRICS", "csv"),
    "final_metrics": ("FINAL_METRICS", "csv"),
    "geval_rubrics": ("GEVAL_RUBRICS", _rubrics),
    "preflight": ("PREFLIGHT", _bool),
    "preflight_threshold": ("PREFLIGHT_THRESHOLD", _float),
    "preflight_action": ("PREFLIGHT_ACTION", None),
    "preflight_wait_s": ("PREFLIGHT_WAIT", _float),
    "final_reconcile": ("FINAL_RECONCILE", _bool),
    "final_pass": ("FINAL_PASS", None),
    "end_wait_s": ("END_WAIT", _float),
    "sample_rate": ("SAMPLE_RATE", _float),
    "concurrency": ("CONCURRENCY", _int),
    "queue_size": ("QUEUE_SIZE", _int),
    "judge_timeout_s": ("JUDGE_TIMEOUT", _float),
    "max_retries": ("MAX_RETRIES", _int),
    "retry_backoff_s": ("RETRY_BACKOFF", _float),
    "per_stream_budget": ("STREAM_BUDGET", _int),
    "global_budget_per_minute": ("GLOBAL_BUDGET_PER_MINUTE", _int),
    "judge_cpu_share": ("JUDGE_CPU_SHARE", _float),
    "judge_linger_s": ("JUDGE_LINGER", _float),
    "judge_processes": ("JUDGE_PROCESSES", _count),
    "hold_timeout_s": ("HOLD_TIMEOUT", _float),
    "max_judge_input_chars": ("MAX_JUDGE_INPUT_CHARS", _int),
    "max_queue_chars": ("MAX_QUEUE_CHARS", _int),
    "capture_content": ("CAPTURE_CONTENT", _bool),
    "max_text_attribute_chars": ("MAX_TEXT_CHARS", _int),
    "answer_nodes": ("ANSWER_NODES", "csv"),
    "sse_token_field": ("SSE_TOKEN_FIELD", None),
    "terminal_frames": ("TERMINAL_FRAMES", _terminal_frames),
}


def _llm_settings(env: Mapping[str, str], prefix: str, fallback: JudgeLLMSettings | None) -> JudgeLLMSettings:
    def get(name: str) -> str | None:
        v = env.get(f"{prefix}{name}")
        return v if v else None

    base = fallback or JudgeLLMSettings()
    timeout_raw = get("TIMEOUT")
    in_cost = get("INPUT_COST_PER_MTOK")
    out_cost = get("OUTPUT_COST_PER_MTOK")
    return JudgeLLMSettings(
        provider=get("PROVIDER") or base.provider,
        model=get("MODEL") or base.model,
        base_url=get("BASE_URL") or base.base_url,
        api_key=get("API_KEY") or base.api_key,
        timeout_s=_float(f"{prefix}TIMEOUT", timeout_raw) if timeout_raw else base.timeout_s,
        input_cost_per_mtok=_float(f"{prefix}INPUT_COST_PER_MTOK", in_cost) if in_cost
        else base.input_cost_per_mtok,
        output_cost_per_mtok=_float(f"{prefix}OUTPUT_COST_PER_MTOK", out_cost) if out_cost
        else base.output_cost_per_mtok,
        embedding_model=get("EMBEDDING_MODEL") or base.embedding_model,
    )


def _app_llm_fallback(env: Mapping[str, str]) -> JudgeLLMSettings:
    """The application's own LLM settings, used for judging only when no ``EVAL_*`` setting exists."""
    if env.get("ANTHROPIC_API_KEY") and not env.get("OPENAI_API_KEY"):
        return JudgeLLMSettings(provider="anthropic", api_key=env.get("ANTHROPIC_API_KEY"),
                                base_url=env.get("ANTHROPIC_BASE_URL") or None)
    if env.get("OPENAI_API_KEY") or env.get("OPENAI_BASE_URL"):
        return JudgeLLMSettings(provider="openai", api_key=env.get("OPENAI_API_KEY"),
                                base_url=env.get("OPENAI_BASE_URL") or None,
                                model=env.get("OPENAI_MODEL") or None)
    return JudgeLLMSettings()


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read ``STREAMJUDGE_*`` and ``EVAL_*`` variables from ``env`` (default ``os.environ``).

    Keyword ``overrides`` win over the environment. Raises :class:`ConfigError` naming the variable
    when a value cannot be used.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for fname, (suffix, parser) in _ENV_FIELDS.items():
        var = _PREFIX + suffix
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if parser is None:
            values[fname] = raw.strip()
        elif parser == "csv":
            values[fname] = _csv(raw)
        else:
            values[fname] = parser(var, raw)
    if "eval_llm" not in overrides:
        app = _app_llm_fallback(env)
        values["eval_llm"] = _llm_settings(env, "EVAL_", app)
    if "checkpoint_llm" not in overrides:
        final = overrides.get("eval_llm", values.get("eval_llm"))
        values["checkpoint_llm"] = _llm_settings(env, "EVAL_CHECKPOINT_", final)
    values.update(overrides)
    processes = values.get("judge_processes", 0)
    if isinstance(processes, int) and processes > 0 and "concurrency" not in values:
        # two calls in flight per worker: each has its next request queued while it replies
        values["concurrency"] = max(Settings().concurrency, 2 * processes)
    try:
        return Settings(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
