"""What the sm103 pipeline adds to the block-scaled kernels, in their SASS.

The sm103 template (templates/sm103_blockscaled.py.j2, catalog/hardware/sm103.yaml) builds the
48-byte-K block-scaled fp4 MMA of SM 10.3 (the DSL's SM103MmaMXF4NVF4Op and SM103MmaMXF4Op:
``tcgen05.mma .kind::mxf4nvf4 / .kind::mxf4`` with K = 96 e2m1 elements) over the pipeline's
fixed 384-byte CTA K. No B300 has run these kernels; per kernel of tests/compile/conftest.py's
SM103_BLOCKSCALED_KERNELS, built deviceless for sm_103a:

* eight UTCOMMA per 384-byte K slice (384 / 48; the sm100 pipeline issues four per 128-byte
  slice), no other MMA kind, no ``.2CTA``, each naming the accumulator and both scale factors in
  tensor memory;
* the 48-byte K itself. nvdisasm (13.5) prints the K = 96 MMA with the mnemonic of the
  64-element one (``UTCOMMA.BLOCK16`` for nvfp4, ``UTCOMMA`` for mxfp4, on sm_103a both): the
  width is not in the opcode but in the MMA's instruction descriptor (``idesc[URx]``), whose
  immediates the kernel builds with ``UMOV`` / ``USEL``. Measured on these kernels: every
  descriptor immediate (the one whose M field, bits 24-28, is tile M / 16 and N field, bits
  17-22, tile N / 8) has bit 31 set, 0x88202480 and 0x88200480 for 128x128 nvfp4 (the second
  without the accumulate bit); the sm100 pipeline's fp4 kernel built for the same sm_103a
  target has it clear (0x08402480 for 128x256 nvfp4). The test checks both sides;
* one ``UTCCP.T.S.4x32dp128bit`` per 512-byte scale-factor atom of the slice: the MMAs read 6
  (nvfp4) or 3 (mxfp4) blocks, across atoms, so the whole slice's factors go to tensor memory;
* TMA loads and stores, no local memory (no LDL/STL), the modelled shared memory within the
  opt-in limit, registers within the facts, and the manifest saying compile-verified;
* the epilogue's pack into C's type: ``F2FP.F16.F32.PACK_AB`` and no bf16 pack in the fp16-output
  kernel, ``F2FP.BF16.F32.PACK_AB`` and no fp16 one in the others.
"""

from __future__ import annotations

import json
import re

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import SM103_BLOCKSCALED_KERNELS

pytestmark = pytest.mark.compile

MMA_OPCODES = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")
ATOM_BYTES = 512
# The instruction descriptor's K-width bit that the 48-byte-K MMA sets (measured, module doc).
K96_BIT = 1 << 31
# The epilogue's conversion of two fp32 accumulator values into a packed pair of C's type.
PACK = {"bf16": "F2FP.BF16.F32.PACK_AB", "f16": "F2FP.F16.F32.PACK_AB"}
# The sm100 pipeline's fp4 kernel that tests/compile/conftest.py's FP4_KERNELS builds for sm_103a.
SM100_FP4_ON_SM103 = "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe8m0x32"


@pytest.fixture(scope="module")
def records(sm103_blockscaled_build):
    return {r.kernel_id: (b, r) for b in sm103_blockscaled_build.bundles for r in b.records}


def mma_lines(sass: str) -> list[str]:
    return [line for line in sass.splitlines() if re.search(r"\bUTC[A-Z]MMA\b", line)]


def descriptor_immediates(sass: str, tile_m: int, tile_n: int) -> set[int]:
    """The 32-bit immediates of the SASS that are MMA instruction descriptors of this tile."""
    values = {int(h, 16) for h in re.findall(r"\b0x([0-9a-f]{1,8})\b", sass)}
    return {v for v in values if (v >> 24) & 0x1F == tile_m >> 4 and (v >> 17) & 0x3F == tile_n >> 3}


