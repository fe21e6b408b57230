# The same commands locally and in CI. `make test` builds .venv from nothing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
QUIX_VENV  := .venv-quix
QUIX_STAMP := $(QUIX_VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install install-quix test test-fast soak check fmt demo sim chaos bench clean image

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP) $(QUIX_STAMP)

# Quix Streams requires confluent-kafka<2.13, below the [dev] venv's, so it gets a venv of its
# own; tests/kafka/test_quix_exactly_once.py runs its worker with this venv's python (and
# builds it through this target when run on its own).
$(QUIX_STAMP): tests/kafka/quix-requirements.txt
	rm -rf $(QUIX_VENV)
	$(PY) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/pip install --quiet -r tests/kafka/quix-requirements.txt
	touch $(QUIX_STAMP)

install-quix: $(QUIX_STAMP)

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
