"""Kernel ids: one grammar for every pipeline, and it round-trips.

    gemm_<pipeline>_<a>_<b>_<acc>_<c>_<layout>_<M>x<N>x<K>_c<CM>x<CN>[_<option>...]

Options appear only when they differ from their default, in this fixed order:
``pingpong`` (schedule), ``swapab`` (C^T = B^T A^T), ``2cta`` (CTA pair per MMA), ``sf<scale>x<block>``
(block-scaled operands, e.g. ``sfe4m3x16``), ``rn`` (raster along N),
``sw<S>`` (swizzle), ``ef<operands>`` (operands whose loads hint the L2 to
evict them first, e.g. ``efb``), ``s<S>`` (explicit stage count). Examples:
``gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1``,
``gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta``,
``gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x256x768_c1x1_sfe4m3x16``.
``parse_kernel_id(format_kernel_id(c)) == c`` for every canonical config, and
a string that parses but is spelled differently from its canonical form
(leading zeros, options out of order, a default spelled out) is rejected.
"""

from __future__ import annotations

import re

from builder.config import BlockScale, Cluster, DTypes, KernelConfig, Layout, Operand, Raster, Schedule, Tile
from builder.dtypes import DType

_DT = "|".join(sorted((d.value for d in DType), key=len, reverse=True))
_ID_RE = re.compile(
    rf"^gemm_(?P<pipeline>sm\d+)_(?P<a>{_DT})_(?P<b>{_DT})_(?P<acc>{_DT})_(?P<c>{_DT})"
    r"_(?P<layout>[tn]{2})_(?P<tm>\d+)x(?P<tn>\d+)x(?P<tk>\d+)_c(?P<cm>\d+)x(?P<cn>\d+)"
    r"(?P<options>(?:_[a-z0-9]+)*)$"
)
_SCALE_RE = re.compile(rf"sf({_DT})x(\d+)")


class KernelIdError(ValueError):
    """The string is not a canonical kernel id."""


def format_kernel_id(config: KernelConfig) -> str:
    d = config.dtypes
    parts = [
        "gemm", config.pipeline, d.a.value, d.b.value, d.acc.value, d.c.value, config.layout.code,
        f"{config.tile.m}x{config.tile.n}x{config.tile.k}", f"c{config.cluster.m}x{config.cluster.n}",
    ]
    if config.schedule is not Schedule.COOPERATIVE:
        parts.append(config.schedule.value)
    if config.swap_ab:
        parts.append("swapab")
    if config.cta_group != 1:
        parts.append(f"{config.cta_group}cta")
    if config.block_scale is not None:
        parts.append(f"sf{config.block_scale.scale.value}x{config.block_scale.block}")
    if config.raster is not Raster.M:
        parts.append(f"r{config.raster.value}")
    if config.swizzle != 1:
        parts.append(f"sw{config.swizzle}")
    if config.evict_first:
        parts.append("ef" + "".join(sorted(o.value for o in config.evict_first)))
    if config.stages is not None:
        parts.append(f"s{config.stages}")
    return "_".join(parts)


def parse_kernel_id(kernel_id: str) -> KernelConfig:
    match = _ID_RE.match(kernel_id)
    if not match:
        raise KernelIdError(
            f"{kernel_id!r} is not a kernel id; expected "
            "gemm_<pipeline>_<a>_<b>_<acc>_<c>_<layout>_<M>x<N>x<K>_c<CM>x<CN>[_options]")
    g = match.groupdict()
    schedule, raster, swizzle, stages = Schedule.COOPERATIVE, Raster.M, 1, None
    cta_group, block_scale, swap_ab = 1, None, False
    evict_first: frozenset[Operand] = frozenset()
    for token in filter(None, g["options"].split("_")):
        scale = _SCALE_RE.fullmatch(token)
        if token == Schedule.PINGPONG.value:
            schedule = Schedule.PINGPONG
        elif token == "swapab":
            swap_ab = True
        elif re.fullmatch(r"\d+cta", token):
            cta_group = int(token[:-3])
        elif scale:
            block_scale = BlockScale(DType(scale.group(1)), int(scale.group(2)))
        elif token == "rn":
            raster = Raster.N
        elif re.fullmatch(r"sw\d+", token):
            swizzle = int(token[2:])
        elif re.fullmatch(r"ef[ab]+", token):
            evict_first = frozenset(Operand(letter) for letter in token[2:])
        elif re.fullmatch(r"s\d+", token):
            stages = int(token[1:])
        else:
            raise KernelIdError(f"{kernel_id!r}: unknown option {token!r}; "
                                "known: pingpong, swapab, <G>cta, sf<scale>x<block>, rn, sw<S>, ef<a|b|ab>, s<S>")
    config = KernelConfig(
        pipeline=g["pipeline"],
        dtypes=DTypes(DType(g["a"]), DType(g["b"]), DType(g["acc"]), DType(g["c"])),
        layout=Layout.from_code(g["layout"]),
        tile=Tile(int(g["tm"]), int(g["tn"]), int(g["tk"])),
        cluster=Cluster(int(g["cm"]), int(g["cn"])),
        schedule=schedule, raster=raster, swizzle=swizzle, stages=stages,
        cta_group=cta_group, block_scale=block_scale, swap_ab=swap_ab, evict_first=evict_first,
    )
    canonical = format_kernel_id(config)
    if canonical != kernel_id:
        raise KernelIdError(f"{kernel_id!r} is not canonical; it is spelled {canonical!r}")
    return config
