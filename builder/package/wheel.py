"""Package a bundle directory as a standard platform wheel (PEP 427, core metadata 2.1).

``tilekiln_kernels_<bundle>-<version>-py3-none-<manylinux tag>.whl`` holds::

    tilekiln_kernels_<bundle>/__init__.py      bundle_dir() -> the directory below
    tilekiln_kernels_<bundle>/bundle/...       manifest.json, every file it hashes, signature.json if signed
    tilekiln_kernels_<bundle>-<version>.dist-info/{METADATA,WHEEL,entry_points.txt,RECORD}

It registers ``<bundle> = tilekiln_kernels_<bundle>:bundle_dir`` under the
entry-point group ``tilekiln.bundles`` and requires the runtime range the
manifest records (``tilekiln-runtime>=0.5,<0.6``), so pip installs a runtime that
reads it. The platform tag is the glibc the library was linked for (``bundle.glibc``),
checked against the library (``builder/package/platform_tag.py``).

Why the standard library's zipfile and not a build backend: a bundle is not
a Python project to build, it is a fixed set of files whose names and
hashes the manifest already fixes. A backend (setuptools, hatchling, flit)
would need a generated project tree, and none of them makes a platform
wheel from prebuilt files without an extension-module workaround. A wheel is
a zip with four metadata files; writing it here takes one module, and makes
it byte-reproducible: members in a fixed order (package files sorted, then
METADATA, WHEEL, entry_points.txt, RECORD last as PEP 427 asks), a fixed
timestamp (1980-01-01, the zip epoch), fixed modes and compression level.
The tests install it with pip into a fresh environment and load it there.
``build-report.json`` is left out: it records compile times, which vary.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from builder import __version__
from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.package.platform_tag import GlibcTarget, PlatformTag, platform_tag
from tilekiln._files import write_atomic
from tilekiln.discovery import ENTRY_POINT_GROUP
from tilekiln.bundle_files import SIGNATURE_NAME
from tilekiln.errors import BundleError
from tilekiln.manifest import MANIFEST_NAME, Manifest, read_manifest
from tilekiln.signing import parse_signature

# The distribution of the runtime (runtime/pyproject.toml); the import name is `tilekiln`,
# but PyPI's `tilekiln` is an unrelated project, so a bundle must never require that name.
RUNTIME_DISTRIBUTION = "tilekiln-runtime"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
COMPRESS_LEVEL = 9
_BUNDLE_NAME = re.compile(r"[a-z0-9]+")

PACKAGE_INIT = '''"""Prebuilt tilekiln GEMM kernels: bundle {name} {version} for {arch}, {count} kernels.

The tilekiln runtime finds this package through its ``{group}`` entry point,
``tilekiln.load("{name}")``; it checks every file under ``bundle/`` against
``bundle/manifest.json`` before it opens the library.
"""

from pathlib import Path

__version__ = "{version}"


def bundle_dir() -> Path:
    """The bundle directory inside this installed package."""
    return Path(__file__).resolve().parent / "bundle"
'''


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class SizeRow:
    """What one part of the wheel costs: its files' bytes, and what they take compressed."""

    part: str  # a kernel id, "library", "manifest", "signature" or "package metadata"
    raw_bytes: int
    wheel_bytes: int


@dataclass(frozen=True)
class Wheel:
    filename: str
    data: bytes
    tag: PlatformTag
    requires: str  # the Requires-Dist line's value, e.g. "tilekiln-runtime>=0.5,<0.6"
    rows: tuple[SizeRow, ...]  # largest first

    @property
    def size(self) -> int:
        return len(self.data)


class WheelTooLarge(DiagnosticError):
    """The wheel exceeds the size budget; ``rows`` break its size down per kernel."""

    def __init__(self, diagnostic: Diagnostic, rows: tuple[SizeRow, ...]):
        super().__init__([diagnostic])
        self.rows = rows

    def __reduce__(self):
        return (WheelTooLarge, (self.diagnostics[0], self.rows))


def distribution_name(bundle: str) -> str:
    return f"tilekiln-kernels-{bundle}"


def package_name(bundle: str) -> str:
    return f"tilekiln_kernels_{bundle}"


