"""Inference for the ``model`` judge: one worker thread that batches (context, claim) pairs.

Like the SDK's BatchProcessor, one small class owns one job: :class:`ModelRuntime` has a bounded inbox,
one worker thread and a condition to wake it. ``evaluate`` calls of any number of judges and streams put
:class:`ClaimRequest` s in; the worker tokenises them (``tokenizers``, Rust), splits long contexts into
windows that fit the model beside the claim, gathers pairs across requests into batches of up to
``batch_size`` pairs (waiting at most ``max_batch_ms`` for a batch to fill), runs the model (ONNX Runtime
releases the GIL while it runs, so the application's threads keep running) and resolves each request's
future once all its pairs are scored.

A request whose deadline passed, or whose caller gave up (its future cancelled by the judge pool's
timeout), is dropped before its pairs are run, and a batch is given until the latest deadline among its
requests: past it, a watchdog stops the ONNX Runtime run between two graph nodes. Work nobody waits for
any more never makes later work pile up behind it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamjudge._fork import after_fork_in_child
from streamjudge.judging.judges._model_files import ModelSpec

# tokenised contexts are kept (a stream's contexts come back at every checkpoint) up to this many tokens
# in all, as flat int32 char offsets: 8 bytes a token
_CONTEXT_CACHE_TOKENS = 2_000_000
_OVERLAP_DIV = 8  # consecutive context windows overlap by 1/8 of a window, at least the claim's length


class ModelRuntimeError(Exception):
    """Inference could not run (model failed to load or to run); the message says why."""


class QueueFullError(ModelRuntimeError):
    """More claims are pending than the runtime's queue holds."""


class DeadlineError(ModelRuntimeError):
    """A request's deadline passed before its pairs were scored."""


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The best score of one claim over all context windows (and its hypothesis variants).

    ``context`` / ``start`` / ``end`` locate the best window (char offsets in that context); ``variant`` is
    which hypothesis variant scored best; ``truncated`` counts the claim's tokens cut to fit the window.
    """

    score: float
    context: int
    start: int
    end: int
    variant: int
    truncated: int


@dataclass(slots=True)
class ClaimRequest:
    """Claims to score against one contexts tuple. Each claim is one or more hypothesis variants."""

    claims: Sequence[Sequence[str]]
    contexts: tuple[str, ...]
    deadline: float
    future: Future[list[ClaimResult]] = field(default_factory=Future)
    enqueued: float = 0.0
    # filled in by the worker
    best: list[ClaimResult | None] = field(default_factory=list)
    remaining: int = 0


@dataclass(slots=True)
class _Pair:
    request: ClaimRequest
    claim: int
    variant: int
    premise: str
    hypothesis: str
    context: int
    start: int
    end: int
    truncated: int


@dataclass(slots=True)
class RuntimeStats:
    """Counters of the worker (read for benchmarks and tests; not locked: approximate while running)."""

    requests: int = 0
    batches: int = 0
    pairs: int = 0
    largest_batch: int = 0
    truncated_claims: int = 0
    dropped_requests: int = 0
    run_seconds: float = 0.0
    # seconds of the most recent batches (tokenising + model run), for latency percentiles
    batch_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=4096))


class Backend(Protocol):
    """Runs the classifier on one padded batch; returns logits ``[batch, n_labels]``.

    ``deadline`` (``time.monotonic``) is the batch's time budget: a backend that can stop a run midway
    raises :class:`DeadlineError` once it passes; one that cannot may ignore it.
    """

    #: the sequence length the model was exported with, when it is fixed (``None``: any length)
    fixed_length: int | None

    def run(self, input_ids: Any, attention_mask: Any, token_type_ids: Any, deadline: float) -> Any: ...

    def close(self) -> None: ...


class _Watchdog:
    """Sets ONNX Runtime's ``RunOptions.terminate`` when the running batch's deadline passes.

    One thread per backend, armed and disarmed around each run (a lock and a notify: microseconds), so a
    batch that nobody waits for any more stops at its next graph node instead of running to the end.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: tuple[Any, float] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, run_options: Any, deadline: float) -> None:
        with self._cond:
            self._armed = (run_options, deadline)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="streamjudge-model-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._armed = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                armed = self._armed
                if armed is None:
                    self._cond.wait()
                    continue
                remaining = armed[1] - time.monotonic()
                if remaining > 0:
                    self._cond.wait(min(remaining, threading.TIMEOUT_MAX))
                    continue
                armed[0].terminate = True
                self._armed = None


