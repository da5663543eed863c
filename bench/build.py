"""Build-system throughput: kernels per minute at 1 and 2 workers, no-op and one-change rebuilds.

Method: a fixed 16-kernel sm90 catalog (4 tiles x 2 clusters x 2 dtypes,
one explicit item per kernel) is written into a temporary project copied
from this checkout's templates and facts. Every number is the wall time of
the real command line (``tilekiln build``, a fresh process, CLI start-up
included), because that is what a developer or CI waits for:

* cold builds with ``-j 1`` and ``-j 2``, each from an empty cache, so every
  kernel is compiled and the library linked, ``--cold-repeats`` of each,
  interleaved (kernels/min = 16 / median wall * 60);
* the no-op rebuild (everything cached, the bundle already current), the
  median of ``--repeats`` runs, for the 16-kernel catalog and for this
  checkout's default catalog;
* one-config-change rebuilds: one item's ``swizzle`` is set to a value not
  built before (a new kernel id), so exactly one kernel compiles and the
  library relinks; the median of ``--repeats`` changes (at most 4).

    python3 bench/build.py --json bench/results/build-$(date +%F).json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from project import scratch_project  # bench/project.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
TILES = ([128, 128, 64], [128, 256, 64], [64, 128, 64], [64, 256, 64])
CLUSTERS = ([1, 1], [2, 1])
DTYPES = ("bf16", "f16")
SWIZZLES = (2, 4, 8, 16)  # the valid values besides the default 1: one fresh kernel each


def catalog_text(swizzle_of_first: int = 1) -> str:
    lines = ["pipeline: sm90", "targets: [sm_90a]", "defaults:", "  layout: tn", "kernels:"]
    first = True
    for dtype in DTYPES:
        for tile in TILES:
            for cluster in CLUSTERS:
                lines += [f"  - dtypes: {{a: {dtype}, b: {dtype}, acc: f32, c: {dtype}}}",
                          f"    tile: {tile}", f"    cluster: {cluster}"]
                if first:
                    lines.append(f"    swizzle: {swizzle_of_first}")
                    first = False
    return "\n".join(lines) + "\n"


def tilekiln(project: Path, out: Path, cache: Path, *args: str) -> tuple[float, dict]:
    """Run ``tilekiln build``; return its wall seconds and its build report."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-c", "from builder.cli.entry import main; main()", "--root", str(project), "build",
           "--out", str(out), "--cache", str(cache), "--progress", "none", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"tilekiln build failed ({proc.returncode}):\n{proc.stderr}")
    return wall, json.loads((out / "sm90a" / "build-report.json").read_text())


def statuses(report: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in report["kernels"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each rebuild measurement")
    p.add_argument("--cold-repeats", type=int, default=5, help="cold builds at each worker count")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tilekiln-bench-") as tmp:
        base = Path(tmp)
        project = scratch_project(base / "project", catalog_text())
        cold: dict[int, list[float]] = {1: [], 2: []}
        compile_seconds: dict[int, list[float]] = {1: [], 2: []}  # summed over kernels, as workers report them
        for attempt in range(args.cold_repeats):  # interleaved, so machine noise hits both alike
            for jobs in (1, 2):
                out, cache = base / f"out-j{jobs}-{attempt}", base / f"cache-j{jobs}-{attempt}"
                wall, report = tilekiln(project, out, cache, "-j", str(jobs))
                assert statuses(report) == {"compiled": 16}, statuses(report)
                cold[jobs].append(wall)
                compile_seconds[jobs].append(sum(r["compile_seconds"] for r in report["kernels"]))
                print(f"cold build, -j {jobs}: {wall:.1f} s, {16 / wall * 60:.1f} kernels/min", flush=True)
        for jobs, walls in cold.items():
            median = statistics.median(walls)
            results[f"cold_j{jobs}"] = {"kernels_per_minute": round(16 / median * 60, 1),
                                        "median_wall_seconds": round(median, 2),
                                        "runs_wall_seconds": [round(w, 2) for w in walls],
                                        "runs_sum_compile_seconds": [round(c, 2) for c in compile_seconds[jobs]]}
        out, cache = base / "out-j2-0", base / "cache-j2-0"
        noop = []
        for _ in range(args.repeats):
            wall, report = tilekiln(project, out, cache)
            assert statuses(report) == {"cached": 16}, statuses(report)
            noop.append(wall)
        results["noop_rebuild_seconds"] = {"median": round(statistics.median(noop), 3),
                                           "runs": [round(x, 3) for x in noop]}
        print(f"no-op rebuild: {statistics.median(noop):.2f} s (median of {len(noop)})", flush=True)
        change = []
        catalog = project / "catalog" / "gemm" / "sm90.yaml"
        for swizzle in SWIZZLES[:args.repeats]:
            catalog.write_text(catalog_text(swizzle))
            wall, report = tilekiln(project, out, cache)
            assert statuses(report) == {"cached": 15, "compiled": 1}, statuses(report)
            change.append(wall)
        results["one_change_rebuild_seconds"] = {"median": round(statistics.median(change), 3),
                                                 "runs": [round(x, 3) for x in change]}
        print(f"one-config-change rebuild: {statistics.median(change):.2f} s (median of {len(change)})", flush=True)
        default_out, default_cache = base / "out-default", base / "cache-default"
        tilekiln(ROOT, default_out, default_cache)
        default_noop = [tilekiln(ROOT, default_out, default_cache)[0] for _ in range(args.repeats)]
        results["default_catalog_noop_rebuild_seconds"] = {"median": round(statistics.median(default_noop), 3),
                                                           "runs": [round(x, 3) for x in default_noop]}
        print(f"no-op rebuild of the default catalog: {statistics.median(default_noop):.2f} s", flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    report = {"date": datetime.date.today().isoformat(), "benchmark": "bench/build.py",
              "machine": {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version()},
              "catalog": {"kernels": 16, "tiles": list(TILES), "clusters": list(CLUSTERS), "dtypes": list(DTYPES)},
              "results": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
