"""evict_first puts the L2 cache policy on the hinted operand's TMA loads, and on no other."""

from __future__ import annotations

import json
import re

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import make_project, run_build, sm90_catalog

pytestmark = pytest.mark.compile

# In a 2x1 cluster the MMA's B is multicast along the cluster's M and its A is
# not, so the SASS tells which operand a load belongs to.
CATALOG = sm90_catalog("""\
  - tile: [64, 128, 64]
    schedule: pingpong
    sweep:
      evict_first: [[], [b]]
  # Swapped, the problem's B is the MMA's A: the unicast loads.
  - tile: [64, 16, 64]
    swap_ab: true
    evict_first: [b]
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn", cluster="[2, 1]")

# A TMA load's last operand is its cache policy: desc[URZ] when it has none.
_LOAD_RE = re.compile(r"UTMALDG\.\w+(?P<multicast>\.MULTICAST)?\s.*desc\[(?P<policy>UR\w+)\]")


def hinted_loads(cubin: bytes) -> dict[str, set[bool]]:
    """For the unicast and the multicast TMA loads of a cubin, whether they carry a cache policy."""
    sass = disassemble(cubin)
    found: dict[str, set[bool]] = {"unicast": set(), "multicast": set()}
    for m in _LOAD_RE.finditer(sass):
        found["multicast" if m.group("multicast") else "unicast"].add(m.group("policy") != "URZ")
    return found


def test_the_hint_lands_on_the_problems_operand(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    bundle = result.bundles[0].path
    manifest = {k["id"]: k for k in json.loads((bundle / "manifest.json").read_text())["kernels"]}
    plain = "gemm_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c2x1_pingpong"
    assert set(manifest) == {plain, f"{plain}_efb", "gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c2x1_swapab_efb"}
    assert manifest[plain]["config"]["evict_first"] == [] and manifest[f"{plain}_efb"]["config"]["evict_first"] == ["b"]
    loads = {r.kernel_id: hinted_loads(r.cubin) for r in result.bundles[0].records}
    assert loads[plain] == {"unicast": {False}, "multicast": {False}}
    assert loads[f"{plain}_efb"] == {"unicast": {False}, "multicast": {True}}
    assert loads["gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c2x1_swapab_efb"] == {
        "unicast": {True}, "multicast": {False}}
    # The hint costs nothing else: same registers and shared memory as the plain twin.
    for key in ("registers", "smem_bytes", "spills"):
        assert manifest[plain]["resources"][key] == manifest[f"{plain}_efb"]["resources"][key]
