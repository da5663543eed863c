"""Validation rules: one function per rule id, grouped by topic.

``RULES`` is the registry the validator runs and ``docs/catalog.md``
documents; ``rule`` registers a kernel rule and ``catalog_rule`` a rule over
the whole catalog. Topic modules: ``numerics`` (targets, template, dtypes,
layout, schedule), ``geometry`` (MMA shapes, K, clusters, CTA pairs),
``memory`` (shared memory, carveout, descriptor reach, TMEM, registers),
``contract`` (TMA boxes and alignment, epilogue tile), ``catalog_wide``
(duplicates, shadowed kernels).
"""

from __future__ import annotations

from builder.check.context import KernelContext
from builder.check.derive import Sm90Plan, Tcgen05Plan, sm90_smem, tcgen05_smem
from builder.check.rules.registry import RULES, Rule, catalog_rule, rule

# Importing a topic module registers its rules; RULES keeps this order.
from builder.check.rules import numerics  # noqa: E402,F401  isort: skip
from builder.check.rules import geometry  # noqa: E402,F401  isort: skip
from builder.check.rules import memory  # noqa: E402,F401  isort: skip
from builder.check.rules import contract  # noqa: E402,F401  isort: skip
from builder.check.rules import catalog_wide  # noqa: E402,F401  isort: skip

__all__ = ["RULES", "Rule", "catalog_rule", "rule", "summarize"]


def summarize(ctx: KernelContext) -> dict[str, object]:
    """Derived values for ``tilekiln validate --explain``."""
    p, cfg = ctx.plan, ctx.entry.config
    common = {
        "kernel": ctx.entry.kernel_id,
        "pipeline": cfg.pipeline,
        "targets": list(ctx.entry.targets),
        "template": ctx.template.name if ctx.template else None,
        "stages": p.stages,
        "stages_source": "explicit" if cfg.stages is not None else "auto (largest that fits)",
        "max_fitting_stages": p.max_fitting_stages,
        "smem_total_bytes": p.smem.total,
        "smem_budget_bytes": p.smem_budget,
        "smem_epilogue_bytes": p.smem.epilogue_bytes,
        "smem_barrier_bytes": p.smem.barrier_bytes,
        "smem_static_bytes": p.smem.static_bytes,
        # The templates are persistent with one CTA per SM (min_blocks_per_mp=1).
        "occupancy_ctas_per_sm": 1 if p.max_fitting_stages else 0,
        "epilogue_tile": [p.epi_m, p.epi_n],
        "stride_divisibility_elements": list(p.contract.stride_divisibility),
    }
    if isinstance(p, Sm90Plan):
        one = sm90_smem(cfg, ctx.facts, ctx.template, 1, p.epi_m, p.epi_n)
        return common | {
            "smem_per_stage_bytes": one.a_bytes + one.b_bytes,
            "consumer_warpgroups": p.consumer_wgs,
            "threads_per_cta": p.threads,
            "registers_producer_consumer": [p.producer_regs, p.consumer_regs],
            "accumulator_registers_per_thread": p.acc_regs_per_thread,
        }
    assert isinstance(p, Tcgen05Plan)
    params = ctx.template.manifest.parameters if ctx.template else None
    one = tcgen05_smem(cfg, ctx.facts, params, 1, p.epi_m, p.epi_n)
    return common | {
        "smem_per_stage_bytes": one.a_bytes + one.b_bytes + one.scale_bytes,
        "smem_budget_name": p.smem_budget_name,
        "smem_oversized_launch": p.oversized_launch,
        "smem_model": "exact (template Storage struct)" if p.has_template else "lower bound (no template)",
        "smem_operand_end_bytes": p.smem.operand_end,
        "smem_operand_address_end_bytes": p.smem.operand_address_end,
        "max_stages_within_budget": p.max_budget_stages,
        "max_stages_within_descriptor_reach": p.max_descriptor_stages,
        "cta_group": p.cta_group,
        "mma_instruction_mnk_bytes": [p.mma_m, p.mma_n, ctx.facts.require("mma_k_bytes")],
        "mma_per_stage_k": p.k_blocks,
        "threads_per_cta": p.threads,
        "tmem_accumulator_stages": p.acc_stages,
        "tmem_columns_per_stage": p.tmem_acc_columns // p.acc_stages,
        "tmem_columns_allocated": p.tmem_alloc_columns,
        "tmem_columns_available": ctx.facts.require("tmem_columns"),
        "multicast_a_b": [p.mcast_a, p.mcast_b],
    } | ({"tmem_scale_factor_columns": p.tmem_scale_columns} if p.tmem_scale_columns else {})
