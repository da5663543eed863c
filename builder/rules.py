"""Validation rules: one function per rule id, each (kernel context) -> diagnostics.

A rule never prints or raises for a bad config; it returns diagnostics that
say what is wrong, the fact that decides it (with its value) and how to fix
it. Rules read hardware values only through ``PipelineFacts.require`` and
derived quantities only from ``builder.derive``. ``RULES`` is the registry
the validator runs and ``docs/catalog.md`` documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from builder.catalog import CatalogEntry
from builder.derive import Sm90Plan, plan_sm90, sm90_smem
from builder.diagnostics import Diagnostic, Severity
from builder.facts import PipelineFacts
from builder.templates import Template


@dataclass(frozen=True)
class KernelContext:
    entry: CatalogEntry
    facts: PipelineFacts
    template: Template
    plan: Sm90Plan

    def diag(self, rule: str, field: str | None, message: str, hint: str,
             severity: Severity = Severity.ERROR, **facts: object) -> Diagnostic:
        return Diagnostic(rule, f"{self.entry.kernel_id}: {message}", self.entry.locate(field), hint,
                          severity, facts)


RuleFn = Callable[[KernelContext], Iterable[Diagnostic]]


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    check: RuleFn


RULES: list[Rule] = []


def rule(rule_id: str, summary: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        RULES.append(Rule(rule_id, summary, fn))
        return fn
    return register


def make_context(entry: CatalogEntry, facts: PipelineFacts, template: Template) -> KernelContext:
    return KernelContext(entry, facts, template, plan_sm90(entry.config, facts, template))


@rule("TARGET-ARCH", "every target of a config is a compile target of its pipeline")
def check_targets(ctx: KernelContext) -> Iterator[Diagnostic]:
    known = ctx.facts.target_names
    for t in ctx.entry.targets:
        if t not in known:
            yield ctx.diag("TARGET-ARCH", "targets", f"target {t!r} is not a target of pipeline "
                           f"{ctx.facts.pipeline}", f"use one of {', '.join(known)}", targets=list(known))


@rule("TEMPLATE-SUPPORT", "the pipeline's template implements the dtypes, layout and schedule")
def check_template(ctx: KernelContext) -> Iterator[Diagnostic]:
    why = ctx.template.unsupported(ctx.entry.config)
    if why:
        field = "dtypes" if why.startswith("dtypes") else ("layout" if why.startswith("layout") else "schedule")
        yield ctx.diag("TEMPLATE-SUPPORT", field, f"template {ctx.template.name}: {why}",
                       f"pick an offered value or extend the template and {ctx.template.manifest_file}")


@rule("DTYPE-COMBO", "the (A, B, accumulator, C) types are an MMA combination of the pipeline")
def check_dtypes(ctx: KernelContext) -> Iterator[Diagnostic]:
    d = ctx.entry.config.dtypes
    combos = ctx.facts.require("dtype_combos")
    match = [c for c in combos if (c.a, c.b, c.acc) == (d.a, d.b, d.acc)]
    if not match:
        offered = ", ".join(f"{c.a.value}x{c.b.value}->{c.acc.value}" for c in combos)
        yield ctx.diag("DTYPE-COMBO", "dtypes", f"{d.a.value} x {d.b.value} accumulating in {d.acc.value} is "
                       f"not an MMA of pipeline {ctx.facts.pipeline}", f"use one of: {offered}")
        return
    combo = match[0]
    if d.c not in combo.c:
        yield ctx.diag("DTYPE-COMBO", "dtypes", f"output type {d.c.value} is not produced from "
                       f"{d.acc.value} accumulators here", f"use c: {' or '.join(x.value for x in combo.c)}")
    if combo.archs is not None:
        for t in ctx.entry.targets:
            if t not in combo.archs:
                yield ctx.diag("DTYPE-ARCH", "dtypes", f"the {d.a.value}x{d.b.value} MMA exists only on "
                               f"{', '.join(combo.archs)}, not on target {t}", "drop the target or the dtype")


@rule("LAYOUT-DTYPE", "operands stored MN-major use a type the MMA can read transposed")
def check_layout(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    allowed = ctx.facts.require("mn_major_dtypes")
    for name, k_major, dtype in (("A", cfg.layout.a_k_major, cfg.dtypes.a), ("B", cfg.layout.b_k_major, cfg.dtypes.b)):
        if not k_major and dtype not in allowed:
            yield ctx.diag("LAYOUT-DTYPE", "layout", f"operand {name} is MN-major but {dtype.value} operands "
                           f"must be K-major on {ctx.facts.pipeline} (transposed MMA operands: "
                           f"{', '.join(x.value for x in allowed)})", "use layout tn for this dtype",
                           mn_major_dtypes=[x.value for x in allowed])


@rule("MMA-TILE-M", "the CTA tile M is a whole number of warpgroup MMAs per consumer warpgroup")
def check_tile_m(ctx: KernelContext) -> Iterator[Diagnostic]:
    mma_m = ctx.facts.require("mma_m_per_warpgroup")
    tm = ctx.entry.config.tile.m
    if tm % mma_m:
        yield ctx.diag("MMA-TILE-M", "tile", f"tile M {tm} is not a multiple of the {mma_m}-row warpgroup MMA",
                       f"use {max(mma_m, tm // mma_m * mma_m)} or {(tm // mma_m + 1) * mma_m}", mma_m=mma_m)
    elif ctx.plan.wg_tile_m % mma_m:
        yield ctx.diag("MMA-TILE-M", "tile", f"tile M {tm} splits into {ctx.plan.wg_tile_m} rows per consumer "
                       f"warpgroup, not a multiple of {mma_m}", f"use a multiple of {mma_m * ctx.plan.consumer_wgs}")


@rule("MMA-TILE-N", "the CTA tile N is a legal MMA N")
def check_tile_n(ctx: KernelContext) -> Iterator[Diagnostic]:
    rng = ctx.facts.require("mma_n")
    tn = ctx.entry.config.tile.n
    if tn < rng.min or tn > rng.max or tn % rng.step:
        yield ctx.diag("MMA-TILE-N", "tile", f"tile N {tn} is not an MMA N ({rng.min}..{rng.max} step {rng.step})",
                       f"use a multiple of {rng.step} between {rng.min} and {rng.max}",
                       mma_n_min=rng.min, mma_n_max=rng.max, mma_n_step=rng.step)


@rule("MMA-TILE-K", "the CTA tile K is a whole number of MMA K steps")
def check_tile_k(ctx: KernelContext) -> Iterator[Diagnostic]:
    k_bytes = ctx.facts.require("mma_k_bytes")
    cfg = ctx.entry.config
    elem_bits = cfg.dtypes.a.bits
    tile_k_bytes = cfg.tile.k * elem_bits // 8
    if tile_k_bytes % k_bytes:
        step = k_bytes * 8 // elem_bits
        yield ctx.diag("MMA-TILE-K", "tile", f"tile K {cfg.tile.k} ({tile_k_bytes} B of {cfg.dtypes.a.value}) is "
                       f"not a multiple of the {k_bytes}-byte MMA K", f"use a multiple of {step} elements",
                       mma_k_bytes=k_bytes)


@rule("TMA-BOX", "every TMA box dimension is within the hardware limit")
def check_tma_box(ctx: KernelContext) -> Iterator[Diagnostic]:
    limit = ctx.facts.require("tma_box_dim_max")
    t = ctx.entry.config.tile
    for name, value in (("M", t.m), ("N", t.n), ("K", t.k)):
        if value > limit:
            yield ctx.diag("TMA-BOX", "tile", f"tile {name} {value} exceeds the {limit}-element TMA box limit",
                           f"use tile {name} <= {limit}", tma_box_dim_max=limit)


@rule("CLUSTER-SHAPE", "the cluster fits the portable limit and has power-of-two dims")
def check_cluster(ctx: KernelContext) -> Iterator[Diagnostic]:
    c = ctx.entry.config.cluster
    limit = ctx.facts.require("max_cluster_size")
    if c.size > limit:
        yield ctx.diag("CLUSTER-SHAPE", "cluster", f"cluster {c.m}x{c.n} has {c.size} CTAs, over the portable "
                       f"limit of {limit}", f"use at most {limit} CTAs per cluster", max_cluster_size=limit)
    if ctx.facts.require("cluster_dims_power_of_two"):
        for name, v in (("M", c.m), ("N", c.n)):
            if v & (v - 1):
                yield ctx.diag("CLUSTER-SHAPE", "cluster", f"cluster {name} = {v} is not a power of two",
                               "use 1, 2, 4 or 8")


@rule("SMEM-BUDGET", "the shared-memory pipeline fits the per-block opt-in limit")
def check_smem(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan, cfg = ctx.plan, ctx.entry.config
    smem = plan.smem
    if plan.max_fitting_stages == 0:
        yield ctx.diag("SMEM-BUDGET", "tile", f"not even one stage fits: {smem.total} B needed with 1 stage, "
                       f"limit {plan.smem_budget} B", "use a smaller tile", smem_bytes=smem.total,
                       smem_per_block_optin=plan.smem_budget)
    elif cfg.stages is not None and smem.total > plan.smem_budget:
        yield ctx.diag("SMEM-BUDGET", "stages", f"{cfg.stages} stages need {smem.total} B of shared memory "
                       f"(A {smem.a_bytes} + B {smem.b_bytes} + epilogue {smem.epilogue_bytes} + barriers "
                       f"{smem.barrier_bytes} + padding {smem.padding} + static {smem.static_bytes}), over the "
                       f"{plan.smem_budget} B opt-in limit", f"use stages <= {plan.max_fitting_stages} or auto",
                       smem_bytes=smem.total, smem_per_block_optin=plan.smem_budget,
                       max_stages=plan.max_fitting_stages)
    elif cfg.stages is not None and cfg.stages < 2:
        yield ctx.diag("SMEM-BUDGET", "stages", "one stage serialises TMA and MMA",
                       f"use stages >= 2 (up to {plan.max_fitting_stages} fit)", Severity.WARNING)


@rule("REGISTER-BUDGET", "accumulators fit the consumer warpgroups' registers")
def check_registers(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan = ctx.plan
    rng = ctx.facts.require("setmaxnreg")
    # Beyond the accumulators a consumer thread needs addresses, loop state and
    # the epilogue fragment; 64 is what the 128x256 tile leaves (232 - 128)
    # and still compiles without spills.
    headroom = 64
    if plan.acc_regs_per_thread + headroom > plan.consumer_regs:
        yield ctx.diag("REGISTER-BUDGET", "tile", f"{plan.acc_regs_per_thread} accumulator registers per thread "
                       f"plus {headroom} working registers exceed the {plan.consumer_regs} a consumer thread gets",
                       "use a smaller tile M x N", acc_regs=plan.acc_regs_per_thread,
                       consumer_regs=plan.consumer_regs)
    for name, regs in (("producer", plan.producer_regs), ("consumer", plan.consumer_regs)):
        if regs < rng.min or regs > rng.max or regs % rng.step:
            yield ctx.diag("REGISTER-BUDGET", None, f"{name} register count {regs} is not a legal setmaxnreg "
                           f"value ({rng.min}..{rng.max} step {rng.step})",
                           f"fix producer_registers in {ctx.template.manifest_file}")


@rule("SWIZZLE", "the raster swizzle is a power of two")
def check_swizzle(ctx: KernelContext) -> Iterator[Diagnostic]:
    s = ctx.entry.config.swizzle
    if s & (s - 1) or s > 16:
        yield ctx.diag("SWIZZLE", "swizzle", f"swizzle {s} is not a power of two up to 16", "use 1, 2, 4, 8 or 16")


def summarize(ctx: KernelContext) -> dict[str, object]:
    """Derived values for ``tilekiln validate --explain``."""
    p = ctx.plan
    per_stage = sm90_smem(ctx.entry.config, ctx.facts, ctx.template, 1, p.epi_m, p.epi_n)
    return {
        "kernel": ctx.entry.kernel_id,
        "stages": p.stages,
        "stages_source": "explicit" if ctx.entry.config.stages is not None else "auto (largest that fits)",
        "max_fitting_stages": p.max_fitting_stages,
        "smem_per_stage_bytes": per_stage.a_bytes + per_stage.b_bytes,
        "smem_epilogue_bytes": p.smem.epilogue_bytes,
        "smem_total_bytes": p.smem.total,
        "smem_budget_bytes": p.smem_budget,
        "consumer_warpgroups": p.consumer_wgs,
        "threads_per_cta": p.threads,
        "registers_producer_consumer": [p.producer_regs, p.consumer_regs],
        "accumulator_registers_per_thread": p.acc_regs_per_thread,
        "occupancy_ctas_per_sm": 1,
        "epilogue_tile": [p.epi_m, p.epi_n],
        "stride_divisibility_elements": list(p.stride_divisibility),
    }
