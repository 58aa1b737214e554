"""Attribute, event, span and metric names used by streamjudge.

Every name streamjudge writes onto telemetry lives here, so the rest of the code imports a constant
instead of repeating a string. The ``gen_ai.evaluation.*`` names follow the OpenTelemetry GenAI
semantic conventions for evaluation results; the ``streamjudge.*`` names are ours.
"""

from __future__ import annotations

from typing import Final

# --- span names ----------------------------------------------------------------------------------
SPAN_STREAM: Final = "streamjudge.stream"
SPAN_CHECKPOINT: Final = "streamjudge.checkpoint"
SPAN_EVALUATOR: Final = "streamjudge.evaluate"
SPAN_NODE_PREFIX: Final = "langgraph.node"

# --- what kind of span this is (drives the processor's routing) -----------------------------------
SPAN_TYPE: Final = "streamjudge.span.type"
SPAN_TYPE_STREAM: Final = "stream"
SPAN_TYPE_CHECKPOINT: Final = "checkpoint"
SPAN_TYPE_EVALUATOR: Final = "evaluator"
SPAN_TYPE_NODE: Final = "node"

# --- stream span ---------------------------------------------------------------------------------
STREAM_ID: Final = "streamjudge.stream.id"
STREAM_TTFT_MS: Final = "streamjudge.stream.time_to_first_token_ms"
# time to first token counted from the request's start (STREAM_TTFT_MS counts from the answer node's)
STREAM_TTFT_REQUEST_MS: Final = "streamjudge.stream.time_to_first_token_from_request_ms"
# when the model's first token came (STREAM_TTFT_MS is the client's: later in hold-back mode)
STREAM_MODEL_TTFT_MS: Final = "streamjudge.stream.model_time_to_first_token_ms"
# chars of tokens too large to judge whole that passed through unjudged (see MAX_TOKEN_CHARS)
STREAM_UNJUDGED_CHARS: Final = "streamjudge.stream.unjudged_chars"
# the model's text when it differs from STREAM_ANSWER (what the client received)
STREAM_MODEL_ANSWER: Final = "streamjudge.model_answer"
# false when the stream's action or mode could not be enforced where its tokens come from; the reason beside
ACTION_ENFORCED: Final = "streamjudge.action.enforced"
ACTION_ENFORCED_REASON: Final = "streamjudge.action.enforced.reason"
STREAM_TOKENS: Final = "streamjudge.stream.tokens"
STREAM_CHARS: Final = "streamjudge.stream.chars"
STREAM_CHECKPOINTS: Final = "streamjudge.stream.checkpoints"
STREAM_ALERTS: Final = "streamjudge.stream.alerts"
STREAM_VERDICT: Final = "streamjudge.stream.verdict"
STREAM_ACTION: Final = "streamjudge.stream.action"
STREAM_MODE: Final = "streamjudge.stream.mode"
STREAM_REGENERATIONS: Final = "streamjudge.stream.regenerations"
STREAM_OUTCOME: Final = "streamjudge.stream.outcome"  # completed / disconnected / error / stopped
STREAM_SKIPPED_TOKENS: Final = "streamjudge.stream.skipped_tokens"
STREAM_QUESTION: Final = "streamjudge.question"
STREAM_ANSWER: Final = "streamjudge.answer"
STREAM_ANSWER_LENGTH: Final = "streamjudge.answer.length"
STREAM_ANSWER_SHA256: Final = "streamjudge.answer.sha256"
STREAM_CONTEXT_COUNT: Final = "streamjudge.contexts.count"
# on a deferred answer span only: what a worker needs for the final pass, once per trace
STREAM_CONTEXTS: Final = "streamjudge.contexts"
STREAM_REFERENCE: Final = "streamjudge.reference"
PREFLIGHT_SCORE: Final = "streamjudge.preflight.context_precision"
PREFLIGHT_LABEL: Final = "streamjudge.preflight.label"
PREFLIGHT_POLICY: Final = "streamjudge.preflight.policy"

# --- checkpoint span -----------------------------------------------------------------------------
CHECKPOINT_INDEX: Final = "streamjudge.checkpoint.index"
CHECKPOINT_CHAR_START: Final = "streamjudge.checkpoint.char_start"
CHECKPOINT_CHAR_END: Final = "streamjudge.checkpoint.char_end"
CHECKPOINT_SENTENCES: Final = "streamjudge.checkpoint.sentences"
CHECKPOINT_TEXT: Final = "streamjudge.checkpoint.text"  # the sentences this checkpoint judges
CHECKPOINT_TEXT_LENGTH: Final = "streamjudge.checkpoint.text.length"
CHECKPOINT_TEXT_SHA256: Final = "streamjudge.checkpoint.text.sha256"
CHECKPOINT_FINAL: Final = "streamjudge.checkpoint.final"

