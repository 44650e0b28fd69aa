# tilenest: two commands on a fresh machine.
#   make demo   capture the examples, print their TileIR, run them
#   make test   run the default test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow sanitize docs lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,cuda]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tilenest.demo

# the default suite on every core (test files kept whole on one worker, so
# their module fixtures are built once)
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile

test-slow: $(STAMP)
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
