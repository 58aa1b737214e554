"""The SSE parser's cost with chunking: a body cut into 1 KB chunks against the same body in one chunk.

    python benchmarks/bench_sse_parser.py [--repeat N] [--json]

A parser that re-scans its buffer on every chunk is quadratic in the size of an unfinished frame: a 4 MB
frame in 1 KB chunks then costs seconds on the event loop (and holds the client's bytes as long). A
linear parser takes about the same time either way, so the ratio ``chunked / whole`` stays near 1.

Cases (each timed ``--repeat`` times; min / median / max in ms, ratio of the medians):

* ``4MB frame``: one ``data:`` frame with a 4 MB JSON token (over the parser's frame cap: passed through);
* ``900KB frame``: the same under the cap (parsed);
* ``20k data lines``: 20 000 ``data:`` lines of one frame without a blank line until the end, one line
  per chunk in the chunked run;
* ``token frames``: 20 000 ordinary ``event: token`` frames, one frame per chunk (the hot path), in the
  chunked run, against all of them in one chunk;
* ``ndjson 4MB line`` / ``ndjson 900KB line`` / ``ndjson lines``: the same for :class:`JSONLinesParser`
  (a JSON-lines body), the last one 20 000 ``{"token": ...}`` lines, one per chunk.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from streamjudge.instrumentation._sse import JSONLinesParser, SSEParser


def _frame(size: int) -> bytes:
    return b'event: token\ndata: {"token": "' + b"x" * size + b'"}\n\n'


def _cut(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


Parser = SSEParser | JSONLinesParser


def _run(chunks: list[bytes], make: Callable[[], Parser] = SSEParser) -> Callable[[], int]:
    def run() -> int:
        parser = make()
        sent = 0
        for chunk in chunks:
            complete, _, _ = parser.feed_split(chunk)
            sent += len(complete)
        return sent + len(parser.flush())

    return run


def _times(run: Callable[[], int], repeat: int, size: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        assert run() == size  # every byte went out
        out.append((time.perf_counter() - started) * 1000)
    return out


Case = tuple[bytes, list[bytes], Callable[[], Parser]]


def _cases() -> dict[str, Case]:
    big = _frame(4 << 20)
    under = _frame(900 << 10)
    lines = b"".join(b"data: line %d\n" % i for i in range(20_000)) + b"\n"
    frames = [b'event: token\ndata: {"token": " tok%d"}\n\n' % i for i in range(20_000)]
    big_line = b'{"token": "' + b"x" * (4 << 20) + b'"}\n'
    under_line = b'{"token": "' + b"x" * (900 << 10) + b'"}\n'
    json_lines = [b'{"token": " tok%d"}\n' % i for i in range(20_000)]
    return {
        "4MB frame": (big, _cut(big, 1024), SSEParser),
        "900KB frame": (under, _cut(under, 1024), SSEParser),
        "20k data lines": (lines, lines.splitlines(keepends=True), SSEParser),
        "token frames": (b"".join(frames), frames, SSEParser),
        "ndjson 4MB line": (big_line, _cut(big_line, 1024), JSONLinesParser),
        "ndjson 900KB line": (under_line, _cut(under_line, 1024), JSONLinesParser),
        "ndjson lines": (b"".join(json_lines), json_lines, JSONLinesParser),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = {}
    for name, (body, chunks, make) in _cases().items():
        whole = _times(_run([body], make), args.repeat, len(body))
        chunked = _times(_run(chunks, make), args.repeat, len(body))
        report[name] = {
            "chunks": len(chunks),
            "whole_ms": [min(whole), statistics.median(whole), max(whole)],
            "chunked_ms": [min(chunked), statistics.median(chunked), max(chunked)],
            "ratio": statistics.median(chunked) / statistics.median(whole),
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{'case':<18} {'chunks':>7}  {'whole ms (min/med/max)':>26}  "
          f"{'chunked ms (min/med/max)':>28}  ratio")
    for name, r in report.items():
        w = "/".join(f"{v:.2f}" for v in r["whole_ms"])
        c = "/".join(f"{v:.2f}" for v in r["chunked_ms"])
        print(f"{name:<18} {r['chunks']:>7}  {w:>26}  {c:>28}  {r['ratio']:.1f}")


if __name__ == "__main__":
    main()
