"""Blockwise fp8 kernels compile to what the template's promotion scheme claims, and launch through
the glue with strided scale tensors.

The SASS shows the scheme: each K block's WGMMAs start from a zero accumulator (``RZ, !UPT``)
and the next block's WGMMAs are in flight while the previous one is promoted
(``WARPGROUP.DEPBAR.LE gsb0, 0x1``: wait until at most one group runs), no block's WGMMAs wait
for a scale's global load, and there are no local-memory spills even at 192 accumulator
registers of 232. A swapped kernel (the tokens along the MMA's N) promotes each column with its
own A scale and reads one B scale per K block. The launch runs against the recording stand-in of
tests/compile/test_launch_record.py.
"""

from __future__ import annotations

import re

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_launch_record import Recorded, expected_launch, link_recording_library, operand, recorded_launch

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - tile: [128, 128, 128]
    cluster: [2, 1]
  - tile: [64, 128, 128]
    schedule: pingpong
    cluster: [1, 1]
  - tile: [128, 192, 128]
    cluster: [1, 1]
  - tile: [64, 16, 128]
    cluster: [4, 1]
    swap_ab: true
  - tile: [64, 64, 128]
    cluster: [2, 1]
    swap_ab: true
""", dtypes="{a: e4m3, b: e4m3, acc: f32, c: bf16}", layout="tn", scaling="blockwise")
COOPERATIVE = "gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c2x1_blockwise"
PINGPONG = "gemm_sm90_e4m3_e4m3_f32_bf16_tn_64x128x128_c1x1_pingpong_blockwise"
# Two B scale blocks per tile, one partial sum (tilekiln/spec.py, blockwise_partials).
WIDE = "gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x192x128_c1x1_blockwise"
# Swapped: 64 rows of B (within one 128-row scale block) by 16 or 64 tokens.
SWAPPED = {"gemm_sm90_e4m3_e4m3_f32_bf16_tn_64x16x128_c4x1_swapab_blockwise": 16,
           "gemm_sm90_e4m3_e4m3_f32_bf16_tn_64x64x128_c2x1_swapab_blockwise": 64}
# A K block is 4 WGMMAs of K 32; the mainloop issues blocks at four places (the first block, the
# two of the loop body taking blocks in pairs, the odd last one).
BLOCK_SITES, WGMMAS_PER_BLOCK = 4, 4
_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def loads_waited_at_issue(sass: str) -> list[str]:
    """The instructions that read a global load's result between an mbarrier wait and the next
    WGMMA (or warpgroup arrive) where the load was issued after the last WGMMA: a K block's
    WGMMAs then wait for a global round trip before they issue. A pass over the SASS in address
    order; a register's load is forgotten once another instruction writes it, and every load
    once a WGMMA issues (a load issued before a block's WGMMAs has had them to land). A wait
    followed by a TMA load is a producer's, not a block's."""
    loaded, after_wait, found = set(), False, []
    for op, args in _SASS_LINE.findall(sass):
        regs = re.findall(r"\bR(\d+)\b", args)
        if op.startswith("SYNCS.PHASECHK"):
            after_wait = True
            continue
        if op.startswith(("UTMALDG", "WARPGROUP.ARRIVE", "QGMMA")):
            after_wait = False
            if op.startswith("QGMMA"):
                loaded.clear()
            continue
        # R2UR writes a uniform register and stores write memory: every R operand is read.
        writes = not op.startswith(("R2UR", "ST", "RED", "ATOM"))
        if after_wait and any(r in loaded for r in (regs[1:] if writes else regs)):
            found.append(f"{op} {args.strip()}")
        if writes and regs:
            loaded.discard(regs[0])
            if op.startswith("LDG"):
                loaded.add(regs[0])
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("blockwise")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result.bundles[0]


def test_each_block_starts_fresh_and_overlaps_the_previous_promotion(built):
    assert {r.kernel_id for r in built.records} == {COOPERATIVE, PINGPONG, WIDE, *SWAPPED}
    for record in (r for r in built.records if r.kernel_id != WIDE):
        sass = disassemble(record.cubin)
        mma_n = SWAPPED.get(record.kernel_id, 128)
        wgmmas = re.findall(rf"QGMMA\.64x{mma_n}x32\.F32\.E4M3\.E4M3 (R\d+), gdesc\[UR\d+\], (\w+)", sass)
        assert len(wgmmas) == BLOCK_SITES * WGMMAS_PER_BLOCK, record.kernel_id
        fresh = [dst for dst, src in wgmmas if src == "RZ"]
        assert len(fresh) == BLOCK_SITES, "one zero-initialised WGMMA per K block"
        assert len(set(fresh)) == 2, "two partial sums alternate"
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass, "the next block runs while one is promoted"
        assert record.info.local_bytes == 0 and dict(record.info.census)["LDL"] == 0, record.kernel_id
        assert dict(record.info.census)["STL"] == 0, record.kernel_id


def test_a_tile_over_two_b_blocks_promotes_each_block_once_done(built):
    """128x192: one issue site of a fresh partial sum, waited for in full (``0x0``) before its
    promotion, which is unrolled for both splits between the B blocks (64 or 128 columns): two
    promotions of 96 values each."""
    (record,) = [r for r in built.records if r.kernel_id == WIDE]
    sass = disassemble(record.cubin)
    wgmmas = re.findall(r"QGMMA\.64x192x32\.F32\.E4M3\.E4M3 (R\d+), gdesc\[UR\d+\], (\w+)", sass)
    assert len(wgmmas) == WGMMAS_PER_BLOCK and [src for _, src in wgmmas].count("RZ") == 1
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" in sass and "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in sass
    values = record.ctx.plan.acc_regs_per_thread
    assert values == 96
    assert len(re.findall(r"\bFFMA\b", sass)) == 2 * values
    assert record.info.local_bytes == 0 and not record.info.spills
    # Two accumulator sets fit (rule REGISTER-BUDGET's model).
    assert 2 * values <= max(int(r) for r in re.findall(r"\bR(\d+)\b", sass)) < record.ctx.plan.consumer_regs


def test_a_swapped_tile_promotes_each_column_with_its_own_a_scale(built):
    """Swapped, a thread's accumulator values lie in tile_n / 4 columns (two per 8-column group)
    and two row halves: each promotion multiplies tile_n / 4 column scales by the one B scale and
    adds each of the tile_n / 2 values with one FFMA, and each K block reads those scales and the
    B scale with tile_n / 4 + 1 loads. The mainloop has five promotion sites (two in the loop
    that takes blocks in pairs, two after an odd count, one after an even one) and four sites
    that read a block's scales."""
    for kernel_id, tile_n in SWAPPED.items():
        (record,) = [r for r in built.records if r.kernel_id == kernel_id]
        sass = disassemble(record.cubin)
        values = record.ctx.plan.acc_regs_per_thread
        assert values == tile_n // 2
        ffma, ldg = len(re.findall(r"\bFFMA\b", sass)), len(re.findall(r"\bLDG\.E\b", sass))
        assert ffma == 5 * values, kernel_id
        assert ldg == BLOCK_SITES * (tile_n // 4 + 1), kernel_id
        assert record.info.local_bytes == 0 and not record.info.spills


def test_no_block_waits_for_a_scale_load_before_its_wgmmas(built):
    """The scales are read after a block's WGMMAs issue (templates/common/blockwise.j2, mainloop):
    read before, ptxas's R2UR of the B scale stalled the 64x128 ping-pong kernel's issue on the
    load every K block (``R2UR UR35, R202`` between the stage wait and the first QGMMA)."""
    for record in built.records:
        assert not loads_waited_at_issue(disassemble(record.cubin)), record.kernel_id


def test_the_issue_check_finds_a_load_read_before_the_wgmmas():
    sass = """
        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR24], R24, gsb0 ;
        /*0020*/                   LDG.E R210, desc[UR34][R218.64] ;
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR5], R88 ;
        /*0040*/                   R2UR UR33, R210 ;
        /*0050*/                   WARPGROUP.ARRIVE ;
        /*0060*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR24], RZ, !UPT ;
    """
    assert loads_waited_at_issue(sass) == ["R2UR UR33, R210"]
    # Loaded before the last WGMMA, or overwritten since the load: nothing to wait for.
    lines = sass.strip().splitlines()
    assert not loads_waited_at_issue("\n".join([lines[1], lines[0], *lines[2:]]))
    assert not loads_waited_at_issue("\n".join([*lines[:2], "/*0028*/ MOV R210, RZ ;", *lines[2:]]))


def test_a_blockwise_plan_launches_through_the_glue(built, tmp_path):
    recorded = Recorded(built, link_recording_library(built, tmp_path / "lib"), tmp_path)
    for kernel_id in (COOPERATIVE, PINGPONG, WIDE, *SWAPPED):
        ctx = recorded.records[kernel_id].ctx
        recorded.configure(recorded.records[kernel_id].info.static_smem_bytes,
                           ctx.facts.require("smem_per_block_optin"))
        m, n, k = 1000, 576, 1024
        a = operand("a", m, k, 1, "e4m3", 0x7F0000000000, True)
        b = operand("b", k, n, 1, "e4m3", 0x7F1000000000, False)
        c = operand("out", m, n, 1, "bf16", 0x7F2000000000, True)
        plan = recorded.bundle.plan(a, b, c, kernel=kernel_id, out_dtype="bf16",
                                    requested=(("scaling", "blockwise"),), scale_strides=(m, m * 8, 8, 8 * 5))
        index = [x.id for x in recorded.bundle.kernels].index(kernel_id)
        resident = recorded.bundle.resident_clusters(recorded.bundle.kernels[index], 0)
        before = len(recorded.events())
        recorded.bundle.launch(plan, a.ptr, b.ptr, c.ptr, 0, 0x7F3000000000, 0x7F3000010000)
        (launch,) = [e for e in recorded.events()[before:] if e["event"] == "launch"]
        assert launch["path"] == "driver"
        assert recorded_launch(launch) == expected_launch(ctx, m, n, 1, resident)
