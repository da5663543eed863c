"""The tcgen05 template compiles for every Blackwell-family target into what its plan says.

A small catalog covering each form the default bundles hold (bf16/f16 and fp8,
every layout letter, 1-CTA and 2-CTA, swapped operands, an activation) is built
deviceless through the normal build, each kernel for one target. No Blackwell
or Rubin part has run these kernels: this SASS census is what verifies them.
Per kernel, read from the plan the validator derived:

* the MMA kind: UTCHMMA for 16-bit operands, UTCQMMA for 8-bit ones, no other;
  every MMA in its ``.2CTA`` form exactly when the kernel pairs CTAs;
* the MMA K width: one K slice of ``cta_k_bytes`` is ``k_blocks`` instructions
  of the pipeline's ``mma_k_bytes`` (the mainloop is unrolled once per slice),
  so the sm107 pipeline's fp8 kernels issue half as many UTCQMMAs per slice;
* TMA loads and stores, no local memory, the shared memory the validator
  modelled (static part included) within its budget, registers within the
  pipeline's facts (per thread, and for the CTA's threads on one SM), and the
  exact target the cubin was assembled for;
* the scheduler: a ``scheduler: clc`` kernel's cluster-launch-control query
  (``clusterlaunchcontrol.try_cancel``, SASS ``UGETNEXTWORKID.BROADCAST``),
  and none in any static kernel (check_scheduler_census, which the grouped
  templates' census modules also run).
"""

from __future__ import annotations

import json
import re

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import TCGEN05_KERNELS as KERNELS
from tilekiln.spec import Scheduler

pytestmark = pytest.mark.compile

MMA_BY_BITS = {16: "UTCHMMA", 8: "UTCQMMA"}
MMA_OPCODES = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")


@pytest.fixture(scope="module")
def sm100_build(tcgen05_build):
    return {r.kernel_id: (b, r) for b in tcgen05_build.bundles for r in b.records}


def mma_instructions(sass: str) -> list[str]:
    """The tcgen05 MMA instructions of a disassembly, with their modifiers (``UTCQMMA.2CTA``)."""
    return re.findall(r"\b(UTC[A-Z]MMA(?:\.[A-Z0-9_]+)*)\b", sass)


# Block-scaled kernels have their own census (tests/compile/test_blockscaled_kernels.py).
DENSE = sorted(k for k in KERNELS if "_sf" not in k)


@pytest.mark.parametrize("kernel_id", DENSE)
def test_kernel_compiles_to_the_mma_its_plan_names(sm100_build, kernel_id):
    bundle, record = sm100_build[kernel_id]
    arch = KERNELS[kernel_id][0]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.status == "compiled" and bundle.arch == arch and compiled_for(record.cubin) == arch
    mma = MMA_BY_BITS[cfg.mma_dtypes.a.bits]
    assert record.info.count(mma) == plan.k_blocks == plan.cta_k_bytes // plan.mma_k_bytes, dict(record.info.census)
    assert all(record.info.count(op) == 0 for op in MMA_OPCODES if op != mma)
    forms = set(mma_instructions(disassemble(record.cubin)))
    assert forms == {f"{mma}.2CTA" if plan.cta_group == 2 else mma}
    assert record.info.count("UTMALDG") > 0 and record.info.count("UTMASTG") > 0
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    facts = record.ctx.facts
    assert record.info.registers <= facts.require("max_registers_per_thread")
    assert record.info.registers * plan.threads <= facts.require("registers_per_sm")
    assert record.info.static_smem_bytes == plan.smem.static_bytes
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    (kernel,) = [k for k in manifest["kernels"] if k["id"] == kernel_id]
    assert kernel["resources"]["smem_bytes"] == plan.smem.total <= plan.smem_budget
    assert kernel["config"]["cta_group"] == cfg.cta_group and kernel["verification"] == "compile-verified"


