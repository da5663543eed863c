"""A bundle's tuning file: the tables ``tilekiln tune`` measured after the build, beside its manifest.

    <bundle>/tuning.json      JSON, keys sorted
      schema_version          "2.0"
      manifest_sha256         integrity.manifest_sha256 of the manifest it was measured against
      tables                  one per SKU measured, sorted by device name, each:
        device                the GPU's name, as torch.cuda.get_device_name reports it
        compute_capability    [major, minor]
        sm_count              its SM count
        memory_mib            its memory (cuDeviceTotalMem) in MiB
        table                 {shape bucket: choice label}   (tilekiln/select.py)
        measurements          {shape bucket: the times that decided it}
        model                 optional: {parameter: value}, the selector model fitted on this SKU
      integrity               {"tuning_sha256": sha256 of the canonical JSON of the rest}

The manifest is verified and never rewritten after the build; its
``tuning_tables`` are the build-time tables (from catalog/tuning/<bundle>/).
A bundle selects by those tables with this file's over them, per device name
(:func:`overlay_tables`): a tune on an H100 adds or replaces the H100's
buckets and leaves the H200's as they were, and which table a device selects
by is tilekiln/tuning/sku.py's rule. The file is not among the manifest's
``files``: it is written after the build, and neither a rebuild nor a wheel
carries it (commit tune's ``--table-out`` file to ship a table).

:func:`read_tuning_file` raises :class:`BundleIntegrityError` naming the file
when it is not JSON, fails its own digest or is malformed: something edited
or damaged it. A file of another schema major (1.x held a single table of
one device), or one measured against another manifest, is ignored with a
:class:`TuningFileWarning`: it belongs to another build or runtime (pip
replaces only the files it installed, so upgrading a bundle wheel that was
tuned in place leaves the old file behind), and loading the bundle with its
build-time tables is correct, only not tuned.

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
from tilekiln.manifest import Manifest, Sku, TuningTable, canonical_json

SCHEMA_VERSION = "2.0"
# Candidate times are kept in ms to 10 ns: at 0.1 us, every kernel of a 30 us
# bf16 2048^3 tune read 30.0 or 30.1, too coarse to rank them.
TIME_DECIMALS = 5

_FIX = "delete it (the bundle then selects by its build-time tables) and run tilekiln tune again"


def tuning_digest(data: dict) -> str:
    """sha256 of a tuning file's canonical JSON without its ``integrity`` field (the manifest's rule)."""
    return hashlib.sha256(canonical_json({k: v for k, v in data.items() if k != "integrity"})).hexdigest()


def write_tuning_file(directory: Path, tables: tuple[TuningTable, ...], manifest_sha256: str) -> Path:
    """Replace the tuning file of the bundle in ``directory`` with ``tables`` (one per device
    name), measured against the manifest whose self digest is ``manifest_sha256``; returns its path."""
    data = {"schema_version": SCHEMA_VERSION, "manifest_sha256": manifest_sha256,
            "tables": [t.plain() for t in _by_device(tables)]}
    data["integrity"] = {"tuning_sha256": tuning_digest(data)}
    path = directory / TUNING_NAME
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_tuning_file(directory: Path, manifest: Manifest) -> tuple[TuningTable, ...]:
    """The tables of the tuning file in ``directory`` for the bundle of ``manifest``; none when
    there is no file, or when it is another build's or format's (with a TuningFileWarning)."""
    path = directory / TUNING_NAME
    if not os.path.lexists(path):
        return ()
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
        return ()
    integrity = data.get("integrity")
    if (integrity.get("tuning_sha256") if isinstance(integrity, dict) else None) != tuning_digest(data):
        raise BundleIntegrityError(manifest.name, TUNING_NAME, "content does not match its recorded sha256", _FIX)
    measured_against = data.get("manifest_sha256")
    if measured_against != manifest.sha256:
        warnings.warn(f"bundle {manifest.name}: {path} was measured against another manifest.json (sha256 "
                      f"{str(measured_against)[:12]}, this bundle's is {manifest.sha256[:12]}), so its table is "
                      "ignored; tune the bundle again, or delete the file", TuningFileWarning, stacklevel=2)
        return ()
    try:
        tables = tuple(TuningTable.from_plain(t) for t in data["tables"])
        if len({t.device for t in tables}) != len(tables):
            raise ValueError("two tables of one device")
        return _by_device(tables)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleIntegrityError(manifest.name, TUNING_NAME, f"malformed ({type(exc).__name__}: {exc})",
                                   _FIX) from None


def overlay(base: TuningTable | None, over: TuningTable | None) -> TuningTable | None:
    """``base`` with ``over``'s buckets (choice and measurements) in place of its own, and
    ``over``'s SKU and model: both of one device, ``base`` its build-time table."""
    if over is None:
        return base
    if base is None:
        return over
    replaced = {bucket for bucket, _ in over.table}
    table = dict(base.table) | dict(over.table)
    measurements = {b: m for b, m in base.measurements if b not in replaced} | dict(over.measurements)
    return TuningTable(over.sku, tuple(sorted(table.items())), tuple(sorted(measurements.items())),
                       over.model or base.model)


def overlay_tables(base: tuple[TuningTable, ...], over: tuple[TuningTable, ...]) -> tuple[TuningTable, ...]:
    """The tables a bundle selects by: each of ``base`` (the build-time ones) with the table of
    ``over`` (the tuning file's) of the same device name over it, and ``over``'s other tables;
    a table never takes buckets from another device's."""
    return _by_device(tuple(overlay(table_of(base, name), table_of(over, name))
                            for name in {t.device for t in (*base, *over)}))


def table_of(tables: tuple[TuningTable, ...], device: str) -> TuningTable | None:
    """The table measured on ``device`` (a name), if any."""
    return next((t for t in tables if t.device == device), None)


def add_measured(base: TuningTable | None, entries: dict[str, dict], sku: Sku) -> TuningTable:
    """``base`` (of ``sku``, or None) with the buckets of ``entries`` (``{bucket: {"kernel": label,
    ...measurements}}``, as ``tilekiln.tuning.policy.tune`` and ``tilekiln.tuning.merge.combine``
    return them) over it."""
    measured = TuningTable(sku, tuple(sorted((b, e["kernel"]) for b, e in entries.items())),
                           tuple(sorted((b, {k: v for k, v in e.items() if k != "kernel"})
                                        for b, e in entries.items())))
    return overlay(base, measured)


def replace_table(tables: tuple[TuningTable, ...], table: TuningTable) -> tuple[TuningTable, ...]:
    """``tables`` with ``table`` in place of the one of its device (or added)."""
    return _by_device((*(t for t in tables if t.device != table.device), table))


def _by_device(tables) -> tuple[TuningTable, ...]:
    return tuple(sorted(tables, key=lambda t: t.device))
