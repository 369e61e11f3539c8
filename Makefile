# One target per job; each sets up .venv first (scripts/setup.sh is a no-op when current).
VENV := .venv
BIN := $(VENV)/bin
SRC := src tests bench examples

.PHONY: setup setup-harbor test-harbor setup-harbor-oldest test-harbor-oldest setup-ray test-ray demo demo-protocol test test-slow test-all format format-check lint typecheck check clean

setup:
	@scripts/setup.sh

demo: setup
	$(BIN)/osmosis train run --demo

demo-protocol: setup
	$(BIN)/python examples/quickstart/demo.py

test: setup
	$(BIN)/pytest -q -m "not ray and not slow"

# The slow tier: whole trainings, the README's platform script, kill -9 recovery (CI runs it too).
test-slow: setup
	$(BIN)/pytest -q -m "slow and not ray"

# The Ray tier: the distributed extra in .venv, its tests on a local two-node Ray cluster
# (they skip with a reason where Ray is missing or cannot start).
setup-ray: setup
	@OSMOSIS_EXTRAS=dev,distributed scripts/setup.sh

test-ray: setup-ray
	$(BIN)/pytest -q -m ray

# The Harbor tier: Python 3.12+ in .venv-harbor (Harbor needs it), bubblewrap for the sandbox.
# Its tests live in tests/harbor; the rest of the suite needs extras this venv leaves out.
setup-harbor:
	@scripts/setup_harbor.sh

test-harbor: setup-harbor
	.venv-harbor/bin/pytest -q -m harbor tests/harbor

# The same tier on the oldest Harbor the extra accepts (0.20.0), in .venv-harbor-020.
setup-harbor-oldest:
	@HARBOR_VERSION=0.20.0 scripts/setup_harbor.sh

test-harbor-oldest: setup-harbor-oldest
	.venv-harbor-020/bin/pytest -q -m "harbor and not slow" tests/harbor

format: setup
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

format-check: setup
	$(BIN)/ruff format --check $(SRC)

lint: setup
	$(BIN)/ruff check $(SRC)

typecheck: setup
	$(BIN)/pyright

check: format-check lint typecheck test test-slow

clean:
	rm -rf $(VENV) .venv-harbor .venv-harbor-020 .pytest_cache .ruff_cache
