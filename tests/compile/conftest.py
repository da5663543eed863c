"""A two-kernel catalog built once per session (deviceless compile on the CPU)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.compile.parallel import LocalExecutor
from builder.pipeline.build import BuildRequest, build

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


@dataclass(frozen=True)
class ProjectWheels:
    runtime: Path  # tilekiln_runtime-<version>-py3-none-any.whl (runtime/pyproject.toml)
    build: Path  # tilekiln_build-<version>-py3-none-any.whl (pyproject.toml)


@pytest.fixture(scope="session")
def project_wheels(tmp_path_factory) -> ProjectWheels:
    """The runtime and build tool wheels as `make wheel` builds them, offline and from a copy
    of the checkout (setuptools writes build/ and egg-info trees where it builds)."""
    src = tmp_path_factory.mktemp("project-src")
    for name in ("pyproject.toml", "README.md", "runtime/pyproject.toml"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for name in ("tilekiln", "builder"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("project-dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "--wheel-dir", str(out), str(src / "runtime"), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (runtime,) = out.glob("tilekiln_runtime-*.whl")
    (build_tool,) = out.glob("tilekiln_build-*.whl")
    return ProjectWheels(runtime, build_tool)
