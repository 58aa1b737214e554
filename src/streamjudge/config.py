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
import math
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
JUDGE_NAMES: tuple[str, ...] = ("local", "model", "llm", "ragas", "deepeval", "cascade")
#: how readily a judge with three-way sentence verdicts alerts: ``strict`` alerts on uncertain sentences
Strictness = Literal["lenient", "default", "strict"]
STRICTNESS: tuple[str, ...] = ("lenient", "default", "strict")
#: what a name absent from the contexts is: hard evidence (``fail``) or a weak signal (``uncertain``)
NamesPolicy = Literal["fail", "uncertain"]
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

    def __post_init__(self) -> None:
        # the same checks as the EVAL_* options (a JudgeLLMSettings serves the final pass or checkpoints)
        for name, suffix, *_ in _LLM_FIELDS:
            opt = _BY_VAR["EVAL_" + suffix]
            try:
                opt._accept(getattr(self, name))
            except _Rejected:
                raise ConfigError(
                    f"JudgeLLMSettings.{name}={getattr(self, name)!r}: expected {opt.accepts} "
                    f"(environment: EVAL_{suffix} / EVAL_CHECKPOINT_{suffix})", expected=opt.accepts,
                ) from None


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
    # default: it does not lower time to alert, and under load each tick takes the GIL from request handling
    # (docs/performance.md has the figures)
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
    # three-way sentence verdicts: ``strictness`` (lenient / default / strict: strict alerts on uncertain
    # sentences) and what a name absent from the contexts is (``fail`` / ``uncertain``; None: uncertain when
    # lenient, else fail). The ``cascade`` judge asks ``cascade_judge`` about the sentences the local judge
    # is uncertain about (and, with ``cascade_confirm_fails``, about its fails before they alert)
    strictness: Strictness = "default"
    names_absent: NamesPolicy | None = None
    cascade_judge: str = "llm"
    cascade_confirm_fails: bool = False

    def __post_init__(self) -> None:
        # every field with an option is checked against its entry in OPTIONS (type, range, choices)
        for name, opt in _FIELD_OPTIONS:
            object.__setattr__(self, name, opt.check(getattr(self, name)))
        for metric, v in self.thresholds.items():
            if not 0.0 <= v <= 1.0:
                raise _invalid("thresholds", f"{metric}={v}", "metric=value pairs with values from 0 to 1")
        for spec in self.terminal_frames:
            kind, sep, value = spec.partition(":")
            if not sep or kind.strip() not in TERMINAL_FRAME_KINDS or not value.strip():
                raise ConfigError(
                    f"STREAMJUDGE_TERMINAL_FRAMES: {spec!r} is not event:NAME, data:TEXT or type:NAME "
                    "(STREAMJUDGE_TERMINAL_FRAMES=none turns holding back off)",
                    setting="terminal_frames", expected=_FRAMES_EXPECTED,
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


# --- the settings table -----------------------------------------------------------------------------
#
# One entry per environment variable: what it sets, its type, its default, what it accepts and what it
# does. The parser below, Settings' own validation and the settings reference in the docs all read it.
# A new setting: a field in Settings (or JudgeLLMSettings) and one entry in OPTIONS.

_PREFIX = "STREAMJUDGE_"

#: what each kind of option is called in the settings reference
KIND_NAMES: Mapping[str, str] = {
    "bool": "boolean", "int": "integer", "float": "number", "text": "text", "secret": "text (secret)",
    "choice": "choice", "list": "list", "judge": "judge name", "thresholds": "metric=value list",
    "rubrics": "JSON", "frames": "list", "processes": "integer or auto",
}
_BOOL_TRUE = ("1", "true", "yes", "on")
_BOOL_FALSE = ("0", "false", "no", "off")
_FRAMES_EXPECTED = ("event:NAME, data:TEXT or type:NAME, comma separated "
                    "(STREAMJUDGE_TERMINAL_FRAMES=none turns holding back off)")
_JUDGE_EXPECTED = ", ".join(JUDGE_NAMES) + " or package.module:ClassName"


class _Rejected(ValueError):
    """A value outside what an option accepts (the caller words the error)."""


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True, slots=True)
class Option:
    """One setting as users set it: an environment variable, the field it fills, its type and range.

    ``field`` is the :class:`Settings` field (``eval_llm.timeout_s`` for a judge-LLM setting; None for a
    variable read elsewhere in the package). ``low``/``high`` bound numbers (``above``: ``low`` itself is
    not accepted); ``choices`` lists the values of a choice; ``default`` is what applies when the variable
    is unset or unusable (for a field: the field's default).
    """

    var: str
    field: str | None
    kind: str
    doc: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    none_empties: bool = False  # for a list: "none" means an empty list (an empty variable: the default)

    @property
    def type_name(self) -> str:
        """The type as the settings reference names it."""
        return KIND_NAMES[self.kind]

    @property
    def default_text(self) -> str:
        """The default as the settings reference and the error lines show it."""
        return _show(self.default)

    @property
    def accepts(self) -> str:
        """What the option accepts, in words (the end of every error about it)."""
        kind = self.kind
        if kind == "bool":
            return "true or false (or 1/0, yes/no, on/off)"
        if kind in ("int", "float", "processes"):
            what = "an integer" if kind != "float" else "a number"
            if self.low is not None and self.high is not None:
                what += f" from {_num(self.low)} to {_num(self.high)}"
            elif self.low is not None:
                what += f" {'>' if self.above else '>='} {_num(self.low)}"
            elif self.high is not None:
                what += f" <= {_num(self.high)}"
            return what + (", or auto" if kind == "processes" else "")
        if kind == "choice":
            return _one_of(self.choices)
        if kind == "judge":
            return _JUDGE_EXPECTED
        if kind == "thresholds":
            return "metric=value pairs with values from 0 to 1, comma separated"
        if kind == "rubrics":
            return "a JSON object of rubric name -> list of evaluation steps, or the path of a JSON file"
        if kind == "frames":
            return _FRAMES_EXPECTED
        if kind == "list":
            return "names, comma separated" + (' ("none": none at all)' if self.none_empties else "")
        return "any text"

    def check(self, value: Any) -> Any:
        """``value`` as stored (an enum normalised), or :class:`ConfigError` naming the field."""
        try:
            return self._accept(value)
        except _Rejected:
            raise _invalid(self.field or self.var, value, self.accepts) from None

    def parse(self, raw: str) -> Any:
        """The value of the variable's text ``raw``, or :class:`ConfigError` naming the variable, the value
        as written and what is accepted."""
        try:
            return self._accept(self._convert(raw))
        except _Rejected:
            hint = _did_you_mean(_enum(raw), self.choices) if self.kind == "choice" else ""
            raise ConfigError(f"{self.var}={raw!r}: expected {self.accepts}{hint}",
                              setting=self.field, expected=self.accepts) from None

    def _convert(self, raw: str) -> Any:
        kind, text = self.kind, raw.strip()
        if kind == "bool":
            if text.lower() in _BOOL_TRUE:
                return True
            if text.lower() in _BOOL_FALSE:
                return False
            raise _Rejected
        if kind == "processes" and text.lower() == "auto":
            return "auto"
        if kind in ("int", "processes"):
            try:
                return int(text)
            except ValueError:
                raise _Rejected from None
        if kind == "float":
            try:
                return float(text)
            except ValueError:
                raise _Rejected from None
        if kind == "judge":
            return parse_judge_name(self.var, raw)
        if kind == "thresholds":
            return _thresholds(self.var, raw)
        if kind == "rubrics":
            return _rubrics(self.var, raw)
        if kind in ("list", "frames"):
            return () if (self.none_empties or kind == "frames") and text.lower() == "none" else _csv(raw)
        return text

    def _accept(self, value: Any) -> Any:
        kind = self.kind
        if value is None and self.default is None:
            return None  # an optional setting left unset
        if kind == "bool":
            if not isinstance(value, bool):
                raise _Rejected
        elif kind in ("int", "float", "processes"):
            if kind == "processes" and isinstance(value, str) and value.strip().lower() == "auto":
                return "auto"
            ok_types = (int,) if kind != "float" else (int, float)
            if isinstance(value, bool) or not isinstance(value, ok_types) or not math.isfinite(value):
                raise _Rejected
            low, high = self.low, self.high
            if (low is not None and (value <= low if self.above else value < low)) or (
                    high is not None and value > high):
                raise _Rejected
        elif kind == "choice":
            value = _enum(value)
            if value not in self.choices:
                raise _Rejected
        elif kind in ("text", "secret", "judge") and not isinstance(value, str):
            raise _Rejected
        return value


