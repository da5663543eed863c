"""A two-kernel catalog built once per session (deviceless compile on the CPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.build import BuildRequest, build
from builder.parallel import LocalExecutor

ROOT = Path(__file__).resolve().parents[2]

SMALL_CATALOG = """pipeline: sm90
targets: [sm_90a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
  - tile: [128, 128, 64]
    cluster: [1, 1]
  - tile: [64, 128, 64]
    cluster: [1, 2]
"""


def make_project(base: Path, catalog: str = SMALL_CATALOG) -> Path:
    for name in ("catalog", "templates"):
        shutil.copytree(ROOT / name, base / name)
    for old in (base / "catalog" / "gemm").glob("*.yaml"):
        old.unlink()
    (base / "catalog" / "gemm" / "sm90.yaml").write_text(catalog)
    return base


def run_build(project: Path, out: Path, cache: Path, jobs: int = 1, **kwargs):
    return build(BuildRequest(root=project, out_dir=out, cache_dir=cache, executor=LocalExecutor(jobs),
                              progress="none", **kwargs))


@pytest.fixture(scope="session")
def small_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("small")
    project = make_project(base / "project")
    result = run_build(project, base / "artifacts", base / "cache")
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    return result.bundles[0]
