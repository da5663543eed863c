"""Shared test fixtures and the one place GPU tests decide to skip."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gpu_available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def gpu_bundle_dir() -> Path:
    """The default sm90a bundle for GPU tests; build it first with `make build-kernels`."""
    path = Path(os.environ.get("TILEKILN_TEST_BUNDLE", ROOT / "artifacts" / "sm90a"))
    if not (path / "manifest.json").exists():
        pytest.fail(f"GPU tests need a built bundle at {path}; run `make build-kernels` (or set TILEKILN_TEST_BUNDLE)")
    return path


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A scratch copy of catalog/ and templates/ that a test may edit."""
    for name in ("catalog", "templates"):
        shutil.copytree(ROOT / name, tmp_path / name)
    return tmp_path
