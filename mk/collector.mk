# Real processes for the collector/alerting integration tests: an OpenTelemetry Collector built with ocb from
# collector/builder-config.yaml, Jaeger v2, and Prometheus + Alertmanager from Debian packages.
# Build outputs live under $(CACHE), keyed so that a second run is instant; Go's module cache (~/go) is reused.
# `make -s collector` / `make -s jaeger` print the binary's absolute path as their last line (the tests read it).

GO ?= go
OCB_VERSION ?= v0.161.0
OCB_DIR := $(CACHE)/tools/ocb-$(OCB_VERSION)
OCB := $(OCB_DIR)/builder

COLLECTOR_MANIFEST := collector/builder-config.yaml
COLLECTOR_NAME := otelcol-streamjudge
COLLECTOR_DIR := $(CACHE)/collector/$(shell sha256sum $(COLLECTOR_MANIFEST) 2>/dev/null | cut -c1-16)
COLLECTOR_BIN := $(COLLECTOR_DIR)/$(COLLECTOR_NAME)

# Jaeger v2's Go module path has no /v2, so v2.x tags cannot be fetched as module versions, and `go install` of
# the v1.x tag fails on its replace directive. Instead: download the tagged module source (v1.76.0 is the same
# commit as Jaeger v2.13.0) and build cmd/jaeger with that module as the main module, so its replace directives
# apply. JAEGER_VERSION may also be a pseudo-version of a later commit where the module proxy serves one.
JAEGER_MODULE := github.com/jaegertracing/jaeger
JAEGER_VERSION ?= v1.76.0
JAEGER_DIR := $(CACHE)/jaeger/$(JAEGER_VERSION)
JAEGER_BIN := $(JAEGER_DIR)/jaeger

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: collector jaeger test-infra prometheus-packages

$(OCB):
	@mkdir -p $(OCB_DIR)
	GOBIN=$(OCB_DIR) $(GO) install go.opentelemetry.io/collector/cmd/builder@$(OCB_VERSION)

# The directory name is the manifest's content hash, so the binary needs no timestamp prerequisite (a checkout
# that touches the manifest must not trigger a rebuild). Build into a scratch dir and move the binary into place
# last, so an interrupted build never leaves a binary that looks finished.
$(COLLECTOR_BIN): | $(OCB)
	@rm -rf $(COLLECTOR_DIR)/build && mkdir -p $(COLLECTOR_DIR)/build
	sed '/^dist:/a\  output_path: $(COLLECTOR_DIR)/build' $(COLLECTOR_MANIFEST) > $(COLLECTOR_DIR)/builder-config.yaml
	$(OCB) --config $(COLLECTOR_DIR)/builder-config.yaml --ldflags '-s -w' >&2
	mv $(COLLECTOR_DIR)/build/$(COLLECTOR_NAME) $@.tmp && mv $@.tmp $@ && rm -rf $(COLLECTOR_DIR)/build

collector: $(COLLECTOR_BIN)
	@echo $(COLLECTOR_BIN)

# a scratch dir of its own per build: two checkouts building at once must not remove each other's sources
$(JAEGER_BIN):
	@mkdir -p $(JAEGER_DIR)
	set -e; work=$$(mktemp -d $(JAEGER_DIR)/build.XXXXXX); trap 'rm -rf "$$work"' EXIT; \
	src=$$(cd $(JAEGER_DIR) && $(GO) mod download -json $(JAEGER_MODULE)@$(JAEGER_VERSION) \
	  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); test -n "$$src"; \
	cp -r "$$src" "$$work/src"; chmod -R u+w "$$work/src"; \
	(cd "$$work/src" && $(GO) build -trimpath -ldflags '-s -w' -o ../jaeger ./cmd/jaeger >&2); \
	mv "$$work/jaeger" $@

jaeger: $(JAEGER_BIN)
	@echo $(JAEGER_BIN)

# Debian names the Alertmanager package prometheus-alertmanager; promtool ships with prometheus.
prometheus-packages:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null; then \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    prometheus prometheus-alertmanager >&2; \
	fi

test-infra: prometheus-packages collector jaeger

TEST_DEPS += test-infra
