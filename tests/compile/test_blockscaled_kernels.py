"""The block-scaled tcgen05 template compiles into the block-scaled MMAs its plan names.

mxfp8 (with the other tcgen05 kernels of the session, tests/compile/conftest.py), nvfp4 and
mxfp4 kernels are built deviceless through the normal build, each for one target (sm_100a,
sm_103a, sm_107a between them). No Blackwell or Rubin part has run them; this SASS census is
what verifies them. Per kernel, from the plan the validator derived:

* the MMA kind: UTCQMMA for e4m3 data (kind::mxf8f6f4), UTCOMMA for e2m1 (kind::mxf4 and
  mxf4nvf4), ``k_blocks`` of them per K slice, no other MMA; every MMA and scale-factor copy in
  its ``.2CTA`` form exactly when the kernel pairs CTAs;
* the block-scaled form: every MMA names three tensor-memory operands, the accumulator and
  the scale factors of A and of B (a dense UTCQMMA names the accumulator only, its sixth
  operand a register); nvfp4's, with four 16-element scale blocks per 64-element MMA K, are
  the ``.4X`` form (``.BLOCK16`` as nvdisasm spells it for sm_103a and sm_107a);
* the scale factors' way into tensor memory: one ``UTCCP.T.S.4x32dp128bit`` (tcgen05.cp of
  a 512-byte scale-factor atom) per atom of the stage's SFA and SFB;
* TMA loads (A, B and both scale-factor tensors) and stores, no local memory, the shared
  memory the validator modelled (scale-factor rings included), registers within the facts,
  and the manifest saying compile-verified;
* the epilogue's rounding to C: ``F2FP.F16.F32.PACK_AB`` (two fp32 values to a pair of fp16)
  in an fp16-output kernel and never the bf16 form, ``F2FP.BF16.F32.PACK_AB`` in a bf16 one;
* a SwiGLU kernel, with one CTA or on a CTA pair: silu's exponential and half the TMA stores.
"""

from __future__ import annotations

import json
import re

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import (BLOCKSCALED_F16_KERNELS, BLOCKSCALED_SWIGLU_KERNELS, FP4_KERNELS,
                                    TCGEN05_KERNELS)

pytestmark = pytest.mark.compile

KERNELS = {**{k: v for k, v in TCGEN05_KERNELS.items() if "_sf" in k}, **FP4_KERNELS, **BLOCKSCALED_SWIGLU_KERNELS,
           **BLOCKSCALED_F16_KERNELS}
MMA_BY_BITS = {8: "UTCQMMA", 4: "UTCOMMA"}
MMA_OPCODES = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")
ATOM_BYTES = 512  # one scale-factor atom: 128 rows x 4 blocks
# nvdisasm's spelling of the MMA with a 16-element scale block (four per 64-element fp4 MMA K):
# .4X for sm_100a, .BLOCK16 for sm_103a and sm_107a (CUDA 13 toolchain, measured; as in
# tests/compile/test_blockscaled_grouped_kernels.py).
BLOCK16_FORM = {"sm_103a": ".BLOCK16", "sm_107a": ".BLOCK16"}
# The epilogue's conversion of two fp32 accumulator values into a packed pair of C's type.
PACK = {"bf16": "F2FP.BF16.F32.PACK_AB", "f16": "F2FP.F16.F32.PACK_AB"}


@pytest.fixture(scope="module")
def records(tcgen05_build, fp4_build, blockscaled_swiglu_build, blockscaled_f16_build):
    return {r.kernel_id: (b, r) for build in (tcgen05_build, fp4_build, blockscaled_swiglu_build,
                                              blockscaled_f16_build)
            for b in build.bundles for r in b.records}


def mma_lines(sass: str) -> list[str]:
    return [line for line in sass.splitlines() if re.search(r"\bUTC[A-Z]MMA\b", line)]


