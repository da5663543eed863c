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

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveInt, StrictBool, TypeAdapter, create_model, model_validator

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.load.catalog import yaml_type
from builder.load.pydantic_errors import load_models
from builder.load.yamlmodel import (PipelineName, StrictCount, StrictPositiveInt, TemplateFileName,
                                    YamlModel)
from tilekiln.spec import FAMILY_NAMES, FieldSpec, KernelConfig, config_fields


def _support_fields() -> dict[str, tuple[object, object]]:
    """The ``supports`` keys the spec names (tilekiln/spec.py, FieldSpec.support): per field, the
    values a template builds (a field without a default must list them; one with a default builds
    the default unless it says otherwise), or a flag that allows a non-default value at all."""
    out = {}
    for f, s in config_fields():
        if s.support is None:
            continue
        key, kind = s.support
        if kind == "flag":
            out[key] = (StrictBool, Field(default=False, description=f"builds non-default {f.name}: {s.description}"))
        elif f.default is dataclasses.MISSING:
            out[key] = (list[yaml_type(s.codec)], Field(min_length=1, description=f"{f.name} values built"))
        else:
            default = [] if f.default is None else [_plain(f.name, s, f.default)]
            out[key] = (list[yaml_type(s.codec)], Field(default=default, description=f"{f.name} values built"))
    return out


def _plain(name: str, spec: FieldSpec, value: object) -> object:
    return TypeAdapter(yaml_type(spec.codec)).validate_python(spec.codec.plain(value), strict=False)


Supports = create_model(
    "Supports", __base__=YamlModel, __doc__="What a template builds, by kernel field (tilekiln/spec.py)",
    tile_m=(dict[PositiveInt, list[StrictPositiveInt]] | None, Field(
        default=None, description="per CTA group, the CTA tile M values implemented (all legal ones if absent)")),
    cluster_m=(list[StrictPositiveInt] | None, Field(
        default=None, description="cluster M values implemented (all legal ones if absent)")),
    b_rows_multiple=(StrictPositiveInt | None, Field(
        default=None, description="B rows one CTA loads (tile N / cta_group) must be a multiple of this")),
    **_support_fields())


class Sm90Parameters(YamlModel):
    kind: Literal["wgmma"]
    producer_registers: dict[PositiveInt, StrictPositiveInt] = Field(
        description="the producer warpgroup's registers, per consumer warpgroup count; the consumers share the rest")
    epilogue_stages: StrictPositiveInt
    epilogue_tile_n: StrictPositiveInt
    static_smem_bytes: StrictCount
    max_stages: StrictPositiveInt
    max_consumer_warpgroups: StrictPositiveInt = Field(
        description="most cooperative consumer warpgroups; a tile gets as many as split its MMA row blocks evenly")
    pingpong_consumer_warpgroups: StrictPositiveInt = Field(description="consumer warpgroups of a ping-pong kernel")
    max_pingpong_row_blocks: StrictPositiveInt = Field(
        description="most warpgroup-MMA row blocks in a ping-pong tile (its epilogue walks one block at a time)")
    programmatic_launch: StrictBool = Field(
        description="the generated launch allows programmatic stream serialization (PDL)")
    index_tables: StrictCount = Field(
        0, description="int32 tables in shared memory per entry of an index vector (a grouped kernel's group table)")

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
    static_smem_bytes: StrictCount
    max_stages: StrictPositiveInt
    oversized_smem_launch: StrictBool = Field(
        description="on a pipeline with smem_oversized_carveout, a kernel whose stages need more than the "
                    "opt-in limit is loaded with the oversized carveout")
    programmatic_launch: StrictBool = Field(
        description="the generated launch allows programmatic stream serialization (PDL)")
    scheduler_threads: StrictCount = Field(
        0, description="threads a scheduler: clc kernel adds for its scheduler warp (0: the template builds none)")
    clc_stages: StrictCount = Field(
        0, description="cluster-launch-control responses a scheduler: clc kernel buffers in shared memory")
    max_scale_blocks_per_mma: StrictPositiveInt | None = Field(
        None, description="block-scaled templates: the most scale blocks along K one MMA may read")
    index_tables: StrictCount = Field(
        0, description="int32 tables in shared memory per entry of an index vector (a grouped kernel's group table)")


TemplateParameters = Annotated[Sm90Parameters | Tcgen05Parameters, Field(discriminator="kind")]


