"""The ``model`` judge: a local NLI / hallucination-detector classifier scores each sentence.

Any sequence-classification model that reads a (premise, hypothesis) pair works: NLI models (the score is
the softmax probability of the label whose name matches ``entail`` in ``config.json``'s ``id2label``) and
hallucination detectors (HHEM-style: one logit through a sigmoid, or a label named ``consistent`` /
``supported``). The model directory holds ``config.json``, ``tokenizer.json`` and ``model.onnx`` (or
``onnx/model.onnx``, as ``optimum-cli export onnx --task text-classification`` writes it);
``STREAMJUDGE_MODEL_PATH`` names it, or a hub model id fetched with huggingface_hub's ``snapshot_download``
at startup where the machine can reach the hub and the package is installed. Inference runs through ONNX
Runtime and ``tokenizers`` (no torch); ``STREAMJUDGE_MODEL_BACKEND=torch`` loads the model with
transformers instead (CUDA when available), imported only then.

How a score is made (faithfulness; context recall is the same over the reference's sentences):

* The answer is split into sentences with :func:`streamjudge.sentences.split_sentences`. Questions and
  assistant filler ("Here is what I found.") are not claims and count neither way, as in the local judge.
  At a checkpoint, a last sentence without terminal punctuation (and no line break after it) is not
  finished yet and is left to the next checkpoint.
* Each sentence is the hypothesis, each context the premise. A context longer than the model's window
  (the smallest of ``max_position_embeddings``, ``tokenizer_config.json``'s ``model_max_length`` and
  ``STREAMJUDGE_MODEL_MAX_LENGTH``) is cut into token windows that fit beside the sentence, overlapping by
  an eighth of a window and at least by the sentence's length, so a supporting passage about as long as
  the sentence is whole in some window; a sentence longer than half the window is cut to half of it, and
  the explanation says so. Models that read one text (HHEM-2.1: a ``prompt`` template in ``config.json``
  with ``{text1}`` for the premise and ``{text2}`` for the hypothesis) get the template filled in instead
  of a pair, and the template's tokens are left room in every window.
* A sentence's value is its best score over all windows of all contexts. A sentence that opens with a
  pronoun ("It opened in 1889.") is also scored with the sentence before it prepended (from the answer, or
  the last sentence of ``EvalInput.prefix`` at a checkpoint) and keeps the better of the two: the prefix
  only resolves the reference, the earlier sentence is not scored again.
* ``Score.value`` is the share of claim sentences whose value is at least 0.5, the local judge's
  "supported claims / checkable claims", so the two judges' scores and thresholds read the same way;
  ``Score.sentences`` carries each sentence's own probability (the pool fails the metric when any of them
  is below the threshold). The explanation quotes each unsupported sentence and the context sentence of
  its best window that shares the most words with it.

Answer relevancy and context precision are skipped (``unsupported_metric``): a pair classifier answers
"does this text support that claim", not "is this relevant".

Off the application's loop and GIL: claims go to one worker thread per model (shared by both tiers and
every stream) through a bounded queue; it tokenises in Rust, batches pairs across concurrent ``evaluate``
calls (up to ``STREAMJUDGE_MODEL_BATCH_SIZE`` pairs, waiting at most ``STREAMJUDGE_MODEL_MAX_BATCH_MS``
for a batch to fill) and runs ONNX Runtime, which releases the GIL while it computes, with
``STREAMJUDGE_MODEL_THREADS`` intra-op threads. The judge pool keeps at most ``STREAMJUDGE_CONCURRENCY``
evaluations in flight, so that many can share a batch (each brings its sentences x context windows). A
full queue gives ``Score(skipped="model_queue_full")``;
claims not reached within the pool's per-call timeout (``STREAMJUDGE_JUDGE_TIMEOUT``) give
``skipped="model_timeout"`` and are dropped before they run; a batch still running once the deadline of
every claim in it has passed is stopped between graph nodes (ONNX Runtime's ``RunOptions.terminate``) and
also gives ``model_timeout``. A model that cannot load or run raises
:class:`~streamjudge.judging.base.JudgeError`, which the pool records as the job's ``error`` outcome.

The worker is not under ``STREAMJUDGE_JUDGE_CPU_SHARE`` (that caps the pool's own thread, whose work holds
the GIL); ``STREAMJUDGE_MODEL_THREADS`` bounds the cores inference takes.

Tiers: a model costs milliseconds or more per sentence where the local judge costs microseconds, so the
usual set-up judges checkpoints (and the pre-flight gate, which needs context precision) with the local
judge and the final pass with the model::

    STREAMJUDGE_CHECKPOINT_JUDGE=local STREAMJUDGE_JUDGE=model STREAMJUDGE_MODEL_PATH=/models/nli-onnx

Setting both tiers to ``model`` shares one loaded model and one worker between them (the pre-flight gate
then has no score: context precision is skipped).
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamjudge import semconv
from streamjudge.config import ConfigError, Settings
from streamjudge.judging.base import EvalInput, JudgeError, JudgeResult, Score, SentenceScore
from streamjudge.judging.judges._local_text import analyze, normalize
from streamjudge.judging.judges._model_files import ModelFileError, ModelSpec, read_spec, resolve_directory
from streamjudge.judging.judges._model_runtime import (
    ClaimRequest,
    ClaimResult,
    DeadlineError,
    ModelRuntime,
    ModelRuntimeError,
    QueueFullError,
)
from streamjudge.results import SentenceVerdict
from streamjudge.sentences import Sentence, split_sentences

__all__ = ["DECISION_THRESHOLD", "ModelJudge"]

#: a sentence counts as supported in ``Score.value`` when its probability is at least this
DECISION_THRESHOLD = 0.5
#: a sentence's probability below this is a ``fail`` verdict; from it up to DECISION_THRESHOLD ``uncertain``;
#: from DECISION_THRESHOLD on ``supported`` (the verdict is recorded; labels still follow the threshold)
FAIL_BELOW = 0.3
_BACKENDS = ("auto", "onnx", "torch")
_MAX_LISTED = 3  # unsupported sentences quoted in an explanation
_MAX_QUOTE = 120
_PREFIX_TAIL = 1000  # chars of ``EvalInput.prefix`` read to find the sentence before a checkpoint
_PRONOUN = re.compile(
    r"^[\"'“(]*(?:it|its|they|their|them|he|his|him|she|her|this|these|those|that|there|such)\b",
    re.IGNORECASE,
)
_TERMINATED = re.compile(r"[.!?…。！？][\"'”’)\]}»*]*(?:\[\d+\])*\s*$")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class _Claim:
    sentence: Sentence
    variants: tuple[str, ...]  # the sentence, then (pronoun) the previous sentence + the sentence


class ModelJudge:
    """Judges sentences with a local classifier through a shared batching worker. Safe to call concurrently.

    Build it with :meth:`from_settings`, or from a :class:`ModelRuntime` of your own.
    """

    name = "model"
    #: faithfulness names each failing sentence (see :class:`~streamjudge.judging.base.Judge`)
    scores_sentences = True

    def __init__(self, runtime: ModelRuntime, *, timeout_s: float = 30.0, release: Any = None) -> None:
        self.runtime = runtime
        self._timeout_s = timeout_s
        self._release = release
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings, tier: str = "final") -> ModelJudge:
        """The model of ``STREAMJUDGE_MODEL_PATH`` (both tiers share one loaded model and worker)."""
        del tier
        options = _options(settings)
        runtime, release = _shared_runtime(options)
        runtime.start()  # the worker loads the model now, so the first answer does not wait for it
        return cls(runtime, timeout_s=settings.judge_timeout_s, release=release)

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item``: faithfulness and context recall; other metrics are skipped."""
        wanted = list(dict.fromkeys(metrics))
        scores: dict[str, Score] = {}
        runs: dict[str, Any] = {}
        for metric in wanted:
            if metric == semconv.FAITHFULNESS:
                runs[metric] = self._faithfulness(item)
            elif metric == semconv.CONTEXT_RECALL:
                runs[metric] = self._context_recall(item)
            else:
                scores[metric] = Score(metric, None, skipped="unsupported_metric")
        if len(runs) == 1:  # the usual case (a checkpoint asks for faithfulness only): no extra task
            results: list[Any] = []
            try:
                results.append(await next(iter(runs.values())))
            except ModelRuntimeError as exc:
                results.append(exc)
        else:
            results = list(await asyncio.gather(*runs.values(), return_exceptions=True))
        failed: list[ModelRuntimeError] = []
        for metric, res in zip(runs, results, strict=True):
            if isinstance(res, ModelRuntimeError):
                failed.append(res)
                scores[metric] = Score(metric, None, skipped=f"judge_error: {res}"[:300])
            elif isinstance(res, BaseException):
                raise res
            else:
                scores[metric] = res
        if failed and len(failed) == len(runs):
            # nothing was scored: the pool records the job as an error with this message
            raise JudgeError(f"model judge: {failed[0]}") from failed[0]
        return JudgeResult(self.name, tuple(scores[m] for m in wanted))

    async def aclose(self) -> None:
        """Give back this judge's share of the runtime; the last judge of a model stops its worker."""
        if self._closed:
            return
        self._closed = True
        if self._release is not None:
            await asyncio.to_thread(self._release)

    # --- metrics -----------------------------------------------------------------------------------

    async def _faithfulness(self, item: EvalInput) -> Score:
        name = semconv.FAITHFULNESS
        if not item.answer.strip():
            return Score(name, None, skipped="empty_answer")
        if not _has_text(item.contexts):
            return Score(name, None, skipped="no_contexts")
        claims = _claims(item.answer, item.prefix, drop_tail=item.kind == "checkpoint")
        return await self._score(name, claims, item.contexts, "sentences", with_sentences=True)

    async def _context_recall(self, item: EvalInput) -> Score:
        name = semconv.CONTEXT_RECALL
        if not (item.reference or "").strip():
            return Score(name, None, skipped="no_reference")
        if not _has_text(item.contexts):
            return Score(name, None, skipped="no_contexts")
        claims = _claims(item.reference or "", "", drop_tail=False)
        # the reference's sentences are not the judged text: no per-sentence ranges in answer coordinates
        return await self._score(name, claims, item.contexts, "reference sentences", with_sentences=False)

    async def _score(self, name: str, claims: list[_Claim], contexts: tuple[str, ...], what: str, *,
                     with_sentences: bool) -> Score:
        if not claims:
            return Score(name, None, skipped="no_claims")
        contexts = tuple(contexts)
        request = ClaimRequest([c.variants for c in claims], contexts, time.monotonic() + self._timeout_s)
        try:
            future = self.runtime.submit(request)
        except QueueFullError as exc:
            return Score(name, None, explanation=str(exc), skipped="model_queue_full")
        try:
            results = await asyncio.wrap_future(future)
        except DeadlineError as exc:
            return Score(name, None, explanation=str(exc), skipped="model_timeout")
        return self._summarise(name, claims, contexts, results, what, with_sentences)

    def _summarise(self, name: str, claims: list[_Claim], contexts: tuple[str, ...],
                   results: list[ClaimResult], what: str, with_sentences: bool) -> Score:
        spec = self.runtime.spec
        label = spec.label
        supported = 0
        sentences: list[SentenceScore] = []
        unsupported: list[str] = []
        truncated = 0
        for claim, res in zip(claims, results, strict=True):
            ok = res.score >= DECISION_THRESHOLD
            supported += ok
            truncated += res.truncated > 0
            reason = f"{label} {res.score:.2f}"
            if res.variant:
                reason += " (read with the sentence before it)"
            if not ok:
                passage = _passage(claim.sentence.text, contexts, res)
                reason += f"; closest passage: \"{passage}\"" if passage else "; no passage supports it"
                unsupported.append(f"\"{_quote(claim.sentence.text)}\" ({reason})")
            if res.truncated:
                reason += (f"; sentence cut by {res.truncated} tokens to fit the "
                           f"{self.runtime.max_length}-token window")
            sentences.append(SentenceScore(claim.sentence.start, claim.sentence.end, res.score, reason,
                                           verdict=band_verdict(res.score), tier="model",
                                           kind=None if ok else "model"))
        value = supported / len(claims)
        expl = f"{supported}/{len(claims)} {what} supported ({label} >= {DECISION_THRESHOLD:g})"
        if unsupported:
            more = len(unsupported) - _MAX_LISTED
            expl += "; unsupported: " + "; ".join(unsupported[:_MAX_LISTED])
            expl += f"; and {more} more" if more > 0 else ""
        if truncated:
            expl += f"; {truncated} {what} cut to fit the model's {self.runtime.max_length}-token window"
        return Score(name, value, explanation=expl, sentences=tuple(sentences) if with_sentences else ())


