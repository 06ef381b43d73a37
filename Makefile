# The two commands of the Quickstart: `make demo` and `make test`.
# Both create .venv when it is missing and install graphwire into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.graphwire-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
DEMO_DATASET := synthetic:products?nodes=100000&degree=20&features=100&classes=47&seed=0

.PHONY: demo test lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: on these machines 2.13.0 resolves to a local CPU build,
# while an unpinned torch would pull several GB of CUDA packages.
$(STAMP): $(BIN)/python pyproject.toml
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,sim]'
	touch $(STAMP)

install: $(STAMP)

# Each demo replaces the last one's runs/demo (train refuses a run's folder
# without --overwrite).
demo: install
	$(BIN)/graphwire train --dataset '$(DEMO_DATASET)' --model sage \
		--workers 4 --exchange g3 --partition metis --epochs 40 --seed 0 \
		--out runs/demo --overwrite

lint: install
	$(BIN)/ruff check graphwire tests benchmarks
	$(BIN)/ruff format --check graphwire tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q --durations=15

clean:
	rm -rf $(VENV) runs
