"""The kernel catalog: YAML files of tile configs, expanded into entries.

``catalog/gemm/<pipeline>.yaml`` lists kernels. Each item under ``kernels``
gives fields directly or lists values under ``sweep`` (the cartesian product
of the listed values is taken); ``defaults`` fills what an item leaves out.
Every expanded :class:`CatalogEntry` remembers the YAML path each of its
fields came from, so a rule can point at the exact line of the value it
rejects. ``catalog/catalog.yaml`` holds the bundle version, glibc target and size budget.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Mapping

from pydantic import AfterValidator, Field, StrictBool, TypeAdapter, create_model, field_validator

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.load.paths import display_path
from builder.load.pydantic_errors import load_model, load_models
from builder.load.yamlmodel import PipelineName, StrictPositiveInt, TargetName, YamlModel
from builder.load.yamlsrc import YamlDocument, YamlPath
from tilekiln.spec import (
    FAMILY_NAMES,
    LAYOUT_CODES,
    Codec,
    DType,
    EnumCodec,
    KernelConfig,
    Operand,
    config_fields,
    format_kernel_id,
)


class DTypesModel(YamlModel):
    a: DType
    b: DType
    acc: DType
    c: DType


class BlockScaleModel(YamlModel):
    scale: DType = Field(description="scale-factor type, e.g. e4m3 (nvfp4) or e8m0 (mx formats)")
    block: StrictPositiveInt = Field(description="K elements sharing one scale factor, e.g. 16 or 32")


LayoutCode = Literal[LAYOUT_CODES]


def _distinct(operands: list[Operand]) -> list[Operand]:
    twice = sorted({o.value for o in operands if operands.count(o) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(twice)} more than once; name each operand once")
    return operands


# The YAML type of each value shape of tilekiln/spec.py (enumerations are their own types).
YAML_TYPES: dict[str, object] = {
    "family": Literal[FAMILY_NAMES],
    "dtypes": DTypesModel,
    "layout": LayoutCode,
    "positive_ints3": tuple[StrictPositiveInt, StrictPositiveInt, StrictPositiveInt],
    "positive_ints2": tuple[StrictPositiveInt, StrictPositiveInt],
    "positive_int": StrictPositiveInt,
    "bool": StrictBool,
    "block_scale": BlockScaleModel,
    "operands": Annotated[list[Operand], AfterValidator(_distinct), Field(json_schema_extra={"uniqueItems": True})],
    "stages": StrictPositiveInt | Literal["auto"],
}


def yaml_type(codec: Codec) -> object:
    """What a catalog file may write for a field of this codec."""
    return codec.enum if isinstance(codec, EnumCodec) else YAML_TYPES[codec.shape]


# Every kernel field but the pipeline, which the catalog file names for all its kernels.
KERNEL_FIELDS = tuple((f, s) for f, s in config_fields() if f.name != "pipeline")
REQUIRED_FIELDS = tuple(f.name for f, _ in KERNEL_FIELDS if f.default is dataclasses.MISSING)
_PLAIN = {f.name: TypeAdapter(yaml_type(s.codec)) for f, s in KERNEL_FIELDS}

KernelFields = create_model(
    "KernelFields", __base__=YamlModel, __doc__="A kernel's fields (tilekiln/spec.py, KernelConfig)",
    **{f.name: (yaml_type(s.codec) | None, Field(default=None, description=s.description)) for f, s in KERNEL_FIELDS})
SweepFields = create_model(
    "SweepFields", __base__=YamlModel, __doc__="Lists of values whose cartesian product is taken",
    **{f.name: (list[yaml_type(s.codec)] | None, Field(default=None, min_length=1)) for f, s in KERNEL_FIELDS})


class KernelItem(KernelFields):
    sweep: SweepFields | None = None
    targets: list[TargetName] | None = Field(default=None, min_length=1, description="override the file's targets")


class CatalogFile(YamlModel):
    pipeline: PipelineName
    targets: list[TargetName] = Field(min_length=1, description="compile targets, e.g. [sm_90a]")
    defaults: KernelFields = KernelFields()
    kernels: list[KernelItem] = Field(min_length=1)


class CatalogSettings(YamlModel):
    # ASCII digits only: `\d` (Python's re and pydantic's regex alike) and
    # str.isdigit also match full-width and Arabic-Indic digits, which int()
    # and float() then read as if they were ASCII. Bounded lengths: the version
    # names wheel files (tilekiln_kernels_sm90a-<version>-...whl).
    version: str = Field(pattern=r"^[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,6}$", description="semantic version of built bundles")
    wheel_size_limit: str = Field(default="100MB", pattern=r"^[0-9]{1,6}(\.[0-9]{1,6})? ?(B|KB|MB|GB)$")
    glibc: str = Field(pattern=r"^2\.[0-9]{1,3}$", description="oldest glibc the bundles run on, quoted: '2.28'; "
                       "the library is linked for it and its wheel tagged manylinux_2_28")

    @field_validator("version")
    @classmethod
    def _no_leading_zeros(cls, v: str) -> str:
        if any(len(p) > 1 and p.startswith("0") for p in v.split(".")):
            raise ValueError("version parts must not have leading zeros")
        return v

    @property
    def wheel_size_limit_bytes(self) -> int:
        return parse_size(self.wheel_size_limit)

    @property
    def glibc_version(self) -> tuple[int, int]:
        major, minor = self.glibc.split(".")
        return int(major), int(minor)


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KB|MB|GB)\s*", text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 100MB")
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[match.group(2)]
    return int(float(match.group(1)) * scale)


@dataclass(frozen=True)
class CatalogEntry:
    """One expanded kernel with the YAML paths its fields came from."""

    config: KernelConfig
    targets: tuple[str, ...]
    file: str
    item: int
    field_paths: Mapping[str, YamlPath]
    doc: YamlDocument

    @property
    def kernel_id(self) -> str:
        return format_kernel_id(self.config)

    def locate(self, field: str | None = None) -> Location:
        """Location of ``field``'s value (or of the whole item)."""
        path = self.field_paths.get(field) if field else None
        return self.doc.locate(path if path is not None else ("kernels", self.item))


