"""Row-wise scales and the residual: each compiles into the epilogue as predicated global loads (32-bit
scales, 16-bit residual values), kernels without them read what they read before, and every
kernel's host launch takes the arguments the glue builds (row-wise scale vectors of M and N
elements, the residual at C's strides) from the call block and the plan."""

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
      scaling: [tensor, rowwise]
  - scaling: rowwise
    bias: bf16
  # swap_ab: the MMA's rows take scale_b, its columns scale_a
  - scaling: rowwise
    swap_ab: true
    tile: [64, 16, 256]
  - dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
    tile: [128, 128, 64]
    sweep:
      residual: [none, add]
  - dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
    swap_ab: true
    tile: [64, 16, 64]
    bias: bf16
    residual: add
""", dtypes="{a: e4m3, b: e4m3, acc: f32, c: bf16}", layout="tn", tile="[128, 128, 128]", cluster="[1, 1]")

FP8 = "gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1"
BF16 = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
# A 16-bit global load (a bf16 bias or residual value), or a 32-bit one (a float32 scale).
LOADS = re.compile(r"\bLDG\.E(\.U16)?(?:\.[A-Z0-9]+)*\b")


def _loads(sass: str) -> Counter:
    return Counter("u16" if m.group(1) else "b32" for m in LOADS.finditer(sass))


@pytest.fixture(scope="module")
def epilogue_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("rowwise_residual")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result


def test_rowwise_scales_and_the_residual_are_read_in_the_epilogue_and_only_there(epilogue_build):
    loads = {}
    for record in epilogue_build.bundles[0].records:
        loads[record.kernel_id] = _loads(disassemble(record.cubin))
        assert not record.info.spills and record.info.local_bytes == 0, record.kernel_id
    # Per tensor: two scalars. Row-wise: a scale per fragment row and column, no 16-bit load.
    assert not loads[FP8]["u16"] and not loads[f"{FP8}_rowwise"]["u16"], loads
    assert loads[f"{FP8}_rowwise"]["b32"] > loads[FP8]["b32"], loads
    assert loads[f"{FP8}_rowwise_biasbf16"]["u16"] > 0
    assert loads["gemm_sm90_e4m3_e4m3_f32_bf16_tn_64x16x256_c1x1_swapab_rowwise"]["b32"] > loads[FP8]["b32"]
    assert not loads[BF16], f"the plain kernel reads global memory outside TMA: {loads[BF16]}"
    assert loads[f"{BF16}_resadd"]["u16"] > 0 and not loads[f"{BF16}_resadd"]["b32"], loads[f"{BF16}_resadd"]
    assert loads["gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c1x1_swapab_biasbf16_resadd"]["u16"] > 0


def test_rowwise_and_residual_kernels_launch_as_their_plan_says(epilogue_build, tmp_path):
    """The runtime plans each kernel asking for its scaling, bias and residual and launches it
    through the bundle's glue and the kernel's exported launcher, against the recording stand-in
    for the driver (tests/compile/test_launch_record.py)."""
    (bundle,) = epilogue_build.bundles
    recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
    configs = [r.ctx.entry.config for r in recorded.records.values()]
    assert any(c.scaling.value == "rowwise" for c in configs) and any(c.residual.value == "add" for c in configs)
    for kernel_id in recorded.records:
        _, pairs = run_kernel(recorded, kernel_id)
        for expected, launched in pairs:
            assert launched == expected, kernel_id
