"""The block-scaled grouped templates (templates/sm100_blockscaled_grouped.py.j2 on the sm100 and
sm107 pipelines, sm103_blockscaled_grouped.py.j2 on sm103) compile for the Blackwell-family targets
into what their plans say, and their host launch path launches what the validator derived.

No Blackwell or Rubin part has run these kernels: this census and the recorded launches are what
verifies them. The catalog's fifteen kernels (catalog/gemm/sm100_blockscaled_grouped.yaml and the
grouped items of sm107_blockscaled.yaml and sm103_blockscaled.yaml), each for one target: mxfp8,
nvfp4 and mxfp4 in the contiguous layout, mxfp8, nvfp4 and mxfp4 in the masked one; mxfp8 and mxfp4
on the sm107 pipeline's 64-byte K in both, and fp4 with e5m3 scales (SM 10.7 only) contiguous;
nvfp4 and mxfp4 on the sm103 pipeline's 48-byte K contiguous, mxfp4 masked; and nvfp4's
cluster-launch-control twin. Per kernel:

* the block-scaled MMA: UTCQMMA for e4m3 data (kind::mxf8f6f4), UTCOMMA for e2m1 (mxf4 for
  32-element e8m0 blocks; mxf4nvf4 for nvfp4, its 16-element-block form, ``.BLOCK16`` as nvdisasm
  spells it for sm_103a), ``k_blocks`` of them per K slice (K slice bytes / the pipeline's MMA K:
  128 / 32 = 4 on sm100, 128 / 64 = 2 on sm107, 384 / 48 = 8 on sm103), each naming three
  tensor-memory operands (the accumulator and the scale factors of A and of B), never ``.2CTA``;
  the sm103 kernels' MMA descriptors ask for the 48-byte K (instruction-descriptor bit 31,
  tests/compile/test_sm103_blockscaled_kernels.py);
* one ``UTCCP.T.S.4x32dp128bit`` per 512-byte scale-factor atom of the stage's SFA and SFB;
* TMA loads of A, B and both scale-factor tensors, TMA stores, the partial tile's predicated
  stores (STG) and the group table's loads (LDG), no local memory, registers within the facts, the
  shared memory the plan modelled (scale-factor rings and group table included);
* launched through the driver (the recording stand-in of test_launch_record.py) with grid (1, 1,
  min(work-item bound, resident clusters)) (the clc twin: (bound, 1, 1)), the plan's threads and
  dynamic shared memory, the cluster attribute, for contiguous and masked problems.
"""

from __future__ import annotations

import json
import re

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import build_catalogs, records_by_id
from tests.compile.test_launch_record import Recorded, check_grouped_launches, link_recording_library
from tests.compile.test_sm100_kernels import check_scheduler_census
from tests.compile.test_sm103_blockscaled_kernels import K96_BIT, descriptor_immediates
from tilekiln.blockscaled import block_request
from tilekiln.grouped import MAX_GROUPS
from tilekiln.problem import requested_epilogue

pytestmark = pytest.mark.compile

