# Two commands on a fresh clone: `make build-kernels`, then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: build-kernels test wheel clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[build,test]'
	touch $(STAMP)

build-kernels: $(STAMP)
	$(BIN)/tilekiln validate catalog
	$(BIN)/tilekiln build --progress plain

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# dist/: the runtime wheel (tilekiln-<version>-py3-none-any.whl) and one wheel per
# bundle under artifacts/. build/ is setuptools' scratch tree; stale files there
# would end up in the runtime wheel.
wheel: build-kernels
	rm -rf build
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir dist .
	$(BIN)/tilekiln package artifacts/*/ --out dist

clean:
	rm -rf artifacts dist
