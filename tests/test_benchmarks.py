"""`make bench` runs every benchmark to its end: the parts that build judges the way the runtime does are
run here on a tiny input, so a default that changes what `create_judge` returns cannot stop it unseen."""

from __future__ import annotations

import sys
from pathlib import Path

# appended: a benchmark module (run.py) must not shadow any other module a test imports
sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_local_judge


def test_local_judge_tiers_section_runs_to_its_end() -> None:
    # the default judge_processes ("auto") wraps the local judge; the tiers section measures the judges
    # themselves, sharing one index cache in this thread
    answer = ("The company was founded in 1998 in Palo Alto. It listed its shares on the Nasdaq in August. "
              "It paid a large dividend every year.")
    result = bench_local_judge._bench_tiers([((bench_local_judge.SYNTHETIC_CONTEXT,), answer)], repeat=1)
    assert result["shared_us_per_stream"] > 0
    assert result["own_caches_us_per_stream"] > 0
    assert result["ratio"] > 0
