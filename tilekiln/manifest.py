"""Read and verify a bundle's ``manifest.json`` (format: docs/bundle-format.md).

Verification happens before the library is opened (:func:`read_bundle`): the
directory holds nothing but regular files the manifest accounts for
(tilekiln/bundle_files.py), the schema's major version, the runtime ABI
version, the manifest's own digest (``integrity.manifest_sha256``, over its
canonical JSON without that field), its records' types and ranges, and the
sha256 of every listed file, each read once. Any mismatch raises
:class:`BundleIntegrityError` or :class:`BundleCompatibilityError`; nothing is
loaded. The builder writes the digest with :func:`manifest_digest`, so there
is one definition of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tilekiln._json import load_object
from tilekiln.bundle_files import (MANIFEST_NAME, SIGNATURE_NAME, UNLISTED, Identity, check_entries, identity,
                                   open_directory, read_file, scan)
from tilekiln.errors import BundleCompatibilityError, BundleIntegrityError
from tilekiln.model import model_of
from tilekiln.spec import KernelRecord, plain_int

SUPPORTED_SCHEMA_MAJOR = 2
# The tk_* C API and the plan/call blocks of templates/link/glue.c.j2, which _native packs;
# the builder stamps it into the library and the manifest. 2: scale_a/scale_b added.
# 3: tk_run(plan, call), the static half packed once per plan. 4: tk_max_active_clusters.
# 5: one tk_run_<family> per kernel family, its blocks derived from tilekiln/spec.py.
# 6: the plan block holds each scale's strides (blockwise scales are strided tensors).
# 7: the gemm family's bias vector (call block and launcher argument after the scales).
# 8: the gemm family's residual (call block and launcher argument after the bias), and row-wise
#    scales passed as {data, extent} vectors.
# 9: the gemm family's scale_result (call block and launcher argument after the residual).
# 10: by-value float32 launch arguments (tilekiln/spec.py, ValueArg): the gemm family's alpha and
#     beta, in the call block after the pointers (padded to 8 bytes) and launcher arguments after
#     scale_result.
ABI_VERSION = 10


@dataclass(frozen=True)
class DriverFloor:
    """The oldest driver the library's static CUDA runtime runs on."""

    cuda_version: int  # as cuDriverGetVersion reports it: 1000 * major + 10 * minor
    linux_driver: str


@dataclass(frozen=True)
class BundleInfo:
    name: str
    version: str
    arch: str  # sm_90a
    arch_kind: str  # "a" or "f"
    compute_capability: tuple[int, int]
    abi_version: int
    runtime_requires: str  # PEP 440 specifier of the runtimes that read it
    driver_requires: DriverFloor
    glibc: str  # the oldest glibc the library runs on


@dataclass(frozen=True)
class Provenance:
    git_commit: str
    build_host: str
    catalog_files: tuple[str, ...]


@dataclass(frozen=True)
class Sku:
    """A GPU model as the driver describes it: what a tuning table was measured on, and what
    finds the nearest SKU's table for a device that has none of its own (tilekiln/tuning/sku.py).
    A table read from a manifest of schema 2.6 or older states only its device name, so its
    SM count and memory are None there (unknown: they rank after every known value); a device
    whose driver cannot be asked has no name (Bundle._query_device)."""

    name: str | None  # cuDeviceGetName, as torch.cuda.get_device_name reports it: "NVIDIA H100 80GB HBM3"
    compute_capability: tuple[int, int]
    sm_count: int | None  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    memory_mib: int | None  # cuDeviceTotalMem // 2**20 (torch's total_memory // 2**20)
    # A device's peak DRAM bandwidth (tilekiln._driver.dram_gbps), which the selection model prices
    # streamed operands by (tilekiln/model.py, on_device); a table does not state it (a fitted
    # table's model does, as the bandwidth its constants hold at), so its SKU has None.
    dram_gbps: int | None = None

    def plain(self) -> dict:
        return {"device": self.name, "compute_capability": list(self.compute_capability),
                "sm_count": self.sm_count, "memory_mib": self.memory_mib}

    @classmethod
    def from_plain(cls, data: dict) -> Sku:
        cc = data["compute_capability"]
        if not isinstance(cc, list) or len(cc) != 2:
            raise ValueError(f"compute_capability {cc!r} is not [major, minor]")
        return cls(str(data["device"]), (plain_int(cc[0], "compute_capability"), plain_int(cc[1], "compute_capability")),
                   plain_int(data["sm_count"], "sm_count", 1), plain_int(data["memory_mib"], "memory_mib", 1))


