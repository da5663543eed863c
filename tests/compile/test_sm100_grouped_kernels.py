"""The tcgen05 grouped template (templates/sm100_grouped.py.j2) compiles for every Blackwell-family
target into what its plan says, and its host launch path launches what the validator derived.

No Blackwell or Rubin part has run these kernels: this census and the recorded launches are what
verifies them. Seven kernels, each for one target: the contiguous layout (bf16 K-major B, bf16
N-major B with A multicast along a 1x2 cluster, fp8) and the masked one (bf16, and fp8 on the sm107
pipeline's 64-byte K), and the cluster-launch-control twins of the bf16 contiguous and masked ones.
Per kernel:

* the MMA kind (UTCHMMA for 16-bit operands, UTCQMMA for 8-bit ones), never a .2CTA form (one CTA
  along M: the template's cluster_m), ``k_blocks`` of them per K slice: the pipeline's MMA K width;
* TMA loads and stores, no local memory, shared memory the plan modelled (its group table
  included) within the budget, registers within the facts, the exact target;
* the group's last, partial tile is stored from registers (STG; the dense tcgen05 kernels store
  only through TMA: 0 STG in gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1 for sm_100a), and the
  group table is read from global memory (one LDG per 32 groups);
* launched through the driver (the recording stand-in of test_launch_record.py) with grid
  (1, cluster_n, min(work-item bound, resident clusters)), the bound being what the host can count
  without reading ``offs``/``masked_m`` (tilekiln/grouped.py, GroupedProblem.work_items), the
  plan's 192 threads and dynamic shared memory, the cluster attribute and programmatic
  serialization; a clc kernel with grid (1 x bound, cluster_n, 1) and 224 threads, and exactly one
  ``UGETNEXTWORKID.BROADCAST`` (check_scheduler_census).
"""

from __future__ import annotations

import re

import pytest

from builder.compile.cubin import compiled_for, disassemble
from tests.compile.conftest import build_catalogs, records_by_id
from tests.compile.test_launch_record import Recorded, check_grouped_launches, link_recording_library
from tests.compile.test_sm100_kernels import check_scheduler_census
from tilekiln.grouped import MAX_GROUPS

pytestmark = pytest.mark.compile

SM100 = """pipeline: sm100
targets: [sm_100a]
defaults:
  family: grouped
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
  - tile: [128, 256, 64]
    cluster: [1, 1]
    targets: [sm_100a]
  - tile: [128, 128, 64]
    cluster: [1, 2]
    layout: tt
    targets: [sm_100f]
  - family: grouped_masked
    tile: [128, 128, 64]
    cluster: [1, 1]
    targets: [sm_103a]
  - tile: [128, 256, 64]
    cluster: [1, 1]
    scheduler: clc
    targets: [sm_100a]
  - family: grouped_masked
    tile: [128, 128, 64]
    cluster: [1, 1]
    scheduler: clc
    targets: [sm_103a]
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    tile: [128, 256, 128]
    cluster: [1, 1]
    targets: [sm_103a]
"""
SM107 = """pipeline: sm107
targets: [sm_107a]
defaults:
  family: grouped_masked
  dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
  layout: tn
kernels:
  - tile: [128, 128, 128]
    cluster: [1, 1]
"""
KERNELS = {
    "grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1": "sm_100a",
    "grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_clc": "sm_100a",
    "grouped_masked_sm100_bf16_bf16_f32_bf16_tn_128x128x64_c1x1_clc": "sm_103a",
    "grouped_sm100_bf16_bf16_f32_bf16_tt_128x128x64_c1x2": "sm_100f",
    "grouped_masked_sm100_bf16_bf16_f32_bf16_tn_128x128x64_c1x1": "sm_103a",
    "grouped_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1": "sm_103a",
    "grouped_masked_sm107_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1": "sm_107a",
}
MMA_BY_BITS = {16: "UTCHMMA", 8: "UTCQMMA"}
MMA_OPCODES = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")
STORES = re.compile(r"\bSTG\.E(?:\.[A-Z0-9]+)*\b")
LOADS = re.compile(r"\bLDG\.E(?:\.[A-Z0-9]+)*\b")
# (total_M or M_max, N, K, G): decode-sized, ragged, large with many groups, one group.
PROBLEMS = ((16, 4096, 4096, 8), (1008, 1040, 528, 3), (8192, 1536, 2048, 128), (300, 256, 128, 1))


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return build_catalogs(tmp_path_factory.mktemp("sm100_grouped"), {"sm100.yaml": SM100, "sm107.yaml": SM107})


