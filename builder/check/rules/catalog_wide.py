"""Rules over the whole catalog: duplicate ids and kernels the runtime can never pick.

The runtime (``tilekiln/select.py``) tells kernels apart by pipeline, dtypes,
operand majorness, contract, CTA tile M x N, cluster and whether A and B are
swapped; among kernels equal
in all of these its model estimates the same time and the smallest id wins,
so the others run only if a tuning table names them: those a committed
table (``catalog/tuning/``) names are not reported.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from builder.check.context import KernelContext
from builder.check.rules.registry import catalog_rule
from builder.diagnostics import Diagnostic, Severity


@catalog_rule("DUPLICATE-ID", "no two catalog entries expand to the same kernel id")
def check_duplicates(kernels: tuple[KernelContext, ...]) -> Iterator[Diagnostic]:
    seen: dict[str, KernelContext] = {}
    for ctx in kernels:
        first = seen.setdefault(ctx.entry.kernel_id, ctx)
        if first is not ctx:
            where = first.entry.locate()
            yield ctx.diag("DUPLICATE-ID", None, f"defined twice (first at {where})",
                           "remove one; two kernels with the same id would be indistinguishable in a bundle",
                           first_file=where.file, first_line=where.line)


def selection_key(ctx: KernelContext) -> tuple:
    """What the runtime's selection sees of a kernel (besides its id): the spec's selection
    fields (tilekiln/spec.py) and the contract."""
    return (ctx.entry.targets, ctx.entry.config.selection_key(), ctx.plan.contract)


def build_key(ctx: KernelContext) -> tuple:
    """Everything that decides the generated code: equal keys build the same kernel (an explicit
    stage count equal to what auto derives builds the auto kernel)."""
    return (selection_key(ctx), replace(ctx.entry.config, stages=None), ctx.plan.stages)


@catalog_rule("SHADOWED", "every kernel can be selected: none builds the same code as, or is indistinguishable "
                          "at run time from, an earlier one")
def check_shadowed(kernels: tuple[KernelContext, ...]) -> Iterator[Diagnostic]:
    built: dict[tuple, KernelContext] = {}
    selected: dict[tuple, KernelContext] = {}
    ids: set[str] = set()
    for ctx in kernels:
        kid = ctx.entry.kernel_id
        if kid in ids:
            continue  # DUPLICATE-ID
        ids.add(kid)
        cfg = ctx.entry.config
        if cfg.stages is not None and cfg.stages == ctx.plan.max_fitting_stages:
            yield ctx.diag("SHADOWED", "stages", f"stages {cfg.stages} is what auto derives; the kernel is the "
                           "stages: auto kernel under another id", "write stages: auto (or drop the kernel)",
                           Severity.WARNING, stages=cfg.stages, auto_stages=ctx.plan.max_fitting_stages)
        twin = built.setdefault(build_key(ctx), ctx)
        if twin is not ctx:
            yield ctx.diag("SHADOWED", None, f"builds the same code as {twin.entry.kernel_id} "
                           f"({twin.entry.locate()})", "drop one of the two", Severity.WARNING,
                           same_code_as=twin.entry.kernel_id)
            continue
        rival = selected.setdefault(selection_key(ctx), ctx)
        if rival is not ctx:
            # The model ties and the smaller id wins; the warning goes to the one that never runs.
            winner, loser = sorted((rival, ctx), key=lambda c: c.entry.kernel_id)
            if loser.tuned:
                continue
            yield loser.diag("SHADOWED", None, f"the runtime cannot tell it from {winner.entry.kernel_id} "
                             f"({winner.entry.locate()}): same dtypes, layout, contract, tile M x N and cluster, "
                             "so its model ties and picks the smaller id; this kernel runs only if a tuning table "
                             "names it", "drop it, make it differ in tile M x N or cluster, or keep it for "
                             "`tilekiln tune`", Severity.WARNING, selected_instead=winner.entry.kernel_id)