@dataclass(frozen=True)
class TuningTable:
    """Measured choices per shape bucket (tilekiln/select.py) on one SKU, from ``tilekiln tune``:
    one of the manifest's build-time ``tuning_tables`` or of a bundle's tuning file
    (tilekiln/tuning/table.py). ``model``: the selector model's parameters fitted on this SKU
    (named floats), carried as they are; an empty tuple writes no ``model`` key."""

    sku: Sku
    table: tuple[tuple[str, str], ...]  # (shape bucket, choice label), sorted
    measurements: tuple[tuple[str, dict], ...] = ()
    model: tuple[tuple[str, float], ...] = ()  # (parameter name, value), sorted

    @property
    def device(self) -> str:
        return self.sku.name

    def plain(self) -> dict:
        data = {**self.sku.plain(), "table": dict(self.table), "measurements": dict(self.measurements)}
        if self.model:
            data["model"] = dict(self.model)
        return data

    @classmethod
    def from_plain(cls, data: dict) -> TuningTable:
        return cls(Sku.from_plain(data), _table(data), tuple(sorted(data.get("measurements", {}).items())),
                   _model(data.get("model", {})))

    @classmethod
    def from_plain_2_6(cls, data: dict, compute_capability: tuple[int, int]) -> TuningTable:
        """The single ``tuning`` table of a manifest of schema 2.6 or older, which names its device
        and nothing else of it; it was measured on a device that runs the bundle, whose compute
        capability is the bundle's."""
        return cls(Sku(str(data.get("device", "unknown")), compute_capability, None, None), _table(data),
                   tuple(sorted(data.get("measurements", {}).items())))


def _table(data: dict) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(b), str(c)) for b, c in data.get("table", {}).items()))


def _model(data: dict) -> tuple[tuple[str, float], ...]:
    if not isinstance(data, dict):
        raise ValueError(f"model {data!r} is not an object of named numbers")
    out = []
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"model.{name}: {value!r} is not a finite number")
        out.append((str(name), float(value)))
    model_of(tuple(out))  # a parameter the selection model does not have is refused here, not at a call
    return tuple(sorted(out))


@dataclass(frozen=True)
class Manifest:
    """A bundle's ``manifest.json``, every field typed (docs/bundle-format.md)."""

    schema_version: str
    bundle: BundleInfo
    library: str
    files: tuple[tuple[str, str], ...]  # (relative path, sha256), sorted
    kernels: tuple[KernelRecord, ...]
    toolchain: tuple[tuple[str, str], ...]
    provenance: Provenance
    # The build-time tables, one per SKU, sorted by device name; Bundle.tables adds the tuning file's.
    tuning_tables: tuple[TuningTable, ...] = ()
    sha256: str = ""  # integrity.manifest_sha256 as read ("" until the writer adds it); not in plain()

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def version(self) -> str:
        return self.bundle.version

    @property
    def arch(self) -> str:
        return self.bundle.arch

    @property
    def arch_kind(self) -> str:
        return self.bundle.arch_kind

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.bundle.compute_capability

    def kernel(self, kernel_id: str) -> KernelRecord:
        for k in self.kernels:
            if k.id == kernel_id:
                return k
        raise KeyError(kernel_id)

    def plain(self) -> dict:
        """The JSON object, without ``integrity`` (:func:`manifest_digest` covers the rest)."""
        b = self.bundle
        data = {
            "schema_version": self.schema_version,
            "bundle": {**dataclasses.asdict(b), "compute_capability": list(b.compute_capability)},
            "library": self.library,
            "files": dict(self.files),
            "kernels": [k.plain() for k in self.kernels],
            "toolchain": dict(self.toolchain),
            "provenance": {**dataclasses.asdict(self.provenance),
                           "catalog_files": list(self.provenance.catalog_files)},
        }
        if self.tuning_tables:
            data["tuning_tables"] = [t.plain() for t in self.tuning_tables]
        return data

    @classmethod
    def from_plain(cls, data: dict) -> Manifest:
        b = data["bundle"]
        files = data["files"]
        for relative in files:
            _check_relative(relative)
        if data["library"] not in files:
            raise ValueError(f"library {data['library']} is not among the hashed files")
        kernels = tuple(KernelRecord.from_plain(k) for k in data["kernels"])
        if [k.index for k in kernels] != list(range(len(kernels))):
            raise ValueError("kernel indexes are not 0, 1, ... in order (the library's kernel table)")
        floor = b["driver_requires"]
        integrity = data.get("integrity")
        return cls(
            schema_version=str(data["schema_version"]),
            bundle=BundleInfo(
                name=str(b["name"]), version=str(b["version"]), arch=str(b["arch"]), arch_kind=str(b["arch_kind"]),
                compute_capability=(plain_int(b["compute_capability"][0], "bundle.compute_capability"),
                                    plain_int(b["compute_capability"][1], "bundle.compute_capability")),
                abi_version=plain_int(b["abi_version"], "bundle.abi_version"),
                runtime_requires=str(b["runtime_requires"]),
                driver_requires=DriverFloor(plain_int(floor["cuda_version"], "bundle.driver_requires.cuda_version"),
                                            str(floor["linux_driver"])),
                glibc=str(b["glibc"])),
            library=str(data["library"]), files=tuple(sorted((str(k), str(v)) for k, v in files.items())),
            kernels=kernels,
            toolchain=tuple(sorted((str(k), str(v)) for k, v in data["toolchain"].items())),
            provenance=Provenance(**{**data["provenance"],
                                     "catalog_files": tuple(data["provenance"]["catalog_files"])}),
            tuning_tables=_tuning_tables(data, b["compute_capability"]),
            sha256=str(integrity.get("manifest_sha256", "")) if isinstance(integrity, dict) else "",
        )


