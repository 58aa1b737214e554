# local judge: FaithBench dev split (read from ../shared/benchdata, never copied into the repo)
.PHONY: bench-faithbench
bench-faithbench: install
	$(BIN)/python benchmarks/bench_judge_accuracy.py $(FAITHBENCH_ARGS)
