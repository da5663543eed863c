# Two commands on a fresh clone: `make build-kernels`, then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: build-kernels test wheel clean

# Both distributions editable, in one resolve: the build tool (this directory) pins
# tilekiln-runtime, which ./runtime provides from this checkout. The ./ matters: a bare
# `runtime` would be a requirement name for pip, and PyPI has a package of that name.
$(STAMP): pyproject.toml runtime/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./runtime -e '.[test]'
	touch $(STAMP)

build-kernels: $(STAMP)
	$(BIN)/tilekiln validate catalog
	$(BIN)/tilekiln build --progress plain

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# dist/: the runtime wheel (tilekiln_runtime-<version>-py3-none-any.whl), the build tool's
# (tilekiln_build-<version>-py3-none-any.whl) and one wheel per bundle under artifacts/.
# build/ and runtime/build/ are setuptools' scratch trees, whose stale files would end up in a
# wheel; dist/ starts empty, so it holds this release's wheels and no older ones.
wheel: build-kernels
	rm -rf build runtime/build dist
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir dist ./runtime .
	$(BIN)/tilekiln package artifacts/*/ --out dist

clean:
	rm -rf artifacts dist
