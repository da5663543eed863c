"""Rules on tile and cluster geometry against the MMA instruction shapes."""

from __future__ import annotations

from typing import Iterator

from builder.check.context import KernelContext
from builder.check.derive import Sm90Plan
from builder.check.rules.registry import rule
from builder.diagnostics import Diagnostic
from tilekiln.spec import Schedule


@rule("CTA-GROUP", "the CTAs per MMA (1, or 2 for a CTA pair) is an MMA form of the pipeline")
def check_cta_group(ctx: KernelContext) -> Iterator[Diagnostic]:
    groups = ctx.facts.require("mma_cta_groups")
    g = ctx.entry.config.cta_group
    if g not in groups:
        yield ctx.diag("CTA-GROUP", "cta_group", f"cta_group {g} is not an MMA form of pipeline "
                       f"{ctx.facts.pipeline} ({ctx.mma} MMAs span {' or '.join(map(str, groups))} CTA)",
                       f"use cta_group {' or '.join(map(str, groups))}", cta_group=g, mma_cta_groups=groups)


def _tcgen05_m_fact(ctx: KernelContext) -> str:
    scaled = "_block_scaled" if ctx.entry.config.block_scale is not None else ""
    return f"mma_m{scaled}_{ctx.entry.config.cta_group}cta"