@pytest.fixture(scope="module")
def records(build):
    return records_by_id(build)


def test_the_catalog_builds_each_kernel_for_its_target(records):
    assert {kid: b.arch for kid, (b, _) in records.items()} == KERNELS


@pytest.mark.parametrize("kernel_id", sorted(KERNELS))
def test_kernel_compiles_to_the_mma_its_plan_names(records, kernel_id):
    bundle, record = records[kernel_id]
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    assert record.ctx.template.name == "sm100_grouped"
    assert record.status == "compiled" and compiled_for(record.cubin) == KERNELS[kernel_id]
    mma = MMA_BY_BITS[cfg.mma_dtypes.a.bits]
    assert record.info.count(mma) == plan.k_blocks == plan.cta_k_bytes // plan.mma_k_bytes, dict(record.info.census)
    assert all(record.info.count(op) == 0 for op in MMA_OPCODES if op != mma)
    sass = disassemble(record.cubin)
    assert set(re.findall(r"\b(UTC[A-Z]MMA(?:\.[A-Z0-9_]+)*)\b", sass)) == {mma}
    assert record.info.count("UTMALDG") > 0 and record.info.count("UTMASTG") > 0
    # The partial tile's predicated stores, and the group table's reads of offs / masked_m.
    assert STORES.search(sass) and LOADS.search(sass)
    assert not record.info.spills and record.info.local_bytes == 0 and record.info.stack_bytes == 0
    assert record.info.count("LDL") == 0 and record.info.count("STL") == 0
    facts = record.ctx.facts
    assert record.info.registers <= facts.require("max_registers_per_thread")
    assert record.info.registers * plan.threads <= facts.require("registers_per_sm")
    assert record.info.static_smem_bytes == plan.smem.static_bytes
    # Row ends and item ends: two int32 tables of one more entry than the most groups.
    assert plan.smem.table_bytes == 2 * (MAX_GROUPS + 1) * 4
    assert plan.smem.total <= plan.smem_budget


def test_the_clc_twins_issue_try_cancel_once_and_the_static_kernels_never(records):
    clc = {kid for kid, (bundle, record) in records.items() if check_scheduler_census(bundle, record)}
    assert clc == {kid for kid in KERNELS if kid.endswith("_clc")} and len(clc) == 2
    _, twin = records["grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1"]
    _, record = records["grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_clc"]
    assert (record.ctx.plan.threads, twin.ctx.plan.threads) == (224, 192)
    # The cursor into the group table moves back where a cancelled item lies before its group.
    assert "while item < item_ends[group]:" in record.source and "while item < item_ends[group]:" not in twin.source


def test_the_sm107_pipeline_issues_the_64_byte_k_mma(records):
    """Two UTCQMMAs per 128-byte K slice where the sm100 pipeline's fp8 kernel issues four."""
    _, k64 = records["grouped_masked_sm107_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1"]
    _, k32 = records["grouped_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1"]
    assert (k64.ctx.plan.mma_k_bytes, k32.ctx.plan.mma_k_bytes) == (64, 32)
    assert (k64.info.count("UTCQMMA"), k32.info.count("UTCQMMA")) == (2, 4)


def test_every_grouped_kernel_launches_as_its_plan_says(build, tmp_path):
    launched = set()
    for bundle in build.bundles:
        recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
        launched |= check_grouped_launches(recorded, PROBLEMS)
    assert launched == set(KERNELS)
