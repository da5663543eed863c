"""Hardware facts: one reviewed YAML file per pipeline, one accessor.

``catalog/hardware/<pipeline>.yaml`` holds every fact a rule or template may
use, each with the source it was taken from. :func:`load_facts` validates the
files (unknown keys are errors) and :meth:`PipelineFacts.require` is the only
way rules read a value: a fact the pipeline does not declare raises
:class:`~builder.diagnostics.DiagnosticError` naming the pipeline and file,
so a new pipeline can never silently inherit another pipeline's number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import Field, StrictBool, StrictInt, model_validator

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.load.paths import display_path
from builder.load.pydantic_errors import load_models
from builder.load.yamlmodel import PipelineName, StrictPositiveInt, TargetName, YamlModel
from builder.load.yamlsrc import YamlDocument
from tilekiln.spec import DType

T = TypeVar("T")


class Fact(YamlModel, Generic[T]):
    value: T
    source: str = Field(min_length=3, description="where the value comes from (document, API, measurement)")

    @classmethod
    def model_parametrized_name(cls, params: tuple[Any, ...]) -> str:
        """``Fact[int]`` rather than ``Fact[Annotated[int, Strict(strict=True)]]``: the name is the
        title of the fact's type in the JSON Schema, which editors show."""
        return re.sub(r"Annotated\[(\w+), Strict\(strict=True\)\]", r"\1", super().model_parametrized_name(params))


class IntRange(YamlModel):
    min: StrictInt
    max: StrictInt
    step: StrictPositiveInt

    def __contains__(self, value: int) -> bool:
        return self.min <= value <= self.max and value % self.step == 0

    def __str__(self) -> str:
        return f"{self.min}..{self.max} step {self.step}"


ComputeCapability = tuple[StrictInt, StrictInt]


class DTypeCombo(YamlModel):
    """A dense MMA input/accumulator combination and the output types its epilogue may write."""

    a: DType
    b: DType
    acc: DType
    c: list[DType]
    only_on: list[ComputeCapability] | None = Field(
        default=None, description="the instruction exists only on these compute capabilities")


class BlockScaleCombo(YamlModel):
    """A block-scaled MMA kind: operand types, scale-factor type and block size (elements per scale)."""

    name: str
    a: DType
    b: DType
    scale: DType
    block: StrictInt
    acc: DType
    c: list[DType]
    only_on: list[ComputeCapability] | None = None


class Target(YamlModel):
    """A compile target: ``a`` targets run only on that exact compute capability,
    ``f`` targets on the same major with minor >= the target's; ``runs_on``
    lists the compute capabilities of the family a cubin may meet."""

    name: TargetName
    kind: Literal["a", "f"]
    compute_capability: ComputeCapability
    runs_on: list[ComputeCapability] = Field(min_length=1)
    source: str = Field(min_length=3)

    @model_validator(mode="after")
    def _runs_on_matches_kind(self) -> "Target":
        major, minor = self.compute_capability
        if self.kind == "a" and self.runs_on != [self.compute_capability]:
            raise ValueError(f"an 'a' target runs only on its own compute capability [{major}, {minor}]")
        if self.kind == "f" and (self.compute_capability not in self.runs_on or any(
                m != major or n < minor for m, n in self.runs_on)):
            raise ValueError(f"an 'f' target runs on compute capabilities [{major}, >= {minor}] "
                             "including its own")
        return self


class FactsBody(YamlModel):
    """Every fact any pipeline may declare; a pipeline leaves out what it lacks."""

    mma_instruction: Fact[Literal["wgmma", "tcgen05"]] | None = None
    mma_cta_groups: Fact[list[StrictInt]] | None = None
    threads_per_warpgroup: Fact[StrictInt] | None = None
    mma_m_per_warpgroup: Fact[StrictInt] | None = None
    mma_m_1cta: Fact[list[StrictInt]] | None = None
    mma_m_2cta: Fact[list[StrictInt]] | None = None
    mma_m_block_scaled_1cta: Fact[list[StrictInt]] | None = None
    mma_m_block_scaled_2cta: Fact[list[StrictInt]] | None = None
    mma_n: Fact[IntRange] | None = None
    mma_n_2cta: Fact[IntRange] | None = None
    mma_n_step_mn_major_8bit: Fact[dict[int, StrictInt]] | None = None
    mma_k_bytes: Fact[StrictInt] | None = None
    mma_target_kinds: Fact[list[Literal["a", "f"]]] | None = None
    cta_k_bytes_max: Fact[StrictInt] | None = None
    cta_k_bytes_fixed: Fact[StrictInt] | None = None
    smem_per_block_optin: Fact[StrictInt] | None = None
    smem_oversized_carveout: Fact[StrictInt] | None = None
    smem_descriptor_limit: Fact[StrictInt] | None = None
    smem_buffer_alignment: Fact[StrictInt] | None = None
    mbarrier_bytes: Fact[StrictInt] | None = None
    tmem_lanes: Fact[StrictInt] | None = None
    tmem_columns: Fact[StrictInt] | None = None
    tmem_exclusive_above: Fact[StrictInt] | None = None
    tmem_alloc_min_columns: Fact[StrictInt] | None = None
    max_cluster_size: Fact[StrictInt] | None = None
    max_cluster_size_nonportable: Fact[StrictInt] | None = None
    cluster_dims_power_of_two: Fact[StrictBool] | None = None
    cluster_launch_control: Fact[StrictBool] | None = None
    clc_response_bytes: Fact[StrictInt] | None = None
    tma_box_dim_max: Fact[StrictInt] | None = None
    tma_alignment_bytes: Fact[StrictInt] | None = None
    tma_cache_policy_evict_first: Fact[StrictInt] | None = None
    registers_per_sm: Fact[StrictInt] | None = None
    max_registers_per_thread: Fact[StrictInt] | None = None
    setmaxnreg: Fact[IntRange] | None = None
    dtype_combos: Fact[list[DTypeCombo]] | None = None
    mn_major_dtypes: Fact[list[DType]] | None = None
    block_scale_combos: Fact[list[BlockScaleCombo]] | None = None
    block_scale_atom_rows: Fact[StrictInt] | None = None
    block_scale_atom_k_blocks: Fact[StrictInt] | None = None


