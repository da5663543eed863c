"""Open a built bundle, a bundle directory or a bundle wheel, without installing anything.

:func:`open_artifact` reads the manifest with the runtime's reader
(``tilekiln/manifest.py``), checks a directory as ``tilekiln.load`` does
(``read_bundle``: nothing but regular files the manifest accounts for, every
file against its sha256; tilekiln/bundle_files.py reads them, so a link or a
FIFO is refused, never followed or waited on) and its tuning file
(``tilekiln/tuning/table.py``), a wheel's files against their sha256, and
keeps the outcome as a value instead of raising:
``tilekiln inspect`` shows a damaged bundle and says what is wrong with it.
A wheel is read as a zip; its bundle is the one ``<package>/bundle/manifest.json``.
"""

from __future__ import annotations

import email.parser
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from tilekiln.bundle_files import open_directory, read_file
from tilekiln.errors import BundleCompatibilityError, BundleIntegrityError
from tilekiln.manifest import MANIFEST_NAME, Manifest, TuningTable, parse_manifest, read_bundle, verify_files
from tilekiln.tuning.table import overlay_tables, read_tuning_file


@dataclass(frozen=True)
class WheelInfo:
    filename: str
    distribution: str
    version: str
    requires: tuple[str, ...]
    tag: str
    archive_bytes: int


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Manifest
    sizes: tuple[tuple[str, int], ...]  # every file present that the manifest lists, and the manifest
    problem: str  # "" when the manifest and every file match their sha256
    wheel: WheelInfo | None
    tuning_file: tuple[TuningTable, ...] = ()  # a directory's tuning file's tables, written by `tilekiln tune`

    @property
    def tables(self) -> tuple[TuningTable, ...]:
        """The tables the bundle selects by, one per SKU: the manifest's build-time tables, each with
        the tuning file's buckets of the same device."""
        return overlay_tables(self.manifest.tuning_tables, self.tuning_file)

    @property
    def kind(self) -> str:
        return "wheel" if self.wheel else "bundle directory"

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self.sizes)

    def size_of(self, relative: str) -> int | None:
        return dict(self.sizes).get(relative)


def open_artifact(path: Path) -> Artifact:
    """Raises ``DiagnosticError`` when ``path`` is neither, or its manifest cannot be read at all."""
    if path.is_dir():
        return _open(path, _reader(path), None)
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            prefix, wheel = _wheel_layout(path, zf)
            return _open(path, lambda rel: zf.read(prefix + rel), wheel)
    raise _error(path, "neither a bundle directory nor a bundle wheel",
                 "pass a directory written by `tilekiln build` or a wheel written by `tilekiln package`")


def _open(path: Path, read: Callable[[str], bytes], wheel: WheelInfo | None) -> Artifact:
    try:
        raw = read(MANIFEST_NAME)
    except (FileNotFoundError, KeyError):
        raise _error(path, f"has no {MANIFEST_NAME}", "rebuild or repackage the bundle") from None
    except BundleIntegrityError as exc:
        raise _error(path, str(exc), "rebuild or repackage the bundle") from None
    except OSError as exc:  # a directory or unreadable file in its place
        raise _error(path, f"cannot read {MANIFEST_NAME} ({exc.strerror})", "rebuild or repackage the bundle") from None
    problem = ""
    try:
        try:
            manifest = parse_manifest(raw, path.name)
        except BundleIntegrityError as exc:
            problem = str(exc)
            manifest = parse_manifest(raw, path.name, verify=False)
    except BundleIntegrityError as exc:
        raise _error(path, str(exc), "rebuild or repackage the bundle") from None
    except BundleCompatibilityError as exc:
        raise _error(path, str(exc), "inspect it with a tilekiln that reads this format") from None
    if not problem:
        try:
            if wheel is None:
                read_bundle(path)
            else:
                verify_files(manifest, read)
        except BundleIntegrityError as exc:
            problem = str(exc)
    tuning_file: tuple[TuningTable, ...] = ()
    if wheel is None and not problem:
        try:
            tuning_file = read_tuning_file(path, manifest)
        except BundleIntegrityError as exc:
            problem = str(exc)
    sizes = []
    for relative in [r for r, _ in manifest.files] + [MANIFEST_NAME]:
        try:
            sizes.append((relative, len(read(relative))))
        except (OSError, KeyError, BundleIntegrityError):  # missing or unreadable: the integrity problem says which
            continue
    return Artifact(path, manifest, tuple(sizes), problem, wheel, tuning_file)


def _reader(directory: Path) -> Callable[[str], bytes]:
    """Read a file of the bundle ``directory`` as the runtime does (tilekiln/bundle_files.py)."""
    def read(relative: str) -> bytes:
        root = open_directory(directory.name, directory)
        try:
            return read_file(directory.name, root, relative)[0]
        finally:
            os.close(root)

    return read


def _wheel_layout(path: Path, zf: zipfile.ZipFile) -> tuple[str, WheelInfo]:
    names = zf.namelist()
    manifests = [n for n in names if n.count("/") == 2 and n.endswith(f"/bundle/{MANIFEST_NAME}")]
    metadata = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    wheel_files = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/WHEEL")]
    if len(manifests) != 1 or len(metadata) != 1 or len(wheel_files) != 1:
        raise _error(path, "is a zip but not a tilekiln bundle wheel (it needs one <package>/bundle/manifest.json "
                           "and one .dist-info)", "pass a wheel written by `tilekiln package`")
    meta = email.parser.Parser().parsestr(zf.read(metadata[0]).decode())
    tags = email.parser.Parser().parsestr(zf.read(wheel_files[0]).decode()).get_all("Tag") or []
    info = WheelInfo(path.name, meta.get("Name", ""), meta.get("Version", ""),
                     tuple(meta.get_all("Requires-Dist") or ()), ", ".join(tags), path.stat().st_size)
    return manifests[0][: -len(MANIFEST_NAME)], info


def _error(path: Path, problem: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("INSPECT-INPUT", problem, Location(str(path)), hint)])