SM100 = """pipeline: sm100
targets: [sm_100a]
defaults:
  family: grouped
  dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
  block_scale: {scale: e8m0, block: 32}
  layout: tn
kernels:
  - tile: [128, 256, 128]
    cluster: [1, 1]
    targets: [sm_100a]
  - tile: [128, 256, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
    block_scale: {scale: e4m3, block: 16}
    targets: [sm_103a]
  - tile: [128, 256, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
    block_scale: {scale: e4m3, block: 16}
    scheduler: clc
    targets: [sm_103a]
  - tile: [128, 256, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
    targets: [sm_100a]
  - family: grouped_masked
    tile: [128, 128, 128]
    cluster: [1, 1]
    targets: [sm_100a]
  - family: grouped_masked
    tile: [128, 128, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
    targets: [sm_103a]
  - family: grouped_masked
    tile: [128, 128, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
    block_scale: {scale: e4m3, block: 16}
    targets: [sm_100a]
"""
SM107 = """pipeline: sm107
targets: [sm_107a]
defaults:
  dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
  block_scale: {scale: e8m0, block: 32}
  layout: tn
kernels:
  - family: grouped
    tile: [128, 256, 128]
    cluster: [1, 1]
  - family: grouped_masked
    tile: [128, 128, 128]
    cluster: [1, 1]
  - family: grouped
    tile: [128, 256, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
    block_scale: {scale: e5m3, block: 32}
  - family: grouped
    tile: [128, 256, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
  - family: grouped_masked
    tile: [128, 128, 256]
    cluster: [1, 1]
    dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
"""
SM103 = """pipeline: sm103
targets: [sm_103a]
defaults:
  dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}
  layout: tn
kernels:
  - family: grouped
    tile: [128, 128, 768]
    cluster: [1, 1]
    block_scale: {scale: e4m3, block: 16}
  - family: grouped
    tile: [128, 128, 768]
    cluster: [1, 1]
    block_scale: {scale: e8m0, block: 32}
  - family: grouped_masked
    tile: [128, 128, 768]
    cluster: [1, 1]
    block_scale: {scale: e8m0, block: 32}
"""
KERNELS = {
    "grouped_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32": "sm_100a",
    "grouped_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16": "sm_103a",
    "grouped_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16_clc": "sm_103a",
    "grouped_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe8m0x32": "sm_100a",
    "grouped_masked_sm100_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_sfe8m0x32": "sm_100a",
    "grouped_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32": "sm_107a",
    "grouped_masked_sm107_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_sfe8m0x32": "sm_107a",
    "grouped_sm107_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe5m3x32": "sm_107a",
    "grouped_masked_sm100_e2m1_e2m1_f32_bf16_tn_128x128x256_c1x1_sfe8m0x32": "sm_103a",
    "grouped_masked_sm100_e2m1_e2m1_f32_bf16_tn_128x128x256_c1x1_sfe4m3x16": "sm_100a",
    "grouped_sm107_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe8m0x32": "sm_107a",
    "grouped_masked_sm107_e2m1_e2m1_f32_bf16_tn_128x128x256_c1x1_sfe8m0x32": "sm_107a",
    "grouped_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16": "sm_103a",
    "grouped_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe8m0x32": "sm_103a",
    "grouped_masked_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe8m0x32": "sm_103a",
}
# The template of each pipeline's block-scaled grouped kernels.
TEMPLATES = {"sm100": "sm100_blockscaled_grouped", "sm107": "sm100_blockscaled_grouped",
             "sm103": "sm103_blockscaled_grouped"}
FORMATS = {("e4m3", "e8m0", 32): "mxfp8", ("e2m1", "e4m3", 16): "nvfp4", ("e2m1", "e8m0", 32): "mxfp4",
           ("e2m1", "e5m3", 32): "fp4-e5m3-b32"}
MMA_BY_BITS = {8: "UTCQMMA", 4: "UTCOMMA"}
MMA_OPCODES = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")
ATOM_BYTES = 512  # one scale-factor atom: 128 rows x 4 blocks
# nvdisasm's spelling of the MMA with a 16-element scale block: .4X for sm_100a, .BLOCK16 for sm_103a
# and sm_107a (CUDA 13 toolchain, measured; test_blockscaled_kernels.py has sm_100a's and sm_107a's).
BLOCK16_FORM = {"sm_103a": ".BLOCK16", "sm_107a": ".BLOCK16"}
STORES = re.compile(r"\bSTG\.E(?:\.[A-Z0-9]+)*\b")
LOADS = re.compile(r"\bLDG\.E(?:\.[A-Z0-9]+)*\b")
# (total_M or M_max, N, K, G): decode-sized, ragged, large with many groups, one group.
PROBLEMS = ((16, 4096, 4096, 8), (1008, 1280, 512, 3), (8192, 1536, 2048, 128), (300, 256, 256, 1))


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return build_catalogs(tmp_path_factory.mktemp("blockscaled_grouped"),
                          {"sm100.yaml": SM100, "sm107.yaml": SM107, "sm103.yaml": SM103})


@pytest.fixture(scope="module")
def records(build):
    return records_by_id(build)


def test_the_catalog_builds_each_kernel_for_its_target(records):
    assert {kid: b.arch for kid, (b, _) in records.items()} == KERNELS


