# Quick start (README): `make demo` runs the main job, `make test` runs the full test suite.
# Both create .venv on first use; nothing is installed outside it except the Horovod wheel cache.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit horovod clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,profile,tune]'
	touch $@

# Horovod 0.28.1 needs source edits to build against torch 2.14 (scripts/install_horovod.sh);
# the wheel is cached in the user cache dir so this is slow only once per machine.
horovod: $(STAMP)
	bash scripts/install_horovod.sh $(BIN)/python

demo: $(STAMP)
	bash scripts/demo.sh $(BIN)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

# PACE_REQUIRE_EXTRAS=1: a test that would skip for want of torch or Horovod fails instead.
test: $(STAMP) horovod lint typecheck
	PACE_REQUIRE_EXTRAS=1 $(BIN)/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
