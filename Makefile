# Two commands for a fresh machine: `make quickstart` and `make test`. Each builds .venv if missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kbert-installed

.PHONY: quickstart lint test test-fast bench clean

# uv installs what pip would (the same resolution, from the same indexes and PIP_FIND_LINKS, the
# system's certificates), downloading and unpacking in parallel: a fresh venv in a fraction of
# pip's time. pip installs it instead where uv cannot run. --compile-bytecode writes the .pyc files
# pip writes and uv leaves out: without them, a Python that may not write its own
# (PYTHONDONTWRITEBYTECODE, set on the hosts here) compiles TensorFlow's and Keras' sources again in
# every process, and the tests start hundreds.
INSTALL = $(BIN)/pip install --quiet uv && UV_NATIVE_TLS=1 $(BIN)/uv pip install --quiet --compile-bytecode \
	--python $(BIN)/python $${PIP_FIND_LINKS:+--find-links $$PIP_FIND_LINKS}

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(INSTALL) -e ".[test,beam]" || $(BIN)/pip install --quiet -e ".[test,beam]"
	@touch $(STAMP)

quickstart: $(STAMP)
	@bash scripts/quickstart.sh

LINT_PATHS := kbert cli converters serving tests benchmarks scripts

# Checks only (`ruff check --fix` and `ruff format` make the changes); both run, either fails it.
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS); rc=$$?; $(BIN)/ruff format --check $(LINT_PATHS) && exit $$rc

# Two pytest workers, one test file each at a time (module fixtures are made once): the tests
# spend much of their time in single-threaded Python (imports, tiny models, subprocesses).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# The inner loop: everything but the tests marked slow (training runs, exports, servers,
# packaging), in under 3 minutes. CI runs the whole `make test`.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" tests

bench: $(STAMP)
	$(INSTALL) -e ".[test,beam,bench]" || $(BIN)/pip install --quiet -e ".[test,beam,bench]"
	$(BIN)/python benchmarks/convert_bench.py
	$(BIN)/python benchmarks/tokenizer_bench.py

clean:
	rm -rf $(VENV) quickstart-out