def _settings_default(name: str) -> Any:
    f = Settings.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _o(field_name: str, suffix: str, kind: str, doc: str, **kw: Any) -> Option:
    """The option of a :class:`Settings` field (its default is the field's)."""
    return Option(_PREFIX + suffix, field_name, kind, doc, _settings_default(field_name), **kw)


_PROBABILITY = {"low": 0.0, "high": 1.0}
_SECONDS = {"low": 0.0}

#: every STREAMJUDGE_* option, in the order of the settings reference
OPTIONS: tuple[Option, ...] = (
    # judges
    _o("judge", "JUDGE", "judge", "Judge of the final answer (and of checkpoints unless "
       "STREAMJUDGE_CHECKPOINT_JUDGE is set)."),
    _o("checkpoint_judge", "CHECKPOINT_JUDGE", "judge", "Judge of checkpoints, the fast tier (unset: "
       "STREAMJUDGE_JUDGE)."),
    _o("threshold", "THRESHOLD", "float", "A score below it fails.", **_PROBABILITY),
    _o("thresholds", "THRESHOLDS", "thresholds", "Per-metric thresholds over STREAMJUDGE_THRESHOLD."),
    _o("checkpoint_metrics", "CHECKPOINT_METRICS", "list", "Metrics scored at each checkpoint."),
    _o("final_metrics", "FINAL_METRICS", "list", "Metrics scored on the final answer."),
    _o("geval_rubrics", "GEVAL_RUBRICS", "rubrics", "GEval rubrics for the deepeval judge (scored when "
       "named in the metrics)."),
    # actions
    _o("action", "ACTION", "choice", "What a failed checkpoint does.", choices=_ACTIONS),
    _o("mode", "MODE", "choice", "Stream first (may retract) or hold each window back until it passed.",
       choices=_MODES),
    _o("max_regenerations", "MAX_REGENERATIONS", "int", "Regenerations per answer before stopping.",
       low=0),
    _o("fallback_message", "FALLBACK_MESSAGE", "text", "What the client reads when an answer is stopped."),
    # checkpoint windows
    _o("window_sentences", "CHECKPOINT_SENTENCES", "int", "Sentences per checkpoint.", low=1),
    _o("window_chars", "CHECKPOINT_CHARS", "int", "Characters after which a checkpoint closes early.",
       low=1),
    _o("checkpoint_every", "CHECKPOINT_EVERY", "int", "Instead, a checkpoint at every N-th sentence "
       "whatever its length (0: off).", low=0),
    # pre-flight gate and final pass
    _o("preflight", "PREFLIGHT", "bool", "Score the retrieved contexts before the first token."),
    _o("preflight_threshold", "PREFLIGHT_THRESHOLD", "float", "Context score below which the pre-flight "
       "action applies.", **_PROBABILITY),
    _o("preflight_action", "PREFLIGHT_ACTION", "choice", "What a low pre-flight score does.",
       choices=_PREFLIGHT_ACTIONS),
    _o("preflight_wait_s", "PREFLIGHT_WAIT", "float", "Seconds the first token may wait for the "
       "pre-flight score.", **_SECONDS),
    _o("final_reconcile", "FINAL_RECONCILE", "bool", "Judge the complete answer with the full suite."),
    _o("final_pass", "FINAL_PASS", "choice", "Where the final pass runs: here, or in streamjudge worker.",
       choices=_FINAL_PASSES),
    _o("end_wait_s", "END_WAIT", "float", "Seconds a stream waits at its end for verdicts in flight "
       "(off the token path).", **_SECONDS),
    # judge pool
    _o("sample_rate", "SAMPLE_RATE", "float", "Share of traces judged.", **_PROBABILITY),
    _o("concurrency", "CONCURRENCY", "int", "Judge calls in flight.", low=1),
    _o("queue_size", "QUEUE_SIZE", "int", "Judge requests queued, at most.", low=1),
    _o("judge_timeout_s", "JUDGE_TIMEOUT", "float", "Seconds one judge call may take.", low=0.0,
       above=True),
    _o("max_retries", "MAX_RETRIES", "int", "Retries of a judge call after a transient error.", low=0),
    _o("retry_backoff_s", "RETRY_BACKOFF", "float", "Seconds before the first retry (doubling).",
       **_SECONDS),
    _o("per_stream_budget", "STREAM_BUDGET", "int", "Judge calls per stream (0: unlimited).", low=0),
    _o("global_budget_per_minute", "GLOBAL_BUDGET_PER_MINUTE", "int", "Judge calls per minute in all "
       "(0: unlimited).", low=0),
    _o("judge_cpu_share", "JUDGE_CPU_SHARE", "float", "Most of one core the judge pool's thread may use "
       "(0: no cap).", **_PROBABILITY),
    _o("judge_cpu_share_max", "JUDGE_CPU_SHARE_MAX", "float", "How far that cap may rise while the app "
       "keeps time (at most STREAMJUDGE_JUDGE_CPU_SHARE: a fixed cap).", **_PROBABILITY),
    _o("judge_linger_s", "JUDGE_LINGER", "float", "Seconds the idle pool polls for work before it "
       "sleeps.", **_SECONDS),
    _o("judge_processes", "JUDGE_PROCESSES", "processes", "Worker processes for a CPU-bound judge "
       "(0: in the pool's thread; auto: when measured to help).", low=0, high=64),
    _o("judge_worker_nice", "JUDGE_WORKER_NICE", "int", "Niceness of judge worker processes.", low=0,
       high=19),
    _o("hold_timeout_s", "HOLD_TIMEOUT", "float", "Seconds a judged span is held for its scores before "
       "it is exported without them.", low=0.0, above=True),
    _o("max_judge_input_chars", "MAX_JUDGE_INPUT_CHARS", "int", "Judge inputs (contexts, an answer) over "
       "this many characters are skipped, recorded.", low=1),
    _o("max_queue_chars", "MAX_QUEUE_CHARS", "int", "Characters queued for judging across streams, at "
       "most.", low=1),
    # content on spans
    _o("capture_content", "CAPTURE_CONTENT", "bool", "Question, contexts and answer text on spans "
       "(off: length and sha256). Unset: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, else on."),
    _o("max_text_attribute_chars", "MAX_TEXT_CHARS", "int", "Longest text on a span (head and tail of "
       "a longer one).", low=16),
    # instrumentation
    _o("answer_nodes", "ANSWER_NODES", "list", "LangGraph nodes whose model stream is the answer."),
    _o("question_keys", "QUESTION_KEYS", "list", "Input keys holding the user's question, in order (else "
       "the last human message of messages / chat_history)."),
    _o("openinference_inline", "OPENINFERENCE_INLINE", "bool", "Run openinference's LangChain tracer "
       "in the caller's task instead of a thread pool."),
    _o("sse_token_field", "SSE_TOKEN_FIELD", "text", "Dot path of the token in JSON SSE data (apps "
       "without an instrumented graph)."),
    _o("terminal_frames", "TERMINAL_FRAMES", "frames", "The app's frames that end an answer, held back "
       "until the guard's last events are sent."),
    _o("client_events", "CLIENT_EVENTS", "bool", "Send the guard's warning/retract/stop events to the "
       "client in the app's frame format."),
    _o("routes_include", "ROUTES_INCLUDE", "list", "Request paths that may carry a judged answer "
       "(fnmatch patterns; empty: every path)."),
    _o("routes_exclude", "ROUTES_EXCLUDE", "list", "Request paths never judged (fnmatch patterns).",
       none_empties=True),
    # the model judge
    _o("model_path", "MODEL_PATH", "text", "The model judge's directory (or hub id)."),
    _o("model_backend", "MODEL_BACKEND", "choice", "The model judge's runtime.",
       choices=("auto", "onnx", "torch")),
    _o("model_batch_size", "MODEL_BATCH_SIZE", "int", "Pairs per inference batch.", low=1),
    _o("model_max_batch_ms", "MODEL_MAX_BATCH_MS", "float", "Milliseconds a batch waits to fill.",
       low=0.0),
    _o("model_threads", "MODEL_THREADS", "int", "ONNX Runtime intra-op threads (0: its default).", low=0),
    _o("model_max_length", "MODEL_MAX_LENGTH", "int", "The model's input window in tokens (0: from its "
       "config).", low=0),
    _o("model_queue_size", "MODEL_QUEUE_SIZE", "int", "Claims pending for the model, at most.", low=1),
    # three-way sentence verdicts and the cascade
    _o("strictness", "STRICTNESS", "choice", "What an uncertain sentence does: strict alerts on it too; "
       "lenient fails only numbers, dates, units and flipped negations.", choices=STRICTNESS),
    _o("names_absent", "NAMES_ABSENT", "choice", "What a name the contexts lack is (unset: uncertain when "
       "lenient, else fail).", choices=("fail", "uncertain")),
    _o("cascade_judge", "CASCADE_JUDGE", "judge", "The cascade judge's strong tier: asked only about the "
       "sentences the local judge is uncertain about."),
    _o("cascade_confirm_fails", "CASCADE_CONFIRM_FAILS", "bool", "The cascade asks its strong tier about "
       "the local judge's fails too, before they alert."),
)

