"""A bundle's tuning file: the table ``tilekiln tune`` measured after the build, beside its manifest.

    <bundle>/tuning.json      JSON, keys sorted
      schema_version          "1.0"
      manifest_sha256         integrity.manifest_sha256 of the manifest it was measured against
      device                  the GPU it was measured on
      table                   {shape bucket: choice label}   (tilekiln/select.py)
      measurements            {shape bucket: the times that decided it}
      integrity               {"tuning_sha256": sha256 of the canonical JSON of the rest}

The manifest is verified and never rewritten after the build; its ``tuning``
key is the build-time table (from catalog/tuning/<bundle>.json). A bundle
selects by that table with this file's buckets in place of its own
(:func:`overlay`). The file is not among the manifest's ``files``: it is
written after the build, and neither a rebuild nor a wheel carries it
(commit tune's ``--table-out`` file to ship a table).

:func:`read_tuning_file` raises :class:`BundleIntegrityError` naming the file
when it is not JSON, fails its own digest or is malformed: something edited
or damaged it. A file of another schema major, or one measured against
another manifest, is ignored with a :class:`TuningFileWarning`: it belongs to
another build (pip replaces only the files it installed, so upgrading a
bundle wheel that was tuned in place leaves the old file behind), and loading
the bundle with its build-time table is correct, only not tuned.

Concurrency: the file is replaced atomically (tilekiln/_files.py); of two
tunes of one bundle the last to write wins. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from tilekiln._files import write_atomic
from tilekiln._json import load_object
from tilekiln.bundle_files import TUNING_NAME, open_directory, read_file
from tilekiln.errors import BundleIntegrityError, TuningFileWarning
from tilekiln.manifest import Manifest, TuningTable, canonical_json

SCHEMA_VERSION = "1.0"
# Candidate times are kept in ms to 10 ns: at 0.1 us, every kernel of a 30 us
# bf16 2048^3 tune read 30.0 or 30.1, too coarse to rank them.
TIME_DECIMALS = 5

_FIX = "delete it (the bundle then selects by its build-time table) and run tilekiln tune again"


def tuning_digest(data: dict) -> str:
    """sha256 of a tuning file's canonical JSON without its ``integrity`` field (the manifest's rule)."""
    return hashlib.sha256(canonical_json({k: v for k, v in data.items() if k != "integrity"})).hexdigest()


def write_tuning_file(directory: Path, tuning: TuningTable, manifest_sha256: str) -> Path:
    """Replace the tuning file of the bundle in ``directory`` with ``tuning``, measured against
    the manifest whose self digest is ``manifest_sha256``; returns its path."""
    data = {"schema_version": SCHEMA_VERSION, "manifest_sha256": manifest_sha256, **tuning.plain()}
    data["integrity"] = {"tuning_sha256": tuning_digest(data)}
    path = directory / TUNING_NAME
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_tuning_file(directory: Path, manifest: Manifest) -> TuningTable | None:
    """The table of the tuning file in ``directory`` for the bundle of ``manifest``; None when
    there is none, or when it is another build's or format's (with a TuningFileWarning)."""
    path = directory / TUNING_NAME
    if not os.path.lexists(path):
        return None
    root = open_directory(manifest.name, directory)
    try:
        raw, _ = read_file(manifest.name, root, TUNING_NAME, _FIX)  # a link or a FIFO is refused, unread
    finally:
        os.close(root)
    try:
        data = load_object(raw)
    except ValueError as exc:
        raise BundleIntegrityError(manifest.name, TUNING_NAME, f"not valid JSON ({exc})", _FIX) from None
    # The schema first, as for the manifest: another format may digest differently.
    schema = str(data.get("schema_version", ""))
    if schema.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        warnings.warn(f"bundle {manifest.name}: {path} has tuning file schema {schema!r}, and this tilekiln "
                      f"runtime reads {SCHEMA_VERSION.split('.')[0]}.x, so its table is ignored; tune the bundle "
                      "again with this runtime, or delete the file", TuningFileWarning, stacklevel=2)
        return None
    integrity = data.get("integrity")
    if (integrity.get("tuning_sha256") if isinstance(integrity, dict) else None) != tuning_digest(data):
        raise BundleIntegrityError(manifest.name, TUNING_NAME, "content does not match its recorded sha256", _FIX)
    measured_against = data.get("manifest_sha256")
    if measured_against != manifest.sha256:
        warnings.warn(f"bundle {manifest.name}: {path} was measured against another manifest.json (sha256 "
                      f"{str(measured_against)[:12]}, this bundle's is {manifest.sha256[:12]}), so its table is "
                      "ignored; tune the bundle again, or delete the file", TuningFileWarning, stacklevel=2)
        return None
    try:
        return TuningTable.from_plain(data)
    except (TypeError, ValueError, AttributeError) as exc:
        raise BundleIntegrityError(manifest.name, TUNING_NAME, f"malformed ({type(exc).__name__}: {exc})",
                                   _FIX) from None


def overlay(base: TuningTable | None, over: TuningTable | None) -> TuningTable | None:
    """``base`` with ``over``'s buckets (choice and measurements) in place of its own, and
    ``over``'s device: the table a bundle selects by, ``base`` its build-time one."""
    if over is None:
        return base
    if base is None:
        return over
    replaced = {bucket for bucket, _ in over.table}
    table = dict(base.table) | dict(over.table)
    measurements = {b: m for b, m in base.measurements if b not in replaced} | dict(over.measurements)
    return TuningTable(over.device, tuple(sorted(table.items())), tuple(sorted(measurements.items())))


def add_measured(base: TuningTable | None, entries: dict[str, dict], device: str) -> TuningTable:
    """``base`` with the buckets of ``entries`` (``{bucket: {"kernel": label, ...measurements}}``,
    as ``tilekiln.tuning.policy.tune`` and ``tilekiln.tuning.merge.combine`` return them) over it."""
    measured = TuningTable(device, tuple(sorted((b, e["kernel"]) for b, e in entries.items())),
                           tuple(sorted((b, {k: v for k, v in e.items() if k != "kernel"})
                                        for b, e in entries.items())))
    return overlay(base, measured)
