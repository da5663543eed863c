"""The check stage's central value: one expanded kernel with its facts, template and derived plan.

:func:`make_context` makes it (the validator, for every catalog entry); rules read it, the
renderer fills a template from it, and the compile and package stages carry it to the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.check.derive import Plan, make_plan
from builder.diagnostics import Diagnostic, Severity
from builder.load.catalog import CatalogEntry
from builder.load.facts import PipelineFacts
from builder.load.templates import Template


@dataclass(frozen=True)
class KernelContext:
    """One expanded kernel with its pipeline's facts, its template (None when no
    template serves the pipeline) and its derived plan."""

    entry: CatalogEntry
    facts: PipelineFacts
    template: Template | None
    plan: Plan
    tuned: bool = False  # a committed tuning table names it (builder/load/tuning.py)

    @property
    def mma(self) -> str:
        return self.facts.require("mma_instruction")

    def diag(self, rule: str, field: str | None, message: str, hint: str,
             severity: Severity = Severity.ERROR, **facts: object) -> Diagnostic:
        """A diagnostic about this kernel (its id is the ``subject``) at ``field``'s value, or at the
        whole catalog item when ``field`` is None; ``facts`` are the numbers the rule decided on."""
        return Diagnostic(rule, message, self.entry.locate(field), hint, severity, facts,
                          subject=self.entry.kernel_id)



def make_context(entry: CatalogEntry, facts: PipelineFacts, template: Template | None) -> KernelContext | None:
    """The kernel's context, or None when no plan can be derived (no usable template)."""
    plan = make_plan(entry.config, facts, template)
    return KernelContext(entry, facts, template, plan) if plan is not None else None