#: judge-LLM options: ``EVAL_<NAME>`` sets the final pass's judge LLM, ``EVAL_CHECKPOINT_<NAME>`` the
#: checkpoints' (which falls back to ``EVAL_<NAME>``)
_LLM_FIELDS: tuple[tuple[str, str, str, str, dict[str, Any]], ...] = (
    ("provider", "PROVIDER", "text", "Judge LLM API: openai, openai_compatible or anthropic.", {}),
    ("model", "MODEL", "text", "Judge LLM model name.", {}),
    ("base_url", "BASE_URL", "text", "Judge LLM endpoint (credentials in it are never logged).", {}),
    ("api_key", "API_KEY", "secret", "Judge LLM API key (never printed).", {}),
    ("timeout_s", "TIMEOUT", "float", "Seconds one judge LLM request may take.", {"low": 0.0, "above": True}),
    ("input_cost_per_mtok", "INPUT_COST_PER_MTOK", "float", "USD per million input tokens (0: unknown).",
     {"low": 0.0}),
    ("output_cost_per_mtok", "OUTPUT_COST_PER_MTOK", "float", "USD per million output tokens (0: unknown).",
     {"low": 0.0}),
    ("embedding_model", "EMBEDDING_MODEL", "text", "Embedding model on the same endpoint (ragas).", {}),
)


