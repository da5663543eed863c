"""The bias field: each bias type compiles into the epilogue as a predicated global load, and a
kernel without bias reads no global memory outside TMA, as before the field existed."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import make_project, run_build

pytestmark = pytest.mark.compile

CATALOG = """pipeline: sm90
targets: [sm_90a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
  tile: [128, 128, 64]
  cluster: [1, 1]
kernels:
  - sweep:
      bias: [none, bf16, f32]
  - bias: bf16
    activation: silu
  # swap_ab: the bias runs along the MMA's rows
  - swap_ab: true
    tile: [64, 16, 64]
    bias: bf16
  # fp8: the per-tensor scales are applied before the bias
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    tile: [128, 128, 128]
    bias: bf16
"""

BASE = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
# A 16-bit global load for a bf16 bias, a 32-bit one for f32 (no width suffix).
LOADS = re.compile(r"\bLDG\.E(\.U16)?(?:\.[A-Z0-9]+)*\b")


def _loads(sass: str) -> Counter:
    return Counter("u16" if m.group(1) else "b32" for m in LOADS.finditer(sass))


def test_each_bias_type_is_read_in_the_epilogue_and_only_there(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    loads, sass = {}, {}
    for record in result.bundles[0].records:
        sass[record.kernel_id] = disassemble(record.cubin)
        loads[record.kernel_id] = _loads(sass[record.kernel_id])
        assert not record.info.spills and record.info.local_bytes == 0, record.kernel_id
    assert not loads[BASE], f"the plain kernel reads global memory outside TMA: {loads[BASE]}"
    assert loads[f"{BASE}_biasbf16"]["u16"] > 0 and not loads[f"{BASE}_biasbf16"]["b32"], loads[f"{BASE}_biasbf16"]
    assert loads[f"{BASE}_biasf32"]["b32"] > 0 and not loads[f"{BASE}_biasf32"]["u16"], loads[f"{BASE}_biasf32"]
    assert loads[f"{BASE}_biasbf16_silu"]["u16"] > 0 and "MUFU.EX2" in sass[f"{BASE}_biasbf16_silu"]
    assert loads["gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c1x1_swapab_biasbf16"]["u16"] > 0
    assert loads["gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_biasbf16"]["u16"] > 0
