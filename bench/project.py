"""A scratch copy of the project whose only catalog file is a given sm90 catalog: what the build
benchmarks (build.py, faults.py) build, so they time and break the real build on their own kernels."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scratch_project(base: Path, sm90_catalog: str) -> Path:
    """``base`` holding the repository's catalog/ and templates/ with ``sm90_catalog`` as the only
    catalog/gemm/*.yaml."""
    for name in ("catalog", "templates"):
        shutil.copytree(ROOT / name, base / name)
    for old in (base / "catalog" / "gemm").glob("*.yaml"):
        old.unlink()
    (base / "catalog" / "gemm" / "sm90.yaml").write_text(sm90_catalog)
    return base
