"""Kernel templates and what each one implements.

Every ``templates/<name>.py.j2`` has a ``templates/<name>.yaml`` manifest
beside it: the pipeline it serves, the dtype/layout/schedule/CTA-group
combinations it implements and its fixed design parameters. The parameters
are per design (``parameters.kind``): the warpgroup-MMA template of sm90 has
a register split, the tcgen05 template an accumulator depth in tensor memory
and whether its launch asks for the oversized shared-memory carveout.
Hardware limits never appear here; they are in ``catalog/hardware``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, StrictBool, StrictInt, model_validator

from builder.catalog import BlockScaleModel, DTypesModel, LayoutCode
from builder.config import KernelConfig, Schedule
from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.pydantic_errors import load_models
from builder.yamlmodel import StrictPositiveInt, YamlModel


class Supports(YamlModel):
    dtypes: list[DTypesModel] = Field(min_length=1)
    layouts: list[LayoutCode] = Field(min_length=1)
    schedules: list[Schedule] = Field(min_length=1)
    cta_groups: list[StrictPositiveInt] = Field(default=[1], min_length=1)
    tile_m: dict[PositiveInt, list[StrictPositiveInt]] | None = Field(
        default=None, description="per CTA group, the CTA tile M values implemented (all legal ones if absent)")
    block_scales: list[BlockScaleModel] = Field(default=[], description="block-scaled operand formats implemented")
    b_rows_multiple: StrictPositiveInt | None = Field(
        default=None, description="B rows one CTA loads (tile N / cta_group) must be a multiple of this")
    swap_ab: StrictBool = Field(
        default=False, description="builds swap_ab kernels (C^T = B^T A^T, C stored M-major)")
    evict_first: StrictBool = Field(
        default=False, description="hints operand loads EVICT_FIRST in the L2 (evict_first)")


class Sm90Parameters(YamlModel):
    kind: Literal["wgmma"]
    producer_registers: dict[PositiveInt, StrictPositiveInt] = Field(
        description="the producer warpgroup's registers, per consumer warpgroup count; the consumers share the rest")
    epilogue_stages: StrictInt
    epilogue_tile_n: StrictInt
    static_smem_bytes: StrictInt
    max_stages: StrictInt
    max_consumer_warpgroups: StrictPositiveInt = Field(
        description="most cooperative consumer warpgroups; a tile gets as many as split its MMA row blocks evenly")
    pingpong_consumer_warpgroups: StrictPositiveInt = Field(description="consumer warpgroups of a ping-pong kernel")
    max_pingpong_row_blocks: StrictPositiveInt = Field(
        description="most warpgroup-MMA row blocks in a ping-pong tile (its epilogue walks one block at a time)")

    @model_validator(mode="after")
    def _every_consumer_count_has_a_split(self) -> Sm90Parameters:
        counts = set(range(1, self.max_consumer_warpgroups + 1)) | {self.pingpong_consumer_warpgroups}
        missing = sorted(counts - set(self.producer_registers))
        if missing:
            raise ValueError(f"producer_registers has no entry for {', '.join(map(str, missing))} consumer "
                             f"warpgroup(s); add one per count up to max_consumer_warpgroups")
        return self


class Tcgen05Parameters(YamlModel):
    kind: Literal["tcgen05"]
    threads: StrictPositiveInt = Field(description="threads per CTA (the template's warp roles)")
    acc_stages: StrictPositiveInt = Field(description="accumulator buffers in tensor memory")
    epilogue_stages: StrictPositiveInt
    epilogue_tile_n: StrictPositiveInt = Field(
        description="widest epilogue sub-tile N; halved until it divides tile N")
    epilogue_tile_m: StrictPositiveInt = Field(description="epilogue sub-tile rows (one TMEM lane per row)")
    static_smem_bytes: StrictInt
    max_stages: StrictPositiveInt
    oversized_smem_launch: StrictBool = Field(description="the generated launch requests the oversized carveout")


TemplateParameters = Annotated[Sm90Parameters | Tcgen05Parameters, Field(discriminator="kind")]


class TemplateManifest(YamlModel):
    template: str
    pipeline: str
    supports: Supports
    parameters: TemplateParameters


@dataclass(frozen=True)
class Template:
    name: str
    path: Path
    manifest: TemplateManifest
    manifest_file: str

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def unsupported(self, config: KernelConfig) -> tuple[str, str] | None:
        """(catalog field, why) if this template cannot build ``config``, else None."""
        s = self.manifest.supports
        d = config.dtypes
        if not any((x.a, x.b, x.acc, x.c) == (d.a, d.b, d.acc, d.c) for x in s.dtypes):
            offered = ", ".join(f"{x.a.value}/{x.b.value}/{x.acc.value}/{x.c.value}" for x in s.dtypes)
            return "dtypes", f"dtypes {'/'.join(d.tokens)} are not implemented (offered: {offered})"
        if config.layout.code not in s.layouts:
            return "layout", f"layout {config.layout.code} is not implemented (offered: {', '.join(s.layouts)})"
        if config.schedule not in s.schedules:
            return "schedule", (f"schedule {config.schedule.value} is not implemented "
                                f"(offered: {', '.join(x.value for x in s.schedules)})")
        if config.swap_ab and not s.swap_ab:
            return "swap_ab", "swap_ab kernels (C^T = B^T A^T) are not implemented"
        if config.evict_first and not s.evict_first:
            return "evict_first", "L2 eviction hints on the operand loads (evict_first) are not implemented"
        if config.cta_group not in s.cta_groups:
            return "cta_group", (f"cta_group {config.cta_group} is not implemented "
                                 f"(offered: {', '.join(map(str, s.cta_groups))})")
        if s.tile_m is not None and config.tile.m not in s.tile_m.get(config.cta_group, []):
            offered = ", ".join(map(str, s.tile_m.get(config.cta_group, []))) or "none"
            return "tile", f"tile M {config.tile.m} is not implemented with cta_group {config.cta_group} " \
                           f"(offered: {offered})"
        rows = config.tile.n // config.cta_group
        if s.b_rows_multiple is not None and (config.tile.n % config.cta_group or rows % s.b_rows_multiple):
            step = s.b_rows_multiple * config.cta_group
            return "tile", (f"tile N {config.tile.n} gives each CTA {config.tile.n / config.cta_group:g} rows of B, not "
                            f"a multiple of {s.b_rows_multiple} (use tile N a multiple of {step})")
        scale = config.block_scale
        if scale is not None and not any((x.scale, x.block) == (scale.scale, scale.block) for x in s.block_scales):
            offered = ", ".join(f"{x.scale.value}x{x.block}" for x in s.block_scales) or "none, dense only"
            return "block_scale", f"block_scale {scale.scale.value}x{scale.block} is not implemented " \
                                  f"(offered: {offered})"
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
    for _, display, doc, manifest in load_models(sorted(directory.glob("*.yaml")), display_root, TemplateManifest,
                                                 "TEMPLATE-MANIFEST", problems):
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
