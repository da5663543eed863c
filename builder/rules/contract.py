"""Rules on what TMA and the epilogue need: box limits, alignment and the epilogue sub-tile."""

from __future__ import annotations

from typing import Iterator

from builder.derive import Tcgen05Plan
from builder.diagnostics import Diagnostic
from builder.rules.registry import KernelContext, rule


def _boxes(ctx: KernelContext) -> list[tuple[str, int, int, int]]:
    """(operand, inner box dimension, outer box dimension, element bits) of each TMA box one CTA uses."""
    cfg, plan = ctx.entry.config, ctx.plan
    t, d, lay = cfg.tile, cfg.dtypes, cfg.layout
    b_n = t.n // cfg.cta_group if isinstance(plan, Tcgen05Plan) else t.n
    boxes = [("A", t.k if lay.a_k_major else t.m, t.m if lay.a_k_major else t.k, d.a.bits),
             ("B", t.k if lay.b_k_major else b_n, b_n if lay.b_k_major else t.k, d.b.bits)]
    if plan.epi_n:
        boxes.append(("C", plan.epi_n, plan.epi_m, d.c.bits))
    return boxes


@rule("TMA-BOX", "every TMA box dimension is within the hardware limit")
def check_tma_box(ctx: KernelContext) -> Iterator[Diagnostic]:
    limit = ctx.facts.require("tma_box_dim_max")
    for operand, inner, outer, _ in _boxes(ctx):
        for value in (inner, outer):
            if value > limit:
                yield ctx.diag("TMA-BOX", "tile", f"the {operand} TMA box is {outer}x{inner} elements; {value} "
                               f"exceeds the {limit}-element box limit (tma_box_dim_max)",
                               f"use tile dimensions <= {limit}", tma_box_dim_max=limit)


@rule("TMA-ALIGN", "the contract's stride divisibility and every box row are whole 16-byte TMA units")
def check_tma_alignment(ctx: KernelContext) -> Iterator[Diagnostic]:
    align = ctx.facts.require("tma_alignment_bytes")
    cfg, plan = ctx.entry.config, ctx.plan
    d = cfg.dtypes
    for name, dtype, div in zip("ABC", (d.a, d.b, d.c), plan.stride_divisibility):
        if (div * dtype.bits) % (8 * align):
            yield ctx.diag("TMA-ALIGN", "dtypes", f"the contract asks {name} strides to be multiples of {div} "
                           f"{dtype.value} elements = {div * dtype.bits / 8:g} B, not a multiple of the {align}-byte "
                           "TMA stride unit (tma_alignment_bytes)", "fix the contract in builder/derive",
                           tma_alignment_bytes=align)
    if plan.base_alignment % align:
        yield ctx.diag("TMA-ALIGN", None, f"the contract's {plan.base_alignment}-byte base alignment is not a "
                       f"multiple of TMA's {align} bytes", "fix the contract in builder/derive")
    for operand, inner, _, bits in _boxes(ctx):
        if (inner * bits) % (8 * align):
            yield ctx.diag("TMA-ALIGN", "tile", f"a row of the {operand} TMA box is {inner} elements = "
                           f"{inner * bits / 8:g} B, not a multiple of {align} B (tma_alignment_bytes: "
                           "cuTensorMapEncodeTiled needs boxDim[0] x element size in 16-byte units)",
                           f"make the tile's contiguous dimension a multiple of {8 * align // bits} elements",
                           tma_alignment_bytes=align)


@rule("EPI-TILE", "the epilogue sub-tile divides the CTA tile")
def check_epilogue(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan, cfg = ctx.plan, ctx.entry.config
    if not plan.epi_n:
        return  # no template, no epilogue to check
    t = cfg.tile
    if t.m % plan.epi_m or t.n % plan.epi_n:
        yield ctx.diag("EPI-TILE", "tile", f"the template stores C in {plan.epi_m}x{plan.epi_n} sub-tiles, which "
                       f"do not tile the {t.m}x{t.n} CTA tile", f"use tile M a multiple of {plan.epi_m} and tile N "
                       f"a multiple of {plan.epi_n}", epi_tile=[plan.epi_m, plan.epi_n])
