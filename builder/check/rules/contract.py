"""Rules on what TMA and the epilogue need: 16-byte alignment and the epilogue sub-tile."""

from __future__ import annotations

from typing import Iterator

from builder.check.context import KernelContext
from builder.check.derive import Tcgen05Plan
from builder.check.rules.registry import rule
from builder.diagnostics import Diagnostic


def _rows(ctx: KernelContext) -> list[tuple[str, int, int]]:
    """(operand, contiguous elements, element bits) of each tile one CTA moves with TMA.

    Only the contiguous extent is checked: the DSL's TMA atoms cut a tile
    into as many boxes as needed (a 128x64x512 sm90 tile compiles to 36 TMA
    loads), so tile extents are not bounded by the 256-element box limit.
    """
    cfg, plan = ctx.entry.config, ctx.plan
    t, d, lay = cfg.tile, cfg.mma_dtypes, cfg.mma_layout
    b_n = t.n // cfg.cta_group if isinstance(plan, Tcgen05Plan) else t.n
    rows = [("A", t.k if lay.a_k_major else t.m, d.a.bits), ("B", t.k if lay.b_k_major else b_n, d.b.bits)]
    if plan.epi_n:
        # A swapped kernel stores C^T, whose contiguous dimension is the MMA's M.
        rows.append(("C", plan.epi_m if cfg.swap_ab else plan.epi_n, d.c.bits))
    return rows


@rule("TMA-ALIGN", "the contract's stride divisibility and every box row are whole 16-byte TMA units")
def check_tma_alignment(ctx: KernelContext) -> Iterator[Diagnostic]:
    align = ctx.facts.require("tma_alignment_bytes")
    cfg, plan = ctx.entry.config, ctx.plan
    d = cfg.dtypes
    for name, dtype, div in zip("ABC", (d.a, d.b, d.c), plan.contract.stride_divisibility):
        if (div * dtype.bits) % (8 * align):
            yield ctx.diag("TMA-ALIGN", "dtypes", f"the contract asks {name} strides to be multiples of {div} "
                           f"{dtype.value} elements = {div * dtype.bits / 8:g} B, not a multiple of the {align}-byte "
                           "TMA stride unit (tma_alignment_bytes)", "fix the contract in builder/derive",
                           operand=name, stride_divisibility=div, element_bits=dtype.bits, tma_alignment_bytes=align)
    if plan.contract.base_alignment % align:
        yield ctx.diag("TMA-ALIGN", None, f"the contract's {plan.contract.base_alignment}-byte base alignment is not a "
                       f"multiple of TMA's {align} bytes", "fix the contract in builder/derive",
                       base_alignment=plan.contract.base_alignment, tma_alignment_bytes=align)
    for operand, inner, bits in _rows(ctx):
        if (inner * bits) % (8 * align):
            yield ctx.diag("TMA-ALIGN", "tile", f"a row of the {operand} tile is {inner} contiguous elements = "
                           f"{inner * bits / 8:g} B, not a multiple of {align} B (tma_alignment_bytes: "
                           "cuTensorMapEncodeTiled needs boxDim[0] x element size in 16-byte units)",
                           f"make the tile's contiguous dimension a multiple of {8 * align // bits} elements",
                           operand=operand, contiguous_elements=inner, element_bits=bits, tma_alignment_bytes=align)


@rule("EPI-TILE", "the epilogue sub-tile divides the CTA tile")
def check_epilogue(ctx: KernelContext) -> Iterator[Diagnostic]:
    plan, cfg = ctx.plan, ctx.entry.config
    if not plan.epi_n:
        return  # no template, no epilogue to check
    t = cfg.tile
    if t.m % plan.epi_m or t.n % plan.epi_n:
        # The sm90 template's zipped_divide of a ragged tile aborts the DSL
        # (SIGABRT while compiling 128x40 and 128x48 tiles, DSL 4.8.1).
        yield ctx.diag("EPI-TILE", "tile", f"the template stores C in {plan.epi_m}x{plan.epi_n} sub-tiles, which "
                       f"do not tile the {t.m}x{t.n} CTA tile", f"use tile M a multiple of {plan.epi_m} and tile N "
                       f"a multiple of {plan.epi_n}", tile=[t.m, t.n], epi_tile=[plan.epi_m, plan.epi_n])

