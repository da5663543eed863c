"""Shared test fixtures and the one place GPU tests decide to skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# A long run of the catalog fuzzer with fresh random inputs (tests/unit/test_fuzz_catalog.py):
# pytest tests/unit/test_fuzz_catalog.py --hypothesis-profile=fuzz-campaign
settings.register_profile("fuzz-campaign", max_examples=20_000)


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


def _rewrite_manifest(directory: Path, edit) -> dict:
    """Apply ``edit(manifest)`` to a bundle's manifest and store it with a fresh self digest,
    as a builder would have written it (only the runtime's digest function is used)."""
    from tilekiln.manifest import manifest_digest

    path = directory / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def _relabel_bundle(directory: Path, arch: str, kind: str, cc: tuple[int, int]) -> str:
    """Make the bundle in ``directory`` declare another target; returns its new name.

    The arch check reads only the manifest, so a bundle of sm_90a code that
    declares sm_100a tests it honestly: if the check were missing, its kernels
    would load and run on an H200.
    """
    name = arch.replace("_", "")

    def edit(m):
        m["bundle"].update(name=name, arch=arch, arch_kind=kind, compute_capability=list(cc))

    _rewrite_manifest(directory, edit)
    return name


class Venv:
    """A fresh virtual environment, filled only by ``pip install --no-index`` from local wheels.

    Made ``--without-pip`` and filled by this interpreter's pip (``pip --python``,
    pip >= 22.3), which takes 0.1 s instead of the 3 s of ensurepip.
    """

    def __init__(self, path: Path, system_site_packages: bool = False):
        self.path = path
        cmd = [sys.executable, "-m", "venv", "--without-pip", str(path)]
        if system_site_packages:
            cmd.insert(3, "--system-site-packages")
        subprocess.run(cmd, check=True)
        self.python = path / "bin" / "python"

    @staticmethod
    def clean_env() -> dict[str, str]:
        """The environment without anything that would point Python or tilekiln at this checkout."""
        drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "TILEKILN_BUNDLE_PATH")
        return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PIP_")}

    def pip_install(self, find_links: list[Path], requirements: list[str], ignore_installed: bool = False):
        cmd = [sys.executable, "-m", "pip", "--python", str(self.python), "install", "--no-index",
               "--disable-pip-version-check", "--no-input"]
        for d in find_links:
            cmd += ["--find-links", str(d)]
        if ignore_installed:
            cmd.append("--ignore-installed")
        return subprocess.run(cmd + requirements, capture_output=True, text=True, env=self.clean_env())

    def run(self, script: str, cwd: Path, env: dict[str, str] | None = None):
        return subprocess.run([str(self.python), "-c", script], capture_output=True, text=True, cwd=cwd,
                              env={**self.clean_env(), **(env or {})})


@pytest.fixture(scope="session")
def venv_factory(tmp_path_factory):
    """``venv_factory(system_site_packages=False)`` -> a new, empty :class:`Venv`."""
    return lambda system_site_packages=False: Venv(tmp_path_factory.mktemp("venv") / "env", system_site_packages)


@pytest.fixture(scope="session")
def rewrite_manifest():
    return _rewrite_manifest


@pytest.fixture(scope="session")
def relabel_bundle():
    return _relabel_bundle
