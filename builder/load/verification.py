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

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from tilekiln.spec import Verified

SHA256 = r"^[0-9a-f]{64}$"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class KernelCheck(_Record):
    cubin_sha256: str = Field(pattern=SHA256)
    max_rel_error: float = Field(ge=0)
    runs: int = Field(ge=1)


class HardwareRecord(_Record):
    sku: str = Field(min_length=1, pattern=r"^[A-Za-z0-9 ._()-]+$")
    device: str
    compute_capability: tuple[int, int]
    driver: str
    torch: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    seed: int
    bundle_version: str
    kernels: dict[str, KernelCheck]
    failed: list[str]


class VerificationFile(_Record):
    schema_: Literal[1] = Field(alias="schema")
    bundle: str
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
    label = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    try:
        data = VerificationFile.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        problem = (f"{len(exc.errors())} fields are malformed, first {'.'.join(map(str, exc.errors()[0]['loc']))}: "
                   f"{exc.errors()[0]['msg']}" if isinstance(exc, ValidationError) else str(exc))
        raise DiagnosticError([Diagnostic(
            "VERIFICATION-FILE", f"not a verification file: {problem}", Location(label),
            "regenerate it on the GPU machine with `python3 -m tilekiln.verify BUNDLE --out " + label + "`")]) from None
    if data.bundle != bundle:
        raise DiagnosticError([Diagnostic(
            "VERIFICATION-FILE", f"holds records of bundle {data.bundle!r}, not {bundle!r}", Location(label),
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