def band_verdict(probability: float) -> SentenceVerdict:
    """The three-way verdict of a sentence from the model's probability that the contexts support it."""
    if probability >= DECISION_THRESHOLD:
        return "supported"
    return "uncertain" if probability >= FAIL_BELOW else "fail"


# --- claims ---------------------------------------------------------------------------------------


def _claims(text: str, prefix: str, *, drop_tail: bool) -> list[_Claim]:
    """The sentences of ``text`` worth judging, each with its hypothesis variants."""
    sentences = split_sentences(text)
    if drop_tail and sentences:
        last = sentences[-1]
        if not _TERMINATED.search(last.text) and "\n" not in text[last.end:]:
            sentences.pop()
    previous = ""
    if prefix.strip():
        tail = split_sentences(prefix[-_PREFIX_TAIL:])
        previous = tail[-1].text if tail else ""
    out: list[_Claim] = []
    for s in sentences:
        body = s.text
        if not _is_claim(body):
            previous = body
            continue
        variants: tuple[str, ...] = (body,)
        if previous and _PRONOUN.match(body):
            variants = (body, f"{previous} {body}")
        out.append(_Claim(s, variants))
        previous = body
    return out


def _is_claim(sentence: str) -> bool:
    if sentence.rstrip("\"')]}”’*").endswith("?"):
        return False
    return not analyze(normalize(sentence)).meta_only


