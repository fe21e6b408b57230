# The same commands locally and in CI. `make test` builds .venv from nothing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test test-fast soak check fmt demo sim chaos bench clean image

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest --durations=30 -m "not soak" $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not soak" $(PYTEST_ARGS)

# Longer twins of runs that make test already covers with a short one (each nemesis, each
# client): more faults per run, not new kinds of fault.
soak: $(STAMP)
	$(BIN)/python -m pytest --durations=30 -m soak $(PYTEST_ARGS)

# mypy cannot follow setuptools' package-dir mapping, so it checks a symlinked view of the
# one namespace that the wheel builds (build/typecheck/raftlog/...).
check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python tools/typecheck_view.py build/typecheck
	cd build/typecheck && ../../$(BIN)/mypy --strict -p raftlog

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

demo: $(STAMP)
	$(BIN)/python -m raftlog.demo --spark

sim: $(STAMP)
	$(BIN)/python -m raftlog.sim --seeds 1-2000

chaos: $(STAMP)
	$(BIN)/python -m raftlog chaos run --backend local --nodes 3 --nemesis kill,partition,pause --duration 60 --acks all --seed 1 --out chaos-out

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py --suite quick --out bench-out

# raftlog:local with no image registry: a debootstrap base (kept once built), wheels built on
# this host, an offline install in the image (deploy/README.md).
image: $(STAMP)
	PYTHON=$(BIN)/python deploy/build-image.sh raftlog:local

clean:
	rm -rf build dist bench-out .mypy_cache .ruff_cache .pytest_cache
