# tilenest: two commands on a fresh machine.
#   make demo   capture the examples, print their TileIR, run them
#   make test   run the default test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow sanitize docs lint clean clang

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,cuda]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tilenest.demo

# clang-19 type-checks generated Metal (MSL) kernels against the
# metal_stdlib shim (tilenest/backends/metal/check.py). Installed from the
# distribution when missing and apt-get is usable as root or through
# passwordless sudo (the package lists are refreshed only when they lack it);
# otherwise one line says which tests skip. Silent when clang-19 is present.
clang:
	@command -v clang-19 >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else SUDO=no; fi; \
	  if [ "$$SUDO" != no ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing clang-19 (apt-get) for the Metal type checks"; \
	    log=$$( { apt-cache show clang-19 >/dev/null 2>&1 || $$SUDO apt-get update -qq; } 2>&1 \
	      && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	         --no-install-recommends clang-19 2>&1 ) \
	    || { printf '%s\n' "$$log" | tail -n 5; \
	         echo "clang-19 could not be installed: the Metal type-check tests will skip"; }; \
	  else \
	    echo "clang-19 not found, and installing it needs apt-get as root or passwordless" \
	         "sudo: the Metal type-check tests (tests/test_metal_shim.py) will skip"; \
	  fi; }

# the default suite on every core (test files kept whole on one worker, so
# their module fixtures are built once)
test: $(STAMP) clang
	$(BIN)/python -m pytest -n auto --dist loadfile

test-slow: $(STAMP) clang
	$(BIN)/python -m pytest -m slow

# the device suite under compute-sanitizer (memcheck, racecheck, synccheck);
# needs an NVIDIA GPU, CuPy and the CUDA toolkit's compute-sanitizer
sanitize: $(STAMP)
	$(BIN)/python tests/device_sanitizer.py

# the docs site into site/ (spec/ pages and docstrings; warnings are errors);
# it needs tilenest and its `docs` extra only: a fresh .venv gets nothing else,
# one made by `make test` gets the extra added
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info

# ruff over the package; mypy over the semantics core (the modules it
# imports from elsewhere are read for their types, not checked)
lint: $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check tilenest --select E,F,W,B --ignore E501,E731,E741,B008,B023,B905
	$(BIN)/mypy tilenest/semantics --ignore-missing-imports --follow-imports=silent
