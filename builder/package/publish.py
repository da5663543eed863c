"""Put finished outputs in place: atomically, one writer at a time, and only when they changed.

Concurrency model. Every output directory (a bundle ``<out>/<bundle>``, a
shard ``<out>/shards/<bundle>/<I>-of-<N>``) has a lock file under
``<out>/.locks/``. A writer holds it only while it compares what is on disk
with what it would write, swaps a fully written and fsynced staging tree into
place (:func:`builder.package.bundle.swap_into_place`) and writes the build report.
A tree that already holds exactly the new files is left alone, so a no-op
rebuild rewrites nothing but the report, and two builds finishing together
leave one correct tree. Staging trees of killed writers are removed under
the lock, when no live writer of that output can exist.

The build report describes a build, not the artifact: it is replaced with an
atomic rename beside the files and is not in the manifest's file list.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from filelock import FileLock

from builder.fsutil import remove_path
from builder.package.bundle import BundleFile, manifest_bytes, swap_into_place
from tilekiln._files import write_atomic, write_synced
from tilekiln.bundle_files import SIGNATURE_NAME
from tilekiln.manifest import MANIFEST_NAME

REPORT_NAME = "build-report.json"
LOCK_DIR = ".locks"


def output_lock(out_dir: Path, final: Path) -> FileLock:
    """The lock of one output directory; its name is the output's path below ``out_dir``."""
    name = final.relative_to(out_dir).as_posix().replace("/", "__")
    path = out_dir / LOCK_DIR / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path))


def failure_report_path(out_dir: Path, bundle: str) -> Path:
    """Where a failed build's report goes when the previous bundle is kept untouched."""
    return out_dir / f"{bundle}.{REPORT_NAME}"


@contextmanager
def bundle_output(out_dir: Path, bundle: str) -> Iterator[Path]:
    """Hold the bundle's lock while the caller compares and writes ``<out>/<bundle>``.

    Leftovers of killed writers go first; once the caller has put a bundle in
    place, the report of an earlier failed build is removed, so the reports
    on disk never contradict the bundle.
    """
    final = out_dir / bundle
    out_dir.mkdir(parents=True, exist_ok=True)
    with output_lock(out_dir, final):
        remove_leftovers(final)
        yield final
        failure_report_path(out_dir, bundle).unlink(missing_ok=True)


def publish_failure_report(out_dir: Path, bundle: str, report: bytes) -> Path:
    path = failure_report_path(out_dir, bundle)
    out_dir.mkdir(parents=True, exist_ok=True)
    with output_lock(out_dir, out_dir / bundle):
        write_atomic(path, report)
    return path


def publish_tree(out_dir: Path, final: Path, files: Mapping[str, bytes], report: bytes) -> Path:
    """Make ``final`` hold exactly ``files`` (relative path -> bytes) plus the report."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out_dir, final):
        remove_leftovers(final)
        if tree_digests(final) == {name: _sha256(data) for name, data in files.items()}:
            write_atomic(final / REPORT_NAME, report)
            return final
        staging = final.with_name(f".staging-{final.name}-{uuid.uuid4().hex[:12]}")
        try:
            for name, data in {**files, REPORT_NAME: report}.items():
                path = staging / name
                path.parent.mkdir(parents=True, exist_ok=True)
                write_synced(path, data)
            swap_into_place(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return final


def bundle_is_current(final: Path, files: list[BundleFile], manifest: dict) -> bool:
    """Would :func:`write_bundle` with these inputs produce exactly what ``final`` holds?

    The manifest on disk must be the one it would write (same content, same
    bytes) and list exactly ``files``, and every file on disk must hash to
    its listed sha256 with nothing else in the tree but a ``signature.json``:
    it signs the manifest's bytes, which are unchanged, so a no-op rebuild of a
    signed bundle keeps its signature.
    """
    try:
        raw = (final / MANIFEST_NAME).read_bytes()
        existing = json.loads(raw)
    except (OSError, ValueError):
        return False
    wanted_files = {f.relative: f.sha256 for f in files}
    def without_files(data: dict) -> dict:
        return {k: v for k, v in data.items() if k not in ("files", "integrity")}

    if existing.get("files") != wanted_files or without_files(existing) != without_files(json.loads(json.dumps(manifest))):
        return False
    if raw != manifest_bytes(existing):
        return False
    on_disk = tree_digests(final) or {}
    on_disk.pop(SIGNATURE_NAME, None)
    return on_disk == {**wanted_files, MANIFEST_NAME: _sha256(raw)}


def tree_digests(directory: Path) -> dict[str, str] | None:
    """sha256 of every file below ``directory`` but the build report; None if it does not exist."""
    if not directory.is_dir():
        return None
    files = {p.relative_to(directory).as_posix(): p for p in sorted(directory.rglob("*")) if p.is_file()}
    return {name: _sha256(p.read_bytes()) for name, p in files.items() if name != REPORT_NAME}


def remove_leftovers(final: Path) -> int:
    """Remove what killed writers of ``final`` left: staging and old trees beside it and
    half-written reports beside and in it. Call under its lock, when no writer is alive."""
    name = re.escape(final.name)
    beside = re.compile(rf"\.(staging|old)-{name}-[0-9a-f]{{12}}|\.{name}\.{re.escape(REPORT_NAME)}\.[0-9a-f]{{12}}\.tmp")
    inside = re.compile(rf"\.{re.escape(REPORT_NAME)}\.[0-9a-f]{{12}}\.tmp")
    removed = 0
    for directory, pattern in ((final.parent, beside), (final, inside)):
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if pattern.fullmatch(path.name):
                remove_path(path)
                removed += 1
    return removed






def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
