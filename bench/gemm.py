"""GEMM throughput of tilekiln's own selection next to cuBLAS (torch.matmul), same run.

Method (../shared/reference/gpu-method.md): every kernel is checked against a
float64 reference before it is timed; tilekiln and torch are timed
interleaved, shape by shape, with CUDA events around each of many launches
queued back to back after warm-up (GPU time; ``tilekiln.tuning.timing.median_event_ms``),
the median, inputs rotated when a problem is smaller than the L2. Each timed
block runs right after ``--settle-ms`` of untimed launches of its own side
(``tilekiln.tuning.timing.steady_ms``): at the H200's power cap a block otherwise runs
at the clock the other side's power draw left (bench/README.md, "Block
length"). Both sides' launches are replayed from CUDA graphs
(``tilekiln.tuning.timing.GRAPH_LAUNCHES`` says why), so the host's cost per call drops
out: kernel against kernel. ``--timing eager`` times the calls themselves, as
an eager PyTorch program issues them. The whole suite runs ``--repeats``
times and the spread is reported, since the H200's clocks drift under
sustained load.

    python3 bench/gemm.py --bundle artifacts/sm90a --json bench/results/h200-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/gemm.py")
import tilekiln  # noqa: E402
from tilekiln.tuning.timing import (GRAPH_LAUNCHES, SETTLE_MS, CaptureError, baseline_call,  # noqa: E402
                                    block_launches, graph_ms, graphed, operand_sets, settle_launches, steady_ms,
                                    tilekiln_call, warm_ms)



def shape_suite() -> list[tuple[int, int, int]]:
    shapes = [(s, s, s) for s in (1024, 2048, 4096, 8192)]
    hidden = (4096, 8192)
    for m in (256, 2048, 8192, 16384):
        for h in hidden:
            shapes.append((m, 3 * h, h))      # fused QKV projection
            shapes.append((m, h, h))          # attention output projection
        for h, f in ((4096, 14336), (8192, 28672)):
            shapes.append((m, f, h))          # MLP up
            shapes.append((m, h, f))          # MLP down
    for m in (16, 64, 128):
        shapes.append((m, 8192, 8192))
    return shapes


FP8 = torch.float8_e4m3fn
SCALE_A, SCALE_B = 0.5, 0.25


def check(bundle, a, b, scales) -> float:
    out = tilekiln_call(bundle, a, b, None, scales)
    ref = torch.matmul(a.double(), b.double()) * (1.0 if scales is None else SCALE_A * SCALE_B)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2 or torch.isnan(out).any():
        raise SystemExit(f"numerics check failed for {tuple(a.shape)}x{tuple(b.shape)}: relative error {err}")
    return err


def block_timer(fn, iters: int, settle_ms: float, graph: bool, side: str):
    """A function timing one block of about ``iters`` calls of ``fn`` after ``settle_ms`` of
    untimed ones, in ms per call: replays of ``tilekiln.tuning.timing.graphed(fn)`` (GPU time only), or
    with ``graph`` false the calls themselves (``steady_ms``; the host's cost per call included
    wherever it exceeds the GPU's). The settle count comes from the same way of timing, since
    at small problems an eager call's host cost would make it too short."""
    launch_ms = warm_ms(fn)  # also the warm-up ``graphed`` needs before capture
    if not graph:
        settle = settle_launches(launch_ms, settle_ms)
        return lambda: steady_ms(fn, iters, settle)
    replay = graphed(fn, side)
    settle = settle_launches(warm_ms(replay) / GRAPH_LAUNCHES, settle_ms)
    return lambda: graph_ms(replay, iters, settle)


def run(args) -> dict:
    bundle = tilekiln.load(args.bundle)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": FP8}[args.dtype]
    scales = None
    if dtype == FP8:
        scales = (torch.tensor([SCALE_A], device="cuda"), torch.tensor([SCALE_B], device="cuda"))
    shapes = shape_suite() if not args.quick else [(8192, 8192, 8192), (4096, 4096, 4096), (128, 8192, 8192)]
    rows = {s: {"tilekiln": [], "torch": []} for s in shapes}
    chosen = {}
    for rep in range(args.repeats):
        for (m, n, k) in shapes:
            sets = operand_sets(m, n, k, dtype, torch.bfloat16 if dtype == FP8 else dtype)
            a0, b0, _ = sets[0]
            if rep == 0:
                explained = bundle.explain(a0, b0, out_dtype=None if scales is None else "bf16")
                chosen[(m, n, k)] = (explained.kernel.id, check(bundle, a0, b0, scales))
            flops = 2 * m * n * k
            pick = lambda i: sets[i % len(sets)]  # noqa: E731
            tk = lambda i: tilekiln_call(bundle, *pick(i), scales)  # noqa: E731
            th = lambda i: baseline_call(*pick(i), scales)  # noqa: E731
            iters = block_launches(flops)
            time_tk, time_th = (block_timer(fn, iters, args.settle_ms, args.timing == "graph",
                                            f"{m}x{n}x{k} {side}") for fn, side in ((tk, "tilekiln"), (th, "torch")))
            # Interleave blocks so drift hits both sides alike; each block runs
            # after its own side has settled the clock (tilekiln.tuning.timing.SETTLE_MS).
            t_tk, t_th = [], []
            for _ in range(4):
                t_tk.append(time_tk())
                t_th.append(time_th())
            rows[(m, n, k)]["tilekiln"].append(flops / statistics.median(t_tk) / 1e9)
            rows[(m, n, k)]["torch"].append(flops / statistics.median(t_th) / 1e9)
            r = rows[(m, n, k)]
            print(f"rep {rep} {m:6d}x{n:6d}x{k:6d}  tilekiln {r['tilekiln'][-1]:7.1f}  torch {r['torch'][-1]:7.1f}  "
                  f"ratio {r['tilekiln'][-1] / r['torch'][-1]:.3f}  {chosen[(m, n, k)][0]}", flush=True)
            sets = time_tk = time_th = None  # free the operands (and graphs) before the next shape
    results = []
    for (m, n, k), r in rows.items():
        tk, th = statistics.median(r["tilekiln"]), statistics.median(r["torch"])
        results.append({
            "m": m, "n": n, "k": k, "dtype": args.dtype, "kernel": chosen[(m, n, k)][0],
            "relative_error": chosen[(m, n, k)][1],
            "tilekiln_tflops": round(tk, 1), "torch_tflops": round(th, 1), "ratio": round(tk / th, 4),
            "tilekiln_runs": [round(x, 1) for x in r["tilekiln"]], "torch_runs": [round(x, 1) for x in r["torch"]],
            "ratio_runs": [round(x / y, 4) for x, y in zip(r["tilekiln"], r["torch"])],
        })
    ratios = [x["ratio"] for x in results]
    summary = {"geomean_ratio": round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 4),
               "min_ratio": min(ratios), "shapes": len(results)}
    return {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "bundle": bundle.name, "bundle_version": bundle.version,
            "repeats": args.repeats, "settle_ms": args.settle_ms, "timing": args.timing,
            "summary": summary, "results": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "e4m3"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="three shapes only")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS,
                   help="untimed launches of the same side before each timed block (0: none)")
    p.add_argument("--timing", default="graph", choices=["graph", "eager"],
                   help="graph: replays of CUDA graphs of each side's launches, GPU time only (the default); "
                        "eager: the calls themselves, host cost included where it exceeds the GPU's")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    try:
        report = run(args)
    except CaptureError as exc:
        raise SystemExit(f"bench/gemm.py: {exc}; time the calls themselves with --timing eager")
    print(json.dumps(report["summary"]))
    print(f"{'shape':>22s} {'tilekiln':>9s} {'torch':>9s} {'ratio':>7s}  kernel")
    for r in report["results"]:
        print(f"{r['m']:6d}x{r['n']:6d}x{r['k']:6d} {r['tilekiln_tflops']:9.1f} {r['torch_tflops']:9.1f} "
              f"{r['ratio']:7.3f}  {r['kernel']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
