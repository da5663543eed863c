"""Rules on on-chip memory: shared-memory budget, carveout and descriptor reach, TMEM, registers."""

from __future__ import annotations

from typing import Iterator

from builder.check.context import KernelContext
from builder.check.derive import Sm90Plan, Tcgen05Plan
from builder.check.rules.registry import rule
from builder.diagnostics import Diagnostic, Severity
from tilekiln.spec import Scaling, blockwise_partials


def _breakdown(ctx: KernelContext) -> str:
    s = ctx.plan.smem
    scales = f" + scale factors {s.scale_bytes}" if s.scale_bytes else ""
    return (f"A {s.a_bytes} + B {s.b_bytes}{scales} + epilogue {s.epilogue_bytes} + barriers {s.barrier_bytes} "
            f"+ padding {s.padding} + static {s.static_bytes}")


def _bound(ctx: KernelContext) -> str:
    if isinstance(ctx.plan, Tcgen05Plan) and not ctx.plan.has_template:
        return " (a lower bound: no template serves the pipeline, so only operand rings and barriers count)"
    return ""


def _budget_stages(plan) -> int:
    return plan.max_budget_stages if isinstance(plan, Tcgen05Plan) else plan.max_fitting_stages


def _carveout(ctx: KernelContext) -> int | None:
    return ctx.facts.require("smem_oversized_carveout") if ctx.facts.has("smem_oversized_carveout") else None


def _over(ctx: KernelContext) -> bool:
    plan = ctx.plan
    return plan.smem.total > plan.smem_budget or _budget_stages(plan) == 0


def _requests_carveout(ctx: KernelContext) -> bool:
    return isinstance(ctx.plan, Tcgen05Plan) and ctx.plan.oversized_launch


def _fits_unrequested_carveout(ctx: KernelContext) -> bool:
    carveout = _carveout(ctx)
    return carveout is not None and not _requests_carveout(ctx) and ctx.plan.smem.total <= carveout


