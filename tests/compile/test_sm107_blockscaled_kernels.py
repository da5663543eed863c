"""What the sm107 pipeline adds to the block-scaled kernels, in their SASS.

The block-scaled template on the sm107 pipeline (catalog/hardware/sm107.yaml) builds the 64-byte-K
block-scaled MMA of SM 10.7 (the DSL's SM107BlockScaledMmaMXF8F6F4Op and SM107MmaMXF4NVF4Op, via
cutlass.utils.rubin_helpers) and takes all 576 tensor-memory columns where two 256-column
accumulators and the scale factors need more than 512. No Rubin part has run these kernels; per
kernel of tests/compile/conftest.py's SM107_BLOCKSCALED_KERNELS, built deviceless for sm_107a:

* two MMAs per 128-byte K slice (the sm100 pipeline issues four), UTCQMMA for e4m3 data and
  UTCOMMA for e2m1, ``.2CTA`` exactly for a CTA pair, each naming the accumulator and both scale
  factors in tensor memory;
* one scale-factor copy (``UTCCP.T.S.4x32dp128bit``) per 512-byte atom of a stage;
* the 128x256 tiles keep two accumulators (536 columns) in an exclusive 576-column allocation;
* e5m3 scale factors (SM 10.7 only) are the mxfp4 kernel's instructions with another scale type in
  the MMA's instruction descriptor: the two kernels' SASS differ only in the descriptor
  immediates, bits 23-24 (measured with the CUDA 13 toolchain: 1 for e8m0, 2 for e5m3).
"""

from __future__ import annotations

import difflib
import re

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import SM107_BLOCKSCALED_KERNELS

pytestmark = pytest.mark.compile

MMA_BY_BITS = {8: "UTCQMMA", 4: "UTCOMMA"}
MMA_OPCODES = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")
ATOM_BYTES = 512
# The scale-type field of the block-scaled MMA's instruction descriptor (bits 23-24), as measured.
SCALE_TYPE_SHIFT, SCALE_TYPE = 23, {"e8m0": 1, "e5m3": 2}


@pytest.fixture(scope="module")
def records(sm107_blockscaled_build):
    return {r.kernel_id: (b, r) for b in sm107_blockscaled_build.bundles for r in b.records}


def mma_lines(sass: str) -> list[str]:
    return [line for line in sass.splitlines() if re.search(r"\bUTC[A-Z]MMA\b", line)]


@pytest.mark.parametrize("kernel_id", sorted(SM107_BLOCKSCALED_KERNELS))
def test_kernel_issues_the_64_byte_k_block_scaled_mma(records, kernel_id):
    bundle, record = records[kernel_id]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.status == "compiled" and bundle.arch == "sm_107a" and compiled_for(record.cubin) == "sm_107a"
    assert cfg.pipeline == "sm107" and plan.mma_k_bytes == 64 and plan.cta_k_bytes == 128
    mma = MMA_BY_BITS[cfg.dtypes.a.bits]
    assert record.info.count(mma) == plan.k_blocks == 2, dict(record.info.census)
    assert all(record.info.count(op) == 0 for op in MMA_OPCODES if op != mma)
    assert "cutlass.utils.rubin_helpers" in record.source and "MMA_K_BYTES, MMA_K = 64," in record.source
    sass = disassemble(record.cubin)
    lines = mma_lines(sass)
    pair = ".2CTA" if plan.cta_group == 2 else ""
    assert {re.search(r"\b(UTC[A-Z]MMA(?:\.[A-Z0-9_]+)*)", line).group(1) for line in lines} == {mma + pair}
    assert all(line.count("tmem[") == 3 for line in lines), lines
    one = plan.smem.scale_bytes // plan.stages
    assert len(re.findall(r"\bUTCCP\.T\.S\.(?:2CTA\.)?4x32dp128bit\b", sass)) == one // ATOM_BYTES
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    assert record.info.registers <= record.ctx.facts.require("max_registers_per_thread")
    assert record.info.static_smem_bytes == plan.smem.static_bytes
    assert plan.smem.total <= plan.smem_budget


@pytest.mark.parametrize("kernel_id", sorted(k for k in SM107_BLOCKSCALED_KERNELS if "128x256x" in k))
def test_a_128x256_tile_keeps_two_accumulators_in_576_columns(records, kernel_id):
    """The sm100 pipeline's 128x256 block-scaled tile has one accumulator (2 x 256 + 48 > 512)."""
    _, record = records[kernel_id]
    plan = record.ctx.plan
    assert (plan.acc_stages, plan.tmem_acc_columns, plan.tmem_alloc_columns) == (2, 512, 576)
    assert 512 < plan.tmem_acc_columns + plan.tmem_scale_columns <= 576
    assert "TMEM_COLUMNS = 576" in record.source and 'arch="sm_107"' in record.source


def _normalized(sass: str) -> list[str]:
    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in sass.splitlines()
            if line.strip().startswith("/*")]


def test_e5m3_scales_change_only_the_mma_descriptor_scale_type(records):
    _, e8m0 = records["gemm_sm107_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe8m0x32"]
    _, e5m3 = records["gemm_sm107_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe5m3x32"]
    assert "SF_DTYPE = cutlass.FloatNV8E5M3FNU" in e5m3.source
    old, new = _normalized(disassemble(e8m0.cubin)), _normalized(disassemble(e5m3.cubin))
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    changed = [(old[i1:i2], new[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    assert changed, "the e5m3 kernel's SASS is the e8m0 kernel's"
    mask = ~(3 << SCALE_TYPE_SHIFT)
    for before, after in changed:
        assert len(before) == len(after), (before, after)
        for x, y in zip(before, after):
            hx, hy = re.findall(r"0x[0-9a-f]+", x), re.findall(r"0x[0-9a-f]+", y)
            assert re.sub(r"0x[0-9a-f]+", "IMM", x) == re.sub(r"0x[0-9a-f]+", "IMM", y), (x, y)
            for a, b in zip(map(lambda h: int(h, 16), hx), map(lambda h: int(h, 16), hy)):
                if a != b:
                    assert a & mask == b & mask, (x, y)
                    assert (a >> SCALE_TYPE_SHIFT) & 3 == SCALE_TYPE["e8m0"], x
                    assert (b >> SCALE_TYPE_SHIFT) & 3 == SCALE_TYPE["e5m3"], y