def _llm_options(prefix: str, target: str, doc_suffix: str) -> tuple[Option, ...]:
    defaults = {f.name: f.default for f in dataclasses.fields(JudgeLLMSettings)}
    return tuple(
        Option(prefix + suffix, f"{target}.{name}", kind, doc + doc_suffix, defaults[name], **kw)
        for name, suffix, kind, doc, kw in _LLM_FIELDS
    )


LLM_OPTIONS: tuple[Option, ...] = (
    _llm_options("EVAL_", "eval_llm", "")
    + _llm_options("EVAL_CHECKPOINT_", "checkpoint_llm", " For checkpoints (unset: the EVAL_ value).")
)

#: options read outside :func:`load_settings` (by the part of the package that needs them, through
#: :func:`option_from_env`)
PROCESS_OPTIONS: tuple[Option, ...] = (
    Option(_PREFIX + "SHUTDOWN_TIMEOUT", None, "float", "Seconds a shutdown (SIGTERM, exit) may take in "
           "all: judge pool drain, held spans, sinks, exporters.", 5.0, low=0.0),
)

#: variables of other software that streamjudge reads as defaults of its own options
BORROWED_VARIABLES: Mapping[str, str] = {
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "Default of STREAMJUDGE_CAPTURE_CONTENT: false, "
    "NO_CONTENT or EVENT_ONLY turn content capture off.",
    "OPENAI_API_KEY": "The judge LLM's key when no EVAL_* variable is set (the app's own OpenAI settings).",
    "OPENAI_BASE_URL": "The judge LLM's endpoint when no EVAL_* variable is set.",
    "OPENAI_MODEL": "The judge LLM's model when no EVAL_* variable is set.",
    "ANTHROPIC_API_KEY": "The judge LLM's key (Anthropic) when no EVAL_* variable nor OPENAI_API_KEY is set.",
    "ANTHROPIC_BASE_URL": "The Anthropic judge LLM's endpoint in that case.",
}