@rule("SMEM-BUDGET", "the shared memory of the requested stages fits the budget a launch gets")
def check_smem(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan, cfg = ctx.plan, ctx.entry.config
    smem = plan.smem
    fitting = _budget_stages(plan)
    name = plan.smem_budget_name if isinstance(plan, Tcgen05Plan) else "opt-in limit"
    numbers = dict(stages=plan.stages, smem_bytes=smem.total, smem_budget=plan.smem_budget, max_stages=fitting)
    if _over(ctx) and _fits_unrequested_carveout(ctx):
        return  # SMEM-CARVEOUT explains it
    if fitting == 0:
        yield ctx.diag("SMEM-BUDGET", "tile", f"not even one stage fits: {smem.total} B with 1 stage "
                       f"({_breakdown(ctx)}){_bound(ctx)}, over the {plan.smem_budget} B {name} "
                       "(smem_per_block_optin)", "use a smaller tile M, N or K", **numbers)
    elif cfg.stages is not None and smem.total > plan.smem_budget:
        yield ctx.diag("SMEM-BUDGET", "stages", f"{cfg.stages} stages need {smem.total} B of shared memory "
                       f"({_breakdown(ctx)}){_bound(ctx)}, over the {plan.smem_budget} B {name}",
                       f"use stages <= {fitting} or auto", **numbers)
    elif cfg.stages is not None and cfg.stages < 2:
        yield ctx.diag("SMEM-BUDGET", "stages", "one stage serialises TMA and MMA",
                       f"use stages >= 2 (up to {fitting} fit)", Severity.WARNING, **numbers)


@rule("SMEM-CARVEOUT", "a budget above the opt-in limit is used only by a launch that requests the carveout")
def check_carveout(ctx: KernelContext) -> Iterator[Diagnostic]:
    if not (_over(ctx) and _fits_unrequested_carveout(ctx)):
        return
    plan, cfg = ctx.plan, ctx.entry.config
    carveout = _carveout(ctx)
    who = (f"template {ctx.template.name} launches with the opt-in limit (oversized_smem_launch: false)"
           if ctx.template is not None else "no template serves the pipeline, so no launch requests it")
    what = f"{cfg.stages} stages need" if cfg.stages is not None else "one stage needs"
    yield ctx.diag("SMEM-CARVEOUT", "stages" if cfg.stages is not None else "tile",
                   f"{what} {plan.smem.total} B{_bound(ctx)}, over the {plan.smem_optin} B opt-in limit "
                   f"(smem_per_block_optin); pipeline {ctx.facts.pipeline}'s {carveout} B oversized carveout "
                   f"(smem_oversized_carveout) would hold it, but only a launch that requests it gets it, and {who}",
                   f"use stages <= {plan.max_budget_stages} (within the opt-in limit), or a template whose launch "
                   "requests the oversized carveout", stages=plan.stages, smem_bytes=plan.smem.total,
                   smem_per_block_optin=plan.smem_optin,
                   smem_oversized_carveout=carveout, max_stages=plan.max_budget_stages)


@rule("SMEM-DESC-LIMIT", "every MMA operand lies below the shared-memory descriptor's address reach")
def check_descriptor_reach(ctx: KernelContext) -> Iterator[Diagnostic]:
    if _over(ctx):
        return  # the budget rules report it; a descriptor wrap matters only for memory that exists
    limit = ctx.facts.require("smem_descriptor_limit")
    plan, cfg = ctx.plan, ctx.entry.config
    # The descriptor holds the shared-window address, and the Storage struct (scale rings, A,
    # B) starts after the static reservation: the reservation counts toward the reach.
    end = plan.smem.operand_address_end
    if end <= limit:
        return
    fitting = plan.max_descriptor_stages if isinstance(plan, Tcgen05Plan) else 0
    yield ctx.diag("SMEM-DESC-LIMIT", "stages" if cfg.stages is not None else "tile",
                   f"the operand rings end at shared-memory address {end} ({plan.smem.static_bytes} B static "
                   f"+ {plan.smem.operand_end} B of the Storage struct), past the {limit} B the MMA descriptor "
                   "can address (smem_descriptor_limit: 14 bits of address >> 4); operands beyond it wrap "
                   "silently and the kernel computes garbage", f"use stages <= {fitting} or a smaller tile",
                   stages=plan.stages, operand_end=end, smem_descriptor_limit=limit, max_stages=fitting)


@rule("TMEM-COLUMNS", "the accumulator stages fit the tensor-memory columns")
def check_tmem(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan = ctx.plan
    if not isinstance(plan, Tcgen05Plan):
        return
    cfg = ctx.entry.config
    total = ctx.facts.require("tmem_columns")
    # A block-scaled kernel's scale factors share the columns with its accumulators.
    cols = plan.tmem_acc_columns + plan.tmem_scale_columns
    shape = f"{plan.acc_stages} accumulator stage(s) of {cfg.tile.m}x{cfg.tile.n}" + (
        f" and {plan.tmem_scale_columns} columns of scale factors" if plan.tmem_scale_columns else "")
    if cols > total:
        per_stage = max(1, cols // plan.acc_stages)
        yield ctx.diag("TMEM-COLUMNS", "tile", f"{shape} need {cols} TMEM columns, over pipeline "
                       f"{ctx.facts.pipeline}'s {total} (tmem_columns)",
                       f"use tile N <= {cfg.tile.n * total // cols // 8 * 8}, or at most {total // per_stage} "
                       "accumulator stages in the template", acc_stages=plan.acc_stages, tmem_columns=total,
                       tmem_acc_columns=cols)
    elif (ctx.facts.has("tmem_exclusive_above") and cols > ctx.facts.require("tmem_exclusive_above")
          and 2 * plan.smem.total <= ctx.facts.require("smem_per_block_optin")):
        # Where the kernel's shared memory already keeps a second CTA off the SM, taking all of
        # tensor memory costs nothing, and the columns above the line are what the pipeline offers.
        above = ctx.facts.require("tmem_exclusive_above")
        yield ctx.diag("TMEM-COLUMNS", "tile", f"{shape} need {cols} TMEM columns, more than {above} "
                       "(tmem_exclusive_above): the kernel must allocate all of tensor memory exclusively, so no "
                       "second CTA can share the SM", f"use tile N <= {cfg.tile.n * above // cols // 8 * 8} to "
                       "allocate a power of two", Severity.WARNING, acc_stages=plan.acc_stages,
                       tmem_acc_columns=cols, tmem_exclusive_above=above)


@rule("REGISTER-BUDGET", "accumulators fit the consumer warpgroups' registers (warpgroup MMA)")
def check_registers(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan = ctx.plan
    if not isinstance(plan, Sm90Plan):
        return  # tcgen05 accumulates in tensor memory
    rng = ctx.facts.require("setmaxnreg")
    # Beyond the accumulators a consumer thread needs addresses, loop state and
    # the epilogue fragment; 64 is what the 128x256 tile leaves (232 - 128)
    # and still compiles without spills.
    headroom = 64
    # Blockwise scaling holds the main accumulator and its partial sums (tilekiln/spec.py,
    # blockwise_partials).
    cfg = ctx.entry.config
    sets = 1 + blockwise_partials(cfg.tile.m, cfg.tile.n, cfg.swap_ab) if cfg.scaling is Scaling.BLOCKWISE else 1
    if sets > 1:
        # The blockwise 128x128 cooperative kernels' consumers use up to R227 of 232 (c2x1), 192 of them
        # accumulators, with no spills (nvidia-cutlass-dsl 4.8.1): the promotion loop needs less
        # around it than the epilogue of a large single-accumulator tile.
        headroom = 40
    held = sets * plan.acc_regs_per_thread
    if held + headroom > plan.consumer_regs:
        what = (f"{held} accumulator registers per thread (the main accumulator and {sets - 1} partial "
                f"sum{'s' if sets > 2 else ''} of {plan.acc_regs_per_thread} each, blockwise scaling)" if sets > 1
                else f"{held} accumulator registers per thread")
        yield ctx.diag("REGISTER-BUDGET", "tile", f"{what} plus {headroom} working registers exceed the "
                       f"{plan.consumer_regs} a consumer thread gets", "use a smaller tile M x N", acc_regs=held,
                       headroom_regs=headroom, consumer_regs=plan.consumer_regs, accumulator_sets=sets)
    for name, regs in (("producer", plan.producer_regs), ("consumer", plan.consumer_regs)):
        if regs not in rng:
            yield ctx.diag("REGISTER-BUDGET", None, f"{name} register count {regs} is not a legal setmaxnreg "
                           f"value ({rng})", f"fix producer_registers in {ctx.template.manifest_file}",
                           warpgroup=name, registers=regs, setmaxnreg_min=rng.min, setmaxnreg_max=rng.max,
                           setmaxnreg_step=rng.step)