@dataclass(frozen=True)
class Catalog:
    settings: CatalogSettings
    entries: tuple[CatalogEntry, ...]
    files: tuple[str, ...]

    def for_target(self, arch: str) -> tuple[CatalogEntry, ...]:
        return tuple(e for e in self.entries if arch in e.targets)

    @property
    def targets(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for e in self.entries:
            for t in e.targets:
                seen.setdefault(t)
        return tuple(seen)


def load_catalog(catalog_dir: Path, root: Path | None = None, files: list[Path] | None = None) -> Catalog:
    """Load ``catalog.yaml`` and every ``gemm/*.yaml`` (or just ``files``).

    All schema problems of all files are collected before raising.
    """
    problems: list[Diagnostic] = []
    settings = _load_settings(catalog_dir / "catalog.yaml", root, problems)
    paths = files if files is not None else sorted((catalog_dir / "gemm").glob("*.yaml"))
    entries: list[CatalogEntry] = []
    shown = [display_path(path, root) for path in paths]
    for _, _, doc, model in load_models(paths, root, CatalogFile, "CATALOG-SCHEMA", problems):
        entries.extend(_expand(model, doc, problems))
    if problems:
        raise DiagnosticError(problems)
    return Catalog(settings or CatalogSettings(version="0.0.0"), tuple(entries), tuple(shown))


def load_settings(path: Path, root: Path | None = None) -> CatalogSettings:
    """``catalog/catalog.yaml`` alone (bundle version, wheel size limit); raises ``DiagnosticError``."""
    problems: list[Diagnostic] = []
    settings = _load_settings(path, root, problems)
    if settings is None:
        raise DiagnosticError(problems)
    return settings


def _load_settings(path: Path, root: Path | None, problems: list) -> CatalogSettings | None:
    if not path.exists():
        problems.append(Diagnostic("CATALOG-SETTINGS", "catalog.yaml is missing", Location(display_path(path, root)),
                                   "create it with `version: 0.1.0` (the bundle version)"))
        return None
    try:
        return load_model(path, display_path(path, root), CatalogSettings, "CATALOG-SCHEMA")[1]
    except DiagnosticError as exc:
        problems.extend(exc.diagnostics)
    return None


def _expand(model: CatalogFile, doc: YamlDocument, problems: list) -> list[CatalogEntry]:
    out: list[CatalogEntry] = []
    for i, item in enumerate(model.kernels):
        base: dict[str, tuple[object, YamlPath]] = {}
        for name in (f.name for f, _ in KERNEL_FIELDS):
            if getattr(model.defaults, name) is not None:
                base[name] = (getattr(model.defaults, name), ("defaults", name))
            if getattr(item, name) is not None:
                base[name] = (getattr(item, name), ("kernels", i, name))
        sweep_axes = []
        if item.sweep is not None:
            for name in (f.name for f, _ in KERNEL_FIELDS):
                values = getattr(item.sweep, name)
                if values is None:
                    continue
                if getattr(item, name) is not None:
                    problems.append(Diagnostic(
                        "CATALOG-SWEEP", f"{name!r} is given both directly and under sweep",
                        doc.locate(("kernels", i, "sweep", name)), "keep one of the two", facts={"field": name}))
                sweep_axes.append([(name, v, ("kernels", i, "sweep", name, j)) for j, v in enumerate(values)])
        targets = tuple(item.targets or model.targets)
        for combo in itertools.product(*sweep_axes) if sweep_axes else [()]:
            fields = dict(base)
            for name, value, path in combo:
                fields[name] = (value, path)
            missing = [f for f in REQUIRED_FIELDS if f not in fields]
            if missing:
                problems.append(Diagnostic(
                    "CATALOG-INCOMPLETE", f"kernel is missing {', '.join(missing)}",
                    doc.locate(("kernels", i)), "give the fields in the item, its sweep, or defaults",
                    facts={"missing": missing}))
                break
            out.append(CatalogEntry(_make_config(model.pipeline, fields), targets, doc.file, i,
                                    {k: v[1] for k, v in fields.items()} | {"targets": ("kernels", i, "targets")
                                    if item.targets else ("targets",), "pipeline": ("pipeline",)}, doc))
    return out


def _make_config(pipeline: str, fields: dict[str, tuple[object, YamlPath]]) -> KernelConfig:
    """The config of validated YAML values: each is spelled plain, then typed by its codec."""
    specs = {f.name: spec for f, spec in KERNEL_FIELDS}
    return KernelConfig(pipeline=pipeline, **{
        name: specs[name].codec.typed(_PLAIN[name].dump_python(value, mode="json"))
        for name, (value, _) in fields.items()})
