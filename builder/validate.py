"""Validate a catalog against the hardware facts and the templates.

Runs every rule of ``builder.rules`` on every expanded kernel plus the
catalog-wide checks (duplicate ids), collecting all problems rather than
stopping at the first. The result keeps one :class:`KernelContext` per valid
kernel for the build stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.catalog import Catalog, load_catalog
from builder.diagnostics import Diagnostic, DiagnosticError, Severity, has_errors
from builder.facts import FactTable, UnknownPipeline, load_facts
from builder.rules import RULES, KernelContext, make_context
from builder.templates import TemplateSet, load_templates


@dataclass(frozen=True)
class Project:
    """Where the catalog, facts and templates live."""

    root: Path

    @property
    def catalog_dir(self) -> Path:
        return self.root / "catalog"

    @property
    def hardware_dir(self) -> Path:
        return self.root / "catalog" / "hardware"

    @property
    def templates_dir(self) -> Path:
        return self.root / "templates"


@dataclass(frozen=True)
class Validation:
    catalog: Catalog | None
    facts: FactTable | None
    templates: TemplateSet | None
    kernels: tuple[KernelContext, ...]
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def validate_project(project: Project, catalog_dir: Path | None = None,
                     files: list[Path] | None = None) -> Validation:
    diagnostics: list[Diagnostic] = []
    facts = templates = catalog = None
    try:
        facts = load_facts(project.hardware_dir, project.root)
    except DiagnosticError as exc:
        diagnostics.extend(exc.diagnostics)
    try:
        templates = load_templates(project.templates_dir, project.root)
    except DiagnosticError as exc:
        diagnostics.extend(exc.diagnostics)
    try:
        catalog = load_catalog(catalog_dir or project.catalog_dir, project.root, files)
    except DiagnosticError as exc:
        diagnostics.extend(exc.diagnostics)
    if facts is None or templates is None or catalog is None:
        return Validation(catalog, facts, templates, (), tuple(diagnostics))
    kernels, found = check_catalog(catalog, facts, templates)
    diagnostics.extend(found)
    return Validation(catalog, facts, templates, kernels, tuple(diagnostics))


def check_catalog(catalog: Catalog, facts: FactTable,
                  templates: TemplateSet) -> tuple[tuple[KernelContext, ...], list[Diagnostic]]:
    diagnostics: list[Diagnostic] = []
    kernels: list[KernelContext] = []
    seen: dict[str, object] = {}
    for entry in catalog.entries:
        loc = entry.locate("pipeline")
        try:
            pipeline_facts = facts.pipeline(entry.config.pipeline)
        except UnknownPipeline as exc:
            diagnostics.append(Diagnostic("UNKNOWN-PIPELINE", str(exc).strip('"'), loc,
                                          f"add catalog/hardware/{exc.name}.yaml or use one of {', '.join(exc.known)}"))
            continue
        template = templates.for_pipeline(entry.config.pipeline)
        if template is None:
            diagnostics.append(Diagnostic("TEMPLATE-SUPPORT", f"no template serves pipeline {entry.config.pipeline}",
                                          loc, "add a template manifest for this pipeline"))
            continue
        kid = entry.kernel_id
        if kid in seen:
            first = seen[kid]
            diagnostics.append(Diagnostic(
                "DUPLICATE-ID", f"{kid} is defined twice (first at {first})", entry.locate(),
                "remove one; two kernels with the same id would be indistinguishable in a bundle"))
            continue
        seen[kid] = entry.locate()
        try:
            ctx = make_context(entry, pipeline_facts, template)
            found = [d for r in RULES for d in r.check(ctx)]
        except DiagnosticError as exc:
            diagnostics.extend(exc.diagnostics)
            continue
        diagnostics.extend(found)
        if not any(d.severity is Severity.ERROR for d in found):
            kernels.append(ctx)
    return tuple(kernels), diagnostics