# --- evaluation results (attributes on the judged span, or on the EVALUATOR span) -----------------
#: what was judged: ``checkpoint`` (new sentences), ``answer`` (the final pass), ``preflight`` (contexts)
EVAL_KIND: Final = "streamjudge.eval.kind"
EVAL_STATUS: Final = "streamjudge.eval.status"  # judged / dropped / timeout / error / sampled_out / ...
EVAL_SKIP_REASON: Final = "streamjudge.eval.skip_reason"
EVAL_JUDGE: Final = "streamjudge.eval.judge"
EVAL_LATENCY_MS: Final = "streamjudge.eval.latency_ms"
EVAL_ATTEMPTS: Final = "streamjudge.eval.attempts"
EVAL_CALLS: Final = "streamjudge.eval.llm_calls"
EVAL_INPUT_TOKENS: Final = "streamjudge.eval.input_tokens"
EVAL_OUTPUT_TOKENS: Final = "streamjudge.eval.output_tokens"
EVAL_COST_USD: Final = "streamjudge.eval.cost_usd"
EVAL_PASSED: Final = "streamjudge.eval.passed"
EVAL_TARGET_TRACE_ID: Final = "streamjudge.eval.target.trace_id"
EVAL_TARGET_SPAN_ID: Final = "streamjudge.eval.target.span_id"


def score_attribute(metric: str) -> str:
    """Attribute holding the score of ``metric`` on a judged span (``streamjudge.eval.<metric>.score``)."""
    return f"streamjudge.eval.{metric}.score"


def label_attribute(metric: str) -> str:
    """Attribute holding the pass/fail label of ``metric`` on a judged span."""
    return f"streamjudge.eval.{metric}.label"


def sentences_attribute(metric: str, what: str) -> str:
    """Per-sentence summary of ``metric`` on a judged span: ``worst`` (lowest sentence score), ``failed``
    (how many sentences failed), ``judged`` (how many were scored), ``ranges`` (failed sentences' char
    ranges in the stream's text, flattened ``[start0, end0, start1, end1, ...]``)."""
    return f"streamjudge.eval.{metric}.sentences.{what}"


#: failed sentences' char ranges on a ``gen_ai.evaluation.result`` event (flattened start/end pairs)
EVAL_SENTENCE_RANGES: Final = "streamjudge.eval.sentence_ranges"


# --- GenAI evaluation event (OpenTelemetry semantic conventions) ---------------------------------
EVENT_EVALUATION_RESULT: Final = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
ERROR_TYPE: Final = "error.type"

# OpenInference's span kinds and input/output, so Phoenix (and other OpenInference viewers) render
# streamjudge's own spans: the stream is a CHAIN, a checkpoint a GUARDRAIL, an evaluation an EVALUATOR
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_KIND_CHAIN: Final = "CHAIN"
OPENINFERENCE_KIND_GUARDRAIL: Final = "GUARDRAIL"
OPENINFERENCE_KIND_EVALUATOR: Final = "EVALUATOR"
INPUT_VALUE: Final = "input.value"
OUTPUT_VALUE: Final = "output.value"

# --- other events on the stream span -------------------------------------------------------------
EVENT_FIRST_TOKEN: Final = "streamjudge.first_token"
EVENT_ALERT: Final = "streamjudge.alert"
EVENT_RETRACT: Final = "streamjudge.retract"
EVENT_STOP: Final = "streamjudge.stop"
EVENT_SKIP: Final = "streamjudge.skip"
ALERT_METRIC: Final = "streamjudge.alert.metric"
ALERT_SCORE: Final = "streamjudge.alert.score"
ALERT_CHECKPOINT: Final = "streamjudge.alert.checkpoint"
ALERT_CHAR_END: Final = "streamjudge.alert.char_end"
ALERT_CHAR_START: Final = "streamjudge.alert.char_start"
ALERT_REASON: Final = "streamjudge.alert.reason"
SKIP_REASON: Final = "streamjudge.skip.reason"
#: on the stream span at its end: what was skipped (``what:reason``) and how often, as parallel arrays
SKIP_REASONS: Final = "streamjudge.skip.reasons"
SKIP_COUNTS: Final = "streamjudge.skip.counts"

# --- LangGraph node spans ------------------------------------------------------------------------
NODE_NAME: Final = "node"
NODE_ELAPSED_MS: Final = "elapsed_ms"
SESSION_ID: Final = "session.id"

