# sentence buffer micro-benchmark (ns per token on the hot and slow paths)
.PHONY: bench-sentences
bench-sentences: install
	$(BIN)/python benchmarks/bench_sentences.py
