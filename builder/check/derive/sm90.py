"""Derived values of an sm90 (warpgroup MMA) kernel: stages, shared memory, registers.

The shared-memory model mirrors the ``Storage`` struct of
``templates/sm90_gemm.py.j2``: the ring's mbarriers, then A, B and the
epilogue buffer, each aligned to ``smem_buffer_alignment``; the DSL's static
reservation comes on top. The compile stage compares this model with the
struct size the DSL reports while tracing (``TRACE["smem_bytes"]``), so a
drift between model and template fails the build instead of a launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.check.derive.common import SmemUse, storage_layout, tma_contract
from builder.load.facts import PipelineFacts
from builder.load.templates import Template
from tilekiln.spec import FAMILIES, Contract, KernelConfig, Schedule


@dataclass(frozen=True)
class Sm90Plan:
    """Everything the sm90 template needs beyond the config itself."""

    consumer_wgs: int
    wg_tile_m: int
    threads: int
    epi_m: int
    epi_n: int
    epi_stages: int
    stages: int  # resolved; 0 when not even one stage fits
    max_fitting_stages: int
    smem: SmemUse
    smem_budget: int
    producer_regs: int
    consumer_regs: int
    acc_regs_per_thread: int
    contract: Contract
    buffer_align: int  # bytes: every shared-memory buffer starts on this boundary

    @property
    def wg_threads(self) -> int:
        """Threads of one warpgroup (the producer is one, and each consumer)."""
        return self.threads // (1 + self.consumer_wgs)


def sm90_smem(config: KernelConfig, facts: PipelineFacts, template: Template, stages: int,
              epi_m: int, epi_n: int) -> SmemUse:
    p = template.manifest.parameters
    align = facts.require("smem_buffer_alignment")
    d, t = config.mma_dtypes, config.tile
    # Ping-pong adds one mbarrier per consumer (they order the mainloops) and
    # gives each consumer its own epilogue buffers.
    pingpong_consumers = p.pingpong_consumer_warpgroups if config.schedule is Schedule.PINGPONG else 0
    barriers = (2 * stages + pingpong_consumers) * facts.require("mbarrier_bytes")
    a = t.m * t.k * d.a.bits // 8 * stages
    b = t.n * t.k * d.b.bits // 8 * stages
    epi = epi_m * epi_n * d.c.bits // 8 * p.epilogue_stages * max(1, pingpong_consumers)
    # Int32 tables indexed by an index vector's entries, plus one (the grouped template's group
    # table), right after the barriers.
    table = sum(p.index_tables * (i.limit + 1) * 4 for i in FAMILIES[config.family].indices)
    dynamic, operand_end = storage_layout(barriers + table, a, b, epi, align)
    return SmemUse(barriers, a, b, epi, dynamic, p.static_smem_bytes, operand_end, table_bytes=table)


def plan_sm90(config: KernelConfig, facts: PipelineFacts, template: Template) -> Sm90Plan:
    p = template.manifest.parameters
    wg_threads = facts.require("threads_per_warpgroup")
    mma_m = facts.require("mma_m_per_warpgroup")
    if config.schedule is Schedule.PINGPONG:
        # Each consumer on whole tiles of its own.
        consumer_wgs, tile_wgs = p.pingpong_consumer_warpgroups, 1
    else:
        # As many consumers as split the tile's 64-row MMA blocks evenly (192 rows: three).
        blocks = config.tile.m // mma_m
        consumer_wgs = max([c for c in range(1, p.max_consumer_warpgroups + 1) if blocks % c == 0], default=1)
        tile_wgs = consumer_wgs
    wg_tile_m = config.tile.m // tile_wgs
    epi_m = min(config.tile.m, mma_m * tile_wgs)
    epi_n = min(config.tile.n, p.epilogue_tile_n)
    budget = facts.require("smem_per_block_optin")

    fitting = 0
    for s in range(1, p.max_stages + 1):
        if sm90_smem(config, facts, template, s, epi_m, epi_n).total <= budget:
            fitting = s
    stages = config.stages if config.stages is not None else fitting
    smem = sm90_smem(config, facts, template, max(stages, 1), epi_m, epi_n)

    regs_total = facts.require("registers_per_sm")
    step = facts.require("setmaxnreg").step
    reg_cap = facts.require("max_registers_per_thread") // step * step
    producer = p.producer_registers[consumer_wgs]
    consumer = min(reg_cap, (regs_total - producer * wg_threads) // (wg_threads * consumer_wgs) // step * step)
    acc_regs = config.tile.m * config.tile.n * config.dtypes.acc.bits // 32 // (wg_threads * tile_wgs)

    return Sm90Plan(
        consumer_wgs=consumer_wgs, wg_tile_m=wg_tile_m, threads=wg_threads * (1 + consumer_wgs),
        epi_m=epi_m, epi_n=epi_n, epi_stages=p.epilogue_stages,
        stages=stages, max_fitting_stages=fitting, smem=smem, smem_budget=budget,
        producer_regs=producer, consumer_regs=consumer, acc_regs_per_thread=acc_regs,
        contract=tma_contract(config.dtypes, facts), buffer_align=facts.require("smem_buffer_alignment"),
    )
