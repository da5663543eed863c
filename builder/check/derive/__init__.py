"""Derived values of a kernel: stages, shared memory, tensor memory, registers.

Rules and the renderer share these computations, so the validator checks
exactly what the template will build. Numbers come from the hardware facts
and the template manifest; nothing here restates a hardware value. One
module per MMA family: ``sm90`` (warpgroup MMA) and ``tcgen05``.
"""

from __future__ import annotations

from builder.check.derive.common import SmemUse, align_up
from builder.check.derive.sm90 import Sm90Plan, plan_sm90, sm90_smem
from builder.check.derive.tcgen05 import Tcgen05Plan, plan_tcgen05, tcgen05_smem, tmem_accumulator_columns
from builder.load.facts import PipelineFacts
from builder.load.templates import Sm90Parameters, Tcgen05Parameters, Template
from tilekiln.spec import KernelConfig

Plan = Sm90Plan | Tcgen05Plan

__all__ = ["Plan", "Sm90Plan", "SmemUse", "Tcgen05Plan", "align_up", "make_plan", "plan_sm90", "plan_tcgen05",
           "sm90_smem", "tcgen05_smem", "tmem_accumulator_columns"]


def make_plan(config: KernelConfig, facts: PipelineFacts, template: Template | None) -> Plan | None:
    """The plan of ``config`` on its pipeline, or None when it cannot be derived.

    A tcgen05 plan exists without a template (as bounds, see ``tcgen05``); the
    sm90 plan needs the template's register split, so it needs the template.
    None also when the template's parameters are for another MMA family.
    """
    params = template.manifest.parameters if template is not None else None
    if facts.require("mma_instruction") == "tcgen05":
        return plan_tcgen05(config, facts, params) if params is None or isinstance(params, Tcgen05Parameters) \
            else None
    return plan_sm90(config, facts, template) if isinstance(params, Sm90Parameters) else None