def mma_lines(sass: str) -> list[str]:
    return [line for line in sass.splitlines() if re.search(r"\bUTC[A-Z]MMA\b", line)]


@pytest.mark.parametrize("kernel_id", sorted(KERNELS))
def test_kernel_compiles_to_the_block_scaled_mma_its_plan_names(records, kernel_id):
    bundle, record = records[kernel_id]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.ctx.template.name == TEMPLATES[cfg.pipeline]
    assert record.status == "compiled" and compiled_for(record.cubin) == KERNELS[kernel_id]
    mma = MMA_BY_BITS[cfg.dtypes.a.bits]
    assert record.info.count(mma) == plan.k_blocks == plan.cta_k_bytes // plan.mma_k_bytes, dict(record.info.census)
    assert all(record.info.count(op) == 0 for op in MMA_OPCODES if op != mma)
    sass = disassemble(record.cubin)
    lines = mma_lines(sass)
    form = f"{mma}{BLOCK16_FORM.get(bundle.arch, '.4X')}" if cfg.block_scale.block == 16 else mma
    assert {re.search(r"\b(UTC[A-Z]MMA(?:\.[A-Z0-9_]+)*)", line).group(1) for line in lines} == {form}
    assert all(line.count("tmem[") == 3 for line in lines), lines
    one_stage = plan.smem.scale_bytes // plan.stages
    assert len(re.findall(r"\bUTCCP\.T\.S\.4x32dp128bit\b", sass)) == one_stage // ATOM_BYTES
    assert "2CTA" not in sass
    assert record.info.count("UTMALDG") >= 4 and record.info.count("UTMASTG") > 0
    # The partial tile's predicated stores, and the group table's reads of offs / masked_m.
    assert STORES.search(sass) and LOADS.search(sass)
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    assert record.info.count("LDL") == 0 and record.info.count("STL") == 0
    facts = record.ctx.facts
    assert record.info.registers <= facts.require("max_registers_per_thread")
    assert record.info.registers * plan.threads <= facts.require("registers_per_sm")
    assert record.info.static_smem_bytes == plan.smem.static_bytes
    assert plan.smem.table_bytes == 2 * (MAX_GROUPS + 1) * 4
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    (kernel,) = [k for k in manifest["kernels"] if k["id"] == kernel_id]
    assert kernel["resources"]["smem_bytes"] == plan.smem.total <= plan.smem_budget
    assert kernel["verification"] == "compile-verified"


def test_the_clc_twin_issues_try_cancel_once_and_the_static_kernels_never(records):
    """nvfp4's cluster-launch-control twin (scheduler: clc): its scheduler warp's one
    UGETNEXTWORKID.BROADCAST, none in any static kernel (check_scheduler_census)."""
    clc = {kid for kid, (bundle, record) in records.items() if check_scheduler_census(bundle, record)}
    assert clc == {"grouped_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16_clc"}


def test_the_sm107_pipeline_issues_the_64_byte_k_mma(records):
    """Two UTCQMMAs per 128-byte K slice where the sm100 pipeline's mxfp8 kernel issues four."""
    _, k64 = records["grouped_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32"]
    _, k32 = records["grouped_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32"]
    assert (k64.ctx.plan.mma_k_bytes, k32.ctx.plan.mma_k_bytes) == (64, 32)
    assert (k64.info.count("UTCQMMA"), k32.info.count("UTCQMMA")) == (2, 4)
    # Two 256-column accumulators beside the scale factors: SM 10.7's exclusive 576-column allocation,
    # where the sm100 pipeline's 128x256 keeps one accumulator in 512.
    assert (k64.ctx.plan.acc_stages, k64.ctx.plan.tmem_alloc_columns) == (2, 576) and 'arch="sm_107"' in k64.source
    assert (k32.ctx.plan.acc_stages, k32.ctx.plan.tmem_alloc_columns) == (1, 512)


