"""The rule registry and the context every kernel rule receives.

A rule never prints or raises for a bad config; it returns diagnostics that
say what is wrong, the fact that decides it (with its value) and how to fix
it. Rules read hardware values only through ``PipelineFacts.require`` (a fact
the pipeline does not declare raises FACT-MISSING) and derived quantities
only from ``builder.derive``. Kernel rules see one expanded config; catalog
rules see all of them (duplicates, shadowed kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal

from builder.catalog import CatalogEntry
from builder.derive import Plan
from builder.diagnostics import Diagnostic, Severity
from builder.facts import PipelineFacts
from builder.templates import Template


@dataclass(frozen=True)
class KernelContext:
    """One expanded kernel with its pipeline's facts, its template (None when no
    template serves the pipeline) and its derived plan."""

    entry: CatalogEntry
    facts: PipelineFacts
    template: Template | None
    plan: Plan
    tuned: bool = False  # a committed tuning table names it (builder/tuning.py)

    @property
    def mma(self) -> str:
        return self.facts.require("mma_instruction")

    def diag(self, rule: str, field: str | None, message: str, hint: str,
             severity: Severity = Severity.ERROR, **facts: object) -> Diagnostic:
        """A diagnostic about this kernel (its id is the ``subject``) at ``field``'s value, or at the
        whole catalog item when ``field`` is None; ``facts`` are the numbers the rule decided on."""
        return Diagnostic(rule, message, self.entry.locate(field), hint, severity, facts,
                          subject=self.entry.kernel_id)


KernelRuleFn = Callable[[KernelContext], Iterable[Diagnostic]]
CatalogRuleFn = Callable[[tuple[KernelContext, ...]], Iterable[Diagnostic]]


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    scope: Literal["kernel", "catalog"]
    check: KernelRuleFn | CatalogRuleFn


RULES: list[Rule] = []


def rule(rule_id: str, summary: str) -> Callable[[KernelRuleFn], KernelRuleFn]:
    """Register a kernel rule: (KernelContext) -> diagnostics."""
    def register(fn: KernelRuleFn) -> KernelRuleFn:
        RULES.append(Rule(rule_id, summary, "kernel", fn))
        return fn
    return register


def catalog_rule(rule_id: str, summary: str) -> Callable[[CatalogRuleFn], CatalogRuleFn]:
    """Register a catalog rule: (every kernel context) -> diagnostics."""
    def register(fn: CatalogRuleFn) -> CatalogRuleFn:
        RULES.append(Rule(rule_id, summary, "catalog", fn))
        return fn
    return register