# --- metrics -------------------------------------------------------------------------------------
METER_NAME: Final = "streamjudge"
METRIC_SCORE: Final = "streamjudge.eval.score"
METRIC_ALERTS: Final = "streamjudge.alerts"
#: jobs of a stream cancelled when its client went away (on the stream span)
JUDGE_CANCELLED_JOBS: Final = "streamjudge.judge.cancelled_jobs"
METRIC_JUDGE_DURATION: Final = "streamjudge.judge.duration"
METRIC_QUEUE_DEPTH: Final = "streamjudge.judge.queue.depth"
METRIC_QUEUE_CAPACITY: Final = "streamjudge.judge.queue.capacity"
METRIC_DROPS: Final = "streamjudge.judge.drops"
METRIC_EXPORT_DROPS: Final = "streamjudge.export.drops"  # results a sink (Langfuse, Phoenix) lost
METRIC_JUDGE_ERRORS: Final = "streamjudge.judge.errors"
METRIC_ATTR_EVALUATION: Final = "evaluation"
METRIC_ATTR_REASON: Final = "reason"
METRIC_ATTR_SINK: Final = "sink"
METRIC_ATTR_JUDGE: Final = "judge"

# --- metric names used in scores -----------------------------------------------------------------
FAITHFULNESS: Final = "faithfulness"
ANSWER_RELEVANCY: Final = "answer_relevancy"
CONTEXT_PRECISION: Final = "context_precision"
CONTEXT_RECALL: Final = "context_recall"

# --- instrumentation scope -----------------------------------------------------------------------
TRACER_NAME: Final = "streamjudge"

# --- `streamjudge worker` (deferred final pass behind the collector's load_balancing exporter) -----
METRIC_WORKER_SPANS_RECEIVED: Final = "streamjudge.worker.spans.received"
# re-sent by a collector retry: recognised by its ids, not exported again
METRIC_WORKER_SPANS_DUPLICATE: Final = "streamjudge.worker.spans.duplicate"
# non-answer spans exported, by why they left the trace buffer (judged, complete, evicted_*, ...)
METRIC_WORKER_SPANS_RELEASED: Final = "streamjudge.worker.spans.released"
METRIC_WORKER_ANSWERS: Final = "streamjudge.worker.answers"  # deferred answers by outcome status
METRIC_WORKER_BUFFER_TRACES: Final = "streamjudge.worker.buffer.traces"
METRIC_WORKER_BUFFER_SPANS: Final = "streamjudge.worker.buffer.spans"
METRIC_WORKER_BUFFER_BYTES: Final = "streamjudge.worker.buffer.bytes"
METRIC_ATTR_STATUS: Final = "status"

# --- export failures (span exporters streamjudge creates or takes over) ----------------------------
METRIC_EXPORT_FAILURES: Final = "streamjudge.export.failures"  # spans an exporter failed to deliver
METRIC_ATTR_EXPORTER: Final = "exporter"

# --- answer discovery (zero-code) ------------------------------------------------------------------
#: on the request span (or a chain's top-level span): why no answer of this request could be found to
#: judge (``model_output_not_returned``, ``model_calls_excluded``, ``no_answer_node``)
ANSWER_NOT_FOUND: Final = "streamjudge.answer.not_found"

# --- `streamjudge worker` receivers: requests refused or cut short, by reason ----------------------
# (too_large, bad_request, unauthorized, busy, aborted, timeout, tls)
METRIC_WORKER_REQUESTS_REJECTED: Final = "streamjudge.worker.requests.rejected"

# --- three-way sentence verdicts (SentenceScore.verdict / .tier / .kind) ----------------------------
# Per judged sentence of a metric, on a ``gen_ai.evaluation.result`` event, parallel string arrays in the
# order of the metric's sentences: the verdict (``supported`` / ``uncertain`` / ``fail``), the judge tier
# that decided it (``local``, or the strong judge of a cascade: ``llm``, ``model`` ...) and the kind of
# evidence behind it (``number``, ``date``, ``unit``, ``name``, ``role_swap``, ``negation``, ``detached``,
# ``negation_tie``, ``words``, ``llm``, ``model``; empty for a supported sentence)
EVAL_SENTENCE_VERDICTS: Final = "streamjudge.eval.sentence_verdicts"
EVAL_SENTENCE_TIERS: Final = "streamjudge.eval.sentence_tiers"
EVAL_SENTENCE_KINDS: Final = "streamjudge.eval.sentence_kinds"
#: every judged sentence's char range in the stream's text, flattened, in the order of the arrays above
EVAL_SENTENCE_BOUNDS: Final = "streamjudge.eval.sentence_bounds"
#: the strictness the judge ran at (``lenient`` / ``default`` / ``strict``)
EVAL_STRICTNESS: Final = "streamjudge.eval.strictness"