_FIELD_OPTIONS: tuple[tuple[str, Option], ...] = tuple((o.field, o) for o in OPTIONS if o.field)
_BY_FIELD: dict[str, Option] = {opt.field: opt for opt in OPTIONS if opt.field}
_BY_VAR: dict[str, Option] = {opt.var: opt for opt in (*OPTIONS, *LLM_OPTIONS, *PROCESS_OPTIONS)}


def all_options() -> tuple[Option, ...]:
    """Every option streamjudge reads: STREAMJUDGE_*, EVAL_* and the process-wide ones."""
    return (*OPTIONS, *LLM_OPTIONS, *PROCESS_OPTIONS)


def option(var: str) -> Option:
    """The option of the environment variable ``var`` (KeyError if streamjudge has none)."""
    return _BY_VAR[var]


def parse_judge_name(var: str, raw: str) -> str:
    """A judge name as written in ``var`` (a variable or an option): a built-in one in any case, or
    ``package.module:ClassName``. Raises :class:`ConfigError` naming ``var`` and the accepted names."""
    name = raw.strip()
    if name.lower() in JUDGE_NAMES:
        return name.lower()
    if ":" in name:  # package.module:ClassName, checked when the judge is built
        return name
    hint = _did_you_mean(name.lower(), JUDGE_NAMES)
    raise ConfigError(f"{var}={raw!r}: expected {_JUDGE_EXPECTED}{hint}")


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _thresholds(var: str, raw: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in _csv(raw):
        name, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"{var}: expected metric=value pairs, got {part!r}")
        try:
            v = float(value.strip())
        except ValueError:
            v = math.nan
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
    except (ValueError, RecursionError) as exc:
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
    """``STREAMJUDGE_CAPTURE_CONTENT`` when set and readable, else :func:`capture_content_default` (the
    same answer as ``load_settings(env).capture_content``)."""
    env = os.environ if env is None else env
    raw = (env.get(_PREFIX + "CAPTURE_CONTENT") or "").strip()
    if raw:
        try:
            return bool(_BY_VAR[_PREFIX + "CAPTURE_CONTENT"].parse(raw))
        except ConfigError:
            pass  # load_settings reports it
    return capture_content_default(env)