def package_bundle(bundle_dir: Path, out_dir: Path, max_size: int) -> tuple[Path, Wheel]:
    """Write the wheel of the bundle in ``bundle_dir`` to ``out_dir``; returns its path and contents.

    Raises :class:`WheelTooLarge` (nothing written) when it exceeds ``max_size``
    bytes, and ``DiagnosticError`` when the bundle is missing, fails its
    integrity check or cannot be tagged.
    """
    wheel = make_wheel(bundle_dir)
    if wheel.size > max_size:
        raise WheelTooLarge(Diagnostic(
            "WHEEL-SIZE", f"the wheel {wheel.filename} is {wheel.size:,} bytes, over the limit of {max_size:,}",
            Location(str(bundle_dir)), "drop kernels from the catalog, split the bundle, or raise "
            "wheel_size_limit in catalog/catalog.yaml (PyPI refuses files over 100 MB by default)",
            facts={"wheel_bytes": wheel.size, "limit_bytes": max_size,
                   "breakdown": {r.part: r.wheel_bytes for r in wheel.rows}}), wheel.rows)
    final = out_dir / wheel.filename
    write_atomic(final, wheel.data)
    return final, wheel


def make_wheel(bundle_dir: Path) -> Wheel:
    """The wheel of a verified bundle, in memory."""
    manifest = _verified_manifest(bundle_dir)
    runtime_range = manifest.bundle.runtime_requires
    if not _BUNDLE_NAME.fullmatch(manifest.name):
        raise _error(bundle_dir / MANIFEST_NAME, f"bundle name {manifest.name!r} is not lower-case letters and "
                     "digits, so it cannot name a Python package", "rebuild the bundle with this builder")
    tag = platform_tag((bundle_dir / manifest.library).read_bytes(), str(bundle_dir / manifest.library),
                       _glibc_target(bundle_dir, manifest))
    requires = RUNTIME_DISTRIBUTION + runtime_range
    pkg = package_name(manifest.name)
    dist_info = f"{pkg}-{manifest.version}.dist-info"
    files = [Member(f"{pkg}/bundle/{rel}", (bundle_dir / rel).read_bytes(), executable=rel.endswith(".so"))
             for rel, _ in manifest.files]
    files.append(Member(f"{pkg}/bundle/{MANIFEST_NAME}", (bundle_dir / MANIFEST_NAME).read_bytes()))
    signature = _signature(bundle_dir, manifest)
    if signature is not None:
        files.append(Member(f"{pkg}/bundle/{SIGNATURE_NAME}", signature))
    files.append(Member(f"{pkg}/__init__.py", PACKAGE_INIT.format(
        name=manifest.name, version=manifest.version, arch=manifest.arch, count=len(manifest.kernels),
        group=ENTRY_POINT_GROUP).encode()))
    members = sorted(files, key=lambda m: m.name) + [
        Member(f"{dist_info}/METADATA", _metadata(manifest, requires).encode()),
        Member(f"{dist_info}/WHEEL", _wheel_file(tag).encode()),
        Member(f"{dist_info}/entry_points.txt",
               f"[{ENTRY_POINT_GROUP}]\n{manifest.name} = {pkg}:bundle_dir\n".encode()),
    ]
    members.append(Member(f"{dist_info}/RECORD", _record(members, f"{dist_info}/RECORD").encode()))
    data, compressed = _zip(members)
    filename = f"{pkg}-{manifest.version}-py3-none-{tag.tag}.whl"
    return Wheel(filename, data, tag, requires, _breakdown(manifest, pkg, members, compressed))


def _verified_manifest(bundle_dir: Path) -> Manifest:
    if not (bundle_dir / MANIFEST_NAME).is_file():
        raise _error(bundle_dir, "not a bundle directory (it has no manifest.json)",
                     "pass a directory written by `tilekiln build`, such as artifacts/sm90a")
    try:
        return read_manifest(bundle_dir)
    except BundleError as exc:
        raise _error(bundle_dir, str(exc), "rebuild the bundle with `tilekiln build`") from None


