"""The tune command: measure which kernel is fastest per shape bucket and keep the table beside the bundle.

    python3 -m tilekiln.tune BUNDLE_DIR [--shapes 4096x4096x4096,...] [--model config.json ...]
                             [--dtype bf16|f16|e4m3] [--iters N] [--settle-ms MS]
                             [--table-out catalog/tuning/<bundle>/<device>.json]

``--model`` (repeatable) adds every linear layer of a Hugging Face style config at the tuning
half of the token grid (tilekiln/tuning/models.py), so the held-out half stays unseen for
bench/sweep.py.

Runs on a GPU with torch, on the current CUDA device; tilekiln/tuning/policy.py
says what it measures and tilekiln/tuning/timing.py how. After every shape,
the buckets measured so far are written to the bundle's tuning file,
``BUNDLE_DIR/tuning.json`` (tilekiln/tuning/table.py), over what earlier tunes
of the bundle wrote in the table of this device's SKU; the tables of other
SKUs in the file are kept as they are, and the manifest, which the build
wrote and hashed, is left as it is. The runtime then prefers the tuned kernel
on devices of this SKU (and on those whose nearest SKU it is:
tilekiln/tuning/sku.py) for every problem in those buckets whose contract it
accepts: a process that opens the bundle reads the file, and this process's
open Bundle is told to read it again (``Bundle.reload_tuning``).
After the last shape (and after ``--merge``), the selection model's constants are fitted to all
of the table's measurements (tilekiln/tuning/fit.py) and kept as its ``model``, so the shapes no
bucket holds are ranked as this card ranks them.
``--table-out`` also writes this device's whole table (its build-time table of
the same device, if any, with the file's buckets over it; never another
SKU's): committed as ``catalog/tuning/<bundle>/<device>.json``, every later
build ships it (builder/package/manifest.py).

    python3 -m tilekiln.tune BUNDLE_DIR --merge RUN1.json RUN2.json ... [--table-out FILE]

needs no GPU: it picks each bucket's winner again from the measurements of
several earlier runs of one device (their ``--table-out`` files;
tilekiln/tuning/merge.py) and writes the result, as that device's table, the
same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tilekiln._files import write_atomic
from tilekiln.errors import BundleError
from tilekiln.manifest import MANIFEST_NAME, Sku
from tilekiln.tuning.fit import fit, samples
from tilekiln.tuning.merge import combine, mergeable, read_run
from tilekiln.tuning.models import ConfigError, linear_layers, read_config, split_held_out, token_grid
from tilekiln.tuning.models import shapes as models_shapes
from tilekiln.tuning.policy import DEFAULT_SHAPES, tune
from tilekiln.tuning.table import TUNING_NAME, add_measured, overlay, replace_table, table_of, write_tuning_file
from tilekiln.tuning.timing import SETTLE_MS, CaptureError, require_cuda_torch


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``MxNxK,...`` as (m, n, k) tuples; SystemExit naming ``--shapes`` and the bad item."""
    shapes = []
    for item in filter(None, text.split(",")):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--shapes: {item!r} is not MxNxK with positive integers")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def model_shapes(configs: list[Path]) -> list[tuple[int, int, int]]:
    """The (M, N, K) of every linear layer of ``configs`` at the tuning half of the token grid;
    SystemExit naming ``--model`` and the file when a config does not read."""
    tuning, _ = split_held_out(token_grid())
    out: list[tuple[int, int, int]] = []
    for path in configs:
        try:
            out += models_shapes(linear_layers(read_config(path), str(path)), tuning)
        except ConfigError as exc:
            raise SystemExit(f"--model: {exc}") from None
    return list(dict.fromkeys(out))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m tilekiln.tune", description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--shapes", default=None, help="comma-separated MxNxK list (default: an LLM shape grid)")
    p.add_argument("--model", type=Path, action="append", default=[], metavar="CONFIG.json",
                   help="tune every linear layer of this model config at the tuning half of the token grid")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "e4m3"])
    p.add_argument("--iters", type=int, default=20, help="launches per candidate in the screen")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS,
                   help="untimed launches of the same kernel before each steady-state block (0: none)")
    p.add_argument("--table-out", type=Path, default=None,
                   help="also write this device's table to this file (catalog/tuning/<bundle>/<device>.json)")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="RUN.json",
                   help="no measuring: choose from these earlier runs' --table-out files")
    args = p.parse_args(argv)
    if args.merge:
        read = [read_run(path) for path in args.merge]
        runs = [m for m, _ in read]
        # One card model by name: drivers reserve a few MiB more or less of one card's memory, so
        # runs of one model on two hosts may state different memory; the first run's facts stand.
        if len({d.name for _, d in read}) != 1:
            raise SystemExit(f"--merge: the runs come from different devices "
                             f"({', '.join(sorted({_describe(d) for _, d in read}))})")
        bundle = _load(args.bundle)
        runs, copies = mergeable(runs, {kernel.id for kernel in bundle.kernels})
        if copies:
            print(f"--merge: left out {copies} copied or merged entries (each run's own measurements count once)",
                  file=sys.stderr)
        table = combine(runs)
        _write(args, bundle, bundle.tuning_file, table, read[0][1], fit_model=True)
        print(f"wrote {len(table)} buckets to {bundle.directory / TUNING_NAME}", file=sys.stderr)
        return
    shapes = model_shapes(args.model) + (parse_shapes(args.shapes) if args.shapes else [])
    if not shapes:
        shapes = DEFAULT_SHAPES
    torch = require_cuda_torch("tilekiln tune")
    bundle = _load(args.bundle)
    device = bundle.device(torch.cuda.current_device()).sku
    earlier = bundle.tuning_file
    try:
        table = tune(bundle, shapes, args.dtype, args.iters, args.settle_ms,
                     record=lambda so_far: _write(args, bundle, earlier, so_far, device))
    except CaptureError as exc:
        # The shapes before this one are in the tuning file already (``record``).
        raise SystemExit(f"tilekiln tune: {exc}; the buckets measured before it are written, "
                         "re-run with --shapes leaving that shape out")
    _write(args, bundle, earlier, table, device, fit_model=True)
    print(f"wrote {len(table)} buckets to {bundle.directory / TUNING_NAME}", file=sys.stderr)