@pytest.mark.parametrize("kernel_id", sorted(SM103_BLOCKSCALED_KERNELS))
def test_kernel_issues_eight_48_byte_k_mmas_per_slice(records, kernel_id):
    bundle, record = records[kernel_id]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.status == "compiled" and bundle.arch == "sm_103a" and compiled_for(record.cubin) == "sm_103a"
    assert cfg.pipeline == "sm103" and plan.mma_k_bytes == 48 and plan.cta_k_bytes == 384 and plan.k_blocks == 8
    assert record.info.count("UTCOMMA") == plan.k_blocks, dict(record.info.census)
    assert all(record.info.count(op) == 0 for op in MMA_OPCODES if op != "UTCOMMA")
    assert "sm103_make_blockscaled_trivial_tiled_mma" in record.source and "next_src=" in record.source
    sass = disassemble(record.cubin)
    lines = mma_lines(sass)
    form = "UTCOMMA.BLOCK16" if cfg.block_scale.block == 16 else "UTCOMMA"
    assert {re.search(r"\b(UTC[A-Z]MMA(?:\.[A-Z0-9_]+)*)", line).group(1) for line in lines} == {form}
    assert all(line.count("tmem[") == 3 for line in lines), lines
    assert PACK[cfg.dtypes.c.value] in sass and all(form not in sass for c, form in PACK.items()
                                                     if c != cfg.dtypes.c.value)
    one = plan.smem.scale_bytes // plan.stages
    assert len(re.findall(r"\bUTCCP\.T\.S\.4x32dp128bit\b", sass)) == one // ATOM_BYTES
    assert record.info.count("UTMALDG") >= 4 and record.info.count("UTMASTG") > 0
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    facts = record.ctx.facts
    assert record.info.registers <= facts.require("max_registers_per_thread")
    assert record.info.static_smem_bytes == plan.smem.static_bytes
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    (kernel,) = [k for k in manifest["kernels"] if k["id"] == kernel_id]
    assert kernel["resources"]["smem_bytes"] == plan.smem.total <= plan.smem_budget == plan.smem_optin
    assert kernel["verification"] == "compile-verified"


@pytest.mark.parametrize("kernel_id", sorted(SM103_BLOCKSCALED_KERNELS))
def test_every_mma_descriptor_asks_for_the_48_byte_k(records, kernel_id):
    _, record = records[kernel_id]
    t = record.ctx.entry.config.tile
    descriptors = descriptor_immediates(disassemble(record.cubin), t.m, t.n)
    assert descriptors and all(d & K96_BIT for d in descriptors), sorted(map(hex, descriptors))


def test_the_sm100_pipelines_fp4_kernel_on_sm103_keeps_the_32_byte_k(fp4_build):
    """The same target, the sm100 pipeline's template: its descriptors leave the K-width bit clear,
    so the bit is what the sm103 kernels add, not what sm_103a spells every fp4 MMA with."""
    (record,) = [r for b in fp4_build.bundles for r in b.records if r.kernel_id == SM100_FP4_ON_SM103]
    assert compiled_for(record.cubin) == "sm_103a" and record.ctx.plan.mma_k_bytes == 32
    t = record.ctx.entry.config.tile
    descriptors = descriptor_immediates(disassemble(record.cubin), t.m, t.n)
    assert descriptors and not any(d & K96_BIT for d in descriptors), sorted(map(hex, descriptors))


def test_tensor_memory_holds_the_whole_slices_scale_factors(records):
    """nvfp4 128x128x768: 48 blocks per row, 12 atoms along K, 4 columns each per 128 rows of A and B."""
    _, record = records["gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16"]
    plan = record.ctx.plan
    assert (plan.acc_stages, plan.tmem_acc_columns, plan.tmem_scale_columns, plan.tmem_alloc_columns) == (
        2, 256, 96, 512)
    assert plan.stages == 2