def _signature(bundle_dir: Path, manifest: Manifest) -> bytes | None:
    """The bundle's signature file, if it is signed: it must sign this manifest (it is checked
    against trusted keys where the bundle is loaded, tilekiln/signing.py)."""
    path = bundle_dir / SIGNATURE_NAME
    if not path.exists():
        return None
    raw = path.read_bytes()
    try:
        signed = parse_signature(raw)["manifest_sha256"]
    except ValueError as exc:
        raise _error(path, f"malformed ({exc})", "sign the bundle again (tilekiln sign), or delete the file") from None
    if signed != manifest.sha256:
        raise _error(path, "signs another manifest: the bundle was rebuilt after it was signed",
                     "sign the bundle again (tilekiln sign BUNDLE --key KEY)")
    return raw


def _glibc_target(bundle_dir: Path, manifest: Manifest) -> GlibcTarget:
    """The glibc the bundle was linked for, which its wheel's manylinux tag promises."""
    glibc = manifest.bundle.glibc
    if not re.fullmatch(r"2\.[0-9]+", glibc):
        raise _error(bundle_dir / MANIFEST_NAME, "the manifest does not record bundle.glibc, the glibc its "
                     "library was linked for", "rebuild the bundle with this builder (tilekiln build)")
    major, minor = glibc.split(".")
    return GlibcTarget((int(major), int(minor)), Location(str(bundle_dir / MANIFEST_NAME), path="bundle.glibc"))


def _metadata(m: Manifest, requires: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {distribution_name(m.name)}",
        f"Version: {m.version}",
        f"Summary: Prebuilt tilekiln GEMM kernels for {m.arch} "
        f"(compute capability {m.compute_capability[0]}.{m.compute_capability[1]}), {len(m.kernels)} kernels",
        f"Requires-Dist: {requires}",
        "Description-Content-Type: text/markdown",
        "",
        f"Bundle `{m.name}` {m.version} of ahead-of-time compiled GEMM kernels for `{m.arch}`, built from "
        f"commit `{m.provenance.git_commit}`. Load it with `tilekiln.load(\"{m.name}\")`; "
        "`tilekiln inspect` on this wheel lists its kernels.",
        "",
    ]
    return "\n".join(lines)


def _wheel_file(tag: PlatformTag) -> str:
    return (f"Wheel-Version: 1.0\nGenerator: tilekiln-build {__version__} (builder/package/wheel.py)\n"
            f"Root-Is-Purelib: false\nTag: py3-none-{tag.tag}\n")


def _record(members: list[Member], record_name: str) -> str:
    rows = []
    for m in members:
        digest = base64.urlsafe_b64encode(hashlib.sha256(m.data).digest()).rstrip(b"=").decode()
        rows.append(f"{m.name},sha256={digest},{len(m.data)}")
    rows.append(f"{record_name},,")
    return "\n".join(rows) + "\n"


def _zip(members: list[Member]) -> tuple[bytes, dict[str, int]]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for m in members:
            info = zipfile.ZipInfo(m.name, date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the mode bits below are honoured
            info.external_attr = (0o100755 if m.executable else 0o100644) << 16
            zf.writestr(info, m.data, compresslevel=COMPRESS_LEVEL)
        compressed = {i.filename: i.compress_size for i in zf.infolist()}
    return buf.getvalue(), compressed


def _breakdown(m: Manifest, pkg: str, members: list[Member], compressed: dict[str, int]) -> tuple[SizeRow, ...]:
    """Size per kernel (its source), the library (which holds every kernel's device code:
    the manifest's ``cubin.bytes`` is each kernel's share), the manifest, and the package's own files."""
    owner = {f"{pkg}/bundle/{kernel.source.file}": kernel.id for kernel in m.kernels}
    owner[f"{pkg}/bundle/{m.library}"] = "library"
    owner[f"{pkg}/bundle/{MANIFEST_NAME}"] = "manifest"
    owner[f"{pkg}/bundle/{SIGNATURE_NAME}"] = "signature"
    raw: dict[str, int] = {}
    packed: dict[str, int] = {}
    for member in members:
        part = owner.get(member.name, "package metadata")
        raw[part] = raw.get(part, 0) + len(member.data)
        packed[part] = packed.get(part, 0) + compressed[member.name]
    rows = [SizeRow(part, raw[part], packed[part]) for part in raw]
    return tuple(sorted(rows, key=lambda r: (-r.wheel_bytes, r.part)))


def _error(path: Path, problem: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("WHEEL-INPUT", problem, Location(str(path)), hint)])
