"""The hardware verification records kept in ``catalog/verification/<bundle>.json``.

``python3 -m tilekiln.verify BUNDLE --out catalog/verification/<bundle>.json``
writes them on a GPU machine (tilekiln/verify.py): one record per card model
(SKU), with the sha256 of every kernel's cubin that passed there. Every later
build marks a kernel ``hardware-verified`` on the SKUs whose record holds its
cubin's exact sha256 (builder/package/manifest.py); a kernel whose code has changed
since, or that never ran, is ``compile-verified``. Nothing here trusts a kernel
by its id alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from builder.diagnostics import Diagnostic, DiagnosticError
from builder.load.jsonsrc import load_json
from builder.load.paths import display_path
from builder.load.pydantic_errors import diagnostics_from_validation
from tilekiln.spec import KernelIdError, Verified, parse_kernel_id

RULE = "VERIFICATION-FILE"
SHA256 = r"^[0-9a-f]{64}$"
# Printable ASCII: a device, driver or torch version as their tools spell it.
Text = Annotated[str, Field(pattern=r"^[ -~]{1,100}$")]


def _kernel_id(text: str) -> str:
    try:
        parse_kernel_id(text)
    except KernelIdError as exc:
        raise ValueError(f"{exc}; name kernels by their ids, as tilekiln verify writes them") from None
    return text


KernelId = Annotated[str, AfterValidator(_kernel_id)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class KernelCheck(_Record):
    cubin_sha256: str = Field(pattern=SHA256)
    max_rel_error: float = Field(ge=0)
    runs: int = Field(ge=1)


class HardwareRecord(_Record):
    sku: str = Field(pattern=r"^[A-Za-z0-9 ._()-]{1,80}$")
    device: Text
    compute_capability: tuple[int, int]
    driver: Text
    torch: Text
    date: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
    seed: int
    bundle_version: Text
    kernels: dict[KernelId, KernelCheck]
    failed: list[KernelId]


class VerificationFile(_Record):
    schema_: Literal[1] = Field(alias="schema")
    bundle: str = Field(pattern=r"^sm[1-9][0-9]{1,3}[af]?$")
    records: list[HardwareRecord]

    def verified_on(self, kernel_id: str, cubin_sha256: str) -> tuple[Verified, ...]:
        """The records (SKU, date, driver, largest error) that ran exactly this cubin and passed."""
        return tuple(Verified(r.sku, r.date, r.driver, r.kernels[kernel_id].max_rel_error) for r in self.records
                     if kernel_id in r.kernels and r.kernels[kernel_id].cubin_sha256 == cubin_sha256)


def verification_dir(root: Path) -> Path:
    return root / "catalog" / "verification"


def read_verification(root: Path, bundle: str) -> VerificationFile | None:
    """The committed records of ``bundle``, or None if it has none; a malformed file raises
    :class:`DiagnosticError` (VERIFICATION-FILE) naming it."""
    path = verification_dir(root) / f"{bundle}.json"
    if not path.exists():
        return None
    label = display_path(path, root)
    doc = load_json(path, label, RULE)
    try:
        # As JSON: strict mode takes a JSON array for a tuple, but not a Python list.
        data = VerificationFile.model_validate_json(json.dumps(doc.data))
    except ValidationError as exc:
        raise DiagnosticError(diagnostics_from_validation(exc, doc, RULE, VerificationFile)) from None
    if data.bundle != bundle:
        raise DiagnosticError([Diagnostic(
            RULE, f"holds records of bundle {data.bundle!r}, not {bundle!r}", doc.locate(("bundle",)),
            f"name it catalog/verification/{data.bundle}.json")])
    return data


def check_verification_files(root: Path) -> list[Diagnostic]:
    """Every committed verification file, read as a build would read it."""
    problems = []
    for path in sorted(verification_dir(root).glob("*.json")):
        try:
            read_verification(root, path.stem)
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
    return problems