class FactsFile(YamlModel):
    pipeline: PipelineName
    description: str
    targets: list[Target] = Field(min_length=1)
    facts: FactsBody


FACT_NAMES = tuple(FactsBody.model_fields)


@dataclass(frozen=True)
class PipelineFacts:
    """The validated facts of one pipeline, read through :meth:`require`."""

    pipeline: str
    description: str
    targets: tuple[Target, ...]
    file: str
    _body: FactsBody
    _doc: YamlDocument

    def require(self, name: str) -> Any:
        """The value of fact ``name``; raises if this pipeline does not declare it."""
        if name not in FACT_NAMES:
            raise KeyError(f"{name!r} is not a fact name; known: {', '.join(FACT_NAMES)}")
        fact = getattr(self._body, name)
        if fact is None:
            raise DiagnosticError([Diagnostic(
                "FACT-MISSING",
                f"pipeline {self.pipeline} declares no fact {name!r}, and a rule needs it",
                self._doc.locate(("facts",)),
                f"add `{name}: {{value: ..., source: ...}}` to {self.file}; facts are never "
                "borrowed from another pipeline", facts={"pipeline": self.pipeline, "fact": name})])
        return fact.value

    def has(self, name: str) -> bool:
        return getattr(self._body, name) is not None

    def source(self, name: str) -> str:
        fact = getattr(self._body, name)
        return fact.source if fact is not None else ""

    def locate(self, name: str) -> Location:
        return self._doc.locate(("facts", name))

    def target(self, arch: str) -> Target:
        for t in self.targets:
            if t.name == arch:
                return t
        raise KeyError(arch)

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.targets)


@dataclass(frozen=True)
class FactTable:
    """All pipelines' facts; :meth:`pipeline` raises for an unknown pipeline."""

    pipelines: tuple[PipelineFacts, ...]

    def pipeline(self, name: str) -> PipelineFacts:
        for p in self.pipelines:
            if p.pipeline == name:
                return p
        raise UnknownPipeline(name, self.names)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.pipeline for p in self.pipelines)


class UnknownPipeline(KeyError):
    def __init__(self, name: str, known: tuple[str, ...]):
        self.name, self.known = name, known
        super().__init__(f"unknown pipeline {name!r}; known: {', '.join(known) or 'none'}")


def load_facts(hardware_dir: Path, root: Path | None = None) -> FactTable:
    """Load every ``*.yaml`` in ``hardware_dir``; all problems are reported together."""
    pipelines: list[PipelineFacts] = []
    problems: list[Diagnostic] = []
    for path, display, doc, model in load_models(sorted(hardware_dir.glob("*.yaml")), root, FactsFile,
                                                 "FACTS-SCHEMA", problems):
        if model.pipeline != path.stem:
            problems.append(Diagnostic(
                "FACTS-NAME", f"file declares pipeline {model.pipeline!r} but is named {path.name}",
                doc.locate(("pipeline",)), f"rename the file to {model.pipeline}.yaml or fix the field",
                facts={"pipeline": model.pipeline, "file_stem": path.stem}))
            continue
        pipelines.append(PipelineFacts(model.pipeline, model.description, tuple(model.targets),
                                       display, model.facts, doc))
    if problems:
        raise DiagnosticError(problems)
    if not pipelines:
        raise DiagnosticError([Diagnostic("FACTS-NONE", "no hardware fact files found",
                                          Location(display_path(hardware_dir, root)),
                                          "add catalog/hardware/<pipeline>.yaml")])
    return FactTable(tuple(pipelines))

