"""Kernel templates and what each one implements.

Every ``templates/<name>.py.j2`` has a ``templates/<name>.yaml`` manifest
beside it: the pipeline it serves, the dtype/layout/schedule combinations it
implements and its fixed design parameters (register split, epilogue depth).
Hardware limits never appear here; they are in ``catalog/hardware``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.catalog import DTypesModel, LayoutCode
from builder.config import KernelConfig, Schedule
from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.paths import display_path
from builder.pydantic_errors import diagnostics_from_validation
from builder.yamlsrc import load_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Supports(_Strict):
    dtypes: list[DTypesModel] = Field(min_length=1)
    layouts: list[LayoutCode] = Field(min_length=1)
    schedules: list[Schedule] = Field(min_length=1)


class Sm90Parameters(_Strict):
    producer_registers: int
    epilogue_stages: int
    epilogue_tile_n: int
    static_smem_bytes: int
    max_stages: int
    max_consumer_warpgroups: int


class TemplateManifest(_Strict):
    template: str
    pipeline: str
    supports: Supports
    parameters: Sm90Parameters


@dataclass(frozen=True)
class Template:
    name: str
    path: Path
    manifest: TemplateManifest
    manifest_file: str

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def unsupported(self, config: KernelConfig) -> str | None:
        """Why this template cannot build ``config``, or None if it can."""
        s = self.manifest.supports
        d = config.dtypes
        if not any((x.a, x.b, x.acc, x.c) == (d.a, d.b, d.acc, d.c) for x in s.dtypes):
            offered = ", ".join(f"{x.a.value}/{x.b.value}/{x.acc.value}/{x.c.value}" for x in s.dtypes)
            return f"dtypes {'/'.join(d.tokens)} are not implemented (offered: {offered})"
        if config.layout.code not in s.layouts:
            return f"layout {config.layout.code} is not implemented (offered: {', '.join(s.layouts)})"
        if config.schedule not in s.schedules:
            return (f"schedule {config.schedule.value} is not implemented "
                    f"(offered: {', '.join(x.value for x in s.schedules)})")
        return None


@dataclass(frozen=True)
class TemplateSet:
    templates: tuple[Template, ...]
    directory: Path

    def for_pipeline(self, pipeline: str) -> Template | None:
        for t in self.templates:
            if t.manifest.pipeline == pipeline:
                return t
        return None


def load_templates(directory: Path, display_root: Path | None = None) -> TemplateSet:
    found: list[Template] = []
    problems: list[Diagnostic] = []
    for manifest_path in sorted(directory.glob("*.yaml")):
        display = display_path(manifest_path, display_root)
        doc = load_yaml(manifest_path, display)
        try:
            manifest = TemplateManifest.model_validate(doc.data)
        except ValidationError as exc:
            problems.extend(diagnostics_from_validation(exc, doc, "TEMPLATE-MANIFEST"))
            continue
        path = directory / manifest.template
        if not path.exists():
            problems.append(Diagnostic("TEMPLATE-MISSING", f"template file {manifest.template} does not exist",
                                       doc.locate(("template",)), "fix the name or add the template"))
            continue
        found.append(Template(path.name.removesuffix(".py.j2"), path, manifest, display))
    if problems:
        raise DiagnosticError(problems)
    if not found:
        raise DiagnosticError([Diagnostic("TEMPLATE-NONE", "no template manifests found",
                                          Location(str(directory)), "add templates/<name>.yaml")])
    return TemplateSet(tuple(found), directory)
