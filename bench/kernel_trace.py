"""Where a graph-replayed GEMM's time goes: each side's kernel duration and the gap between
consecutive launches, from a CUPTI trace (torch.profiler), tilekiln next to cuBLAS.

bench/gemm.py's graph timing reads one number per call: the kernel plus whatever lies
between two kernels. This splits it, so a shortfall at a small problem can be put on the
kernel itself or on its start-up: a negative gap means the next launch started before the
previous one ended (programmatic dependent launch).

    python3 bench/kernel_trace.py --bundle artifacts/sm90a --shapes 1024x1024x1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/kernel_trace.py")
import tilekiln  # noqa: E402
from tilekiln.tune import parse_shapes  # noqa: E402
from tilekiln.tuning.timing import (GRAPH_LAUNCHES, CaptureError, baseline_call, graphed,  # noqa: E402
                                    operand_sets, tilekiln_call, warm_ms)

REPLAYS = 20


def trace(replay) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel of ``REPLAYS`` graph replays, in start order."""
    for i in range(3):
        replay(i)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(REPLAYS):
            replay(i)
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(kernels, key=lambda k: k[1])


def summary(kernels: list[tuple[str, float, float]]) -> dict:
    durations = [end - start for _, start, end in kernels]
    gaps = [b[1] - a[2] for a, b in zip(kernels, kernels[1:])]
    periods = [b[1] - a[1] for a, b in zip(kernels, kernels[1:])]
    return {"kernels": len(kernels), "names": sorted({name for name, _, _ in kernels}),
            "duration_us": round(statistics.median(durations), 3),
            "period_us": round(statistics.median(periods), 3),
            "gap_us": round(statistics.median(gaps), 3),
            "min_gap_us": round(min(gaps), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, action="append", required=True,
                        help="bundle directory (repeatable: the same kernels of several builds side by side)")
    parser.add_argument("--shapes", type=parse_shapes, required=True)
    parser.add_argument("--dtype", choices=["bf16", "e4m3"], default="bf16")
    parser.add_argument("--kernel", action="append", default=[],
                        help="trace this kernel of every bundle (repeatable); default: each bundle's choice")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    bundles = {f"{path.parent.name}/{path.name}": tilekiln.load(path) for path in args.bundle}
    fp8 = args.dtype == "e4m3"
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    scales = (torch.ones(1, device="cuda"), torch.ones(1, device="cuda")) if fp8 else None
    rows = []
    for (m, n, k) in args.shapes:
        sets = operand_sets(m, n, k, dtype, torch.bfloat16)

        def ours(bundle, kernel):
            return lambda i: tilekiln_call(bundle, *sets[i % len(sets)], scales, kernel)

        sides = {"cublas": lambda i: baseline_call(*sets[i % len(sets)], scales)}
        for name, bundle in bundles.items():
            if not args.kernel:
                sides[f"{name} choice"] = ours(bundle, None)
            sides.update({f"{name} {kernel}": ours(bundle, kernel) for kernel in args.kernel})
        for side, fn in sides.items():
            warm_ms(fn)
            row = {"shape": [m, n, k], "side": side, "launches_per_graph": GRAPH_LAUNCHES,
                   **summary(trace(graphed(fn, f"{m}x{n}x{k} {side}")))}
            rows.append(row)
            print(f"{m:6d}x{n:6d}x{k:6d} {side:80s} kernel {row['duration_us']:8.3f} us  "
                  f"period {row['period_us']:8.3f}  gap {row['gap_us']:7.3f} (min {row['min_gap_us']:7.3f})  "
                  f"{','.join(row['names'])[:90]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "dtype": args.dtype,
                                         "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    try:
        main()
    except CaptureError as exc:
        raise SystemExit(f"kernel_trace.py: {exc}")