def _llm_settings(
    env: Mapping[str, str], prefix: str, fallback: JudgeLLMSettings | None, errors: list[ConfigError] | None
) -> JudgeLLMSettings:
    """The judge LLM ``prefix`` (``EVAL_`` / ``EVAL_CHECKPOINT_``) names; what is unset comes from
    ``fallback``. With ``errors`` given, an unusable variable is recorded there and left at the fallback."""
    base = fallback or JudgeLLMSettings()
    values: dict[str, Any] = {}
    for name, suffix, *_ in _LLM_FIELDS:
        var = prefix + suffix
        raw = env.get(var)
        if not raw:
            continue
        try:
            values[name] = _BY_VAR[var].parse(raw)
        except ConfigError as exc:
            if errors is None:
                raise
            errors.append(exc)
    return dataclasses.replace(base, **values)


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
    opt = _BY_FIELD.get(setting)
    return opt.var if opt else None


#: ``STREAMJUDGE_*`` variables read by other parts of the project (the collector configuration, the test
#: harness), so never reported as unknown
_OTHER_VARS: frozenset[str] = frozenset({
    "STREAMJUDGE_TRACES_EXPORTERS", "STREAMJUDGE_LOW_SCORE_THRESHOLD", "STREAMJUDGE_OTELCOL",
    "STREAMJUDGE_JAEGER", "STREAMJUDGE_PROMETHEUS", "STREAMJUDGE_PROMTOOL", "STREAMJUDGE_ALERTMANAGER",
    "STREAMJUDGE_AMTOOL", "STREAMJUDGE_PHOENIX_PYTHON",
    "STREAMJUDGE_WORKER_BEARER_TOKEN",  # streamjudge worker: the token its receivers require
    # the scale-out gateway's collector config (collector/): set beside the app in one pod's environment
    "STREAMJUDGE_WORKER_ENDPOINTS", "STREAMJUDGE_WORKER_RETRY_MAX_ELAPSED",
})
_OTHER_PREFIXES: tuple[str, ...] = ("STREAMJUDGE_COLLECTOR_", "STREAMJUDGE_GATEWAY_")

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
    """Every ``STREAMJUDGE_*`` variable streamjudge reads (:func:`load_settings` and elsewhere)."""
    return tuple(opt.var for opt in (*OPTIONS, *PROCESS_OPTIONS))


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

    With ``errors`` given, a variable that cannot be used is recorded there and left at its default.
    """
    values: dict[str, Any] = {}
    raw_of: dict[str, str] = {}
    for opt in OPTIONS:
        raw = env.get(opt.var)
        if raw is None or raw == "" or opt.field is None:
            continue
        try:
            values[opt.field] = opt.parse(raw)
        except ConfigError as exc:
            if errors is None:
                raise
            exc.setting = opt.field
            errors.append(exc)
            continue
        raw_of[opt.field] = raw
    if "capture_content" not in values:  # unset or unusable: the GenAI instrumentations' switch decides
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
    for opt in PROCESS_OPTIONS:  # read elsewhere, later (at shutdown): checked now, when it can be said
        raw = env.get(opt.var)
        if raw and raw.strip():
            try:
                opt.parse(raw)
            except ConfigError as exc:
                if errors is None:
                    raise
                errors.append(exc)
    for name in overrides:
        raw_of.pop(name, None)
    if "eval_llm" not in overrides:
        values["eval_llm"] = _llm_settings(env, "EVAL_", _app_llm_fallback(env), errors)
    if "checkpoint_llm" not in overrides:
        final = overrides.get("eval_llm", values.get("eval_llm"))
        values["checkpoint_llm"] = _llm_settings(env, "EVAL_CHECKPOINT_", final, errors)
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


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, str):
        return value or "empty"
    return _num(value) if isinstance(value, float) else str(value)


def _with_default(exc: ConfigError) -> str:
    """The error and what is used instead: the setting's default."""
    opt = _BY_FIELD.get(exc.setting or "") or next(
        (o for o in (*LLM_OPTIONS, *PROCESS_OPTIONS) if str(exc).startswith(o.var + "=")), None)
    if opt is None:
        return f"{exc} (using the defaults)"
    return f"{exc} (using the default: {opt.default_text})"