def _passage(claim: str, contexts: tuple[str, ...], res: ClaimResult) -> str:
    """The sentence of the best window that shares the most words with ``claim`` (a short quote)."""
    if res.context < 0:
        return ""
    window = contexts[res.context][res.start:res.end]
    words = {w.lower() for w in _WORD.findall(claim)}
    best, best_hits = "", -1
    for s in split_sentences(window):
        hits = len(words & {w.lower() for w in _WORD.findall(s.text)})
        if hits > best_hits:
            best, best_hits = s.text, hits
    return _quote(best)


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 3] + "..."


def _has_text(contexts: Sequence[str]) -> bool:
    return any(c and c.strip() for c in contexts)


# --- settings and the shared runtime ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Options:
    path: str
    backend: str
    batch_size: int
    max_batch_ms: float
    threads: int
    max_length: int
    queue_size: int


def _options(settings: Settings) -> _Options:
    if not settings.model_path or not settings.model_path.strip():
        raise ConfigError(
            "the model judge needs STREAMJUDGE_MODEL_PATH: a directory with config.json, tokenizer.json "
            "and model.onnx (or a hub model id where the hub is reachable)"
        )
    checks = (
        ("STREAMJUDGE_MODEL_BATCH_SIZE", settings.model_batch_size, 1),
        ("STREAMJUDGE_MODEL_MAX_BATCH_MS", settings.model_max_batch_ms, 0),
        ("STREAMJUDGE_MODEL_THREADS", settings.model_threads, 0),
        ("STREAMJUDGE_MODEL_MAX_LENGTH", settings.model_max_length, 0),
        ("STREAMJUDGE_MODEL_QUEUE_SIZE", settings.model_queue_size, 1),
    )
    for var, value, low in checks:
        if value < low:
            raise ConfigError(f"{var}={value!r}: must be >= {low}")
    backend = settings.model_backend.strip().lower()
    if backend not in _BACKENDS:
        raise ConfigError(f"STREAMJUDGE_MODEL_BACKEND={settings.model_backend!r}: use one of {_BACKENDS}")
    return _Options(settings.model_path.strip(), backend, settings.model_batch_size,
                    settings.model_max_batch_ms, settings.model_threads, settings.model_max_length,
                    settings.model_queue_size)


