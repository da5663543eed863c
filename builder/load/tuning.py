"""The measured selection tables kept in ``catalog/tuning/<bundle>.json``.

``python3 -m tilekiln.tune`` measures a bundle on a GPU machine and writes
the bundle's tuning file (tilekiln/tuning/table.py); its ``--table-out`` file,
``{device, table, measurements}``, is what is committed here. Every later
build ships the committed table as the manifest's ``tuning`` key
(builder/package/manifest.py), and validation treats the kernels it names as
selectable (rule SHADOWED). Table values are choice labels: a kernel id, or
``<id>/splitk<S>`` (tilekiln/splitk.py).

Every string of the file reaches a bundle's manifest and ``tilekiln inspect``,
so each has a grammar: the device name, the shape buckets of
tilekiln/select.py and the canonical labels. A malformed file is a located
TUNING-FILE diagnostic of ``validate`` and of the build, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from builder.diagnostics import Diagnostic, DiagnosticError
from builder.load.jsonsrc import load_json
from builder.load.paths import display_path
from builder.load.pydantic_errors import diagnostics_from_validation
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
    samples: dict[Choice, list[tuple[Milliseconds, Milliseconds]]] | None = None


class TuningFile(_Record):
    device: Device
    table: dict[Bucket, Choice]
    measurements: dict[Bucket, Measurement] = {}


def tuning_dir(root: Path) -> Path:
    return root / "catalog" / "tuning"


def read_tuning(root: Path, bundle: str) -> dict | None:
    """The committed tuning data of ``bundle`` (JSON data that :class:`TuningFile` accepts), or
    None if it has none; a malformed file raises :class:`DiagnosticError` (TUNING-FILE)."""
    path = tuning_dir(root) / f"{bundle}.json"
    if not path.exists():
        return None
    doc = load_json(path, display_path(path, root), RULE)
    try:
        # As JSON: strict mode takes a JSON array for a tuple, but not a Python list.
        TuningFile.model_validate_json(json.dumps(doc.data))
    except ValidationError as exc:
        raise DiagnosticError(diagnostics_from_validation(exc, doc, RULE, TuningFile)) from None
    return doc.data


def tuned_kernel_ids(root: Path) -> tuple[frozenset[str], list[Diagnostic]]:
    """Every kernel id the committed tuning tables name, and the diagnostics of those that are
    malformed (whose ids are left out), each file read as a build reads it."""
    ids: set[str] = set()
    problems: list[Diagnostic] = []
    for path in sorted(tuning_dir(root).glob("*.json")):
        try:
            data = read_tuning(root, path.stem)
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
            continue
        ids.update(parse_label(choice)[0] for choice in data["table"].values())
    return frozenset(ids), problems
