"""Mixture-of-experts grouped GEMMs: tilekiln.grouped_gemm next to torch._grouped_mm, a loop of
per-expert matmuls and a dense GEMM of the same FLOPs, in one run.

Each layer is the gate_up GEMM of an expert MLP (N = 2 x the expert's intermediate size) in
torch._grouped_mm's contiguous layout: ``tokens`` tokens each pick ``top_k`` experts, drawn
from a skewed distribution (probabilities proportional to rank^-skew over a random order of
the experts, so a few experts take many rows and some none), rows sorted by expert. Before
timing, tilekiln's result is checked against a float64 reference on a sample of groups (every
group when there are few), its output poisoned with NaN first.

Method (bench/README.md): every side is captured in a CUDA graph of
``tilekiln.tuning.timing.GRAPH_LAUNCHES`` launches and timed by replays (GPU time only), the
sides interleaved block by block for ``--rounds`` rounds after ``--settle-ms`` of their own
untimed launches; the median per side. The per-expert loop reads the routing on the host once,
before capture (it is what an eager MoE layer without a grouped kernel runs); tilekiln and
torch._grouped_mm read ``offs`` on the device. The dense GEMM multiplies all the layer's rows by
one expert's weights: the same FLOPs with no grouping, the bar the issue sets.

``--swiglu`` (bf16) also times the expert MLP's whole gate_up step: ``tilekiln.grouped_swiglu`` (the
product silu(gate) * up in the grouped GEMM's epilogue, on the weight ``swiglu_weight`` converts once)
against torch eager's ``torch._grouped_mm`` then ``silu(gate) * up`` on its (rows, 2I) result.

``--masked 1,8,64`` also times the masked layout (tilekiln.grouped_gemm_masked) at those rows per
expert against the per-expert loop (bf16).

    python3 bench/moe.py --bundle artifacts/sm90a --masked 1,8,64 --json bench/results/h200-<date>-moe.json
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

torch = require_cuda_torch("bench/moe.py")
import tilekiln  # noqa: E402
from tilekiln.tuning.timing import (GRAPH_LAUNCHES, SETTLE_MS, graph_ms, graphed,  # noqa: E402
                                    settle_launches, warm_ms)

# name: (experts in the GEMM, hidden size K, N = 2 x expert intermediate size, top-k)
LAYERS = {
    "mixtral-8x7b": (8, 4096, 2 * 14336, 2),
    "qwen3-30b-a3b": (128, 2048, 2 * 768, 8),
    # 256 routed experts over 8 ranks of expert parallelism: 32 on this GPU, the rows it receives.
    "deepseek-v3-ep8": (32, 7168, 2 * 2048, 8),
    "dbrx": (16, 6144, 2 * 10752, 4),
    "olmoe-1b-7b": (64, 2048, 2 * 1024, 8),
}
TOKENS = (128, 512, 2048, 4096, 16384)
SIDES = ("tilekiln", "torch_grouped_mm", "loop", "dense")
FP8 = torch.float8_e4m3fn


def routing(groups: int, tokens: int, top_k: int, skew: float, gen) -> torch.Tensor:
    """Rows per expert of ``tokens`` tokens routed top-``top_k`` under a skewed distribution."""
    weights = torch.arange(1, groups + 1, device="cuda", dtype=torch.float64) ** -skew
    weights = weights[torch.randperm(groups, device="cuda", generator=gen)]
    picks = torch.multinomial(weights.expand(tokens, groups), top_k, replacement=False, generator=gen)
    return torch.bincount(picks.flatten(), minlength=groups)


def check(out, a, w, offs, scale: float) -> float:
    """Relative error of ``out`` against float64 on up to 8 groups (the largest and a spread of others)."""
    ends = [0] + offs.tolist()
    sizes = [ends[g + 1] - ends[g] for g in range(len(ends) - 1)]
    order = sorted(range(len(sizes)), key=lambda g: -sizes[g])
    sample = sorted(set(order[:1] + order[:: max(1, len(order) // 7)]))[:8]
    num = den = 0.0
    for g in sample:
        rows = slice(ends[g], ends[g + 1])
        if ends[g + 1] == ends[g]:
            continue
        ref = a[rows].double() @ w[g].double().t() * scale
        got = out[rows].double()
        if torch.isnan(got).any():
            raise SystemExit(f"numerics check failed: NaN in group {g}")
        num += (got - ref).norm().item() ** 2
        den += ref.norm().item() ** 2
    err = math.sqrt(num / max(den, 1e-300))
    if not err < 1e-2:
        raise SystemExit(f"numerics check failed: relative error {err}")
    return err


def timer(fn, iters: int, settle_ms: float, side: str):
    warm_ms(fn)
    replay = graphed(fn, side)
    settle = settle_launches(warm_ms(replay) / GRAPH_LAUNCHES, settle_ms)
    return lambda: graph_ms(replay, iters, settle)


def interleaved_medians(timers: dict, rounds: int) -> dict:
    """Each side's median ms over ``rounds`` rounds, the sides timed in turn within a round."""
    times = {side: [] for side in timers}
    for _ in range(rounds):
        for side, t in timers.items():
            times[side].append(t())
    return {side: statistics.median(t) for side, t in times.items()}


