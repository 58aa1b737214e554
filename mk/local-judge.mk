# local judge: FaithBench dev split (read from ../shared/benchdata, never copied into the repo)
.PHONY: bench-faithbench
bench-faithbench: install
	$(BIN)/python benchmarks/faithbench.py $(FAITHBENCH_ARGS)