def _load_spec(options: _Options) -> ModelSpec:
    try:
        spec = read_spec(resolve_directory(options.path, options.backend), max_length=options.max_length)
    except ModelFileError as exc:
        raise ConfigError(f"STREAMJUDGE_MODEL_PATH={options.path!r}: {exc}") from None
    needs = ["tokenizers", "numpy"]
    if options.backend == "onnx" or (options.backend == "auto" and spec.onnx_file is not None):
        if spec.onnx_file is None:
            raise ConfigError(
                f"STREAMJUDGE_MODEL_PATH={options.path!r}: no model.onnx (or onnx/model.onnx) in "
                f"{str(spec.directory)!r}; export the model to ONNX or set STREAMJUDGE_MODEL_BACKEND=torch"
            )
        needs.append("onnxruntime")
    else:
        needs += ["torch", "transformers"]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        hint = "pip install torch transformers" if "torch" in missing else "pip install 'streamjudge[model]'"
        raise ConfigError(f"the model judge needs {', '.join(missing)} ({hint})")
    return spec


_RUNTIMES_LOCK = threading.Lock()
_RUNTIMES: dict[_Options, tuple[ModelRuntime, int]] = {}


def _shared_runtime(options: _Options) -> tuple[ModelRuntime, Any]:
    """One runtime per model and options, counted by its users; the last one to leave shuts it down."""
    with _RUNTIMES_LOCK:
        entry = _RUNTIMES.get(options)
        if entry is None:
            spec = _load_spec(options)
            runtime = ModelRuntime(spec, backend=options.backend, threads=options.threads,
                                   batch_size=options.batch_size, max_batch_ms=options.max_batch_ms,
                                   queue_size=options.queue_size)
            entry = (runtime, 0)
        _RUNTIMES[options] = (entry[0], entry[1] + 1)
        runtime = entry[0]
    released = False

    def release() -> None:
        nonlocal released
        with _RUNTIMES_LOCK:
            if released:
                return
            released = True
            current = _RUNTIMES.get(options)
            if current is None or current[0] is not runtime:
                return
            if current[1] > 1:
                _RUNTIMES[options] = (runtime, current[1] - 1)
                return
            del _RUNTIMES[options]
        runtime.shutdown()

    return runtime, release
