"""Swapped-operand sm90 kernels (C^T = B^T A^T) compile to what their plan predicts."""

from __future__ import annotations

import json

import pytest

from builder.check.validate import Project, validate_project
from tests.compile.conftest import make_project, run_build, sm90_catalog
from tilekiln.manifest import parse_manifest, read_manifest

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
    tile: [64, 16, 64]
    cluster: [2, 1]
  # Mixed fp8: the MMA's A is the problem's B, so its type is e5m2.
  - dtypes: {a: e4m3, b: e5m2, acc: f32, c: bf16}
    tile: [64, 32, 128]
    cluster: [1, 1]
""", layout="tn", swap_ab="true")


def test_swapped_kernels_compile_with_the_problems_arguments(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    bundle = result.bundles[0].path
    manifest = json.loads((bundle / "manifest.json").read_text())
    kernels = {k["config"]["dtypes"]["b"]: k for k in manifest["kernels"]}
    bf16, fp8 = kernels["bf16"], kernels["e5m2"]
    assert bf16["id"] == "gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c2x1_swapab"
    assert fp8["id"] == "gemm_sm90_e4m3_e5m2_f32_bf16_tn_64x32x128_c1x1_swapab"
    # One 64-row warpgroup MMA per tile, wgmma of the right kind, nothing spilled,
    # and the transposed C^T sub-tiles go through stmatrix.
    for k, mma in ((bf16, "HGMMA"), (fp8, "QGMMA")):
        assert k["config"]["swap_ab"] is True and k["threads"] == 256
        sass = k["resources"]["sass"]
        assert sass[mma] > 0 and sass["STSM"] > 0 and sass["LDL"] == sass["STL"] == 0
        assert not k["resources"]["spills"]
    # The build checked each plan's shared-memory model against the traced struct.
    plans = {c.entry.config.dtypes.b.value: c.plan for c in validate_project(Project(project)).kernels}
    assert bf16["resources"]["smem_bytes"] == plans["bf16"].smem.total
    assert fp8["resources"]["smem_bytes"] == plans["e5m2"].smem.total
    # The kernel takes the problem's tensors and swaps them itself.
    source = (bundle / bf16["source"]["file"]).read_text()
    assert "SWAP_AB = True" in source and "C_LAYOUT = LayoutEnum.COL_MAJOR if SWAP_AB" in source
    # The runtime reads the flag back (it prices swapped kernels on the transposed problem);
    # a config written before a field existed, which has no such key, takes the field's default.
    assert all(k.config.swap_ab for k in read_manifest(bundle).kernels)
    for k in manifest["kernels"]:
        del k["config"]["swap_ab"]
    assert not any(k.config.swap_ab for k in parse_manifest(json.dumps(manifest).encode(), "old", verify=False).kernels)
