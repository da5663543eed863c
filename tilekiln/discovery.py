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

from tilekiln.errors import BundleError
from tilekiln.manifest import MANIFEST_NAME

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


def open_bundle(directory: Path):
    """One Bundle object per directory per process, opened (and verified) on first use.

    A later call resolves the path and reads nothing of the bundle: what changes
    in a bundle directory later is the tuning table ``tilekiln tune`` writes, and
    tune has the open Bundle read it (``Bundle.reload_tuning``); a bundle rebuilt
    in place is seen by the next process.
    """
    from tilekiln.bundle import Bundle

    key = directory.resolve()
    bundle = _opened.get(key)
    if bundle is None:
        with _cache_lock:
            bundle = _opened.get(key)
            if bundle is None:
                bundle = _opened[key] = Bundle.open(key)
    return bundle