def run_layer(bundle, name: str, tokens: int, args, gen) -> dict:
    groups, hidden, n, top_k = LAYERS[name]
    counts = routing(groups, tokens, top_k, args.skew, gen)
    m = int(counts.sum())
    offs = counts.cumsum(0).to(torch.int32)
    fp8 = args.dtype == "e4m3"
    a = torch.randn(m, hidden, device="cuda", generator=gen)
    w = torch.randn(groups, n, hidden, device="cuda", generator=gen) / hidden**0.5
    scale_a = scale_b = None
    if fp8:
        a, w = a.to(FP8), w.to(FP8)
        scale_a, scale_b = torch.tensor([0.5], device="cuda"), torch.tensor([2.0], device="cuda")
    else:
        a, w = a.to(torch.bfloat16), w.to(torch.bfloat16)
    b = w.transpose(1, 2)  # nn.Linear weights (G, N, K) as torch._grouped_mm's (G, K, N)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.grouped_gemm(a, b, offs, out=out, scale_a=scale_a, scale_b=scale_b)
    err = check(out, a, w, offs, 1.0)  # the fp8 scales multiply to 1
    kernel = bundle.explain_grouped(a, b, offs).kernel.id
    ends = [0] + offs.tolist()
    dense_b = w[0].t()
    # torch._scaled_grouped_mm takes row-wise scales (a's rows, each group's columns).
    one_a = torch.ones(m, device="cuda") if fp8 else None
    one_b = torch.ones(groups, n, device="cuda") if fp8 else None

    def tk(i):
        bundle.grouped_gemm(a, b, offs, out=out, scale_a=scale_a, scale_b=scale_b)

    def grouped_mm(i):
        if fp8:
            return torch._scaled_grouped_mm(a, b, one_a, one_b, offs=offs, out_dtype=torch.bfloat16)
        return torch._grouped_mm(a, b, offs=offs)

    def loop(i):
        for g in range(groups):
            if ends[g + 1] > ends[g]:
                if fp8:
                    torch._scaled_mm(a[ends[g]:ends[g + 1]], b[g], scale_a=scale_a, scale_b=scale_b,
                                     out_dtype=torch.bfloat16, out=out[ends[g]:ends[g + 1]])
                else:
                    torch.mm(a[ends[g]:ends[g + 1]], b[g], out=out[ends[g]:ends[g + 1]])

    def dense(i):
        if fp8:
            return torch._scaled_mm(a, dense_b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        return torch.mm(a, dense_b, out=out)

    fns = {"tilekiln": tk, "torch_grouped_mm": grouped_mm, "loop": loop, "dense": dense}
    flops = 2 * m * n * hidden
    iters = max(10, min(200, int(2e13 / max(flops, 1))))
    timers, skipped = {}, {}
    for side in SIDES:
        try:
            timers[side] = timer(fns[side], iters, args.settle_ms, f"{name} {tokens} {side}")
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:  # torch lacks it (capture errors too)
            skipped[side] = str(exc).splitlines()[0][:200]
    ms = interleaved_medians(timers, args.rounds)
    tflops = {side: round(flops / v / 1e9, 1) for side, v in ms.items()}
    row = {"layer": name, "tokens": tokens, "rows": m, "groups": groups, "k": hidden, "n": n, "top_k": top_k,
           "empty_groups": int((counts == 0).sum()), "largest_group": int(counts.max()), "dtype": args.dtype,
           "kernel": kernel, "relative_error": err, "tflops": tflops,
           "ms": {side: round(v, 5) for side, v in ms.items()}, "skipped": skipped}
    for side in ("torch_grouped_mm", "loop", "dense"):
        if side in tflops and "tilekiln" in tflops:
            row[f"vs_{side}"] = round(tflops["tilekiln"] / tflops[side], 4)
    if args.swiglu and not fp8:
        row["swiglu"] = time_swiglu(bundle, a, w, offs, iters, args, f"{name} {tokens}")
    return row


def time_swiglu(bundle, a, w, offs, iters: int, args, label: str) -> dict:
    """The gate_up step with SwiGLU: tilekiln's fused grouped kernel against torch._grouped_mm and the
    product in torch, ``w`` (G, 2I, K) holding each expert's [gate; up] rows; checked first on a few
    groups against float64."""
    inter = w.shape[1] // 2
    w_fused = tilekiln.swiglu_weight(w)
    out = torch.full((a.shape[0], inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    tilekiln.grouped_swiglu(a, w_fused, offs, out=out, bundle=bundle)
    ends = [0] + offs.tolist()
    for g in sorted({0, len(ends) // 2 - 1, len(ends) - 2}):
        if ends[g + 1] > ends[g]:
            gu = a[ends[g]:ends[g + 1]].double() @ w[g].double().t()
            ref = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
            err = ((out[ends[g]:ends[g + 1]].double() - ref).norm() / ref.norm()).item()
            if not err < 2e-2:
                raise SystemExit(f"numerics check failed: {label} swiglu group {g}: relative error {err}")
    b = w.transpose(1, 2)

    def torch_swiglu(i):
        gu = torch._grouped_mm(a, b, offs=offs)
        return torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]

    timers = {"tilekiln": timer(lambda i: tilekiln.grouped_swiglu(a, w_fused, offs, out=out, bundle=bundle), iters,
                                args.settle_ms, f"{label} tilekiln swiglu"),
              "torch": timer(torch_swiglu, iters, args.settle_ms, f"{label} torch swiglu")}
    ms = interleaved_medians(timers, args.rounds)
    choice = tilekiln.explain(a, w_fused.transpose(1, 2), offs=offs, activation="swiglu", bundle=bundle)
    return {"kernel": choice.label, "fused": not any(n.startswith("unfused") for n in choice.notes),
            "ms": {side: round(v, 5) for side, v in ms.items()}, "vs_torch": round(ms["torch"] / ms["tilekiln"], 4)}


def run_masked(bundle, name: str, per_expert: int, args, gen) -> dict:
    """Decode through the masked layout: each expert's rows in a slot of M_max = ``per_expert``
    rows, the counts drawn around it (skewed, some experts empty), against the per-expert loop."""
    groups, hidden, n, _ = LAYERS[name]
    weights = torch.arange(1, groups + 1, device="cuda", dtype=torch.float64) ** -args.skew
    share = weights[torch.randperm(groups, device="cuda", generator=gen)] / weights.max()
    counts = (share * per_expert).round().clamp(0, per_expert).to(torch.int32)
    masked_m = counts.clone()
    a = torch.randn(groups, per_expert, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(groups, n, hidden, device="cuda", generator=gen) / hidden**0.5).to(torch.bfloat16)
    b = w.transpose(1, 2)
    out = torch.full((groups, per_expert, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.grouped_gemm_masked(a, b, masked_m, out=out)
    host_counts = counts.tolist()
    for g in range(0, groups, max(1, groups // 8)):
        rows = host_counts[g]
        if rows:
            ref = a[g, :rows].double() @ w[g].double().t()
            err = ((out[g, :rows].double() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                raise SystemExit(f"numerics check failed: masked group {g}: relative error {err}")
    kernel = bundle.explain_grouped(a, b, masked_m, masked=True).kernel.id

    def tk(i):
        bundle.grouped_gemm_masked(a, b, masked_m, out=out)

    def loop(i):
        for g in range(groups):
            if host_counts[g]:
                torch.mm(a[g, :host_counts[g]], b[g], out=out[g, :host_counts[g]])

    flops = 2 * sum(host_counts) * n * hidden
    iters = 50
    timers = {"tilekiln": timer(tk, iters, args.settle_ms, f"{name} masked tilekiln"),
              "loop": timer(loop, iters, args.settle_ms, f"{name} masked loop")}
    ms = interleaved_medians(timers, args.rounds)
    return {"layer": name, "layout": "masked", "m_max": per_expert, "rows": sum(host_counts), "groups": groups,
            "k": hidden, "n": n, "kernel": kernel, "ms": {side: round(v, 5) for side, v in ms.items()},
            "tflops": {side: round(flops / v / 1e9, 1) for side, v in ms.items()},
            "vs_loop": round(ms["loop"] / ms["tilekiln"], 4)}


def geomean(values: list[float]) -> float | None:
    return round(math.exp(statistics.fmean(math.log(v) for v in values)), 4) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", default="sm90a", help="bundle name or directory")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "e4m3"])
    p.add_argument("--layers", default=",".join(LAYERS), help="comma-separated, of: " + ", ".join(LAYERS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--skew", type=float, default=1.0, help="routing skew: probability ~ rank^-skew")
    p.add_argument("--masked", default="", help="also time the masked layout at these rows per expert "
                   "(M_max), e.g. 1,8,64")
    p.add_argument("--swiglu", action="store_true", help="bf16: also time the gate_up step with SwiGLU fused "
                   "against torch._grouped_mm and the product in torch")
    p.add_argument("--rounds", type=int, default=4, help="interleaved timed blocks per side")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    bundle = tilekiln.load(args.bundle)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows = []
    for name in args.layers.split(","):
        for tokens in map(int, args.tokens.split(",")):
            row = run_layer(bundle, name, tokens, args, gen)
            rows.append(row)
            t = row["tflops"]
            print(f"{name:16s} {tokens:6d} tok {row['rows']:7d} rows  " + "  ".join(
                f"{side} {t[side]:6.1f}" for side in SIDES if side in t) + f"  {row['kernel']}"
                + (f"  swiglu x{row['swiglu']['vs_torch']:.2f}" if "swiglu" in row else ""), flush=True)
            torch.cuda.empty_cache()
    masked = []
    for name in args.layers.split(",") if args.masked else ():
        for per_expert in map(int, args.masked.split(",")):
            row = run_masked(bundle, name, per_expert, args, gen)
            masked.append(row)
            print(f"{name:16s} masked M_max {per_expert:3d}  tilekiln {row['ms']['tilekiln'] * 1e3:8.1f} us  "
                  f"loop {row['ms']['loop'] * 1e3:8.1f} us  x{row['vs_loop']:.2f}  {row['kernel']}", flush=True)
            torch.cuda.empty_cache()
    summary = {
        "masked_geomean_vs_loop": geomean([r["vs_loop"] for r in masked]),
        "geomean_vs_torch_grouped_mm": geomean([r["vs_torch_grouped_mm"] for r in rows if "vs_torch_grouped_mm" in r]),
        "swiglu_geomean_vs_torch": geomean([r["swiglu"]["vs_torch"] for r in rows if "swiglu" in r]),
        "geomean_vs_loop": geomean([r["vs_loop"] for r in rows if "vs_loop" in r]),
        "min_vs_dense_at_4096_tokens_and_above": min(
            (r["vs_dense"] for r in rows if r["tokens"] >= 4096 and "vs_dense" in r), default=None),
    }
    print(json.dumps(summary))
    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "bundle": bundle.name, "dtype": args.dtype, "skew": args.skew,
              "rounds": args.rounds, "settle_ms": args.settle_ms, "summary": summary, "results": rows,
              "masked": masked}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