def _report_once(log: logging.Logger, errors: list[ConfigError]) -> None:
    """One error line for the errors not reported before in this process."""
    with _warned_lock:
        fresh = [e for e in errors if "error:" + str(e) not in _warned]
        _warned.update("error:" + str(e) for e in fresh)
    if fresh:
        log.error("streamjudge: %s", "; ".join(_with_default(e) for e in fresh))


def load_settings_or_default(
    log: logging.Logger | None = None, env: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Like :func:`load_settings`, but never raises: a variable that cannot be used keeps its default.

    For the zero-code path, where a bad setting must not stop the application: logs one line (on ``log``,
    default this module's logger; once per process for the same errors) naming each unusable variable,
    what it accepts and the default used instead, and carries on.
    """
    errors: list[ConfigError] = []
    try:
        settings = _load(env, dict(overrides), errors)
    except ConfigError as exc:  # an override set in code is wrong: nothing of the environment to blame
        errors.append(exc)
        settings = Settings()
    if errors:
        _report_once(log or _log, errors)
    return settings


def option_from_env(var: str, env: Mapping[str, str] | None = None, log: logging.Logger | None = None) -> Any:
    """The value of the option ``var`` (one of :data:`PROCESS_OPTIONS` or :data:`OPTIONS`) from ``env``
    (default ``os.environ``): its default when unset; when unusable, its default too, and the error is
    logged once (on ``log``, default this module's logger)."""
    opt = _BY_VAR[var]
    raw = (os.environ if env is None else env).get(var)
    if raw is None or not raw.strip():
        return opt.default
    try:
        return opt.parse(raw)
    except ConfigError as exc:
        _report_once(log or _log, [exc])
        return opt.default
