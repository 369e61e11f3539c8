# One target per job; each sets up .venv first (scripts/setup.sh is a no-op when current).
VENV := .venv
BIN := $(VENV)/bin
SRC := src tests bench examples

.PHONY: setup demo demo-protocol test test-all format format-check lint typecheck check clean

setup:
	@scripts/setup.sh

demo: setup
	$(BIN)/osmosis train run --demo

demo-protocol: setup
	$(BIN)/python examples/quickstart/demo.py

test: setup
	$(BIN)/pytest -q

format: setup
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

format-check: setup
	$(BIN)/ruff format --check $(SRC)

lint: setup
	$(BIN)/ruff check $(SRC)

typecheck: setup
	$(BIN)/pyright

check: format-check lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
