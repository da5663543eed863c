"""The rule registry (the context every kernel rule receives: builder/check/context.py).

A rule never prints or raises for a bad config; it returns diagnostics that
say what is wrong, the fact that decides it (with its value) and how to fix
it. Rules read hardware values only through ``PipelineFacts.require`` (a fact
the pipeline does not declare raises FACT-MISSING) and derived quantities
only from ``builder.check.derive``. Kernel rules see one expanded config; catalog
rules see all of them (duplicates, shadowed kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal

from builder.check.context import KernelContext
from builder.diagnostics import Diagnostic

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
