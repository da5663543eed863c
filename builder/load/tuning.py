"""The measured selection tables kept in ``catalog/tuning/<bundle>/<device>.json``, one per SKU.

``python3 -m tilekiln.tune`` measures a bundle on a GPU machine and writes
the bundle's tuning file (tilekiln/tuning/table.py); its ``--table-out`` file
is what is committed here: ``{device, compute_capability, sm_count,
memory_mib, table, measurements}`` and optionally ``model``, the card it was
measured on stated as the driver described it (what finds the nearest SKU's
table for a device without its own: tilekiln/tuning/sku.py). The file's name
is free (``h200.json``, ``h100-sxm.json``); two files of one bundle may not
name one device. Every later build ships the bundle's tables as the
manifest's ``tuning_tables`` (builder/package/manifest.py), and validation
treats the kernels they name as selectable (rule SHADOWED). Table values are
choice labels: a kernel id, or ``<id>/splitk<S>`` (tilekiln/splitk.py).

Every string of the file reaches a bundle's manifest and ``tilekiln inspect``,
so each has a grammar: the device name, the shape buckets of
tilekiln/select.py, the canonical labels and the model's parameter names. A
malformed file (or a table left at the old single-file place,
``catalog/tuning/<bundle>.json``) is a located TUNING-FILE diagnostic of
``validate`` and of the build, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.load.jsonsrc import load_json
from builder.load.paths import display_path
from builder.load.pydantic_errors import diagnostics_from_validation
from tilekiln.model import PARAMETERS
from tilekiln.spec import DTYPES, LAYOUT_CODES, KernelIdError, parse_kernel_id
from tilekiln.splitk import SPLITS, label, parse_label

RULE = "TUNING-FILE"

_DTYPE = "(?:" + "|".join(sorted(DTYPES)) + ")"
_EXTENT = "[1-9][0-9]{0,9}"
# tilekiln/select.py, shape_bucket: "bf16/bf16->bf16:tn:4096x4096x4096:1".
Bucket = Annotated[str, Field(pattern=rf"^{_DTYPE}/{_DTYPE}->{_DTYPE}:(?:{'|'.join(LAYOUT_CODES)}):"
                                      rf"{_EXTENT}x{_EXTENT}x{_EXTENT}:{_EXTENT}$")]
# The GPU's name as the driver gives it, e.g. "NVIDIA H100 80GB HBM3".
Device = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()-]{0,79}$")]
Milliseconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# A fitted parameter of the selection model (tilekiln/model.py), e.g. "macs_per_element".
ParameterName = Literal[PARAMETERS]


def _choice(text: str) -> str:
    kernel_id, split = parse_label(text)
    try:
        parse_kernel_id(kernel_id)
    except KernelIdError as exc:
        raise ValueError(f"{exc}; write a kernel id of the bundle, or <id>/splitk<S>") from None
    if label(kernel_id, split) != text or (split > 1 and split not in SPLITS):
        raise ValueError(f"{text!r} is not a choice label; write <kernel id> or <kernel id>/splitk<S> with S one "
                         f"of {', '.join(map(str, SPLITS))}")
    return text


Choice = Annotated[str, AfterValidator(_choice)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Measurement(_Record):
    """What decided one bucket (tilekiln/tuning/policy.py and merge.py write it)."""

    candidates: dict[Choice, Milliseconds] = Field(min_length=1)
    flops: int = Field(gt=0)
    shape: tuple[int, int, int]
    tflops: float = Field(ge=0, allow_inf_nan=False)
    baseline_ms: Milliseconds | None = None
    runs: int | None = Field(default=None, ge=1)
    screen: dict[Choice, Milliseconds] | None = None
    # The choices the screen cut: each one's probe over the fastest probe (tilekiln/tuning/policy.py).
    cut: dict[Choice, Annotated[float, Field(ge=1, allow_inf_nan=False)]] | None = None
    samples: dict[Choice, list[tuple[Milliseconds, Milliseconds]]] | None = None


class TuningFile(_Record):
    """One SKU's table: the card it was measured on (as tilekiln.manifest.Sku), what it chose,
    the times that decided it, and the selector model's parameters fitted on it."""

    device: Device
    compute_capability: tuple[Annotated[int, Field(ge=1, le=99)], Annotated[int, Field(ge=0, le=9)]]
    sm_count: int = Field(ge=1, le=4096)
    memory_mib: int = Field(ge=1, le=1 << 30)
    table: dict[Bucket, Choice]
    measurements: dict[Bucket, Measurement] = {}
    model: dict[ParameterName, Annotated[float, Field(allow_inf_nan=False)]] = {}


def tuning_dir(root: Path) -> Path:
    return root / "catalog" / "tuning"


def read_tuning(root: Path, bundle: str) -> list[dict]:
    """The committed tables of ``bundle``, one per file of ``catalog/tuning/<bundle>/`` in file
    name order (JSON data that :class:`TuningFile` accepts); every problem of every file raises
    one :class:`DiagnosticError` (TUNING-FILE)."""
    tables: list[dict] = []
    problems: list[Diagnostic] = []
    named: dict[str, str] = {}  # device -> the file that states it
    old = tuning_dir(root) / f"{bundle}.json"
    if old.exists():
        display = display_path(old, root)
        problems.append(Diagnostic(
            RULE, f"{display} is a tuning table at the single-table place, which builds no longer read",
            Location(display), f"move it to {display_path(tuning_dir(root) / bundle, root)}/<device>.json "
            "(git mv), one file per SKU", facts={"bundle": bundle}))
    for path in sorted((tuning_dir(root) / bundle).glob("*.json")):
        display = display_path(path, root)
        try:
            doc = load_json(path, display, RULE)
            # As JSON: strict mode takes a JSON array for a tuple, but not a Python list.
            TuningFile.model_validate_json(json.dumps(doc.data))
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
            continue
        except ValidationError as exc:
            problems.extend(diagnostics_from_validation(exc, doc, RULE, TuningFile))
            continue
        device = doc.data["device"]
        if device in named:
            problems.append(Diagnostic(
                RULE, f"a second table of {device!r} (the first is {named[device]})", doc.locate(("device",)),
                "keep one table per device: merge the runs (tilekiln tune --merge) and delete the other file",
                facts={"device": device, "first": named[device]}))
            continue
        named[device] = display
        tables.append(doc.data)
    if problems:
        raise DiagnosticError(problems)
    return tables


def tuned_kernel_ids(root: Path) -> tuple[frozenset[str], list[Diagnostic]]:
    """Every kernel id the committed tuning tables name, and the diagnostics of the bundles with
    a malformed table (whose ids are left out), each bundle's tables read as a build reads them."""
    ids: set[str] = set()
    problems: list[Diagnostic] = []
    bundles = {p.stem if p.is_file() else p.name for p in tuning_dir(root).glob("*")
               if p.is_dir() or p.suffix == ".json"}
    for bundle in sorted(bundles):
        try:
            tables = read_tuning(root, bundle)
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
            continue
        ids.update(parse_label(choice)[0] for data in tables for choice in data["table"].values())
    return frozenset(ids), problems