@pytest.mark.parametrize("kernel_id", sorted(KERNELS))
def test_kernel_compiles_to_the_block_scaled_mma_its_plan_names(records, kernel_id):
    bundle, record = records[kernel_id]
    arch = KERNELS[kernel_id][0]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.status == "compiled" and bundle.arch == arch and compiled_for(record.cubin) == arch
    mma = MMA_BY_BITS[cfg.dtypes.a.bits]
    assert record.info.count(mma) == plan.k_blocks == plan.cta_k_bytes // plan.mma_k_bytes, dict(record.info.census)
    assert all(record.info.count(op) == 0 for op in MMA_OPCODES if op != mma)
    sass = disassemble(record.cubin)
    lines = mma_lines(sass)
    pair = ".2CTA" if plan.cta_group == 2 else ""
    form = f"{mma}{pair}{BLOCK16_FORM.get(arch, '.4X')}" if cfg.block_scale.block == 16 else f"{mma}{pair}"
    assert {re.search(r"\b(UTC[A-Z]MMA(?:\.[A-Z0-9_]+)*)", line).group(1) for line in lines} == {form}
    assert all(line.count("tmem[") == 3 for line in lines), lines
    # Under a pair each CTA holds all of the tile's SFB: one copy per atom of SFA and of SFB.
    one = record.ctx.plan.smem.scale_bytes // plan.stages
    assert len(re.findall(r"\bUTCCP\.T\.S\.(?:2CTA\.)?4x32dp128bit\b", sass)) == one // ATOM_BYTES
    assert f"UTCCP.T.S{pair}.4x32dp128bit" in sass
    assert record.info.count("UTMALDG") >= 4 and record.info.count("UTMASTG") > 0
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    facts = record.ctx.facts
    assert record.info.registers <= facts.require("max_registers_per_thread")
    assert record.info.registers * plan.threads <= facts.require("registers_per_sm")
    assert record.info.static_smem_bytes == plan.smem.static_bytes
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    (kernel,) = [k for k in manifest["kernels"] if k["id"] == kernel_id]
    assert kernel["resources"]["smem_bytes"] == plan.smem.total <= plan.smem_budget
    assert kernel["verification"] == "compile-verified"


def test_a_dense_fp8_mma_is_not_the_block_scaled_form(records):
    """The census tells the kinds apart: a per-tensor-scaled UTCQMMA names one TMEM operand pair."""
    _, dense = records["gemm_sm100_e4m3_e5m2_f32_bf16_tn_128x256x128_c2x1_2cta"]
    assert all(line.count("tmem[") == 2 for line in mma_lines(disassemble(dense.cubin)))
    assert "UTCCP" not in disassemble(dense.cubin)


def test_tensor_memory_holds_the_accumulators_and_the_scale_factors(records):
    """128x256: one 256-column accumulator beside 48 scale-factor columns (2 x 256 + 48 > 512)."""
    _, record = records["gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32"]
    plan = record.ctx.plan
    assert (plan.acc_stages, plan.tmem_acc_columns, plan.tmem_scale_columns, plan.tmem_alloc_columns) == (
        1, 256, 48, 512)
    assert "ACC_COLUMNS = 256" in record.source and "SFA_COLUMNS = 16" in record.source


@pytest.mark.parametrize("kernel_id", sorted(KERNELS))
def test_the_epilogue_rounds_to_the_kernels_output_type(records, kernel_id):
    """An fp16-output kernel packs its fp32 values into fp16 pairs and never into bf16 ones (the
    result type scaled_gemm's out_dtype asks for), a bf16 one the other way round."""
    _, record = records[kernel_id]
    c = record.ctx.entry.config.dtypes.c.value
    sass = disassemble(record.cubin)
    assert sass.count(PACK[c]) > 0
    assert all(form not in sass for out, form in PACK.items() if out != c)


@pytest.mark.parametrize("kernel_id", sorted(BLOCKSCALED_SWIGLU_KERNELS))
def test_a_swiglu_kernel_stores_half_the_columns_of_its_ungated_twin(records, kernel_id):
    """silu's exponential is there, and the TMA stores cover a CTA's 128x128 C tile of its 128x256
    accumulator (the whole MMA tile with one CTA, its half of the 256x256 MMA on a pair, whose
    columns pair inside the CTA as with one): four 128x32 sub-tiles, where the ungated mxfp8
    kernel of that tile stores eight."""
    _, record = records[kernel_id]
    _, ungated = records["gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32"]
    plan = record.ctx.plan
    assert record.ctx.entry.config.activation.gated
    assert "MUFU.EX2" in disassemble(record.cubin) and "MUFU.EX2" not in disassemble(ungated.cubin)
    assert record.info.count("UTMASTG") == (128 // plan.epi_m) * (128 // plan.epi_n) == 4
    assert ungated.info.count("UTMASTG") == 2 * record.info.count("UTMASTG")
