"""Render a validated kernel into a CuTe DSL Python source.

Only typed, validated values reach a template: the context below is built
from the :class:`~tilekiln.spec.KernelConfig` and its derived plan, and the
Jinja environment uses ``StrictUndefined`` so a misspelled variable is an
error, not an empty string.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from tilekiln.spec import Schedule
from builder.derive import Tcgen05Plan
from builder.rules import KernelContext


@dataclass(frozen=True)
class RenderedSource:
    kernel_id: str
    text: str
    template_sha256: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@lru_cache(maxsize=4)
def _environment(directory: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _common_context(ctx: KernelContext) -> dict[str, object]:
    cfg, plan = ctx.entry.config, ctx.plan
    return {
        "kernel_id": ctx.entry.kernel_id,
        "a_dtype": cfg.dtypes.a.cutlass_name,
        "b_dtype": cfg.dtypes.b.cutlass_name,
        "acc_dtype": cfg.dtypes.acc.cutlass_name,
        "c_dtype": cfg.dtypes.c.cutlass_name,
        "a_k_major": cfg.layout.a_k_major,
        "b_k_major": cfg.layout.b_k_major,
        "tile_m": cfg.tile.m, "tile_n": cfg.tile.n, "tile_k": cfg.tile.k,
        "cluster_m": cfg.cluster.m, "cluster_n": cfg.cluster.n,
        "stages": plan.stages,
        "epi_m": plan.epi_m, "epi_n": plan.epi_n, "epi_stages": plan.epi_stages,
        "threads": plan.threads,
        "raster": cfg.raster.value,
        "raster_along_m": cfg.raster.value == "m",
        "swizzle": cfg.swizzle,
        "buffer_align": ctx.facts.require("smem_buffer_alignment"),
        "a_stride_div": plan.stride_divisibility[0],
        "b_stride_div": plan.stride_divisibility[1],
        "c_stride_div": plan.stride_divisibility[2],
        # 8-bit float inputs carry per-tensor scales, applied in the epilogue.
        "scaled": cfg.dtypes.a.value in ("e4m3", "e5m2"),
    }


def template_context(ctx: KernelContext) -> dict[str, object]:
    """The template variables: the config and the plan the validator checked."""
    plan = ctx.plan
    if isinstance(plan, Tcgen05Plan):
        cfg = ctx.entry.config
        return _common_context(ctx) | {
            "cta_group": plan.cta_group,
            "mma_m": plan.mma_m,
            "b_rows": cfg.tile.n // plan.cta_group,
            "k_blocks": plan.k_blocks,
            "acc_stages": plan.acc_stages,
            "tmem_columns": plan.tmem_alloc_columns,
        }
    cfg = ctx.entry.config
    evict_a, evict_b = cfg.mma_evict_first
    return _common_context(ctx) | {
        "consumer_wgs": plan.consumer_wgs,
        "wg_threads": plan.threads // (1 + plan.consumer_wgs),
        "wg_tile_m": plan.wg_tile_m,
        "pingpong": cfg.schedule is Schedule.PINGPONG,
        "swap_ab": cfg.swap_ab,
        "evict_first_a": evict_a, "evict_first_b": evict_b,
        # Read only by kernels that hint a load, so a pipeline without the fact builds the rest.
        "evict_first_policy": hex(ctx.facts.require("tma_cache_policy_evict_first")) if cfg.evict_first else "0",
        "producer_regs": plan.producer_regs,
        "consumer_regs": plan.consumer_regs,
    }


def render_kernel(ctx: KernelContext) -> RenderedSource:
    template = ctx.template
    env = _environment(str(template.path.parent))
    text = env.get_template(template.path.name).render(**template_context(ctx))
    return RenderedSource(ctx.entry.kernel_id, text, template.source_sha256)


def write_source(source: RenderedSource, directory: Path) -> Path:
    path = directory / f"{source.kernel_id}.py"
    path.write_text(source.text)
    return path
