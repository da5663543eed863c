"""Derived values of a tcgen05 (Blackwell, Rubin) kernel: stages, shared and tensor memory.

With a template, the shared-memory model mirrors the ``Storage`` struct of
``templates/sm100_gemm.py.j2``: the operand ring's full/empty mbarriers, the
accumulator full/empty mbarriers, the TMEM dealloc mbarrier and the TMEM
address word, then the A ring, the B ring and the epilogue buffer, each
aligned to ``smem_buffer_alignment``; the DSL's static reservation comes on
top. Under a 2-CTA MMA each CTA holds its M rows of A and half of B's N. The
build compares the struct size the DSL reports while tracing with this model
(measured: 128x256x64, 4 stages, 1-CTA 214016 B; 2-CTA 148480 B; both equal).

Without a template (pipelines no template serves yet), the plan counts only
what any kernel of the config must hold, the operand and scale-factor rings
and their mbarriers, so its shared-memory figure is a lower bound and its
automatic stage count an upper bound; the rules say so.

Tensor memory holds accumulators as 32-bit cells, one lane per row, whatever
the accumulator type. Column counts follow the DSL's accumulator layouts
(``make_fragment_C``, measured with ``find_tmem_tensor_col_offset``):
128 rows per CTA take N columns per stage; a 1-CTA M=64 accumulator fills
half the lanes, so two stages share N columns (64x128, 2 stages: 128); a
2-CTA M=128 pair folds each CTA's 64 rows onto all lanes in N/2 columns
(2-CTA 128x128: 64 per stage). The allocation is a power of two of at least
``tmem_alloc_min_columns``, or every column when the pipeline allows an
exclusive allocation above ``tmem_exclusive_above``.

A block-scaled kernel (``templates/sm100_blockscaled.py.j2``) also holds one
stage's scale factors of A and B in tensor memory, copied there from shared
memory before its MMAs read them: per MMA instruction along K, one column per
32 rows of A and per 32 of B's rows rounded up to a whole 128-row atom
(``block_scale_atom_rows``; the DSL's ``make_tmem_layout_sfa/sfb``). The
48-byte MMA of sm103 (``templates/sm103_blockscaled.py.j2``) reads 6 or 3
blocks, across atoms, so the stage's factors are resident as whole atoms
instead: the same per 4 blocks (``block_scale_atom_k_blocks``) of the stage
(measured: 128x128x768 nvfp4, 24 tcgen05.cp atom copies and SFB at column
offset 48 of SFA's start, as the DSL's ``find_tmem_tensor_col_offset`` says). Its
accumulator stages are the template's, fewer if they and the scale factors do
not fit the columns together. Its ``Storage`` struct puts the scale-factor
rings (SFA then SFB, one 512-byte atom per 128 rows and 4 scale blocks)
between the barriers and the A ring; under a CTA pair each CTA holds the
scale factors of all of the tile's N (measured: 2-CTA 128x256x128 mxfp8,
the traced struct equals the model).

A ``scheduler: clc`` kernel adds a scheduler warp (the template's
``scheduler_threads``) and, first in its ``Storage`` struct, ``clc_stages``
responses of ``clc_response_bytes`` each (16-byte aligned, so the mbarriers
after them stay 8-byte aligned) and a full/empty mbarrier pair per response.

A grouped kernel (``templates/sm100_grouped.py.j2``) puts its group table, two
int32 entries per group plus one each, right after the TMEM address word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from builder.check.derive.common import SmemUse, align_up, storage_layout, tma_contract
from builder.load.facts import PipelineFacts
from builder.load.templates import Tcgen05Parameters
from tilekiln.spec import FAMILIES, Contract, KernelConfig, Scheduler


@dataclass(frozen=True)
class Tcgen05Plan:
    """Everything a tcgen05 template needs beyond the config, and what the rules check."""

    has_template: bool
    cta_group: int
    b_rows: int  # rows of B one CTA loads: tile N split over the CTA pair
    mma_m: int
    mma_n: int
    mma_k_bytes: int  # K bytes one MMA instruction reads (the pipeline's mma_k_bytes)
    mma_k: int  # the same in elements of the MMA's A type
    cta_k_bytes: int
    k_blocks: int  # MMA instructions along K per stage
    threads: int | None  # None without a template; a clc kernel's include its scheduler warp
    clc_stages: int  # cluster-launch-control responses in flight (0: the static scheduler)
    epi_m: int
    epi_n: int
    epi_stages: int
    acc_stages: int
    tmem_acc_columns: int
    tmem_scale_columns: int  # a block-scaled kernel's scale factors of one stage (0 otherwise)
    tmem_alloc_columns: int
    stages: int  # resolved; 0 when not even one stage fits
    max_fitting_stages: int  # within the opt-in limit and the descriptor limit: what auto picks
    max_budget_stages: int  # within the shared-memory budget alone
    max_descriptor_stages: int  # with every operand below the descriptor limit alone
    smem: SmemUse
    smem_optin: int
    smem_budget: int  # what this kernel's launch gets: the opt-in limit, or the carveout it requests
    smem_budget_name: str
    oversized_launch: bool  # the launch requests the oversized carveout (its stages need more than opt-in)
    mcast_a: int  # CTAs one A load is multicast to (along cluster N)
    mcast_b: int  # CTAs one B load is multicast to (along cluster M, per CTA pair)
    contract: Contract
    buffer_align: int  # bytes: every shared-memory buffer starts on this boundary


def tmem_accumulator_columns(cta_m: int, n: int, cta_group: int, acc_stages: int, lanes: int) -> int:
    """TMEM columns of ``acc_stages`` accumulators of a ``cta_m`` x ``n`` CTA tile (see module doc)."""
    if cta_m >= lanes or cta_group == 2:
        return n * cta_m // lanes * acc_stages
    return n * math.ceil(acc_stages * cta_m / lanes)


def tmem_scale_columns(config: KernelConfig, facts: PipelineFacts, k_blocks: int) -> int:
    """TMEM columns of one stage's scale factors of A and B, ``k_blocks`` MMAs along K (see module doc)."""
    if config.block_scale is None:
        return 0
    rows = facts.require("block_scale_atom_rows")
    atom_blocks = facts.require("block_scale_atom_k_blocks")
    blocks_per_mma = facts.require("mma_k_bytes") * 8 // config.mma_dtypes.a.bits // config.block_scale.block
    t, lanes_per_column = config.tile, 32
    # Where an MMA's blocks lie within one atom, each MMA gets its own columns; where they span two
    # (the 48-byte MMA's 6 or 3 blocks), the stage's factors stay resident as whole atoms. A block
    # wider than one MMA's K (blocks_per_mma 0) is no block-scale combination, which a rule reports;
    # the plan still counts its atoms, so that the rule, not a ZeroDivisionError, says so.
    within = blocks_per_mma > 0 and atom_blocks % blocks_per_mma == 0
    units = k_blocks if within else math.ceil(t.k / config.block_scale.block / atom_blocks)
    return (t.m // lanes_per_column + align_up(t.n, rows) // lanes_per_column) * units


def tmem_allocation(columns: int, facts: PipelineFacts) -> int:
    total = facts.require("tmem_columns")
    exclusive_above = facts.require("tmem_exclusive_above") if facts.has("tmem_exclusive_above") else total
    if columns > exclusive_above:
        return total
    return max(facts.require("tmem_alloc_min_columns"), 1 << max(0, (columns - 1).bit_length()))


def _epilogue_tile(config: KernelConfig, p: Tcgen05Parameters | None) -> tuple[int, int]:
    if p is None:
        return 0, 0
    epi_n = p.epilogue_tile_n
    while epi_n > 1 and config.tile.n % epi_n:
        epi_n //= 2
    return min(config.tile.m, p.epilogue_tile_m), epi_n


def tcgen05_smem(config: KernelConfig, facts: PipelineFacts, p: Tcgen05Parameters | None, stages: int,
                 epi_m: int, epi_n: int, acc_stages: int = 0) -> SmemUse:
    align = facts.require("smem_buffer_alignment")
    mbar = facts.require("mbarrier_bytes")
    d, t, group = config.mma_dtypes, config.tile, config.cta_group
    a = t.m * t.k * d.a.bits // 8 * stages
    b = t.n // group * t.k * d.b.bits // 8 * stages
    scales = 0
    if config.block_scale is not None:
        rows = facts.require("block_scale_atom_rows")
        blocks = math.ceil(t.k / config.block_scale.block)
        width = config.block_scale.scale.bits
        # Each CTA holds the scale factors of all of B's tile N, also under a CTA pair (the MMA reads
        # them from both CTAs' tensor memory).
        scales = (align_up(t.m, rows) + align_up(t.n, rows)) * blocks * width // 8 * stages
    if p is None:
        barriers = 2 * stages * mbar
        dynamic, operand_end = storage_layout(barriers, a, b, 0, align, scales)
        return SmemUse(barriers, a, b, 0, dynamic, 0, operand_end, scales)
    # clc responses and their full/empty mbarriers, ring full/empty, accumulator full/empty, the
    # TMEM dealloc mbarrier, then the 32-bit TMEM address
    clc = _clc_stages(config, p)
    clc_bytes = clc * (facts.require("clc_response_bytes") + 2 * mbar) if clc else 0
    barriers = clc_bytes + (2 * stages + 2 * (acc_stages or p.acc_stages) + 1) * mbar + 4
    epi = epi_m * epi_n * d.c.bits // 8 * p.epilogue_stages
    # Int32 tables indexed by an index vector's entries, plus one (the grouped template's group
    # table), right after the TMEM address word.
    table = sum(p.index_tables * (i.limit + 1) * 4 for i in FAMILIES[config.family].indices)
    dynamic, operand_end = storage_layout(barriers + table, a, b, epi, align, scales)
    return SmemUse(barriers, a, b, epi, dynamic, p.static_smem_bytes, operand_end, scales, table)


def _clc_stages(config: KernelConfig, p: Tcgen05Parameters | None) -> int:
    return p.clc_stages if p is not None and config.scheduler is Scheduler.CLC else 0


def smem_budget(facts: PipelineFacts, p: Tcgen05Parameters | None) -> tuple[int, str]:
    """The most bytes a launch of this template may get on the pipeline, and what they are called.

    The oversized carveout counts only when the template's launch can request it
    (``oversized_smem_launch``); otherwise the budget is the opt-in limit (PR #593 review).
    """
    optin = facts.require("smem_per_block_optin")
    if p is not None and p.oversized_smem_launch and facts.has("smem_oversized_carveout"):
        return facts.require("smem_oversized_carveout"), "oversized carveout"
    return optin, "opt-in limit"


def plan_tcgen05(config: KernelConfig, facts: PipelineFacts, p: Tcgen05Parameters | None) -> Tcgen05Plan:
    t, d, group = config.tile, config.mma_dtypes, config.cta_group
    k_bytes = t.k * d.a.bits // 8
    mma_k = facts.require("mma_k_bytes")
    epi_m, epi_n = _epilogue_tile(config, p)
    acc_stages = p.acc_stages if p is not None else 1
    lanes = facts.require("tmem_lanes")
    k_blocks = k_bytes // mma_k if k_bytes % mma_k == 0 else 0
    scale_columns = tmem_scale_columns(config, facts, k_blocks)
    while (scale_columns and acc_stages > 1 and tmem_accumulator_columns(t.m, t.n, group, acc_stages, lanes)
           + scale_columns > facts.require("tmem_columns")):
        acc_stages -= 1
    acc_columns = tmem_accumulator_columns(t.m, t.n, group, acc_stages, lanes)
    ceiling, ceiling_name = smem_budget(facts, p)
    optin = facts.require("smem_per_block_optin")
    limit = facts.require("smem_descriptor_limit")

    def use(stages: int) -> SmemUse:
        return tcgen05_smem(config, facts, p, stages, epi_m, epi_n, acc_stages)

    cap = p.max_stages if p is not None else None
    in_budget = _largest(lambda s: use(s).total <= ceiling, cap)
    in_reach = _largest(lambda s: use(s).operand_address_end <= limit, cap)
    # auto stays within the opt-in limit: the carveout leaves 8 KB of L1 and needs a driver that
    # knows the shared-memory mode attribute, so only a kernel that names its stages asks for it.
    auto = _largest(lambda s: use(s).total <= optin and use(s).operand_address_end <= limit, cap)
    stages = config.stages if config.stages is not None else auto
    smem = use(max(stages, 1))
    oversized = ceiling_name == "oversized carveout" and smem.total > optin
    budget, budget_name = (ceiling, ceiling_name) if oversized else (optin, "opt-in limit")
    return Tcgen05Plan(
        has_template=p is not None, cta_group=group, b_rows=t.n // group, mma_m=t.m * group, mma_n=t.n,
        mma_k_bytes=mma_k, mma_k=mma_k * 8 // d.a.bits, cta_k_bytes=k_bytes,
        k_blocks=k_blocks,
        threads=(p.threads + (p.scheduler_threads if config.scheduler is Scheduler.CLC else 0)
                 if p is not None else None),
        clc_stages=_clc_stages(config, p),
        epi_m=epi_m, epi_n=epi_n, epi_stages=p.epilogue_stages if p is not None else 0,
        acc_stages=acc_stages, tmem_acc_columns=acc_columns, tmem_scale_columns=scale_columns,
        tmem_alloc_columns=tmem_allocation(acc_columns + scale_columns, facts),
        stages=stages, max_fitting_stages=auto, max_budget_stages=in_budget,
        max_descriptor_stages=in_reach, smem=smem,
        smem_optin=optin, smem_budget=budget, smem_budget_name=budget_name, oversized_launch=oversized,
        mcast_a=config.cluster.n, mcast_b=max(1, config.cluster.m // group),
        contract=tma_contract(config.dtypes, facts), buffer_align=facts.require("smem_buffer_alignment"),
    )


def _largest(fits, cap: int | None) -> int:
    """The largest stage count for which ``fits`` holds (0 if none); usage grows with stages."""
    best = 0
    while (cap is None or best < cap) and fits(best + 1):
        best += 1
    return best
