# The documentation site (mkdocs.yml, docs/): `make docs` builds it in strict mode, so a broken link or a
# nav entry without its page fails the build (and `make test`). The reference pages (settings, command line,
# telemetry names) are written from the code first, by the hook docs/hooks/reference.py.
# The site goes to $(CACHE)/site, outside the repo. No --quiet: it hides the warnings strict mode counts, and
# the build then passes with a broken link.
DOCS_SITE ?= $(CACHE)/site

.PHONY: docs docs-serve

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)
	@echo $(DOCS_SITE)/index.html

# live preview on 127.0.0.1:8008
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8008

TEST_DEPS += docs
