"""Settings: environment variables -> one typed, immutable object.

This is the only module that reads ``os.environ`` for streamjudge's own options. Standard ``OTEL_*``
variables are read by the OpenTelemetry SDK itself; judge-LLM settings (``EVAL_*``) are parsed here too so
that every option has one documented place.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
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
#: judge calls in flight per judge worker process (``judge_processes=N`` from the environment)
_CALLS_PER_WORKER = 16

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
#: request paths never judged by default: probes, metrics, docs
DEFAULT_ROUTES_EXCLUDE: tuple[str, ...] = (
    "/metrics", "/metrics/*", "/health", "/healthz", "/health/*", "/livez", "/readyz", "/ready", "/live",
    "/docs", "/docs/*", "/redoc", "/openapi.json", "/favicon.ico",
)

#: input keys that hold the user's question, in order of preference
DEFAULT_QUESTION_KEYS: tuple[str, ...] = (
    "question", "query", "input", "user_question", "standalone_question",
)


#: judges built in (``package.module:ClassName`` names any other)
JUDGE_NAMES: tuple[str, ...] = ("local", "model", "llm", "ragas", "deepeval")
#: metric names the built-in judges score (deepeval also scores GEval rubrics by name)
KNOWN_METRICS: tuple[str, ...] = (
    semconv.FAITHFULNESS,
    semconv.ANSWER_RELEVANCY,
    semconv.CONTEXT_PRECISION,
    semconv.CONTEXT_RECALL,
    "geval_groundedness",
)

_log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An option has a value streamjudge cannot use. The message names the variable and what is allowed.

    ``setting`` is the :class:`Settings` field concerned (None when the error is not about one field).
    """

    def __init__(self, message: str, *, setting: str | None = None, expected: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.expected = expected


def _one_of(choices: tuple[str, ...]) -> str:
    return "one of " + ", ".join(choices)


def _invalid(setting: str, value: object, expected: str) -> ConfigError:
    """The error for a field set in code; :func:`load_settings` rewords it for a variable."""
    var = env_var(setting)
    where = f" (environment: {var})" if var else ""
    return ConfigError(f"Settings.{setting}={value!r}: expected {expected}{where}",
                       setting=setting, expected=expected)


def _enum(value: str) -> str:
    # enum values in any case, and with dashes: "Hold-Back" is hold_back
    return value.strip().lower().replace("-", "_") if isinstance(value, str) else value


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
    queue_size: int = 4096
    judge_timeout_s: float = 30.0
    max_retries: int = 2
    retry_backoff_s: float = 0.2
    per_stream_budget: int = 64
    global_budget_per_minute: int = 0  # 0 = unlimited
    # most of one core's time the judge pool's thread may use (local judge, callbacks); 0 = no cap. While
    # the event loops serving judged streams keep time (their timers run on time: the app has CPU to
    # spare), the cap rises step by step up to judge_cpu_share_max, and halves back as soon as one runs late
    judge_cpu_share: float = 0.15
    judge_cpu_share_max: float = 0.0  # <= judge_cpu_share (the default): a fixed cap
    # seconds the idle judge pool keeps polling (1 ms ticks) for the next job before it sleeps. Off by
    # default: measured, it no longer lowered time to alert (2.8-3.0 ms p50 either way) and under load each
    # tick takes the GIL from request handling (9% fewer requests/s at saturation with 0.05)
    judge_linger_s: float = 0.0
    # worker processes for a CPU-bound judge (`local`, `model`): judging runs on other cores instead of
    # taking the app's GIL; 0 = in the judge pool's thread. "auto": the local judge runs in the pool's thread
    # until it is measured to take a noticeable share of the app's CPU, then in one worker process (on one
    # core too: the kernel preempts a niced worker when the app wakes, the GIL does not preempt the pool's
    # thread; not under a cgroup quota of less than two cores, where a worker would spend the app's quota
    # beside it). LLM judges wait on the network and stay in-process
    judge_processes: int | Literal["auto"] = "auto"
    # the niceness judge worker processes run at (0-19; 0 = the app's own priority): where a worker and the
    # app want the same core, the kernel runs the app first, so a worker judges with CPU the app leaves idle
    judge_worker_nice: int = 10
    hold_timeout_s: float = 60.0  # longest a judged span is held for its scores before export
    # judge inputs over this many chars (contexts of a stream, a final answer) are not judged: a recorded
    # skip instead of seconds of judge time and memory
    max_judge_input_chars: int = 2_000_000
    # text queued for judging across all streams, in chars (a bound by size, beside the count bound)
    max_queue_chars: int = 64_000_000
    # content capture: off -> spans carry length + sha256 instead of the text. Unset, it follows
    # OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT (the GenAI instrumentations' switch) when that is set
    capture_content: bool = True
    # texts on spans are capped (head … tail) so a runaway answer cannot blow up exporter memory
    max_text_attribute_chars: int = 16_384
    # LangGraph / streaming instrumentation
    answer_nodes: tuple[str, ...] = ("generate",)
    # where the user's question is in a chain's or graph's input (first non-empty key wins; without
    # one, the last human message of ``messages`` / ``chat_history``)
    question_keys: tuple[str, ...] = DEFAULT_QUESTION_KEYS
    # openinference's LangChain tracer called in the caller's task (LangChain otherwise hands each of its
    # callbacks to the loop's thread pool); off: LangChain's own dispatch
    openinference_inline: bool = True
    sse_token_field: str | None = None  # JSON path (dot separated) of the token in SSE data payloads
    # the app's frames that end an answer, held back until the guard's last events are sent
    terminal_frames: tuple[str, ...] = DEFAULT_TERMINAL_FRAMES
    # zero-code: the guard's warning / retract / stop events sent to the client in the app's own frame
    # format. Off by default: the client receives exactly the app's bytes
    client_events: bool = False
    # which request paths may carry a judged answer (fnmatch patterns; empty include = every path)
    routes_include: tuple[str, ...] = ()
    routes_exclude: tuple[str, ...] = DEFAULT_ROUTES_EXCLUDE
    # judge LLMs (final pass, and a cheaper one for checkpoints that falls back to it)
    eval_llm: JudgeLLMSettings = field(default_factory=JudgeLLMSettings)
    checkpoint_llm: JudgeLLMSettings = field(default_factory=JudgeLLMSettings)
    # the ``model`` judge (a local NLI / hallucination-detector classifier): a model directory or hub id,
    # ``onnx`` / ``torch`` / ``auto``, pairs per inference batch, how long a batch waits to fill (ms), ONNX
    # Runtime intra-op threads, the model's input window in tokens (0 = from its config), pending claims
    model_path: str | None = None
    model_backend: str = "auto"
    model_batch_size: int = 16
    model_max_batch_ms: float = 5.0
    model_threads: int = 1
    model_max_length: int = 0
    model_queue_size: int = 1024

    def __post_init__(self) -> None:
        enums = (
            ("action", _ACTIONS), ("mode", _MODES), ("preflight_action", _PREFLIGHT_ACTIONS),
            ("final_pass", _FINAL_PASSES),
        )
        for name, choices in enums:
            value = _enum(getattr(self, name))
            if value not in choices:
                raise _invalid(name, getattr(self, name), _one_of(choices))
            object.__setattr__(self, name, value)
        for name in ("threshold", "sample_rate", "preflight_threshold", "judge_cpu_share",
                     "judge_cpu_share_max"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise _invalid(name, v, "a number from 0 to 1")
        for name in ("concurrency", "queue_size", "window_sentences", "window_chars"):
            if getattr(self, name) < 1:
                raise _invalid(name, getattr(self, name), "an integer >= 1")
        for metric, v in self.thresholds.items():
            if not 0.0 <= v <= 1.0:
                raise _invalid("thresholds", f"{metric}={v}", "metric=value pairs with values from 0 to 1")
        if not 0 <= self.judge_worker_nice <= 19:
            raise _invalid("judge_worker_nice", self.judge_worker_nice, "an integer from 0 to 19")
        processes = self.judge_processes
        if isinstance(processes, str) and processes.strip().lower() == "auto":
            object.__setattr__(self, "judge_processes", "auto")
        elif isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
            raise _invalid("judge_processes", processes, "0 or more, or auto")
        for spec in self.terminal_frames:
            kind, sep, value = spec.partition(":")
            if not sep or kind.strip() not in TERMINAL_FRAME_KINDS or not value.strip():
                raise ConfigError(
                    f"STREAMJUDGE_TERMINAL_FRAMES: {spec!r} is not event:NAME, data:TEXT or type:NAME "
                    "(STREAMJUDGE_TERMINAL_FRAMES=none turns holding back off)",
                    setting="terminal_frames",
                    expected="event:NAME, data:TEXT or type:NAME, comma separated "
                    "(STREAMJUDGE_TERMINAL_FRAMES=none turns holding back off)",
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
    raise ConfigError(f"{var}={raw!r}: expected true or false (or 1/0, yes/no, on/off)")


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


def parse_judge_name(var: str, raw: str) -> str:
    """A judge name as written in ``var`` (a variable or an option): a built-in one in any case, or
    ``package.module:ClassName``. Raises :class:`ConfigError` naming ``var`` and the accepted names."""
    name = raw.strip()
    if name.lower() in JUDGE_NAMES:
        return name.lower()
    if ":" in name:  # package.module:ClassName, checked when the judge is built
        return name
    hint = _did_you_mean(name.lower(), JUDGE_NAMES)
    raise ConfigError(f"{var}={raw!r}: expected {', '.join(JUDGE_NAMES)} or package.module:ClassName{hint}")


def _count(var: str, raw: str) -> int:
    n = _int(var, raw)
    if n < 0:
        raise ConfigError(f"{var}={raw!r}: expected 0 or more")
    return n


def _processes(var: str, raw: str) -> int | Literal["auto"]:
    if raw.strip().lower() == "auto":
        return "auto"
    try:
        return _count(var, raw)
    except ConfigError:
        raise ConfigError(f"{var}={raw!r}: expected 0 or more, or auto") from None


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _thresholds(var: str, raw: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in _csv(raw):
        name, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"{var}: expected metric=value pairs, got {part!r}")
        v = _float(var, value.strip())
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"{var}: {part!r}: expected metric=value pairs with values from 0 to 1")
        out[name.strip()] = v
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
    "judge": ("JUDGE", parse_judge_name),
    "checkpoint_judge": ("CHECKPOINT_JUDGE", parse_judge_name),
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
    "judge_cpu_share_max": ("JUDGE_CPU_SHARE_MAX", _float),
    "judge_linger_s": ("JUDGE_LINGER", _float),
    "judge_processes": ("JUDGE_PROCESSES", _processes),
    "judge_worker_nice": ("JUDGE_WORKER_NICE", _int),
    "hold_timeout_s": ("HOLD_TIMEOUT", _float),
    "max_judge_input_chars": ("MAX_JUDGE_INPUT_CHARS", _int),
    "max_queue_chars": ("MAX_QUEUE_CHARS", _int),
    "capture_content": ("CAPTURE_CONTENT", _bool),
    "max_text_attribute_chars": ("MAX_TEXT_CHARS", _int),
    "answer_nodes": ("ANSWER_NODES", "csv"),
    "question_keys": ("QUESTION_KEYS", "csv"),
    "sse_token_field": ("SSE_TOKEN_FIELD", None),
    "terminal_frames": ("TERMINAL_FRAMES", _terminal_frames),
    "model_path": ("MODEL_PATH", None),
    "model_backend": ("MODEL_BACKEND", None),
    "model_batch_size": ("MODEL_BATCH_SIZE", _int),
    "model_max_batch_ms": ("MODEL_MAX_BATCH_MS", _float),
    "model_threads": ("MODEL_THREADS", _int),
    "model_max_length": ("MODEL_MAX_LENGTH", _int),
    "model_queue_size": ("MODEL_QUEUE_SIZE", _int),
    "client_events": ("CLIENT_EVENTS", _bool),
    "openinference_inline": ("OPENINFERENCE_INLINE", _bool),
    "routes_include": ("ROUTES_INCLUDE", "csv"),
    "routes_exclude": ("ROUTES_EXCLUDE", _terminal_frames),
}


#: the OpenTelemetry GenAI instrumentations' content switch: the default of ``capture_content``
GENAI_CAPTURE_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# its values: a boolean (older instrumentations) or a content mode (opentelemetry-util-genai). streamjudge
# records content on spans, so a mode without spans (EVENT_ONLY) means no content on ours
_GENAI_CAPTURE_ON = frozenset({"true", "1", "yes", "on", "span_only", "span_and_event"})
_GENAI_CAPTURE_OFF = frozenset({"false", "0", "no", "off", "no_content", "event_only"})


def capture_content_default(env: Mapping[str, str] | None = None) -> bool:
    """Whether content is captured when ``STREAMJUDGE_CAPTURE_CONTENT`` is not set: what
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (true / SPAN_ONLY / SPAN_AND_EVENT: on;
    false / NO_CONTENT / EVENT_ONLY: off), else on. A value it cannot read is warned about once."""
    env = os.environ if env is None else env
    raw = (env.get(GENAI_CAPTURE_VAR) or "").strip()
    if not raw:
        return True
    if raw.lower() in _GENAI_CAPTURE_ON:
        return True
    if raw.lower() in _GENAI_CAPTURE_OFF:
        return False
    _warn_once(f"var:{GENAI_CAPTURE_VAR}", f"{GENAI_CAPTURE_VAR}={raw!r} is not true/false or NO_CONTENT, "
               "SPAN_ONLY, EVENT_ONLY, SPAN_AND_EVENT: capturing content (set STREAMJUDGE_CAPTURE_CONTENT)")
    return True


def capture_content_from_env(env: Mapping[str, str] | None = None) -> bool:
    """``STREAMJUDGE_CAPTURE_CONTENT`` when set (an unreadable value counts as on, as for the default),
    else :func:`capture_content_default`."""
    env = os.environ if env is None else env
    raw = (env.get(_PREFIX + "CAPTURE_CONTENT") or "").strip()
    if not raw:
        return capture_content_default(env)
    return raw.lower() not in ("0", "false", "no", "off")


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


def env_var(setting: str) -> str | None:
    """The environment variable of the :class:`Settings` field ``setting`` (None if it has none)."""
    entry = _ENV_FIELDS.get(setting)
    return _PREFIX + entry[0] if entry else None


#: ``STREAMJUDGE_*`` variables read by other parts of the project (the collector configuration, the test
#: harness), so never reported as unknown
_OTHER_VARS: frozenset[str] = frozenset({
    "STREAMJUDGE_TRACES_EXPORTERS", "STREAMJUDGE_LOW_SCORE_THRESHOLD", "STREAMJUDGE_OTELCOL",
    "STREAMJUDGE_JAEGER", "STREAMJUDGE_PROMETHEUS", "STREAMJUDGE_PROMTOOL", "STREAMJUDGE_ALERTMANAGER",
    "STREAMJUDGE_AMTOOL", "STREAMJUDGE_PHOENIX_PYTHON",
})
_OTHER_PREFIXES: tuple[str, ...] = ("STREAMJUDGE_COLLECTOR_",)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    _log.warning("streamjudge: %s", message)


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def known_env_vars() -> tuple[str, ...]:
    """Every ``STREAMJUDGE_*`` variable :func:`load_settings` reads."""
    return tuple(_PREFIX + suffix for suffix, _ in _ENV_FIELDS.values())


def _check_unknown_vars(env: Mapping[str, str]) -> None:
    known = set(known_env_vars())
    for var in env:
        if not var.startswith(_PREFIX) or var in known or var in _OTHER_VARS:
            continue
        if var.startswith(_OTHER_PREFIXES):
            continue
        _warn_once(f"var:{var}", f"unknown variable {var} is ignored{_did_you_mean(var, known)}")


def _check_metric_names(settings: Settings) -> None:
    if ":" in settings.judge or ":" in settings.checkpoint_judge_name:
        return  # a judge of your own may score metrics of its own
    known = {*KNOWN_METRICS, *settings.geval_rubrics}
    for field_name in ("final_metrics", "checkpoint_metrics", "thresholds"):
        var = env_var(field_name) or field_name
        for metric in getattr(settings, field_name):
            if metric not in known:
                _warn_once(
                    f"metric:{field_name}:{metric}",
                    f"{var}: unknown metric {metric!r} is not scored{_did_you_mean(metric, known)}; "
                    f"known: {', '.join(sorted(known))} (and rubrics of STREAMJUDGE_GEVAL_RUBRICS)",
                )


def _from_env(
    env: Mapping[str, str], errors: list[ConfigError] | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the variables give, and the raw text of each (field name -> value as written).

    With ``errors`` given, a variable that cannot be parsed is recorded there and left at its default.
    """
    values: dict[str, Any] = {}
    raw_of: dict[str, str] = {}
    for fname, (suffix, parser) in _ENV_FIELDS.items():
        var = _PREFIX + suffix
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            if parser is None:
                values[fname] = raw.strip()
            elif parser == "csv":
                values[fname] = _csv(raw)
            else:
                values[fname] = parser(var, raw)
        except ConfigError as exc:
            if errors is None:
                raise
            exc.setting = fname
            errors.append(exc)
            continue
        raw_of[fname] = raw
    if "capture_content" not in values and not env.get(_PREFIX + "CAPTURE_CONTENT"):
        values["capture_content"] = capture_content_default(env)
    return values, raw_of


def _build(values: dict[str, Any], raw_of: Mapping[str, str], errors: list[ConfigError] | None) -> Settings:
    while True:
        try:
            return Settings(**values)
        except TypeError as exc:
            raise ConfigError(str(exc)) from None
        except ConfigError as exc:
            setting = exc.setting
            if setting is not None and setting in raw_of and exc.expected is not None:
                # the value came from a variable: say it as the user wrote it
                exc = ConfigError(f"{env_var(setting)}={raw_of[setting]!r}: expected {exc.expected}",
                                  setting=setting, expected=exc.expected)
            if errors is None or exc.setting not in values:
                raise exc from None
            errors.append(exc)
            del values[exc.setting]


def _load(
    env: Mapping[str, str] | None, overrides: dict[str, Any], errors: list[ConfigError] | None
) -> Settings:
    env = os.environ if env is None else env
    _check_unknown_vars(env)
    values, raw_of = _from_env(env, errors)
    for name in overrides:
        raw_of.pop(name, None)
    try:
        if "eval_llm" not in overrides:
            app = _app_llm_fallback(env)
            values["eval_llm"] = _llm_settings(env, "EVAL_", app)
        if "checkpoint_llm" not in overrides:
            final = overrides.get("eval_llm", values.get("eval_llm"))
            values["checkpoint_llm"] = _llm_settings(env, "EVAL_CHECKPOINT_", final)
    except ConfigError as exc:
        if errors is None:
            raise
        errors.append(exc)
        values.pop("eval_llm", None)
        values.pop("checkpoint_llm", None)
    values.update(overrides)
    processes = values.get("judge_processes", 0)
    if type(processes) is int and processes > 0 and "concurrency" not in values:
        # sixteen calls in flight per worker: a worker answers every request at hand in one write, so the
        # deeper its pipe, the fewer wake-ups per call (capacity with one worker, 2,000 checkpoints queued:
        # 790-960 checkpoints/s with 4 in flight, 1,300-1,850/s with 16)
        values["concurrency"] = max(Settings().concurrency, _CALLS_PER_WORKER * processes)
    settings = _build(values, raw_of, errors)
    _check_metric_names(settings)
    return settings


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read ``STREAMJUDGE_*`` and ``EVAL_*`` variables from ``env`` (default ``os.environ``).

    Keyword ``overrides`` win over the environment. Raises :class:`ConfigError` naming the variable and the
    values it accepts when a value cannot be used. Logs a warning (once per name) for a ``STREAMJUDGE_*``
    variable that is not an option, with the closest option's name, and for a metric no judge scores.
    """
    return _load(env, dict(overrides), None)


def load_settings_or_default(
    log: logging.Logger | None = None, env: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Like :func:`load_settings`, but never raises: a variable that cannot be used keeps its default.

    For the zero-code path, where a bad setting must not stop the application: logs one line (on ``log``,
    default this module's logger) naming each unusable variable and what it accepts, and carries on.
    """
    errors: list[ConfigError] = []
    try:
        settings = _load(env, dict(overrides), errors)
    except ConfigError as exc:  # an override set in code is wrong: nothing of the environment to blame
        errors.append(exc)
        settings = Settings()
    if errors:
        (log or _log).error(
            "streamjudge: %s; %s",
            "; ".join(str(e) for e in errors),
            "using the default for it" if len(errors) == 1 else "using the defaults for them",
        )
    return settings