class TemplateManifest(YamlModel):
    template: TemplateFileName
    pipelines: list[PipelineName] = Field(min_length=1, description="the pipelines it serves")
    families: list[Literal[FAMILY_NAMES]] = Field(min_length=1, description="the kernel families it implements")
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
        """The template and the shared macros under templates/common/ that every template may import."""
        digest = hashlib.sha256(self.path.read_bytes())
        for shared in sorted((self.path.parent / "common").glob("*.j2")):
            digest.update(shared.read_bytes())
        return digest.hexdigest()

    def unsupported(self, config: KernelConfig) -> tuple[str, str] | None:
        """(catalog field, why) if this template cannot build ``config``, else None."""
        s = self.manifest.supports
        for f, spec in config_fields():
            if spec.support is None:
                continue
            key, kind = spec.support
            value = getattr(config, f.name)
            if kind == "flag":
                if value != f.default and not getattr(s, key):
                    return f.name, f"{f.name} {spec.codec.describe(value)} is not implemented (only the default)"
                continue
            offered = [spec.codec.typed(TypeAdapter(yaml_type(spec.codec)).dump_python(v, mode="json"))
                       for v in getattr(s, key)]
            if not (value is None and f.default is None) and value not in offered:
                names = ", ".join(spec.codec.describe(v) for v in offered) or "none"
                return f.name, f"{f.name} {spec.codec.describe(value)} is not implemented (offered: {names})"
        if s.tile_m is not None and config.tile.m not in s.tile_m.get(config.cta_group, []):
            offered = ", ".join(map(str, s.tile_m.get(config.cta_group, []))) or "none"
            return "tile", f"tile M {config.tile.m} is not implemented with cta_group {config.cta_group} " \
                           f"(offered: {offered})"
        if s.cluster_m is not None and config.cluster.m not in s.cluster_m:
            offered = ", ".join(map(str, s.cluster_m))
            return "cluster", f"cluster M {config.cluster.m} is not implemented (offered: {offered})"
        rows = config.tile.n // config.cta_group
        if s.b_rows_multiple is not None and (config.tile.n % config.cta_group or rows % s.b_rows_multiple):
            step = s.b_rows_multiple * config.cta_group
            return "tile", (f"tile N {config.tile.n} gives each CTA {config.tile.n / config.cta_group:g} rows of B, not "
                            f"a multiple of {s.b_rows_multiple} (use tile N a multiple of {step})")
        return None


@dataclass(frozen=True)
class TemplateSet:
    templates: tuple[Template, ...]
    directory: Path

    def serving(self, pipeline: str, family: str, block_scaled: bool = False) -> tuple[Template, ...]:
        """The templates that implement ``family`` on ``pipeline``, for block-scaled operands or not (a
        template that lists ``block_scales`` builds only block-scaled kernels, one that lists none
        only the others: the block-scaled mainloop is a template of its own); the validator reports
        none or several (TEMPLATE-SUPPORT, TEMPLATE-AMBIGUOUS)."""
        return tuple(t for t in self.templates if pipeline in t.manifest.pipelines and family in t.manifest.families
                     and bool(t.manifest.supports.block_scales) == block_scaled)


def load_templates(directory: Path, display_root: Path | None = None) -> TemplateSet:
    found: list[Template] = []
    problems: list[Diagnostic] = []
    for _, display, doc, manifest in load_models(sorted(directory.glob("*.yaml")), display_root, TemplateManifest,
                                                 "TEMPLATE-MANIFEST", problems):
        path = directory / manifest.template
        if not path.is_file():
            problems.append(Diagnostic("TEMPLATE-MISSING", f"template file {manifest.template} does not exist",
                                       doc.locate(("template",)), "fix the name or add the template"))
            continue
        if not path.resolve().is_relative_to(directory.resolve()):
            problems.append(Diagnostic(
                "TEMPLATE-MANIFEST", f"template file {manifest.template} links to {path.resolve()}, outside "
                f"{directory.name}/", doc.locate(("template",)), "put the template itself in the directory, not a link"))
            continue
        found.append(Template(path.name.removesuffix(".py.j2"), path, manifest, display))
    if problems:
        raise DiagnosticError(problems)
    if not found:
        raise DiagnosticError([Diagnostic("TEMPLATE-NONE", "no template manifests found",
                                          Location(str(directory)), "add templates/<name>.yaml")])
    return TemplateSet(tuple(found), directory)