@rule("MMA-TILE-M", "the CTA tile M is a whole MMA instruction M (per warpgroup on sm90, per CTA or pair on tcgen05)")
def check_tile_m(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    tm = cfg.tile.m
    if isinstance(ctx.plan, Sm90Plan):
        mma_m = ctx.facts.require("mma_m_per_warpgroup")
        if tm % mma_m:
            yield ctx.diag("MMA-TILE-M", "tile", f"tile M {tm} is not a multiple of the {mma_m}-row warpgroup MMA",
                           f"use {max(mma_m, tm // mma_m * mma_m)} or {(tm // mma_m + 1) * mma_m}", tile_m=tm,
                           mma_m=mma_m)
        elif cfg.schedule is Schedule.PINGPONG and ctx.template is not None and tm > (
                rows := mma_m * ctx.template.manifest.parameters.max_pingpong_row_blocks):
            yield ctx.diag("MMA-TILE-M", "tile", f"tile M {tm} is more than the {rows} rows a ping-pong consumer "
                           f"of {ctx.template.path.name} computes",
                           f"use tile M {' or '.join(str(mma_m * b) for b in range(1, rows // mma_m + 1))}, "
                           "or schedule cooperative", tile_m=tm, max_pingpong_tile_m=rows)
        elif ctx.plan.wg_tile_m % mma_m:
            yield ctx.diag("MMA-TILE-M", "tile", f"tile M {tm} splits into {ctx.plan.wg_tile_m} rows per consumer "
                           f"warpgroup, not a multiple of {mma_m}",
                           f"use a multiple of {mma_m * ctx.plan.consumer_wgs}", tile_m=tm,
                           rows_per_warpgroup=ctx.plan.wg_tile_m, consumer_warpgroups=ctx.plan.consumer_wgs,
                           mma_m=mma_m)
        return
    if cfg.cta_group not in ctx.facts.require("mma_cta_groups"):
        return  # CTA-GROUP reports it; there is no M table for it
    name = _tcgen05_m_fact(ctx)
    allowed = ctx.facts.require(name)
    mma_m = tm * cfg.cta_group
    if mma_m not in allowed:
        pair = f" (a CTA pair covers {cfg.cta_group} x {tm} = {mma_m} rows)" if cfg.cta_group > 1 else ""
        kind = "block-scaled " if cfg.block_scale is not None else ""
        tiles = ", ".join(str(m // cfg.cta_group) for m in allowed)
        yield ctx.diag("MMA-TILE-M", "tile", f"tile M {tm}{pair} is not a legal {kind}MMA M of pipeline "
                       f"{ctx.facts.pipeline} with cta_group {cfg.cta_group} ({name}: "
                       f"{', '.join(map(str, allowed))})", f"use tile M {tiles}", tile_m=tm, cta_group=cfg.cta_group,
                       mma_m=mma_m, **{name: allowed})


@rule("MMA-TILE-N", "the CTA tile N is an MMA instruction N for the CTA group and B's majorness")
def check_tile_n(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    tn = cfg.tile.n
    name = "mma_n_2cta" if cfg.cta_group == 2 and ctx.mma == "tcgen05" else "mma_n"
    rng = ctx.facts.require(name)
    if tn not in rng:
        yield ctx.diag("MMA-TILE-N", "tile", f"tile N {tn} is not an MMA N of pipeline {ctx.facts.pipeline}"
                       f"{' under a 2-CTA MMA' if name == 'mma_n_2cta' else ''} ({name}: {rng})",
                       f"use a multiple of {rng.step} between {rng.min} and {rng.max}",
                       tile_n=tn, mma_n_min=rng.min, mma_n_max=rng.max, mma_n_step=rng.step)
        return
    b = cfg.mma_dtypes.b  # under swap_ab the MMA's B is the problem's A
    if (ctx.mma == "tcgen05" and b.bits == 8 and not cfg.mma_layout.b_k_major
            and b in ctx.facts.require("mn_major_dtypes")):
        step = ctx.facts.require("mma_n_step_mn_major_8bit").get(cfg.cta_group)
        if step and tn % step:
            yield ctx.diag("MMA-TILE-N", "tile", f"tile N {tn}: an N-major 8-bit B ({b.value}) needs MMA N in "
                           f"steps of {step} with cta_group {cfg.cta_group} (mma_n_step_mn_major_8bit)",
                           f"use a multiple of {step}, or the MMA's B K-major "
                           f"(layout {'tn/tt' if cfg.swap_ab else 'tn/nn'})", tile_n=tn, mma_n_step=step)


@rule("MMA-TILE-K", "the CTA tile K is a whole number of MMA instruction K widths")
def check_tile_k(ctx: KernelContext) -> Iterator[Diagnostic]:
    k_bytes = ctx.facts.require("mma_k_bytes")
    cfg = ctx.entry.config
    a = cfg.mma_dtypes.a
    bits = a.bits
    tile_k_bytes = cfg.tile.k * bits // 8
    if (cfg.tile.k * bits) % (8 * k_bytes):
        step = k_bytes * 8 // bits
        lower = max(step, cfg.tile.k // step * step)
        yield ctx.diag("MMA-TILE-K", "tile", f"tile K {cfg.tile.k} ({tile_k_bytes} B of {a.value}) is "
                       f"not a multiple of pipeline {ctx.facts.pipeline}'s {k_bytes}-byte MMA K (mma_k_bytes)",
                       f"use a multiple of {step} elements, e.g. {lower} or {lower + step}", tile_k=cfg.tile.k,
                       tile_k_bytes=tile_k_bytes, mma_k_bytes=k_bytes)


@rule("CTA-K-BYTES", "the CTA tile K bytes are within (or equal to) the pipeline's per-stage K")
def check_cta_k(ctx: KernelContext) -> Iterator[Diagnostic]:
    if ctx.mma != "tcgen05":
        return  # warpgroup MMA has no per-stage K limit; the DSL cuts any K into TMA boxes
    cfg = ctx.entry.config
    a = cfg.mma_dtypes.a
    bits = a.bits
    k_bytes = cfg.tile.k * bits // 8
    if ctx.facts.has("cta_k_bytes_fixed"):
        fixed = ctx.facts.require("cta_k_bytes_fixed")
        if k_bytes != fixed:
            yield ctx.diag("CTA-K-BYTES", "tile", f"tile K {cfg.tile.k} is {k_bytes} B of {a.value}; "
                           f"pipeline {ctx.facts.pipeline} fixes the CTA K at {fixed} B (cta_k_bytes_fixed)",
                           f"use tile K {fixed * 8 // bits}", tile_k=cfg.tile.k, tile_k_bytes=k_bytes,
                           cta_k_bytes_fixed=fixed)
        return
    limit = ctx.facts.require("cta_k_bytes_max")
    if k_bytes > limit:
        yield ctx.diag("CTA-K-BYTES", "tile", f"tile K {cfg.tile.k} is {k_bytes} B of {a.value}, over "
                       f"pipeline {ctx.facts.pipeline}'s {limit} B per stage (cta_k_bytes_max)",
                       f"use tile K <= {limit * 8 // bits} and more stages", tile_k=cfg.tile.k, tile_k_bytes=k_bytes,
                       cta_k_bytes_max=limit)


@rule("BLOCK-SCALE-TILE", "a block-scaled tile K covers whole scale-factor atoms")
def check_block_scale_tile(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.block_scale is None:
        return
    blocks = ctx.facts.require("block_scale_atom_k_blocks")
    need = blocks * cfg.block_scale.block
    if cfg.tile.k % need:
        yield ctx.diag("BLOCK-SCALE-TILE", "tile", f"tile K {cfg.tile.k} is not a multiple of {need} elements: a "
                       f"scale-factor atom holds {blocks} blocks of {cfg.block_scale.block} along K "
                       "(block_scale_atom_k_blocks)", f"use a multiple of {need}",
                       tile_k=cfg.tile.k, scale_block=cfg.block_scale.block, block_scale_atom_k_blocks=blocks)


@rule("BLOCK-SCALE-MMA-K", "one block-scaled MMA reads no more scale blocks than its template copies per MMA")
def check_block_scale_mma_k(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    params = ctx.template.manifest.parameters if ctx.template else None
    limit = getattr(params, "max_scale_blocks_per_mma", None)
    if cfg.block_scale is None or limit is None:
        return
    k_bytes = ctx.facts.require("mma_k_bytes")
    mma_k = k_bytes * 8 // cfg.mma_dtypes.a.bits
    per_mma = mma_k // cfg.block_scale.block
    if per_mma > limit:
        yield ctx.diag("BLOCK-SCALE-MMA-K", "block_scale",
                       f"pipeline {ctx.facts.pipeline}'s {k_bytes}-byte MMA K is {mma_k} {cfg.mma_dtypes.a.value} "
                       f"elements, {per_mma} scale blocks of {cfg.block_scale.block}: more than the {limit} that "
                       f"template {ctx.template.name} copies into tensor memory per MMA (max_scale_blocks_per_mma)",
                       f"use block {mma_k // limit} scales, or pipeline sm100 (32-byte MMA K)",
                       mma_k_bytes=k_bytes, scale_block=cfg.block_scale.block, blocks_per_mma=per_mma,
                       max_scale_blocks_per_mma=limit)


@rule("CLUSTER-SHAPE", "the cluster fits the pipeline's cluster limit and has power-of-two dims")
def check_cluster(ctx: KernelContext) -> Iterator[Diagnostic]:
    c = ctx.entry.config.cluster
    limit = ctx.facts.require("max_cluster_size")
    if c.size > limit:
        yield ctx.diag("CLUSTER-SHAPE", "cluster", f"cluster {c.m}x{c.n} has {c.size} CTAs, over pipeline "
                       f"{ctx.facts.pipeline}'s limit of {limit} (max_cluster_size)",
                       f"use at most {limit} CTAs per cluster", cluster=[c.m, c.n], cluster_size=c.size,
                       max_cluster_size=limit)
    if ctx.facts.require("cluster_dims_power_of_two"):
        for name, v in (("M", c.m), ("N", c.n)):
            if v & (v - 1):
                lower = 1 << (v.bit_length() - 1)
                yield ctx.diag("CLUSTER-SHAPE", "cluster", f"cluster {name} = {v} is not a power of two "
                               "(cluster_dims_power_of_two)", f"use {lower} or {lower * 2}", cluster=[c.m, c.n],
                               cluster_dims_power_of_two=True)


@rule("CTA-PAIR", "a 2-CTA MMA's pair fits inside the cluster along M")
def check_cta_pair(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    g = cfg.cta_group
    if g > 1 and cfg.cluster.m % g:
        yield ctx.diag("CTA-PAIR", "cluster", f"cta_group {g} pairs CTAs along M, but cluster M is {cfg.cluster.m}, "
                       f"not a multiple of {g}", f"use cluster [{g * max(1, cfg.cluster.m // g)}, {cfg.cluster.n}] "
                       "or cta_group 1", cta_group=g, cluster_m=cfg.cluster.m)


