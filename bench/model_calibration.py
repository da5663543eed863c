"""The selection model's estimates in microseconds against a sweep's measured times (no GPU).

A sweep (bench/sweep.py) records, per shape, the time of the kernel tilekiln chose. The model
(tilekiln/select.py) prices a kernel in multiply-add times of one SM, which
``ModelParams.sm_macs_per_us`` turns into microseconds, so each measured time can be set against
its estimate; ``--dram-gbps`` moves the model to the sweep card's DRAM bandwidth, as the runtime
does for the device it runs on (tilekiln/model.py, on_device; an H100 SXM's is 3352). Grouped by the kind of tile (128-row cooperative, 64-row cooperative, 64- and
128-row ping-pong, swapped, split-K), the median of measured over estimated says whether the
model prices one kind consistently with the others, which is what ranking needs; the spread
(standard deviation of its logarithm) says how well it follows the shapes. ``--set NAME=VALUE``
overrides a constant, to see what a value would do.

    python3 bench/model_calibration.py bench/results/h100-2026-12-07-sweep-bf16-shard1of4-partial.json
    python3 bench/model_calibration.py SWEEP.json --set lone_warpgroup=1.0 --set step_us=0
    python3 bench/model_calibration.py SWEEP.json --dram-gbps 3352
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.manifest import read_manifest  # noqa: E402
from tilekiln.model import model_of, on_device  # noqa: E402
from tilekiln.select import mma_rate  # noqa: E402
from tilekiln.splitk import parse_label  # noqa: E402
from tilekiln.tuning.fit import model_time, problem_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def kind(kernel, split: int) -> str:
    c = kernel.config
    if split > 1:
        return "split-K"
    if c.swap_ab:
        return "swapped"
    return f"{c.tile.m}-row {c.schedule.value}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", type=Path, nargs="+")
    p.add_argument("--bundle", type=Path, default=ROOT / "artifacts" / "sm90a")
    p.add_argument("--sm-count", type=int, default=132)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--dram-gbps", type=float, default=None, help="the sweep card's peak DRAM bandwidth (GB/s)")
    args = p.parse_args()
    model = on_device(model_of(tuple((name, float(value)) for name, value in (item.split("=", 1) for item in args.set))),
                      args.dram_gbps)
    kernels = {k.id: k for k in read_manifest(args.bundle, verify=False).kernels}
    ratios: dict[str, list[float]] = {}
    for path in args.sweeps:
        sweep = json.loads(path.read_text())
        dtype = sweep["dtype"]
        for r in sweep["results"]:
            kernel_id, split = parse_label(r["kernel"])
            if kernel_id not in kernels:
                continue
            problem = problem_of(f"{dtype}/{dtype}->bf16:tn:0x0x0:1", [r["m"], r["n"], r["k"]])
            us = model_time(r["kernel"], problem, kernels, args.sm_count, model) / model.sm_macs_per_us / mma_rate(problem)
            ratios.setdefault(kind(kernels[kernel_id], split), []).append(r["tilekiln_us"] / us)
    every = [math.log(x) for v in ratios.values() for x in v]
    print(f"{len(every)} shapes, sd(log measured/estimated) {statistics.pstdev(every):.3f}")
    for name, v in sorted(ratios.items()):
        logs = [math.log(x) for x in v]
        print(f"  {name:22s} {len(v):4d} shapes  measured/estimated median {statistics.median(v):.2f}  "
              f"sd(log) {statistics.pstdev(logs):.2f}")


if __name__ == "__main__":
    main()
