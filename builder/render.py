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

from builder.check.context import KernelContext
from tilekiln.spec import (BLOCK_EXTENTS, BLOCKWISE_BLOCK, FAMILIES, GLU_BLOCK, SCALED_OUTPUTS, Scheduler,
                           blockwise_b_blocks, blockwise_partials)


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


def template_context(ctx: KernelContext) -> dict[str, object]:
    """The template variables: the kernel's config (``cfg``, every field of tilekiln/spec.py's
    KernelConfig), the plan the validator checked (``plan``), its family's arguments
    (``family``), the blockwise scale block and the extents counted in it (``block``,
    ``block_extents``), the B scale blocks a blockwise tile spans and the partial sums it holds
    (``b_blocks``, ``partials``), the gated weights' block of rows (``glu_block``), the largest finite C an
    8-bit output saturates to (``c_finite_max``, 0 for other outputs; the docstring states it), and the one fact value a
    template embeds."""
    cfg = ctx.entry.config
    return {
        "kernel_id": ctx.entry.kernel_id,
        "cfg": cfg,
        "plan": ctx.plan,
        "family": FAMILIES[cfg.family],
        "block": BLOCKWISE_BLOCK,
        "b_blocks": blockwise_b_blocks(cfg.tile.m, cfg.tile.n, cfg.swap_ab),
        "partials": blockwise_partials(cfg.tile.m, cfg.tile.n, cfg.swap_ab),
        "block_extents": tuple(BLOCK_EXTENTS),
        "glu_block": GLU_BLOCK,
        "c_finite_max": SCALED_OUTPUTS.get(cfg.dtypes.c.value, 0.0),
        # Read only by kernels that hint a load, so a pipeline without the fact builds the rest.
        "clc": cfg.scheduler is Scheduler.CLC,
        # Read only by clc kernels, so a pipeline without cluster launch control builds the rest.
        "clc_response_bytes": ctx.facts.require("clc_response_bytes") if cfg.scheduler is Scheduler.CLC else 0,
        "evict_first_policy": hex(ctx.facts.require("tma_cache_policy_evict_first")) if cfg.evict_first else "0",
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
