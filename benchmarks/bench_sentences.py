"""Micro-benchmark of the sentence buffer's per-token cost.

    python benchmarks/bench_sentences.py [--data DIR] [--json]

Measures (best of ``--repeat`` runs, ns per token):

* ``fast``: tokens without any sentence-end or line-break character, the hot path every stream takes for
  most tokens (one precompiled character-class search, one append);
* ``stop+resolve``: alternating ``" end."`` / ``" Next"`` tokens, both on the slow path: the first holds a
  candidate, the second decides it and emits the sentence;
* ``faithbench``: the FaithBench dev summaries (``../shared/benchdata/faithbench-dev`` relative to the
  repository root) cut into sub-word tokens of at most 4 characters, fed and flushed per answer;
* ``faithbench words``: the same summaries cut like ``tokenize()`` in ``benchmarks/run.py`` (a word and its
  trailing space, long words cut at 6 chars), the token stream the hot-path benchmark streams; the
  average per token over real text, stops and the tokens that decide them included;
* ``floor``: a bare ``list.append`` per token in the same loop, for scale;
* ``1MB token``: one 1 MB token without any stop (force-split at 1000 chars), in ms.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from streamjudge.sentences import SentenceBuffer, split_sentences

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import tokenize

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "benchdata" / "faithbench-dev"
_SPECIAL = frozenset(".!?\n…。！？")


def _best_ns(run: Callable[[], int], repeat: int) -> float:
    """Best ns per token over ``repeat`` runs; ``run`` returns the number of tokens it fed."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter_ns()
        count = run()
        best = min(best, (time.perf_counter_ns() - started) / count)
    return best


def _fast(repeat: int) -> float:
    tokens = [" the", "ing", " answer", ",", " of", " model", " gross", "ed", " 181", " budget"] * 2000

    def run() -> int:
        feed = SentenceBuffer(max_sentence_chars=10**9).feed  # no run-on cut: only the hot path
        for token in tokens:
            feed(token)
        return len(tokens)

    return _best_ns(run, repeat)


def _floor(repeat: int) -> float:
    tokens = [" the", "ing", " answer", ",", " of", " model", " gross", "ed", " 181", " budget"] * 2000

    def run() -> int:
        sink: list[str] = []
        append = sink.append
        for token in tokens:
            append(token)
        return len(tokens)

    return _best_ns(run, repeat)


def _stop_and_resolve(repeat: int) -> float:
    tokens = [" end.", " Next"] * 10000

    def run() -> int:
        feed = SentenceBuffer().feed
        emitted = 0
        for token in tokens:
            emitted += len(feed(token))
        assert emitted == len(tokens) // 2  # every " Next" decides the " end." before it
        return len(tokens)

    return _best_ns(run, repeat)


def _subword_tokens(text: str) -> list[str]:
    """Cut text like a BPE tokenizer roughly would: a word with its leading space, at most 4 chars each."""
    out: list[str] = []
    for word in re.findall(r"\s*\S+|\s+", text):
        out.extend(word[i : i + 4] for i in range(0, len(word), 4))
    return out



def _faithbench(
    data: Path, repeat: int, tokenize: Callable[[str], list[str]] = _subword_tokens
) -> dict[str, float] | None:
    files = sorted(data.glob("batch_*.json"))
    if not files:
        return None
    answers = [s["summary"] for f in files for s in json.loads(f.read_text())["samples"]]
    streams = [tokenize(a) for a in answers]
    tokens = sum(len(s) for s in streams)
    special = sum(1 for s in streams for t in s if not _SPECIAL.isdisjoint(t))

    def run() -> int:
        for stream in streams:
            buffer = SentenceBuffer()
            feed = buffer.feed
            for token in stream:
                feed(token)
            buffer.flush()
        return tokens

    ns = _best_ns(run, repeat)
    sentences = sum(len(split_sentences(a)) for a in answers)
    return {
        "answers": len(answers),
        "tokens": tokens,
        "sentences": sentences,
        "tokens_with_stop_or_newline": special / tokens,
        "ns_per_token": ns,
    }


def _one_megabyte_ms() -> float:
    text = "x" * 1_000_000
    started = time.perf_counter_ns()
    buffer = SentenceBuffer()
    out = buffer.feed(text) + buffer.flush()
    assert len(out) == 1000
    return (time.perf_counter_ns() - started) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    results: dict[str, object] = {
        "fast_ns_per_token": _fast(args.repeat),
        "stop_and_resolve_ns_per_token": _stop_and_resolve(args.repeat),
        "floor_append_ns_per_token": _floor(args.repeat),
        "faithbench": _faithbench(args.data, args.repeat),
        "faithbench_words": _faithbench(args.data, args.repeat, tokenize),
        "one_megabyte_token_ms": _one_megabyte_ms(),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"fast path (no stop/newline)       {results['fast_ns_per_token']:8.0f} ns/token")
    print(f"stop + resolving token (slow)     {results['stop_and_resolve_ns_per_token']:8.0f} ns/token")
    print(f"floor: list.append in the loop    {results['floor_append_ns_per_token']:8.0f} ns/token")
    for key, label in (("faithbench", "sub-word"), ("faithbench_words", "word-wise")):
        fb = results[key]
        if isinstance(fb, dict):
            print(
                f"faithbench summaries, {label:9s}   {fb['ns_per_token']:8.0f} ns/token "
                f"({fb['answers']:.0f} answers, {fb['tokens']:.0f} tokens, {fb['sentences']:.0f} sentences, "
                f"{fb['tokens_with_stop_or_newline']:.1%} tokens with a stop or newline)"
            )
        else:
            print(f"faithbench summaries, {label:9s}   skipped (no data in {args.data})")
    print(f"one 1 MB token, no stop           {results['one_megabyte_token_ms']:8.1f} ms")


if __name__ == "__main__":
    main()