def test_the_sm107_pipelines_mxfp4_issues_the_64_byte_k_mma(records):
    """Two UTCOMMAs (128 e2m1 elements, four e8m0 blocks each) per 256-element K slice where the sm100
    pipeline's mxfp4 kernels issue four, contiguous and masked."""
    for layout in ("grouped", "grouped_masked"):
        tile = "128x256x256" if layout == "grouped" else "128x128x256"
        _, k64 = records[f"{layout}_sm107_e2m1_e2m1_f32_bf16_tn_{tile}_c1x1_sfe8m0x32"]
        assert (k64.ctx.plan.mma_k_bytes, k64.info.count("UTCOMMA")) == (64, 2)
        assert "sm107_helpers.make_blockscaled_trivial_tiled_mma" in k64.source
    _, k32 = records["grouped_masked_sm100_e2m1_e2m1_f32_bf16_tn_128x128x256_c1x1_sfe8m0x32"]
    assert (k32.ctx.plan.mma_k_bytes, k32.info.count("UTCOMMA")) == (32, 4)


SM103_GROUPED = sorted(kid for kid in KERNELS if "_sm103_" in kid)


@pytest.mark.parametrize("kernel_id", SM103_GROUPED)
def test_the_sm103_pipeline_issues_eight_48_byte_k_mmas_per_384_byte_slice(records, kernel_id):
    """The dense sm103 kernels' mainloop (common/sm103.j2): 768 e2m1 elements per slice in three
    128-byte chunks, eight MMAs whose descriptors set the 48-byte-K bit, one crossing into the next
    chunk through next_src; the slice's factors resident in tensor memory as whole atoms."""
    bundle, record = records[kernel_id]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert bundle.arch == "sm_103a" and cfg.tile.k * cfg.dtypes.a.bits // 8 == plan.cta_k_bytes == 384
    assert (plan.mma_k_bytes, plan.k_blocks, record.info.count("UTCOMMA")) == (48, 8, 8)
    assert "sm103_make_blockscaled_trivial_tiled_mma" in record.source and "next_src=" in record.source
    descriptors = descriptor_immediates(disassemble(record.cubin), cfg.tile.m, cfg.tile.n)
    assert descriptors and all(d & K96_BIT for d in descriptors), sorted(map(hex, descriptors))
    # 48 (nvfp4) or 24 (mxfp4) blocks per row: 12 or 6 atoms along K, 4 columns each per 128 rows of A and B
    atoms = cfg.tile.k // cfg.block_scale.block // 4
    assert plan.tmem_scale_columns == 2 * 4 * atoms and plan.stages == 2


def test_the_sm103_nvfp4_kernel_fits_two_stages_beside_the_group_table(records):
    """Two 108 KiB K-slices, the 2 KiB group table and the 8-column epilogue buffer within the 227 KiB
    opt-in limit: what the template's epilogue_tile_n (8, the dense template's 16) is for."""
    _, record = records["grouped_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16"]
    plan = record.ctx.plan
    assert (plan.stages, plan.epi_n) == (2, 8)
    assert plan.smem.total == 3 * 1024 + 2 * 110592 + 128 * 8 * 2 * 2 + 1024 <= plan.smem_optin


@pytest.mark.parametrize("kernel_id", ["grouped_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32",
                                       "grouped_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16"])
def test_a_contiguous_tile_reads_its_groups_scale_band(records, kernel_id):
    """The rendered kernel (either template) takes each tile's SFA band from the group table (item end
    / N cluster tiles), and sizes SFA for ceil(total_M / 128) + G - 1 bands
    (tilekiln.blockscaled.grouped_bands)."""
    _, record = records[kernel_id]
    assert "band = item_ends[group] // cluster_tiles_n + (row - row_ends[group]) // SF_BAND_ROWS" in record.source
    assert "sfa_shape = (((m + SF_BAND_ROWS - 1) // SF_BAND_ROWS + groups - 1) * SF_BAND_ROWS, k, 1)" in record.source


def test_every_block_scaled_grouped_kernel_launches_as_its_plan_says(build, tmp_path):
    def requested(cfg):
        name = FORMATS[(cfg.dtypes.a.value, cfg.block_scale.scale.value, cfg.block_scale.block)]
        return requested_epilogue(**dict(block_request(name)))

    launched = set()
    for bundle in build.bundles:
        recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
        launched |= check_grouped_launches(recorded, PROBLEMS, requested)
    assert launched == set(KERNELS)
