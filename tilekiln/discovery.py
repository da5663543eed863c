"""Find bundles: installed wheels (entry-point group ``tilekiln.bundles``) and
directories listed in ``TILEKILN_BUNDLE_PATH`` (colon-separated; each entry a
bundle directory or a directory of bundles, such as ``artifacts/``).

A bundle wheel registers ``<name> = <package>:bundle_dir``, a function that
returns the bundle directory inside the installed package.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from tilekiln.bundle_files import MANIFEST_NAME, SIGNATURE_NAME, current_identity
from tilekiln.errors import BundleError
from tilekiln.signing import require_signature, trust_for

ENTRY_POINT_GROUP = "tilekiln.bundles"
PATH_VARIABLE = "TILEKILN_BUNDLE_PATH"


@dataclass(frozen=True)
class BundleLocation:
    name: str
    directory: Path
    source: str  # "entry point <dist>" or "TILEKILN_BUNDLE_PATH"


def _from_entry_points() -> list[BundleLocation]:
    found = []
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        try:
            directory = Path(ep.load()())
        except Exception as exc:  # noqa: BLE001 - a broken wheel must not hide the others
            raise BundleError(f"installed bundle {ep.name!r} ({ep.value}) cannot be located: {exc}") from exc
        dist = ep.dist.name if ep.dist is not None else "unknown"
        found.append(BundleLocation(ep.name, directory, f"entry point of {dist}"))
    return found


def _from_path_variable() -> list[BundleLocation]:
    found = []
    for entry in filter(None, os.environ.get(PATH_VARIABLE, "").split(os.pathsep)):
        base = Path(entry)
        dirs = [base] if (base / MANIFEST_NAME).exists() else sorted(
            p for p in base.glob("*") if (p / MANIFEST_NAME).exists() and not p.name.startswith("."))
        found.extend(BundleLocation(d.name, d, PATH_VARIABLE) for d in dirs)
    return found


def installed() -> list[BundleLocation]:
    """Every bundle this process can see; path entries first, so a local build can shadow a wheel."""
    return _from_path_variable() + _from_entry_points()


def find(name: str) -> BundleLocation:
    for loc in installed():
        if loc.name == name:
            return loc
    raise BundleError(f"no bundle named {name!r} is installed. {describe_installed()}")


def describe_installed(device: tuple[int, int] | None = None) -> str:
    """What the installed bundles cover, in words; with a device's compute capability,
    also which of them run on it."""
    try:
        locs = installed()
    except BundleError as exc:
        return str(exc)
    if not locs:
        return ("No bundles are installed: pip install the bundle wheel for your GPU, e.g. tilekiln-kernels-sm90a, "
                f"or set {PATH_VARIABLE} to a directory of built bundles (e.g. artifacts/).")
    from tilekiln.compat import arch_runs_on
    from tilekiln.manifest import read_manifest

    parts, usable = [], []
    for loc in locs:
        try:
            m = read_manifest(loc.directory, verify=False)
        except Exception:  # noqa: BLE001 - describing, not loading
            parts.append(f"{loc.name} (unreadable, {loc.source})")
            continue
        parts.append(f"{loc.name} ({m.arch}, {loc.source})")
        if device is not None and arch_runs_on(m.arch_kind, m.compute_capability, device):
            usable.append(loc.name)
    text = "Installed bundles cover: " + ", ".join(parts) + "."
    if device is not None:
        cc = f"{device[0]}.{device[1]}"
        text += (f" Those that run on compute capability {cc}: {', '.join(usable)}." if usable else
                 f" None runs on compute capability {cc}.")
    return text


_cache_lock = threading.Lock()
_opened: dict[Path, object] = {}


def open_bundle(directory: Path, trusted_keys=None):
    """One Bundle object per directory per process, verified on first use and checked again on
    every call (docs/security.md).

    Each call lists the directory (``lstat`` only, nothing is read) and compares it with the
    identity recorded when its files were verified (tilekiln/bundle_files.py). Unchanged: the
    same Bundle. Changed (a file modified, replaced, added or removed): the bundle is verified
    from scratch. Damage raises and the Bundle is forgotten; a bundle that verifies with the
    same manifest keeps its Bundle; one rebuilt in place gets a new Bundle, while the old
    object runs on with the library it verified. A signature that ``trusted_keys`` or
    ``TILEKILN_TRUSTED_KEYS`` require is checked on every call, against the signature file
    as verified. Calls on a loaded Bundle never look at its files: this function does, so
    ``tilekiln.load`` costs a directory listing and GEMM calls cost nothing more.

    A tuning file written meanwhile is not looked for: ``tilekiln tune`` has the open Bundle
    read it (``Bundle.reload_tuning``).
    """
    from tilekiln.bundle import Bundle

    key = directory.resolve()
    with _cache_lock:
        cached = _opened.pop(key, None)
        if cached is not None and _unchanged(key, cached):
            bundle = _opened[key] = cached
            trust = trust_for(trusted_keys)
            if trust is not None:
                require_signature(bundle.name, bundle.manifest.sha256, bundle.signature, trust)
            return bundle
        bundle = Bundle.open(key, trusted_keys=trusted_keys)
        if cached is not None and cached.manifest.sha256 == bundle.manifest.sha256:
            cached.identity, cached.signature = bundle.identity, bundle.signature
            bundle = cached
        _opened[key] = bundle
        return bundle


def _unchanged(directory: Path, bundle) -> bool:
    verified = (MANIFEST_NAME, SIGNATURE_NAME, *(relative for relative, _ in bundle.manifest.files))
    return current_identity(bundle.name, directory, verified) == bundle.identity