class OnnxBackend:
    """ONNX Runtime on CPU (or whichever provider the installed onnxruntime package brings first)."""

    def __init__(self, spec: ModelSpec, threads: int) -> None:
        try:
            import numpy as np
            import onnxruntime as ort
        except ImportError as exc:
            raise ModelRuntimeError(
                f"the model judge needs onnxruntime and numpy ({exc}); pip install 'streamjudge[model]'"
            ) from None
        if spec.onnx_file is None:
            raise ModelRuntimeError(f"model directory {str(spec.directory)!r} has no model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(0, threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # graph-optimiser notes would land in the application's stderr
        try:
            self._session = ort.InferenceSession(
                str(spec.onnx_file), sess_options=options, providers=ort.get_available_providers()
            )
        except Exception as exc:  # a corrupt or incompatible graph
            raise ModelRuntimeError(f"ONNX Runtime cannot load {str(spec.onnx_file)!r}: {exc}") from None
        self._np = np
        self._ort = ort
        self._watchdog = _Watchdog()
        self._inputs = {i.name: (np.int32 if i.type == "tensor(int32)" else np.int64)
                        for i in self._session.get_inputs()}
        for required in ("input_ids", "attention_mask"):
            if required not in self._inputs:
                raise ModelRuntimeError(
                    f"{str(spec.onnx_file)!r} has inputs {sorted(self._inputs)!r}; the model judge feeds "
                    "input_ids, attention_mask (and token_type_ids when the graph has it)"
                )
        outputs = [o.name for o in self._session.get_outputs()]
        self._output = "logits" if "logits" in outputs else outputs[0]
        # a graph exported with a static sequence length takes inputs padded to exactly that length
        dims = [i.shape[1] for i in self._session.get_inputs() if len(i.shape) == 2]
        fixed = {d for d in dims if isinstance(d, int) and d > 0}
        self.fixed_length: int | None = min(fixed) if fixed else None

    def run(self, input_ids: Any, attention_mask: Any, token_type_ids: Any, deadline: float) -> Any:
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = token_type_ids
        feed = {k: v.astype(self._inputs[k], copy=False) for k, v in feed.items()}
        options = self._ort.RunOptions()
        if math.isfinite(deadline):
            self._watchdog.arm(options, deadline)
        try:
            return self._session.run([self._output], feed, options)[0]
        except Exception:
            if options.terminate:
                raise DeadlineError(
                    "the batch ran past the deadline of every claim in it and was stopped"
                ) from None
            raise
        finally:
            self._watchdog.disarm()

    def close(self) -> None:
        self._watchdog.close()


class TorchBackend:
    """transformers' AutoModelForSequenceClassification on CUDA when available (imported only here)."""

    def __init__(self, spec: ModelSpec, threads: int) -> None:
        try:
            import torch
            from transformers import AutoModelForSequenceClassification
        except ImportError as exc:
            raise ModelRuntimeError(
                f"STREAMJUDGE_MODEL_BACKEND=torch needs torch and transformers ({exc}); or export the model "
                "to ONNX and use the onnx backend"
            ) from None
        self._torch = torch
        self._device = "cuda" if torch.cuda.is_available() else "cpu"
        if self._device == "cpu" and threads > 0:
            torch.set_num_threads(threads)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(str(spec.directory))
        except Exception as exc:
            raise ModelRuntimeError(f"transformers cannot load {str(spec.directory)!r}: {exc}") from None
        self._model = model.to(self._device).eval()
        self.fixed_length: int | None = None
        type_vocab = getattr(model.config, "type_vocab_size", 0) or 0
        self._types = type_vocab > 1

    def run(self, input_ids: Any, attention_mask: Any, token_type_ids: Any, deadline: float) -> Any:
        del deadline  # a torch forward pass cannot be stopped midway; requests past it are dropped before
        torch = self._torch
        feed = {
            "input_ids": torch.from_numpy(input_ids).to(self._device),
            "attention_mask": torch.from_numpy(attention_mask).to(self._device),
        }
        if self._types:
            feed["token_type_ids"] = torch.from_numpy(token_type_ids).to(self._device)
        with torch.inference_mode():
            logits = self._model(**feed).logits
        return logits.float().cpu().numpy()

    def close(self) -> None:
        """Nothing to stop; the model is freed with the backend."""


def make_backend(spec: ModelSpec, kind: str, threads: int) -> Backend:
    """The backend called ``kind`` (``onnx``, ``torch``, ``auto``: ONNX when model.onnx exists)."""
    if kind == "onnx" or (kind == "auto" and spec.onnx_file is not None):
        return OnnxBackend(spec, threads)
    if kind in ("torch", "auto"):
        return TorchBackend(spec, threads)
    raise ModelRuntimeError(f"unknown model backend {kind!r}: use onnx, torch or auto")


class PairScorer:
    """Tokenises and scores pairs. Used by the worker thread only (a tokenizer's settings are not shared)."""

    def __init__(self, spec: ModelSpec, backend: Backend) -> None:
        import numpy as np
        from tokenizers import Tokenizer

        self.spec = spec
        self._np = np
        self._backend = backend
        text = spec.tokenizer_file.read_text(encoding="utf-8")
        # raw: lengths and char offsets of single texts; pair: the model's input (template, window, padding)
        self._raw = Tokenizer.from_str(text)
        self._raw.no_truncation()
        self._raw.no_padding()
        fixed = backend.fixed_length
        #: the pair's token window: the model's, or less when the graph's inputs have a fixed length
        self.max_length = min(spec.max_length, fixed) if fixed else spec.max_length
        self._pair = Tokenizer.from_str(text)
        self._pair.enable_truncation(self.max_length, strategy="longest_first")
        pad_id, pad_token = _pad(self._pair)
        self._pair.enable_padding(pad_id=pad_id, pad_token=pad_token, length=fixed)
        # a prompt-template model (HHEM-2.1) reads one text: the template with premise and hypothesis in it
        self._prompt = spec.prompt
        self.specials = self._pair.num_special_tokens_to_add(self._prompt is None)
        if self._prompt is not None:
            empty = _fill(self._prompt, "", "")
            self.specials += len(self._raw.encode(empty, add_special_tokens=False).ids)
        if self.max_length <= self.specials + 2:
            raise ModelRuntimeError(
                f"a {self.max_length}-token window leaves no room for a pair ({self.specials} special and "
                "prompt tokens)"
            )
        self._contexts: OrderedDict[str, array[int]] = OrderedDict()
        self._cached_tokens = 0

    def expand(self, request: ClaimRequest) -> list[_Pair]:
        """The pairs of ``request``: every claim variant against every window of every context."""
        variants = [(ci, vi, h) for ci, claim in enumerate(request.claims) for vi, h in enumerate(claim)]
        lengths = [len(e.ids) for e in self._raw.encode_batch([h for _, _, h in variants],
                                                                add_special_tokens=False)]
        offsets = self._context_offsets(request.contexts)
        budget = self.max_length - self.specials
        pairs: list[_Pair] = []
        for (ci, vi, hypothesis), n_claim in zip(variants, lengths, strict=True):
            kept = min(n_claim, budget // 2)
            width = budget - kept
            truncated = n_claim - kept
            for xi, (context, offs) in enumerate(zip(request.contexts, offsets, strict=True)):
                for a, b in _windows(len(offs) // 2, width, kept):
                    start, end = offs[2 * a], offs[2 * b - 1]
                    pairs.append(_Pair(request, ci, vi, context[start:end], hypothesis, xi, start, end,
                                       truncated))
        return pairs

    def close(self) -> None:
        """Stop the backend's helper thread."""
        self._backend.close()

    def score(self, pairs: Sequence[_Pair], deadline: float = math.inf) -> list[float]:
        """Scores of ``pairs`` (probability of the supporting label), one model run within ``deadline``."""
        np = self._np
        if self._prompt is None:
            encodings = self._pair.encode_batch([(p.premise, p.hypothesis) for p in pairs])
        else:
            encodings = self._pair.encode_batch([_fill(self._prompt, p.premise, p.hypothesis) for p in pairs])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        logits = np.asarray(self._backend.run(ids, mask, types, deadline), dtype=np.float64)
        if logits.ndim != 2 or logits.shape[0] != len(pairs):
            raise ModelRuntimeError(f"the model returned shape {logits.shape}, expected [batch, labels]")
        spec = self.spec
        if spec.mode == "softmax":
            if logits.shape[1] != len(spec.labels):
                raise ModelRuntimeError(
                    f"the model has {logits.shape[1]} outputs but config.json names {len(spec.labels)} labels"
                )
            shifted = logits - logits.max(axis=1, keepdims=True)
            exp = np.exp(shifted)
            probs = exp[:, spec.positive] / exp.sum(axis=1)
        else:
            column = logits[:, spec.positive if logits.shape[1] > spec.positive else 0]
            probs = 1.0 / (1.0 + np.exp(-np.clip(column, -60.0, 60.0)))
            if spec.mode == "sigmoid_inverted":
                probs = 1.0 - probs
        return [min(1.0, max(0.0, float(p))) for p in probs]

    def _context_offsets(self, contexts: tuple[str, ...]) -> list[array[int]]:
        """Each context's token char offsets, flat: ``[start0, end0, start1, end1, ...]``."""
        out: list[array[int] | None] = []
        todo: list[int] = []
        for i, c in enumerate(contexts):
            hit = self._contexts.get(c)
            if hit is not None:
                self._contexts.move_to_end(c)
            else:
                todo.append(i)
            out.append(hit)
        if todo:
            encoded = self._raw.encode_batch([contexts[i] for i in todo], add_special_tokens=False)
            for i, enc in zip(todo, encoded, strict=True):
                offs = array("i", [x for o in enc.offsets if o[1] > o[0] for x in o])
                out[i] = offs
                self._contexts[contexts[i]] = offs
                self._cached_tokens += len(offs) // 2
            while self._cached_tokens > _CONTEXT_CACHE_TOKENS and len(self._contexts) > 1:
                _, dropped = self._contexts.popitem(last=False)
                self._cached_tokens -= len(dropped) // 2
        return [o if o is not None else array("i") for o in out]


def _windows(n: int, width: int, claim: int) -> list[tuple[int, int]]:
    """Token windows ``[a, b)`` of ``width`` covering ``n`` tokens. Consecutive windows overlap by an eighth
    of a window and at least by the claim's length (up to half a window), so a passage about as long as
    the claim that one window's edge cuts is whole in the next one."""
    if n == 0:
        return []
    if n <= width:
        return [(0, n)]
    overlap = min(width // 2, max(width // _OVERLAP_DIV, claim))
    step = max(1, width - overlap)
    out = [(a, a + width) for a in range(0, n - width, step)]
    out.append((n - width, n))
    return out


def _fill(prompt: str, premise: str, hypothesis: str) -> str:
    # not str.format: braces inside the texts or the template must stay as they are
    return prompt.replace("{text1}", premise).replace("{text2}", hypothesis)


def _pad(tokenizer: Any) -> tuple[int, str]:
    for token in ("[PAD]", "<pad>", "<|pad|>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id), token
    return 0, "[PAD]"


class ModelRuntime:
    """The worker thread and its bounded inbox. Thread-safe; the backend loads on the worker at first use.

    ``queue_size`` bounds the claims waiting or in flight; a request that would exceed it is refused with
    :class:`QueueFullError` (one request larger than the whole queue is still taken when nothing else is
    pending, so a long final answer can be judged on an idle runtime).
    """

    def __init__(self, spec: ModelSpec, *, backend: str = "auto", threads: int = 1, batch_size: int = 16,
                 max_batch_ms: float = 5.0, queue_size: int = 1024) -> None:
        self.spec = spec
        self._backend_kind = backend
        self._threads = threads
        self.batch_size = batch_size
        self.max_batch_s = max(0.0, max_batch_ms) / 1000.0
        self.queue_size = queue_size
        self.stats = RuntimeStats()
        self._init_state()
        after_fork_in_child(self, ModelRuntime._init_state)

    def _init_state(self) -> None:
        # also the fork hook: the worker thread, its lock and ONNX Runtime's threads do not survive a fork
        self._cond = threading.Condition(threading.Lock())
        self._inbox: deque[ClaimRequest] = deque()
        self._pending_claims = 0
        self._thread: threading.Thread | None = None
        self._shutdown = False
        self._scorer: PairScorer | None = None
        self._load_lock = threading.Lock()
        self._load_error: ModelRuntimeError | None = None
        self._sweep = False  # set when a caller cancelled: the worker drops dead pairs at once

    def submit(self, request: ClaimRequest) -> Future[list[ClaimResult]]:
        """Queue ``request``; its future resolves to one :class:`ClaimResult` per claim."""
        n = len(request.claims)
        with self._cond:
            if self._shutdown:
                raise ModelRuntimeError("the model runtime is shut down")
            if self._load_error is not None:
                raise self._load_error
            if self._pending_claims and self._pending_claims + n > self.queue_size:
                raise QueueFullError(
                    f"{self._pending_claims} claims are already waiting for the model "
                    f"(STREAMJUDGE_MODEL_QUEUE_SIZE={self.queue_size})"
                )
            self._pending_claims += n
            request.enqueued = time.monotonic()
            self._inbox.append(request)
            self._start_locked()
            self._cond.notify()
        # a caller that gives up (cancels the future) wakes the worker, which drops its pairs (outside the
        # lock: a future cancelled already runs the callback at once)
        request.future.add_done_callback(self._wake)
        return request.future

    def start(self) -> None:
        """Start the worker, which loads the model at once (off the calling thread) and then waits."""
        with self._cond:
            if not self._shutdown:
                self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="streamjudge-model", daemon=True)
            self._thread.start()

    def _wake(self, future: Future[list[ClaimResult]]) -> None:
        if future.cancelled():
            with self._cond:
                self._sweep = True
                self._cond.notify()

    @property
    def max_length(self) -> int:
        """The pair's token window (known for sure once the model is loaded: a static graph may cut it)."""
        scorer = self._scorer
        return scorer.max_length if scorer is not None else self.spec.max_length

    @property
    def pending_claims(self) -> int:
        """Claims queued or being scored."""
        return self._pending_claims

    def preload(self) -> None:
        """Load the model now on the calling thread (tests, benchmarks, warm-up at startup)."""
        with self._load_lock:  # the worker may be loading it at the same time
            if self._scorer is None:
                backend = make_backend(self.spec, self._backend_kind, self._threads)
                self._scorer = PairScorer(self.spec, backend)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the worker; requests still pending fail with :class:`ModelRuntimeError`."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    # --- worker ------------------------------------------------------------------------------------

    def _work(self) -> None:
        pairs: deque[_Pair] = deque()
        self._ensure_scorer([], pairs)  # load before the first claims arrive
        while True:
            with self._cond:
                while not self._inbox and not pairs and not self._shutdown:
                    self._cond.wait()
                if self._shutdown:
                    leftover = list(self._inbox)
                    self._inbox.clear()
                    break
                incoming = list(self._inbox)
                self._inbox.clear()
            scorer = self._ensure_scorer(incoming, pairs)
            if scorer is None:
                continue
            for request in incoming:
                self._expand(scorer, request, pairs)
            if self._sweep:  # a caller gave up: give its queue places back now, not when its turn comes
                self._sweep = False
                self._drop_dead(pairs)
            if not pairs:
                continue
            wait = pairs[0].request.enqueued + self.max_batch_s - time.monotonic()
            if len(pairs) < self.batch_size and wait > 0:
                # wait for the batch to fill; a newcomer, a cancelled caller or shutdown wakes us early and
                # the loop decides again
                with self._cond:
                    if not self._inbox and not self._shutdown:
                        self._cond.wait(wait)
                continue
            batch = self._take(pairs)
            if batch:
                self._run(scorer, batch)
        # shutting down: nothing more runs
        if self._scorer is not None:
            self._scorer.close()
        gone = {id(p.request): p.request for p in pairs}
        for request in [*leftover, *gone.values()]:
            self._fail(request, ModelRuntimeError("the runtime shut down before the claims were scored"))

    def _ensure_scorer(self, incoming: list[ClaimRequest], pairs: deque[_Pair]) -> PairScorer | None:
        if self._scorer is not None:
            return self._scorer
        if self._load_error is not None:  # loading failed before: do not try again for every request
            for request in incoming:
                self._fail(request, self._load_error)
            return None
        try:
            self.preload()
        except ModelRuntimeError as exc:
            error: ModelRuntimeError = exc
        except Exception as exc:  # a tokenizer.json the library cannot read, an odd backend failure
            error = ModelRuntimeError(f"the model cannot be loaded: {type(exc).__name__}: {exc}")
        else:
            return self._scorer
        with self._cond:
            self._load_error = error
            incoming.extend(self._inbox)
            self._inbox.clear()
        for request in {id(r): r for r in [*incoming, *(p.request for p in pairs)]}.values():
            self._fail(request, error)
        pairs.clear()
        return None

    def _expand(self, scorer: PairScorer, request: ClaimRequest, pairs: deque[_Pair]) -> None:
        self.stats.requests += 1
        try:
            new = scorer.expand(request)
        except Exception as exc:
            self._fail(request, ModelRuntimeError(f"cannot tokenise the claims: {type(exc).__name__}: {exc}"))
            return
        request.best = [None] * len(request.claims)
        request.remaining = len(new)
        self.stats.truncated_claims += len({p.claim for p in new if p.truncated})
        if not new:
            self._finish(request)
            return
        pairs.extend(new)

    def _take(self, pairs: deque[_Pair]) -> list[_Pair]:
        """The next batch: up to ``batch_size`` pairs from the front whose request still waits."""
        now = time.monotonic()
        batch: list[_Pair] = []
        while pairs and len(batch) < self.batch_size:
            p = pairs.popleft()
            if self._alive(p.request, now):
                batch.append(p)
        return batch

    def _drop_dead(self, pairs: deque[_Pair]) -> None:
        """Leave out every pair whose request was cancelled, failed or ran past its deadline."""
        now = time.monotonic()
        keep = [p for p in pairs if self._alive(p.request, now)]
        if len(keep) != len(pairs):
            pairs.clear()
            pairs.extend(keep)

    def _alive(self, request: ClaimRequest, now: float) -> bool:
        """Whether ``request`` still waits for its scores (a dead one is released or failed here)."""
        if request.future.done():  # cancelled by its caller (the judge pool's timeout), or failed
            self._release(request)
            return False
        if now > request.deadline:
            self._fail(request, DeadlineError(
                f"the model did not reach these claims within their deadline "
                f"({request.deadline - request.enqueued:.3g}s after they were queued)"
            ))
            return False
        return True

    def _run(self, scorer: PairScorer, batch: list[_Pair]) -> None:
        t0 = time.perf_counter()
        try:
            # the batch's budget: the latest deadline among its requests (past it, nobody waits for any)
            scores = scorer.score(batch, max(p.request.deadline for p in batch))
        except Exception as exc:
            error = exc if isinstance(exc, ModelRuntimeError) else ModelRuntimeError(
                f"the model failed on a batch of {len(batch)} pairs: {type(exc).__name__}: {exc}"
            )
            for request in {id(p.request): p.request for p in batch}.values():
                self._fail(request, error)
            return
        finally:
            elapsed = time.perf_counter() - t0
            self.stats.run_seconds += elapsed
            self.stats.batch_seconds.append(elapsed)
        self.stats.batches += 1
        self.stats.pairs += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        for p, s in zip(batch, scores, strict=True):
            request = p.request
            if request.remaining < 0:  # failed or released meanwhile
                continue
            current = request.best[p.claim]
            if current is None or s > current.score:
                request.best[p.claim] = ClaimResult(s, p.context, p.start, p.end, p.variant, p.truncated)
            request.remaining -= 1
            if request.remaining == 0:
                self._finish(request)

    def _finish(self, request: ClaimRequest) -> None:
        self._release(request)
        results = [r if r is not None else ClaimResult(0.0, -1, 0, 0, 0, 0) for r in request.best]
        with contextlib.suppress(InvalidStateError):  # cancelled by its caller meanwhile
            request.future.set_result(results)

    def _fail(self, request: ClaimRequest, error: Exception) -> None:
        self._release(request)
        self.stats.dropped_requests += 1
        with contextlib.suppress(InvalidStateError):
            request.future.set_exception(error)

    def _release(self, request: ClaimRequest) -> None:
        with self._cond:
            if request.remaining >= 0:  # released once
                self._pending_claims -= len(request.claims)
                request.remaining = -1
