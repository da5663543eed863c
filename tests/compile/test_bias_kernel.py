"""The bias field: each bias type compiles into the epilogue as a predicated global load, a kernel
without bias reads no global memory outside TMA, as before the field existed, and every kernel's
host launch takes the bias argument the glue builds from the call block and the plan's N."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_launch_record import Recorded, link_recording_library, run_kernel

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
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
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn", tile="[128, 128, 64]", cluster="[1, 1]")

BASE = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
# A 16-bit global load for a bf16 bias, a 32-bit one for f32 (no width suffix).
LOADS = re.compile(r"\bLDG\.E(\.U16)?(?:\.[A-Z0-9]+)*\b")


def _loads(sass: str) -> Counter:
    return Counter("u16" if m.group(1) else "b32" for m in LOADS.finditer(sass))


@pytest.fixture(scope="module")
def bias_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("bias")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result


def test_each_bias_type_is_read_in_the_epilogue_and_only_there(bias_build):
    result = bias_build
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


def test_bias_kernels_launch_as_their_plan_says(bias_build, tmp_path):
    """The runtime plans each kernel asking for its bias and activation and launches it with a bias
    pointer through the bundle's glue and the kernel's exported launcher, against the recording
    stand-in for the driver (tests/compile/test_launch_record.py)."""
    (bundle,) = bias_build.bundles
    recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
    assert any(r.ctx.entry.config.bias.value != "none" for r in recorded.records.values())
    for kernel_id in recorded.records:
        _, pairs = run_kernel(recorded, kernel_id)
        for expected, launched in pairs:
            assert launched == expected, kernel_id
