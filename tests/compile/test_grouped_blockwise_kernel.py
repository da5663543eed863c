"""Blockwise fp8 grouped kernels (issue 34), built deviceless: the SASS shows the promotion of
templates/common/blockwise.j2 as the dense blockwise kernels have it, and each kernel launches
through tilekiln.grouped as its plan says (the recording driver of test_launch_record.py).

The scheme in the SASS: each K block's WGMMAs start from a zero partial sum (``RZ``), two partial
sums alternate, the next block's WGMMAs are in flight while one is promoted (``WARPGROUP.DEPBAR.LE
gsb0, 0x1``), and each promotion is one FFMA per accumulator value of the thread (``acc + part *
scale``); no local memory, and no register past the consumer's setmaxnreg budget.
"""

from __future__ import annotations

import re

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, make_project, run_build, sm90_catalog
from tests.compile.test_blockwise_kernel import loads_waited_at_issue
from tests.compile.test_launch_record import Recorded, check_grouped_launches, link_recording_library
from tilekiln.problem import requested_epilogue

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - family: grouped
    tile: [128, 128, 128]
  - family: grouped_masked
    tile: [64, 128, 128]
    schedule: pingpong
""", dtypes="{a: e4m3, b: e4m3, acc: f32, c: bf16}", layout="tn", scaling="blockwise", cluster="[1, 1]")
CONTIGUOUS = "grouped_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_blockwise"
MASKED = "grouped_masked_sm90_e4m3_e4m3_f32_bf16_tn_64x128x128_c1x1_pingpong_blockwise"
# A K block is 4 WGMMAs of K 32; the mainloop issues blocks at four places (the first block, the
# two of the loop body taking blocks in pairs, the odd last one) and promotes at five (two in the
# loop body, two after an odd last block, one after an even one).
BLOCK_SITES, WGMMAS_PER_BLOCK, PROMOTE_SITES = 4, 4, 5
# (total_M or M_max, N, K, G), K a multiple of 128: decode-sized, ragged N, many groups, one group.
PROBLEMS = ((16, 4096, 7168, 8), (1008, 576, 512, 3), (8192, 2048, 7168, 128), (300, 256, 128, 1))
REGISTER = re.compile(r"\bR(\d+)\b")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("grouped_blockwise")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return base, result.bundles[0]


def test_each_block_starts_fresh_and_is_promoted_while_the_next_runs(built):
    _, bundle = built
    assert {r.kernel_id for r in bundle.records} == {CONTIGUOUS, MASKED}
    for record in bundle.records:
        plan = record.ctx.plan
        sass = disassemble(record.cubin)
        wgmmas = re.findall(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 (R\d+), gdesc\[UR\d+\], (\w+)", sass)
        assert len(wgmmas) == BLOCK_SITES * WGMMAS_PER_BLOCK, record.kernel_id
        assert record.info.count("QGMMA") == BLOCK_SITES * WGMMAS_PER_BLOCK, record.kernel_id
        fresh = [dst for dst, src in wgmmas if src == "RZ"]
        assert len(fresh) == BLOCK_SITES, "one zero-initialised WGMMA per K block"
        assert len(set(fresh)) == 2, "two partial sums alternate"
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass, "the next block runs while one is promoted"
        assert not loads_waited_at_issue(sass), "a block's WGMMAs wait for a scale's global load"
        # Each consumer thread holds 64 values of its 64 x 128 accumulator block.
        values = plan.acc_regs_per_thread
        assert values == 64, record.kernel_id
        # The epilogue multiplies by nothing (the scales are in the accumulator), so every FFMA is a
        # promotion's.
        ffma = len(re.findall(r"\bFFMA\b", sass))
        assert ffma == PROMOTE_SITES * values, (record.kernel_id, ffma)
        assert record.info.local_bytes == 0 and record.info.count("LDL") == record.info.count("STL") == 0
        assert not record.info.spills, record.kernel_id
        # Three accumulator sets fit the consumer's registers (rule REGISTER-BUDGET's model).
        assert 3 * values <= max(int(r) for r in REGISTER.findall(sass)) < plan.consumer_regs, record.kernel_id


def test_the_promotion_matches_the_dense_blockwise_kernels(built, tmp_path):
    """The same macro in both templates: a dense blockwise kernel of the contiguous kernel's tile has
    as many promotion FFMAs and WGMMAs."""
    dense = run_build(make_project(tmp_path / "project", CATALOG.split("kernels:")[0]
                                   + "kernels:\n  - tile: [128, 128, 128]\n"),
                      tmp_path / "artifacts", tmp_path / "cache")
    assert dense.ok, [r.error for b in dense.bundles for r in b.failed]
    (dense_record,) = dense.bundles[0].records
    (grouped,) = [r for r in built[1].records if r.kernel_id == CONTIGUOUS]
    count = lambda record: len(re.findall(r"\bFFMA\b", disassemble(record.cubin)))  # noqa: E731
    assert count(grouped) == count(dense_record)
    assert grouped.info.count("QGMMA") == dense_record.info.count("QGMMA")


def test_every_blockwise_grouped_kernel_launches_as_its_plan_says(built):
    base, bundle = built
    recorded = Recorded(bundle, link_recording_library(bundle, base / "lib"), base)
    launched = check_grouped_launches(recorded, PROBLEMS, lambda cfg: requested_epilogue(scaling="blockwise"))
    assert launched == {CONTIGUOUS, MASKED}


def test_a_blockwise_swiglu_kernel_promotes_as_the_plain_one_and_pairs_in_the_epilogue(tmp_path):
    """The expert MLP's gate_up: the gated blockwise grouped kernels keep the plain ones' mainloop (as
    many WGMMAs, two fresh partial sums alternating, the next block in flight during a promotion,
    no scale load waited on at issue) and add the pairing to the epilogue, within the registers."""
    gated = CATALOG.replace("    tile: [128, 128, 128]\n", "    tile: [128, 128, 128]\n    activation: swiglu\n")
    gated = gated.replace("    schedule: pingpong\n", "    schedule: pingpong\n    activation: swiglu\n")
    result = run_build(make_project(tmp_path / "project", gated), tmp_path / "artifacts", tmp_path / "cache")
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    records = result.bundles[0].records
    assert {r.kernel_id for r in records} == {CONTIGUOUS + "_swiglu", MASKED + "_swiglu"}
    for record in records:
        sass = disassemble(record.cubin)
        wgmmas = re.findall(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 (R\d+), gdesc\[UR\d+\], (\w+)", sass)
        assert len(wgmmas) == BLOCK_SITES * WGMMAS_PER_BLOCK, record.kernel_id
        assert len({dst for dst, src in wgmmas if src == "RZ"}) == 2, "two partial sums alternate"
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and not loads_waited_at_issue(sass)
        # silu's exponential in the epilogue: the multi-function unit.
        assert "MUFU.EX2" in sass, record.kernel_id
        assert record.info.local_bytes == 0 and not record.info.spills, record.kernel_id
        assert max(int(r) for r in REGISTER.findall(sass)) < record.ctx.plan.consumer_regs
