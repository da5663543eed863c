"""The wheels built on the CPU machine install with plain pip into a fresh environment on the GPU
machine and run a GEMM there, with nothing else from this project importable.

Needs in ``dist/`` (or ``$TILEKILN_DIST``) the runtime wheel ``tilekiln_runtime-*.whl`` and the
bundle wheel ``tilekiln_kernels_sm90a-*.whl``: ``make wheel`` writes both (and the build tool's,
which nothing here installs). The bundle wheel is ``manylinux_2_28``. The environment is made with
``--system-site-packages`` for torch; the wheels come from ``dist/`` only (``pip --no-index``), and
the checks run from a temporary directory with a clean environment, so this checkout is not on
the path. This module imports nothing from ``builder`` (the GPU machine needs no tilekiln-build).
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_PACKAGE = "tilekiln_kernels_sm90a"
RUNTIME_PACKAGE = "tilekiln_runtime"  # the distribution tilekiln-runtime, which the bundle requires


@pytest.fixture(scope="module")
def dist() -> Path:
    path = Path(os.environ.get("TILEKILN_DIST", ROOT / "dist"))
    runtime = sorted(path.glob(f"{RUNTIME_PACKAGE}-*.whl"))
    bundle = sorted(path.glob(f"{BUNDLE_PACKAGE}-*.whl"))
    if not runtime or not bundle:
        pytest.fail(f"{path} needs {RUNTIME_PACKAGE}-*.whl and {BUNDLE_PACKAGE}-*.whl; build them on the CPU machine "
                    "with `make wheel` and bring dist/ along (or set TILEKILN_DIST)")
    return path


@pytest.fixture(scope="module")
def env(dist, venv_factory):
    import torch

    venv = venv_factory(system_site_packages=True)
    if venv.run("import torch", cwd=venv.path).returncode != 0:
        # torch lives in an environment that is not the base interpreter's: make just it visible.
        site = venv.path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        (site / "torch-from-test-runner.pth").write_text(str(Path(torch.__file__).resolve().parents[1]) + "\n")
    # Only the bundle is named: pip takes tilekiln-runtime from dist/ through the bundle's Requires-Dist.
    proc = venv.pip_install([dist], [BUNDLE_PACKAGE.replace("_", "-")], ignore_installed=True)
    assert proc.returncode == 0, (f"pip install failed (this machine has {os.confstr('CS_GNU_LIBC_VERSION')}; "
                                  f"a manylinux_2_Y wheel needs glibc 2.Y or newer):\n{proc.stdout}\n{proc.stderr}")
    return venv


PRELUDE = """
import json, sys
import torch
import tilekiln

def relative_error(out, a, b):
    ref = torch.matmul(a.double(), b.double())
    return ((out.double() - ref).norm() / ref.norm()).item()

a = torch.randn(1000, 520, device="cuda", dtype=torch.bfloat16)
b = torch.randn(520, 1032, device="cuda", dtype=torch.bfloat16)
"""


def test_installed_bundle_runs_a_gemm_from_a_clean_environment(env, tmp_path):
    script = PRELUDE + """
import importlib.metadata as md, os
bundle = tilekiln.load("sm90a")
out = bundle.gemm(a, b)
default = tilekiln.gemm(a, b)   # the installed bundle the runtime picks for the device
torch.cuda.synchronize()
print(json.dumps({
    "runtime": tilekiln.__file__, "bundle_dir": str(bundle.directory),
    "runtime_dist_file": os.path.realpath(md.distribution("tilekiln-runtime").locate_file("tilekiln/__init__.py")),
    "bundles": [[loc.name, loc.source] for loc in tilekiln.bundles()],
    "kernel": bundle.explain(a, b).kernel.id,
    "error": relative_error(out, a, b), "default_error": relative_error(default, a, b),
    "nan": bool(torch.isnan(out).any()), "shape": list(out.shape),
    "project_modules": [m for m in ("builder", "cutlass") if m in sys.modules],
}))
"""
    proc = env.run(script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    venv = str(env.path)
    assert out["runtime"].startswith(venv), f"tilekiln came from {out['runtime']}, not the fresh environment"
    assert out["runtime_dist_file"] == os.path.realpath(out["runtime"]), "tilekiln is not tilekiln-runtime's"
    assert out["bundle_dir"].startswith(venv) and out["bundle_dir"].endswith(f"{BUNDLE_PACKAGE}/bundle")
    assert out["bundles"] == [["sm90a", "entry point of tilekiln-kernels-sm90a"]]
    assert out["shape"] == [1000, 1032] and not out["nan"]
    assert out["error"] < 1e-2 and out["default_error"] < 1e-2, out
    assert out["project_modules"] == []


def test_a_bundle_for_another_arch_is_refused_on_this_device(env, dist, tmp_path, relabel_bundle):
    """A bundle declaring sm_100a (the sm90a bundle relabelled: the check reads only the manifest,
    so if it were missing these kernels would load and run here) is refused before loading."""
    import torch

    cc = torch.cuda.get_device_capability()
    if cc == (10, 0):
        pytest.skip("this device is compute capability 10.0, where an sm_100a bundle is meant to run")
    bundles = tmp_path / "bundles"
    with zipfile.ZipFile(sorted(dist.glob(f"{BUNDLE_PACKAGE}-*.whl"))[-1]) as zf:
        prefix = f"{BUNDLE_PACKAGE}/bundle/"
        for name in zf.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                target = bundles / "sm100a" / name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    relabel_bundle(bundles / "sm100a", "sm_100a", "a", (10, 0))
    script = PRELUDE + """
bundle = tilekiln.load("sm100a")
try:
    bundle.gemm(a, b)
    message = None
except tilekiln.BundleCompatibilityError as exc:
    message = str(exc)
print(json.dumps({"message": message, "initialized": sorted(bundle._initialized), "ready": sorted(bundle._ready),
                  "source": [loc.source for loc in tilekiln.bundles() if loc.name == "sm100a"]}))
"""
    proc = env.run(script, cwd=tmp_path, env={"TILEKILN_BUNDLE_PATH": str(bundles)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["source"] == ["TILEKILN_BUNDLE_PATH"]
    message = out["message"]
    assert message is not None, "an sm_100a bundle ran on this device"
    assert "bundle sm100a holds sm_100a code, which runs only on compute capability 10.0" in message
    assert f"cuda:0 is compute capability {cc[0]}.{cc[1]} and needs a bundle for sm_{cc[0]}{cc[1]}a" in message
    assert "sm90a (sm_90a, entry point of tilekiln-kernels-sm90a)" in message
    if cc == (9, 0):
        assert message.endswith("Those that run on compute capability 9.0: sm90a.")
    assert out["initialized"] == [] and out["ready"] == [], "no kernel may be loaded before the arch check"