def check_scheduler_census(bundle, record) -> bool:
    """clusterlaunchcontrol.try_cancel assembles to UGETNEXTWORKID(.BROADCAST): a clc kernel has
    exactly the one its scheduler warp issues, and no local memory; a static kernel has none. The
    manifest carries the census and the scheduler. Returns whether the kernel is a clc one."""
    clc = record.ctx.entry.config.scheduler is Scheduler.CLC
    expected = int(clc)
    assert record.info.count("UGETNEXTWORKID") == expected, (record.kernel_id, dict(record.info.census))
    forms = set(re.findall(r"\b(UGETNEXTWORKID(?:\.[A-Z]+)*)\b", disassemble(record.cubin)))
    assert forms == ({"UGETNEXTWORKID.BROADCAST"} if clc else set()), record.kernel_id
    assert record.info.count("LDL") == record.info.count("STL") == record.info.local_bytes == 0, record.kernel_id
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    (kernel,) = [k for k in manifest["kernels"] if k["id"] == record.kernel_id]
    assert kernel["resources"]["sass"]["UGETNEXTWORKID"] == expected
    assert kernel["config"]["scheduler"] == record.ctx.entry.config.scheduler.value
    return clc


def test_every_clc_kernel_issues_try_cancel_and_no_static_kernel_does(tcgen05_build, small_build, fp4_build,
                                                                     sm103_blockscaled_build):
    """Over the sm90 kernels and the dense and block-scaled tcgen05 ones (sm100, sm107 and sm103
    pipelines); the grouped templates' modules check theirs."""
    bundles = (*tcgen05_build.bundles, small_build, *fp4_build.bundles, *sm103_blockscaled_build.bundles)
    records = [(b, r) for b in bundles for r in b.records]
    clc = {r.kernel_id for b, r in records if check_scheduler_census(b, r)}
    assert clc == {"gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta_clc",
                   "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_clc",
                   "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_sfe8m0x32_clc",
                   "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16_clc",
                   "gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16_clc"}
    assert len(records) > len(clc)


def test_rubin_fp8_kernels_issue_the_64_byte_k_mma(sm100_build):
    """Two UTCQMMAs per 128-byte K slice where the sm100 pipeline issues four: the K width the
    sm107 facts give (mma_k_bytes 64), which exists only on SM 10.7."""
    _, k64 = sm100_build["gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1"]
    _, k32 = sm100_build["gemm_sm100_e4m3_e5m2_f32_bf16_tn_128x256x128_c2x1_2cta"]
    assert (k64.ctx.plan.mma_k_bytes, k32.ctx.plan.mma_k_bytes) == (64, 32)
    assert (k64.info.count("UTCQMMA"), k32.info.count("UTCQMMA")) == (2, 4)


def test_the_epilogue_computes_its_activation(sm100_build):
    """silu's exponential is the only MUFU.EX2 of the kernels; the plain one has none."""
    _, silu = sm100_build["gemm_sm100_bf16_bf16_f32_bf16_nt_128x256x64_c2x1_2cta_silu"]
    _, plain = sm100_build["gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1"]
    assert "MUFU.EX2" in disassemble(silu.cubin) and "MUFU.EX2" not in disassemble(plain.cubin)


def test_a_swapped_kernel_takes_the_problems_operands(sm100_build):
    """The kernel swaps A and B itself and stores C^T through its M-major view, so its
    arguments (the fake tensors it was traced with) are the problem's."""
    _, record = sm100_build["gemm_sm100_e4m3_e4m3_f32_bf16_nn_128x32x128_c2x1_swapab"]
    assert "SWAP_AB = True" in record.source
    assert "C_LAYOUT = LayoutEnum.COL_MAJOR if SWAP_AB" in record.source
    # The MMA's B is the problem's M-major A: 8-bit and transposed, so MMA N steps by 16.
    assert record.ctx.entry.config.mma_layout.b_k_major is False
