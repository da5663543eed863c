"""Validate a catalog against the hardware facts and the templates.

Runs every rule of ``builder.check.rules`` on every expanded kernel plus the
catalog-wide rules (duplicate ids, shadowed kernels), collecting all problems rather than
stopping at the first. The result keeps one :class:`KernelContext` per valid
kernel for the build stages.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from builder.check.context import KernelContext, make_context
from builder.check.rules import RULES
from builder.diagnostics import Diagnostic, DiagnosticError, did_you_mean, has_errors
from builder.load.catalog import Catalog, load_catalog
from builder.load.facts import FactTable, UnknownPipeline, load_facts
from builder.load.templates import TemplateSet, load_templates
from builder.load.tuning import tuned_kernel_ids
from builder.load.verification import check_verification_files


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
    kernels: tuple[KernelContext, ...]  # buildable: no error of their own
    diagnostics: tuple[Diagnostic, ...]
    planned: tuple[KernelContext, ...] = ()  # every kernel with a derived plan, valid or not

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
    tuned, tuning_problems = tuned_kernel_ids(project.root)
    kernels, planned, found = check_catalog(catalog, facts, templates, tuned)
    diagnostics.extend(found)
    diagnostics.extend(tuning_problems)
    diagnostics.extend(check_verification_files(project.root))
    return Validation(catalog, facts, templates, kernels, tuple(diagnostics), planned)


def check_catalog(catalog: Catalog, facts: FactTable, templates: TemplateSet, tuned: frozenset[str] = frozenset()
                  ) -> tuple[tuple[KernelContext, ...], tuple[KernelContext, ...], list[Diagnostic]]:
    """Run every rule on every entry; return the buildable kernels, every planned
    kernel and all findings.

    A rule that needs a fact the pipeline lacks reports FACT-MISSING (once per
    fact and rule) and the other rules still run. A kernel is clean when its
    own rules found no error; catalog rules (duplicates, shadowing) look at
    the clean kernels, and of clean kernels sharing an id the first is buildable.
    """
    diagnostics: list[Diagnostic] = []
    contexts: list[KernelContext] = []
    clean: list[KernelContext] = []
    reported: set[tuple[str, str]] = set()

    def run(check, arg, rule_id: str, where: str) -> tuple[list[Diagnostic], bool]:
        """(diagnostics, whether a fact was missing)."""
        try:
            return list(check(arg)), False
        except DiagnosticError as exc:
            out = []
            for d in exc.diagnostics:
                if (d.message, rule_id) not in reported:
                    reported.add((d.message, rule_id))
                    out.append(replace(d, message=f"{d.message} (rule {rule_id}, first needed by {where})",
                                       facts={**d.facts, "needed_by_rule": rule_id, "first_needed_by": where}))
            return out, True

    for entry in catalog.entries:
        kid = entry.kernel_id
        try:
            pipeline_facts = facts.pipeline(entry.config.pipeline)
        except UnknownPipeline as exc:
            close = did_you_mean(exc.name, exc.known)
            diagnostics.append(Diagnostic(
                "UNKNOWN-PIPELINE", str(exc).strip('"'), entry.locate("pipeline"),
                (f"did you mean {close!r}? " if close else "")
                + f"add catalog/hardware/{exc.name}.yaml or use one of {', '.join(exc.known)}",
                facts={"pipeline": exc.name, "known": list(exc.known), "did_you_mean": close}, subject=kid))
            continue
        serving = templates.serving(entry.config.pipeline, entry.config.family, entry.config.block_scale is not None)
        if len(serving) > 1:
            names = ", ".join(f"{t.name} ({t.manifest_file})" for t in serving)
            diagnostics.append(Diagnostic(
                "TEMPLATE-AMBIGUOUS", f"templates {names} all implement family {entry.config.family} on "
                f"pipeline {entry.config.pipeline}", entry.locate("pipeline"),
                "remove the pipeline or the family from all of their manifests but one",
                facts={"templates": [t.name for t in serving]}, subject=kid))
            continue
        template = serving[0] if serving else None
        made, missing = run(lambda e: [make_context(e, pipeline_facts, template)], entry, "plan", kid)
        if missing:
            diagnostics.extend(made)
            continue
        ctx = made[0]
        if ctx is None:
            diagnostics.append(Diagnostic(
                "TEMPLATE-SUPPORT", f"template {template.name if template else '(none)'} cannot build "
                f"pipeline {entry.config.pipeline}, whose MMA is {pipeline_facts.require('mma_instruction')}",
                entry.locate("pipeline"), "add a template for this pipeline, or fix parameters.kind in its manifest",
                facts={"template": template.name if template else None,
                       "mma_instruction": pipeline_facts.require("mma_instruction")}, subject=kid))
            continue
        if kid in tuned:
            ctx = replace(ctx, tuned=True)
        contexts.append(ctx)
        found: list[Diagnostic] = []
        broken = False
        for r in RULES:
            if r.scope == "kernel":
                out, missing = run(r.check, ctx, r.id, kid)
                found.extend(out)
                broken = broken or missing
        diagnostics.extend(found)
        if not broken and not has_errors(found):
            clean.append(ctx)
    for r in RULES:
        if r.scope == "catalog":
            diagnostics.extend(run(r.check, tuple(clean), r.id, "the catalog")[0])
    buildable: dict[str, KernelContext] = {}
    for c in clean:
        buildable.setdefault(c.entry.kernel_id, c)
    return tuple(buildable.values()), tuple(contexts), diagnostics