def _tuning_tables(data: dict, compute_capability: list) -> tuple[TuningTable, ...]:
    """Schema 2.7 and newer: ``tuning_tables``, one per SKU. Up to 2.6: the single ``tuning``
    table (:meth:`TuningTable.from_plain_2_6`); a runtime still reads those bundles."""
    if "tuning_tables" in data:
        tables = tuple(sorted((TuningTable.from_plain(t) for t in data["tuning_tables"]), key=lambda t: t.device))
        names = [t.device for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"tuning_tables: two tables of one device ({', '.join(names)})")
        return tables
    if "tuning" in data:
        return (TuningTable.from_plain_2_6(data["tuning"], (plain_int(compute_capability[0], "compute_capability"),
                                                            plain_int(compute_capability[1], "compute_capability"))),)
    return ()


def canonical_json(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def manifest_digest(data: dict) -> str:
    """sha256 of the manifest without its ``integrity`` field."""
    body = {k: v for k, v in data.items() if k != "integrity"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def _check_relative(relative) -> None:
    """A listed file's path: relative, inside the bundle, spelled one way, not a name kept for
    the files beside the manifest."""
    if not isinstance(relative, str) or any(p in ("", ".", "..") or "\0" in p for p in relative.split("/")):
        raise ValueError(f"file {relative!r} lies outside the bundle directory or is not a plain relative path")
    if relative in (MANIFEST_NAME, *UNLISTED):
        raise ValueError(f"file {relative!r} is not one the manifest may list")


@dataclass(frozen=True)
class VerifiedBundle:
    """What :func:`read_bundle` verified of a bundle directory, held in memory: the library is
    opened from these bytes (tilekiln/_native.py), never from its path again."""

    manifest: Manifest
    library: bytes
    signature: bytes | None  # signature.json as read; tilekiln/signing.py checks it against trusted keys
    identity: Identity  # the directory as it was read (tilekiln/bundle_files.py)


def read_bundle(directory: Path) -> VerifiedBundle:
    """Verify the bundle in ``directory``: its entries, its manifest, and the sha256 of every
    listed file, each file read once. Raises :class:`BundleIntegrityError` (or
    :class:`BundleCompatibilityError` for another format) naming the file at fault."""
    label = directory.name
    root = open_directory(label, directory)
    try:
        entries = scan(label, root)
        raw, manifest_stat = read_file(label, root, MANIFEST_NAME)
        manifest = parse_manifest(raw, label)
        check_entries(manifest.name, entries, (relative for relative, _ in manifest.files))
        stats = {MANIFEST_NAME: manifest_stat}
        held: dict[str, bytes] = {}

        def read(relative: str) -> bytes:
            data, stats[relative] = read_file(manifest.name, root, relative)
            if relative == manifest.library:
                held[relative] = data
            return data

        verify_files(manifest, read)
        signature = None
        if SIGNATURE_NAME in entries:
            signature, stats[SIGNATURE_NAME] = read_file(manifest.name, root, SIGNATURE_NAME)
    finally:
        os.close(root)
    return VerifiedBundle(manifest, held[manifest.library], signature, identity(entries, stats))


def read_manifest(directory: Path, verify: bool = True) -> Manifest:
    """The manifest of the bundle in ``directory``; with ``verify``, the whole bundle is verified
    first (:func:`read_bundle`); without, the manifest alone is read (safely) and parsed."""
    if verify:
        return read_bundle(directory).manifest
    label = directory.name
    root = open_directory(label, directory)
    try:
        raw, _ = read_file(label, root, MANIFEST_NAME)
    finally:
        os.close(root)
    return parse_manifest(raw, label, verify=False)


def parse_manifest(raw: bytes, label: str, verify: bool = True) -> Manifest:
    """Parse manifest bytes: versions first (so a newer format is named as such), then the digest."""
    try:
        data = load_object(raw)
    except ValueError as exc:
        raise BundleIntegrityError(label, MANIFEST_NAME, f"not valid JSON ({exc})") from None
    _check_versions(label, data)
    if verify:
        integrity = data.get("integrity")
        recorded = integrity.get("manifest_sha256") if isinstance(integrity, dict) else None
        if recorded != manifest_digest(data):
            raise BundleIntegrityError(label, MANIFEST_NAME, "content does not match its recorded sha256")
    try:
        return Manifest.from_plain(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
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
