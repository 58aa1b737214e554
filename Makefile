# streamjudge — every target installs what it needs; heavy things are cached outside the repo.
SHELL := /bin/bash
PY ?= python3
CACHE ?= $(HOME)/.cache/streamjudge
VENV ?= $(CACHE)/venv
BIN := $(VENV)/bin
EXTRAS ?= dev,langgraph,fastapi,examples,llm,ragas,deepeval,langfuse,phoenix-otel,model
# the dependency set is re-installed only when pyproject.toml or the extras change
DEPS_STAMP := $(VENV)/.deps-$(shell (cat pyproject.toml; echo '$(EXTRAS)') | sha256sum | cut -c1-16)
# mk/*.mk add their own prerequisites of `make test` to TEST_DEPS
TEST_DEPS :=
PYTEST_ARGS ?=

.PHONY: install demo test unit lint typecheck bench clean-venv
.DEFAULT_GOAL := demo

-include mk/*.mk

$(DEPS_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.deps-* && touch $@

# the package itself is installed from *this* checkout every time (cheap), so a venv shared by two
# clones never runs the other clone's code
install: $(DEPS_STAMP)
	@$(BIN)/pip install -q --no-deps -e . >/dev/null

demo: install
	$(BIN)/python -m streamjudge.demo

test: install $(TEST_DEPS)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

unit: install
	$(BIN)/python -m pytest -q -m "not integration" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# every benchmark prints ratios against a baseline measured in the same run
BENCHES ?= run.py bench_instructions.py bench_sentences.py bench_local_judge.py bench_judge_accuracy.py bench_judges.py bench_instrumentation.py bench_model_judge.py bench_peers.py bench_scale.py
bench: install
	@set -e; for b in $(BENCHES); do echo "### benchmarks/$$b"; $(BIN)/python benchmarks/$$b; echo; done

clean-venv:
	rm -rf $(VENV)

# the example app left running under opentelemetry-instrument with a trace viewer (Jaeger, or VIEWER=phoenix);
# prints the app's page and the viewer's address, Ctrl-C stops both (after the mk/*.mk include: it needs
# their JAEGER_BIN / PHOENIX_STAMP)
VIEWER ?= jaeger
.PHONY: demo-ui
demo-ui: install $(if $(filter phoenix,$(VIEWER)),$(PHOENIX_STAMP),$(JAEGER_BIN))
	$(BIN)/python -m streamjudge._demo_ui --viewer $(VIEWER) \
	  $(if $(filter phoenix,$(VIEWER)),--phoenix-python $(PHOENIX_VENV)/bin/python,--jaeger $(JAEGER_BIN))

# the compatibility matrix (noxfile.py): the unit tests and the zero-code smoke check at every corner of the
# supported version ranges but the newest (that one is `make test`), each in its own venv under $(CACHE)/nox;
# NOX_ARGS='-s "corner(oldest)"' runs one corner
NOX_VENV ?= $(CACHE)/nox-tool
NOX_ARGS ?=
.PHONY: compat
$(NOX_VENV)/bin/nox:
	$(PY) -m venv $(NOX_VENV)
	$(NOX_VENV)/bin/pip install -q 'nox>=2024.10'

compat: $(NOX_VENV)/bin/nox
	STREAMJUDGE_CACHE=$(CACHE) $(NOX_VENV)/bin/nox -f noxfile.py $(NOX_ARGS)
