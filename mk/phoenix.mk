# Arize Phoenix for the Phoenix integration tests. It lives in its own venv: arize-phoenix pins
# anthropic<2 (and brings ~100 packages), which must not leak into the project's venv. The tests only
# start `phoenix serve` as a process and talk HTTP/OTLP to it, so nothing of phoenix is imported.
PHOENIX_VENV ?= $(CACHE)/phoenix-venv
PHOENIX_SPEC ?= arize-phoenix>=12
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed-$(shell echo '$(PHOENIX_SPEC)' | sha256sum | cut -c1-12)

.PHONY: phoenix
phoenix: $(PHOENIX_STAMP)
	@echo $(PHOENIX_VENV)/bin/phoenix

$(PHOENIX_STAMP):
	@test -x $(PHOENIX_VENV)/bin/python || $(PY) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/pip install -q --upgrade pip
	$(PHOENIX_VENV)/bin/pip install -q '$(PHOENIX_SPEC)'
	@rm -f $(PHOENIX_VENV)/.installed-* && touch $@

TEST_DEPS += phoenix
