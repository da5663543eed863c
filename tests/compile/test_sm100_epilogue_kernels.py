"""The tcgen05 dense template's fused epilogues: a per-column bias (bf16, f32), row-wise fp8
scales and SwiGLU compile, for each Blackwell-family target, into the MMA kernel of the census
(tests/compile/test_sm100_kernels.py) plus predicated global loads of the bias and scales in the
epilogue, with no local memory; and each kernel's host launch, with its bias and scale pointers,
is what its plan says (the recording stand-in for the driver, tests/compile/test_launch_record.py).
No Blackwell or Rubin part has run them: compile-verified only.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import TCGEN05_EPILOGUE_KERNELS as KERNELS
from tests.compile.test_launch_record import Recorded, _check_launches, link_recording_library

pytestmark = pytest.mark.compile

MMA_BY_BITS = {16: "UTCHMMA", 8: "UTCQMMA"}
# A 16-bit global load for a bf16 bias, a 32-bit one (no width suffix) for an f32 bias or a scale.
LOADS = re.compile(r"\bLDG\.E(\.U16)?(?:\.[A-Z0-9]+)*\b")


# (M, N, K, batch) of the recorded launches: decode, odd M and K, a batch of 2, one tile.
PROBLEMS = ((16, 4096, 4096, 1), (1008, 1024, 528, 1), (8192, 8192, 1024, 2), (128, 128, 128, 1))


def _loads(sass: str) -> Counter:
    return Counter("u16" if m.group(1) else "b32" for m in LOADS.finditer(sass))


@pytest.fixture(scope="module")
def records(tcgen05_epilogue_build):
    return {r.kernel_id: (b, r) for b in tcgen05_epilogue_build.bundles for r in b.records}


@pytest.mark.parametrize("kernel_id", sorted(KERNELS))
def test_the_epilogue_reads_its_bias_and_scales_with_global_loads(records, kernel_id):
    bundle, record = records[kernel_id]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.status == "compiled" and compiled_for(record.cubin) == KERNELS[kernel_id][0] == bundle.arch
    assert record.info.count(MMA_BY_BITS[cfg.mma_dtypes.a.bits]) == plan.k_blocks
    assert record.info.count("UTMALDG") > 0 and record.info.count("UTMASTG") > 0
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    assert record.info.count("LDL") == record.info.count("STL") == 0
    assert record.info.registers <= record.ctx.facts.require("max_registers_per_thread")
    loads = _loads(disassemble(record.cubin))
    rowwise = cfg.scaling.value == "rowwise"
    # bf16 bias: 16-bit loads; f32 bias and row-wise scales: 32-bit ones; nothing else.
    assert (loads["u16"] > 0) == (cfg.bias.value == "bf16"), loads
    assert (loads["b32"] > 0) == (cfg.bias.value == "f32" or rowwise), loads


def test_a_rubin_rowwise_kernel_keeps_the_64_byte_k_mma(records):
    _, k64 = records["gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_rowwise"]
    _, k32 = records["gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_rowwise"]
    assert (k64.info.count("UTCQMMA"), k32.info.count("UTCQMMA")) == (2, 4)


def test_a_swapped_kernel_swaps_its_row_wise_scales_into_the_mmas_terms(records):
    _, record = records["gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x32x128_c2x1_swapab_rowwise_biasbf16"]
    assert "scale_a, scale_b = scale_b, scale_a" in record.source
    assert "index = mma_row if cutlass.const_expr(SWAP_AB) else mma_col" in record.source


def test_a_swiglu_kernel_stores_half_the_columns_of_its_mma_tile(records):
    """silu's exponential is there, and the TMA stores cover the 128x128 C tile of a 128x256 MMA
    tile: four 128x32 sub-tiles, where an ungated kernel of that tile stores eight."""
    _, record = records["gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta_swiglu"]
    plan = record.ctx.plan
    assert "MUFU.EX2" in disassemble(record.cubin)
    assert record.info.count("UTMASTG") == (128 // plan.epi_m) * (128 // plan.epi_n) == 4


@pytest.mark.parametrize("bundle", ["sm100a", "sm100f", "sm103a", "sm107a"])
def test_every_epilogue_kernel_launches_as_its_plan_says(tcgen05_epilogue_build, tmp_path_factory, bundle):
    """Planned asking for its bias, scaling and activation, launched with bias and scale pointers; N a
    multiple of 128 (SwiGLU's whole gate/up block pairs: I = N/2 a multiple of 64)."""
    scratch = tmp_path_factory.mktemp(f"recorded-epilogue-{bundle}")
    (result,) = [b for b in tcgen05_epilogue_build.bundles if b.bundle == bundle]
    _check_launches(Recorded(result, link_recording_library(result, scratch / "lib"), scratch), PROBLEMS)
