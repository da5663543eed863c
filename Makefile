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

wheel: $(STAMP)
	$(BIN)/tilekiln package artifacts/sm90a --out dist

clean:
	rm -rf artifacts dist