def _load(directory: Path):
    """The process's Bundle of ``directory`` (tilekiln.load), verified; SystemExit saying why not."""
    import tilekiln

    try:
        return tilekiln.load(directory)
    except BundleError as exc:
        raise SystemExit(f"tilekiln tune: {directory / MANIFEST_NAME} is not a bundle manifest that loads ({exc})")


def _describe(sku: Sku) -> str:
    return (f"{sku.name}: sm_{sku.compute_capability[0]}{sku.compute_capability[1]}, {sku.sm_count} SMs, "
            f"{sku.memory_mib} MiB")


def _write(args, bundle, earlier, entries: dict[str, dict], device: Sku, fit_model: bool = False) -> None:
    """``entries`` over the table of ``device`` in ``earlier`` (the tuning file's tables), the
    other devices' tables kept, as the bundle's tuning file, which ``bundle`` then selects by;
    with ``--table-out``, also ``device``'s whole table: its build-time table, if the manifest
    has one of this device, with the file's buckets over it. ``fit_model``: also fit the
    selection model to all of that table's measurements (tilekiln/tuning/fit.py) and keep the
    fitted constants as its ``model``."""
    measured = add_measured(table_of(earlier, device.name), entries, device)
    if fit_model:
        whole = overlay(table_of(bundle.manifest.tuning_tables, device.name), measured)
        kernels = {kernel.id: kernel for kernel in bundle.kernels}
        fitted = fit(samples(whole.measurements, kernels), kernels, device.sm_count, device.dram_gbps,
                     log=lambda line: print(line, file=sys.stderr))
        measured = dataclasses.replace(measured, model=fitted.fitted)
    write_tuning_file(bundle.directory, replace_table(earlier, measured), bundle.manifest.sha256)
    bundle.reload_tuning()
    if args.table_out is not None:
        table = overlay(table_of(bundle.manifest.tuning_tables, device.name), measured)
        write_atomic(args.table_out, json.dumps(table.plain(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
