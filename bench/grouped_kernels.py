"""Every plain bf16 grouped kernel of a bundle, pinned, next to the selection's pick,
torch._grouped_mm and a dense GEMM of the same FLOPs: which tile and cluster wins where, and how
far the selection is from the fastest.

The layers and the skewed routing are bench/moe.py's. Each layer runs twice: with the skewed
row counts (most groups end inside a tile) and with every count rounded up to a multiple of 128
(no partial tile on the 128-row kernels), which separates the cost of partial tiles from the
rest. Before timing, every pinned kernel is checked against float64 on routings with empty,
one-row and odd-sized groups, its output poisoned with NaN first. Timing is bench/moe.py's: CUDA
graphs, the sides interleaved for ``--rounds`` rounds, the median per side.

    python3 bench/grouped_kernels.py --bundle artifacts/sm90a --json bench/results/h100-<date>-grouped-kernels.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/grouped_kernels.py")
import tilekiln  # noqa: E402
from moe import LAYERS, SETTLE_MS, interleaved_medians, routing, timer  # noqa: E402

CHECKS = ([0, 1, 129, 300, 0, 257, 5, 640], [1000, 0, 0, 17], [3] * 16)


def plain_grouped(bundle) -> list[str]:
    return sorted(k.id for k in bundle.kernels if k.config.family == "grouped" and k.config.dtypes.a.value == "bf16"
                  and not k.config.activation.gated and k.config.scaling.value == "tensor")


def check(bundle, kernels: list[str], gen) -> None:
    """Each kernel against float64 on the CHECKS routings (N 384, K 256)."""
    n, k = 384, 256
    for counts in CHECKS:
        groups = len(counts)
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        a = torch.randn(sum(counts), k, device="cuda", generator=gen).to(torch.bfloat16)
        w = torch.randn(groups, n, k, device="cuda", generator=gen).to(torch.bfloat16)
        ends = [0] + offs.tolist()
        ref = torch.cat([a[ends[g]:ends[g + 1]].double() @ w[g].double().t() for g in range(groups)])
        for kid in kernels:
            out = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm(a, w.transpose(1, 2), offs, out=out, kernel=kid)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if torch.isnan(out).any() or not err < 1e-2:
                raise SystemExit(f"numerics check failed: {kid} on rows {counts}: error {err:.3g}")


def run_layer(bundle, kernels: list[str], name: str, counts, args) -> dict:
    groups, hidden, n, _ = LAYERS[name]
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    w = (torch.randn(groups, n, hidden, device="cuda", generator=gen) / hidden ** 0.5).to(torch.bfloat16)
    b = w.transpose(1, 2)
    rows = int(counts.sum())
    offs = counts.cumsum(0).to(torch.int32)
    a = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    dense_b = w[0].t()
    flops = 2 * rows * n * hidden
    iters = max(5, min(100, int(1e13 / flops)))
    sides = {kid: (lambda *_, kid=kid: bundle.grouped_gemm(a, b, offs, out=out, kernel=kid)) for kid in kernels}
    sides["selected"] = lambda *_: bundle.grouped_gemm(a, b, offs, out=out)
    sides["torch_grouped_mm"] = lambda *_: torch._grouped_mm(a, b, offs=offs)
    sides["dense"] = lambda *_: torch.mm(a, dense_b, out=out)
    medians = interleaved_medians({s: timer(f, iters, args.settle_ms, s) for s, f in sides.items()}, args.rounds)
    tflops = {s: round(flops / ms / 1e9, 1) for s, ms in medians.items()}
    fastest = max(kernels, key=lambda kid: tflops[kid])
    return {"rows": rows, "tflops": tflops, "selected_kernel": bundle.explain_grouped(a, b, offs).label,
            "fastest_kernel": fastest, "selected_vs_fastest": round(tflops["selected"] / tflops[fastest], 4),
            "selected_vs_torch": round(tflops["selected"] / tflops["torch_grouped_mm"], 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", default="artifacts/sm90a", help="bundle name or directory")
    p.add_argument("--layers", default=",".join(LAYERS), help="comma-separated, of: " + ", ".join(LAYERS))
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--skew", type=float, default=1.0, help="routing skew: probability ~ rank^-skew")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timed blocks per side")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    bundle = tilekiln.load(args.bundle)
    kernels = plain_grouped(bundle)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    check(bundle, kernels, gen)
    results = []
    for name in args.layers.split(","):
        groups, _, _, top_k = LAYERS[name]
        skewed = routing(groups, args.tokens, top_k, args.skew, gen)
        for label, counts in (("skewed", skewed), ("aligned128", (skewed + 127) // 128 * 128)):
            row = {"layer": name, "tokens": args.tokens, "routing": label, **run_layer(bundle, kernels, name, counts, args)}
            print(json.dumps(row), flush=True)
            results.append(row)
    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "bundle": str(args.bundle), "skew": args.skew, "rounds": args.rounds,
              "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
