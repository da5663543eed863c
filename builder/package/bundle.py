"""Write a bundle directory: library, sources and ``manifest.json``.

Layout (``docs/bundle-format.md`` is the normative description)::

    <bundle>/manifest.json        schema, versions, provenance, kernels, file hashes
    <bundle>/lib/libtilekiln_<bundle>.so
    <bundle>/sources/<kernel id>.py.txt

The kernels' cubins are not files of their own: the library embeds each one
whole, and the manifest records its sha256 and size. Sources are text, not
modules (``.py.txt``), so installing a bundle wheel byte-compiles nothing.

The bundle is assembled in a temporary sibling directory and swapped into
place atomically (``renameat2(RENAME_EXCHANGE)`` where the file system has it,
two renames otherwise), so a reader never sees a half-written bundle.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from builder.fsutil import sync_tree
from tilekiln.manifest import MANIFEST_NAME, manifest_digest


@dataclass(frozen=True)
class BundleFile:
    relative: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def bundle_name(arch: str) -> str:
    """``sm_90a`` -> ``sm90a``: the bundle, wheel and entry-point name of a target."""
    return arch.replace("_", "")


def library_name(bundle: str) -> str:
    return f"libtilekiln_{bundle}.so"


def source_file(kernel_id: str) -> str:
    """The bundle path of a kernel's rendered CuTe DSL source."""
    return f"sources/{kernel_id}.py.txt"


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def write_bundle(out_dir: Path, bundle: str, files: list[BundleFile], manifest: dict,
                 extra: dict[str, bytes] | None = None) -> Path:
    """Write files plus the manifest (which gets every file's sha256) and swap into place.

    ``extra`` files (the build report) travel with the bundle but are not part
    of its integrity list: they describe the build, not the artifact.
    """
    manifest = dict(manifest, files={f.relative: f.sha256 for f in sorted(files, key=lambda f: f.relative)})
    manifest["integrity"] = {"manifest_sha256": manifest_digest(manifest)}
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / f".staging-{bundle}-{uuid.uuid4().hex[:12]}"
    try:
        for f in files:
            path = staging / f.relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f.data)
        (staging / MANIFEST_NAME).write_bytes(manifest_bytes(manifest))
        for name, data in (extra or {}).items():
            (staging / name).write_bytes(data)
        sync_tree(staging)
        final = out_dir / bundle
        swap_into_place(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir / bundle


def swap_into_place(new: Path, final: Path) -> None:
    """Make ``final`` the directory ``new`` atomically; the old contents are removed."""
    if not final.exists():
        os.rename(new, final)
        return
    if _exchange(new, final):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the old bundle
        return
    old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:12]}")
    os.rename(final, old)
    os.rename(new, final)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two paths in one step (Linux >= 3.15)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
