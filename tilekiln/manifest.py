"""Read and verify a bundle's ``manifest.json`` (format: docs/bundle-format.md).

Verification happens before the library is opened: the manifest's own digest
(``integrity.manifest_sha256``, over its canonical JSON without that field),
the schema's major version, the runtime ABI version, and the sha256 of every
listed file. Any mismatch raises :class:`BundleIntegrityError` or
:class:`BundleCompatibilityError`; nothing is loaded. The builder writes the
digest with :func:`manifest_digest`, so there is one definition of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tilekiln.errors import BundleCompatibilityError, BundleIntegrityError

MANIFEST_NAME = "manifest.json"
SUPPORTED_SCHEMA_MAJOR = 1
# The tk_* C API and the tk_plan_t/tk_call_t blocks of templates/link/glue.c.j2, which
# _native.PLAN and _native.CALL pack; the builder stamps it into the library and the manifest.
# 2: scale_a/scale_b added to tk_args_t. 3: tk_launch(index, tk_args_t) split into
# tk_run(tk_plan_t, tk_call_t), so the static half is packed once per plan.
ABI_VERSION = 4


@dataclass(frozen=True)
class Contract:
    base_alignment: int
    stride_divisibility: tuple[int, int, int]  # elements, for A, B, C
    max_extent: int


@dataclass(frozen=True)
class KernelInfo:
    index: int
    id: str
    dtypes: tuple[str, str, str, str]  # a, b, acc, c
    a_major: str  # "k" or "m"
    b_major: str  # "k" or "n"
    tile: tuple[int, int, int]  # the MMA's M x N x K: along the problem's N x M x K when swap_ab
    cluster: tuple[int, int]  # in the MMA's terms, like tile
    schedule: str
    stages: int
    contract: Contract
    registers: int
    smem_bytes: int
    cubin_bytes: int
    verification: str
    threads: int  # per CTA, as the kernel launches
    dynamic_smem_bytes: int  # per CTA, as the kernel launches
    swap_ab: bool = False  # the kernel computes C^T = B^T A^T (its arguments stay the problem's)
    raster: str = "m"  # the order CTAs walk the output tiles: along M ("m") or N ("n")
    swizzle: int = 1  # output tiles per band of that walk
    verified_on: tuple[str, ...] = ()  # card models (SKUs) on which exactly this cubin passed `tilekiln verify`

    @property
    def cluster_size(self) -> int:
        return self.cluster[0] * self.cluster[1]

    @property
    def verification_label(self) -> str:
        """``hardware-verified on H100 80GB HBM3, H200``, or ``compile-verified`` for code never run on a GPU."""
        return f"hardware-verified on {', '.join(self.verified_on)}" if self.verified_on else "compile-verified"


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    arch: str
    arch_kind: str
    compute_capability: tuple[int, int]
    abi_version: int
    library: str
    kernels: tuple[KernelInfo, ...]
    files: tuple[tuple[str, str], ...]
    tuning: tuple[tuple[str, str], ...]  # (shape bucket, choice label), measured by `tilekiln tune`
    raw: dict

    @property
    def driver_requires(self) -> dict | None:
        """``{"cuda_version": 13000, "linux_driver": "580.65.06"}``; None before schema 1.3."""
        return self.raw.get("bundle", {}).get("driver_requires")

    def kernel(self, kernel_id: str) -> KernelInfo:
        for k in self.kernels:
            if k.id == kernel_id:
                return k
        raise KeyError(kernel_id)


def canonical_json(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def manifest_digest(data: dict) -> str:
    """sha256 of the manifest without its ``integrity`` field."""
    body = {k: v for k, v in data.items() if k != "integrity"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def read_manifest(directory: Path, verify: bool = True) -> Manifest:
    """The manifest of the bundle in ``directory``; with ``verify``, every file is checked first."""
    label = directory.name
    try:
        raw = (directory / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        raise BundleIntegrityError(label, MANIFEST_NAME, "missing") from None
    except OSError as exc:
        raise BundleIntegrityError(label, MANIFEST_NAME, f"unreadable ({exc.strerror})") from None
    manifest = parse_manifest(raw, label, verify)
    if verify:
        verify_files(manifest, lambda relative: (directory / relative).read_bytes())
    return manifest


def parse_manifest(raw: bytes, label: str, verify: bool = True) -> Manifest:
    """Parse manifest bytes: versions first (so a newer format is named as such), then the digest."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise BundleIntegrityError(label, MANIFEST_NAME, f"not valid JSON ({exc})") from None
    _check_versions(label, data)
    if verify:
        integrity = data.get("integrity")
        recorded = integrity.get("manifest_sha256") if isinstance(integrity, dict) else None
        if recorded != manifest_digest(data):
            raise BundleIntegrityError(label, MANIFEST_NAME, "content does not match its recorded sha256")
    try:
        return _parse(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleIntegrityError(label, MANIFEST_NAME, f"malformed ({type(exc).__name__}: {exc})") from None


def _check_versions(label: str, data: dict) -> None:
    schema = str(data.get("schema_version", ""))
    major = schema.split(".")[0]
    if not major.isdigit():
        raise BundleIntegrityError(label, MANIFEST_NAME, f"schema_version {schema!r} is not a version")
    if int(major) != SUPPORTED_SCHEMA_MAJOR:
        raise BundleCompatibilityError(
            f"bundle {label}: manifest schema version {schema} is not supported by this tilekiln runtime, "
            f"which reads schema {SUPPORTED_SCHEMA_MAJOR}.x; install a tilekiln runtime that matches the bundle")
    bundle = data.get("bundle")
    abi = bundle.get("abi_version") if isinstance(bundle, dict) else None
    if abi != ABI_VERSION:
        raise BundleCompatibilityError(
            f"bundle {label}: library ABI version {abi} differs from this runtime's ABI {ABI_VERSION}; "
            "install matching tilekiln and bundle versions")


def verify_files(manifest: Manifest, read: Callable[[str], bytes]) -> None:
    """Check the sha256 of every listed file; ``read(relative)`` returns a file's bytes.

    Raises :class:`BundleIntegrityError` naming the first missing, unreadable,
    modified or truncated file.
    """
    for relative, digest in manifest.files:
        try:
            data = read(relative)
        except (FileNotFoundError, KeyError):
            raise BundleIntegrityError(manifest.name, relative, "missing") from None
        except OSError as exc:
            raise BundleIntegrityError(manifest.name, relative, f"unreadable ({exc.strerror})") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise BundleIntegrityError(manifest.name, relative,
                                       f"sha256 mismatch ({len(data)} bytes; modified or truncated)")


def _parse(data: dict) -> Manifest:
    b = data["bundle"]
    kernels = []
    for k in data["kernels"]:
        c = k["contract"]
        sd = c["stride_divisibility"]
        kernels.append(KernelInfo(
            index=int(k["index"]), id=k["id"],
            dtypes=(k["dtypes"]["a"], k["dtypes"]["b"], k["dtypes"]["acc"], k["dtypes"]["c"]),
            a_major=k["layout"]["a"], b_major=k["layout"]["b"],
            tile=tuple(k["tile"]), cluster=tuple(k["cluster"]), schedule=k["schedule"], stages=int(k["stages"]),
            contract=Contract(int(c["base_alignment_bytes"]), (int(sd["a"]), int(sd["b"]), int(sd["c"])),
                              int(c["max_extent"])),
            registers=int(k["resources"]["registers"]), smem_bytes=int(k["resources"]["smem_bytes"]),
            cubin_bytes=int(k["cubin"]["bytes"]), verification=k["verification"],
            threads=int(k["threads"]),
            dynamic_smem_bytes=int(k["resources"]["smem_bytes"]) - int(k["resources"]["static_smem_bytes"]),
            # Schema 1.1; a 1.0 manifest has no swapped kernels.
            swap_ab=bool(k.get("swap_ab", False)),
            raster=str(k.get("raster", "m")), swizzle=int(k.get("swizzle", 1)),
            # Schema 1.3; earlier manifests verified nothing on hardware.
            verified_on=tuple(str(v["sku"]) for v in k.get("verified_on", [])),
        ))
    files = data["files"]
    for relative in files:
        if relative.startswith("/") or ".." in relative.split("/"):
            raise ValueError(f"file {relative!r} lies outside the bundle directory")
    if data["library"] not in files:
        raise ValueError(f"library {data['library']} is not among the hashed files")
    tuning = tuple((str(bucket), str(kid)) for bucket, kid in sorted(data.get("tuning", {}).get("table", {}).items()))
    return Manifest(
        name=b["name"], version=b["version"], arch=b["arch"], arch_kind=b["arch_kind"],
        compute_capability=tuple(b["compute_capability"]), abi_version=int(b["abi_version"]),
        library=data["library"], kernels=tuple(kernels), files=tuple(sorted(files.items())),
        tuning=tuning, raw=data,
    )
