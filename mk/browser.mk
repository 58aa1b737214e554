# Headless Chromium for the example page's browser test (tests/instrumentation/test_example_page.py): the
# Debian package, driven by Playwright (dev extra) through executable_path. `playwright install` is never run:
# it would download a browser build of its own.
# SUDO comes from mk/collector.mk when it is included first; defined here too so this file stands alone.
SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: browser-packages

browser-packages:
	@if ! command -v chromium >/dev/null; then \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium >&2; \
	fi

TEST_DEPS += browser-packages
