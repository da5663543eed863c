"""Combine the measurements of several tune runs into one table, without a GPU (``tune --merge``).

A single run is a snapshot of a card whose clock moves with its power cap, so
the shipped table (catalog/tuning/<bundle>/<device>.json) combines runs: :func:`combine`
scores each candidate by its geometric-mean time relative to each run's
fastest; :func:`mergeable` first drops what a run's file copied rather than
measured, and kernels the bundle no longer has. Standard library only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tilekiln.manifest import Sku
from tilekiln.splitk import parse_label
from tilekiln.tuning.table import TIME_DECIMALS


def combine(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """One table from the ``measurements`` of several tune runs.

    Per bucket, each candidate that every run measured there is scored by the
    geometric mean, over the runs, of its time relative to that run's fastest;
    the lowest score wins, and the entry records the geometric-mean time of
    each such candidate. A single run is a snapshot of a card whose clock
    moves with its power cap: on the H200 two runs of the same bundle half an
    hour apart picked different kernels for 107 of 164 buckets, and at
    2048x8192x28672 bf16 one table's pick ran at 0.91 of cuBLAS where the
    other's ran at 1.02 (bench/README.md), so the shipped table combines runs.
    """
    table: dict[str, dict] = {}
    for bucket in sorted({b for run in runs for b in run}):
        entries = [run[bucket] for run in runs if bucket in run]
        common = set.intersection(*(set(e["candidates"]) for e in entries))
        if not common:
            continue
        fastest = [min(e["candidates"][c] for c in common) for e in entries]
        score = {c: _geomean([e["candidates"][c] / f for e, f in zip(entries, fastest)]) for c in common}
        times = {c: round(_geomean([e["candidates"][c] for e in entries]), TIME_DECIMALS) for c in sorted(common)}
        best = min(sorted(common), key=score.get)
        first = entries[0]
        table[bucket] = {"kernel": best, "flops": first["flops"], "shape": first["shape"],
                         "tflops": round(first["flops"] / times[best] / 1e9, 1), "candidates": times,
                         "runs": len(entries)}
        if all("baseline_ms" in e for e in entries):
            table[bucket]["baseline_ms"] = round(_geomean([e["baseline_ms"] for e in entries]), TIME_DECIMALS)
    return table


def mergeable(runs: list[dict[str, dict]], kernel_ids: set[str]) -> tuple[list[dict[str, dict]], int]:
    """The runs' own measurements of the kernels in ``kernel_ids``, and how many entries were
    left out as copies.

    A ``--table-out`` file holds the whole table its bundle selects by (the
    build-time table with the tuning file's buckets over it), so besides
    the buckets its run measured it carries copies: of an earlier run's
    entries (equal to that run's), or of a merged table's (which have
    ``runs``). Counted again, a copy weighs one run twice or mixes in
    measurements of another bundle; each is kept once, merged ones never.
    A kernel dropped from the catalog since a run measured it cannot be the
    table's pick; a bucket left without candidates is left out.
    """
    seen: set[tuple[str, str]] = set()
    kept, copies = [], 0
    for run in runs:
        out = {}
        for bucket, entry in run.items():
            key = (bucket, json.dumps(entry["candidates"], sort_keys=True))
            if "runs" in entry or key in seen:
                copies += 1
                continue
            seen.add(key)
            candidates = {label: t for label, t in entry["candidates"].items() if parse_label(label)[0] in kernel_ids}
            if candidates:
                out[bucket] = dict(entry, candidates=candidates)
        kept.append(out)
    return kept, copies


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def read_run(path: Path) -> tuple[dict[str, dict], Sku]:
    """(measurements, the device's SKU) of a ``--table-out`` file; SystemExit naming the file if it
    is not one."""
    try:
        data = json.loads(path.read_text())
        measurements, device = data["measurements"], Sku.from_plain(data)
        for bucket, entry in measurements.items():
            if not (entry["candidates"] and all(t > 0 for t in entry["candidates"].values())
                    and entry["flops"] > 0 and len(entry["shape"]) == 3):
                raise ValueError(f"bucket {bucket}: no positive candidate times, flops and shape")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"--merge {path}: not a tuning file written by --table-out ({exc})")
    return measurements, device
