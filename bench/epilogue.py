"""Fused epilogues against the torch sequence they replace: linear layers with bias and an
activation, whole MLP blocks, fp8 with row-wise scales and addmm's alpha and beta.

Four parts, each side replayed from CUDA graphs and the two timed interleaved, shape by
shape (the method of bench/gemm.py), every shape checked against float64 first:

- ``linear``: ``tilekiln.linear(x, w, bias, activation=act)`` against
  ``act(F.linear(x, w, bias))`` for Llama-3-8B's layers (fused QKV, attention output, fused
  gate/up, down) at token counts 1 to 16384 (a geometric grid and log-uniform draws between);
- ``mlp``: a Llama-3-8B and a Llama-3-70B MLP block with its residual, ``down(silu(gate) * up) + x``
  with gate and up from one GEMM: tilekiln's route (``tilekiln.swiglu`` on the weight
  ``tilekiln.swiglu_weight`` converts once, the product in its epilogue, then
  ``linear(..., residual=x)``) against torch eager's ops; each row names the swiglu GEMM's
  kernel, and says so where the product ran unfused;
- ``rowwise``: ``tilekiln.scaled_gemm`` with (M, 1) and (1, N) float32 scales against
  ``torch._scaled_mm`` with the same scales; a bundle that takes no row-wise scales is recorded
  as such, with the error it raised;
- ``addmm``: ``tilekiln.addmm(c, a, b, beta=, alpha=)`` (the input fused as the epilogue's
  residual, alpha and beta by value) against ``torch.addmm`` on Llama-3-8B's residual layers
  (attention output, down) at ``ADDMM_M`` tokens, with (alpha, beta) of (1, 1) and (0.5, 2).

    python3 bench/epilogue.py --bundle artifacts/sm90a --json bench/results/epilogue-<card>.json

Results are written after every shape, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/epilogue.py")
import torch.nn.functional as F  # noqa: E402

import tilekiln  # noqa: E402
from tilekiln.tuning.timing import GRAPH_LAUNCHES, graph_ms, graphed, settle_launches, warm_ms  # noqa: E402

ROUNDS = 3
SETTLE_MS = 30.0
L2_BYTES = 60 * 2**20
# Llama-3-8B's linear layers as (name, N, K): hidden 4096, 32 query and 8 key/value heads of 128,
# intermediate 14336 (bench/models/llama-3-8b.json).
LLAMA3_8B_LAYERS = (("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
MLPS = (("llama-3-8b", 4096, 14336), ("llama-3-70b", 8192, 28672))
PARTS = ("linear", "mlp", "rowwise", "addmm")
ACTIVATIONS = {"silu": F.silu, "gelutanh": lambda y: F.gelu(y, approximate="tanh"), "relu": torch.relu}
ADDMM_M = (128, 512, 2048, 4096, 8192)
ADDMM_SCALARS = ((1.0, 1.0), (0.5, 2.0))
ROWWISE_SHAPES = ((16, 4096, 4096), (128, 6144, 4096), (512, 28672, 4096), (1024, 4096, 14336),
                  (2048, 4096, 4096), (4096, 4096, 4096), (4096, 14336, 4096), (8192, 8192, 8192))


def token_counts(seed: int) -> list[int]:
    """1, 2, 4, ... 16384 and, between each pair past 16, one count drawn log-uniformly."""
    rng = random.Random(seed)
    grid = [2**i for i in range(15)]
    between = [round(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for lo, hi in zip(grid[4:], grid[5:])]
    return sorted(set(grid + between))


def copies(nbytes: int) -> int:
    """Input sets that together exceed the L2 twice (at most 8), so launches read memory, not L2."""
    return max(1, min(8, math.ceil(2 * L2_BYTES / nbytes)))


def rel_error(out, ref) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def pair_ms(tk, th, iters: int) -> tuple[float, float]:
    """Medians over ROUNDS interleaved rounds of ``tk(i)`` and ``th(i)`` replayed from CUDA graphs."""
    timers = []
    for fn, side in ((tk, "tilekiln"), (th, "torch")):
        warm_ms(fn)
        replay = graphed(fn, side)
        settle = settle_launches(warm_ms(replay) / GRAPH_LAUNCHES, SETTLE_MS)
        timers.append(lambda replay=replay, settle=settle: graph_ms(replay, iters, settle))
    samples = ([], [])
    for _ in range(ROUNDS):
        for side, timer in enumerate(timers):
            samples[side].append(timer())
    return statistics.median(samples[0]), statistics.median(samples[1])


def launches(flops: float) -> int:
    return max(10, min(200, int(2e13 / flops)))


def linear_row(bundle, m: int, n: int, k: int, act: str) -> dict:
    fn = ACTIVATIONS[act]
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k),
             torch.randn(n, device="cuda", dtype=torch.bfloat16))
            for _ in range(copies(2 * (m * k + n * k + 2 * m * n)))]
    x, w, b = sets[0]
    ref = fn(x.double() @ w.double().t() + b.double())
    err = rel_error(tilekiln.linear(x, w, b, activation=act, bundle=bundle), ref)
    if not err < 2e-2:
        raise SystemExit(f"bench/epilogue.py: linear {m}x{n}x{k} {act}: relative error {err:.3g}")
    tk_ms, th_ms = pair_ms(lambda i: tilekiln.linear(*sets[i % len(sets)], activation=act, bundle=bundle),
                           lambda i: fn(F.linear(*sets[i % len(sets)])), launches(2 * m * n * k))
    choice = tilekiln.explain(x, w.t(), bundle=bundle, activation=act)
    return {"m": m, "n": n, "k": k, "activation": act, "kernel": choice.label, "relative_error": err,
            "tilekiln_us": round(1000 * tk_ms, 3), "torch_us": round(1000 * th_ms, 3), "ratio": round(th_ms / tk_ms, 4)}


def torch_mlp(x, w_gu, w_down):
    gu = F.linear(x, w_gu)
    inter = w_down.shape[1]
    return F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], w_down) + x


def tilekiln_mlp(bundle):
    """tilekiln's MLP block: one GEMM with SwiGLU in its epilogue (on the converted weight), then
    the down projection with the residual."""
    def run(x, w_swiglu, w_down):
        return tilekiln.linear(tilekiln.swiglu(x, w_swiglu, bundle=bundle), w_down, residual=x, bundle=bundle)
    return run


def swiglu_route(bundle, x, w_swiglu) -> str:
    """The swiglu GEMM's kernel, and whether the product ran in its epilogue."""
    choice = tilekiln.explain(x, w_swiglu.t(), activation="swiglu", bundle=bundle)
    return f"swiglu {choice.label}" + (" (unfused: product in torch)" if choice.notes else "")


def mlp_row(bundle, model: str, hidden: int, inter: int, m: int) -> dict:
    w_gu = torch.randn(2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / math.sqrt(hidden)
    w_down = torch.randn(hidden, inter, device="cuda", dtype=torch.bfloat16) / math.sqrt(inter)
    w_swiglu = tilekiln.swiglu_weight(w_gu)
    xs = [torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(copies(4 * m * hidden))]
    run = tilekiln_mlp(bundle)
    x = xs[0]
    route = swiglu_route(bundle, x, w_swiglu)
    ref = torch_mlp(x.double(), w_gu.double(), w_down.double())
    err = rel_error(run(x, w_swiglu, w_down), ref)
    if not err < 2e-2:
        raise SystemExit(f"bench/epilogue.py: {model} MLP at M {m}: relative error {err:.3g}")
    flops = 2 * m * hidden * 3 * inter
    tk_ms, th_ms = pair_ms(lambda i: run(xs[i % len(xs)], w_swiglu, w_down),
                           lambda i: torch_mlp(xs[i % len(xs)], w_gu, w_down), launches(flops))
    return {"model": model, "m": m, "hidden": hidden, "intermediate": inter, "route": route, "relative_error": err,
            "tilekiln_us": round(1000 * tk_ms, 3), "torch_us": round(1000 * th_ms, 3), "ratio": round(th_ms / tk_ms, 4)}


def rowwise_row(bundle, m: int, n: int, k: int) -> dict:
    fp8 = torch.float8_e4m3fn
    a = torch.randn(m, k, device="cuda").to(fp8)
    w = torch.randn(n, k, device="cuda").to(fp8)
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    ref = (a.double() @ w.double().t()) * sa.double() * sb.double()
    try:
        out = tilekiln.scaled_gemm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, bundle=bundle)
    except (TypeError, ValueError, RuntimeError) as exc:
        return {"m": m, "n": n, "k": k, "supported": False, "error": str(exc).splitlines()[0]}
    err = rel_error(out, ref)
    if not err < 2e-2:
        raise SystemExit(f"bench/epilogue.py: row-wise {m}x{n}x{k}: relative error {err:.3g}")
    tk_ms, th_ms = pair_ms(
        lambda i: tilekiln.scaled_gemm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, bundle=bundle),
        lambda i: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
        launches(2 * m * n * k))
    return {"m": m, "n": n, "k": k, "supported": True, "relative_error": err, "tilekiln_us": round(1000 * tk_ms, 3),
            "torch_us": round(1000 * th_ms, 3), "ratio": round(th_ms / tk_ms, 4)}


def addmm_row(bundle, m: int, n: int, k: int, alpha: float, beta: float) -> dict:
    sets = [(torch.randn(m, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() / math.sqrt(k))
            for _ in range(copies(2 * (2 * m * n + m * k + n * k)))]
    c, a, b = sets[0]
    ref = beta * c.double() + alpha * (a.double() @ b.double())
    err = rel_error(tilekiln.addmm(c, a, b, beta=beta, alpha=alpha, bundle=bundle), ref)
    if not err < 2e-2:
        raise SystemExit(f"bench/epilogue.py: addmm {m}x{n}x{k} alpha {alpha} beta {beta}: relative error {err:.3g}")
    tk_ms, th_ms = pair_ms(lambda i: tilekiln.addmm(*sets[i % len(sets)], beta=beta, alpha=alpha, bundle=bundle),
                           lambda i: torch.addmm(*sets[i % len(sets)], beta=beta, alpha=alpha),
                           launches(2 * m * n * k))
    choice = tilekiln.explain(a, b, bundle=bundle, alpha=alpha, beta=beta, residual=c)
    return {"m": m, "n": n, "k": k, "alpha": alpha, "beta": beta, "kernel": choice.label,
            "fused": "resadd" in choice.label and not any(n.startswith("unfused") for n in choice.notes),
            "relative_error": err, "tilekiln_us": round(1000 * tk_ms, 3),
            "torch_us": round(1000 * th_ms, 3), "ratio": round(th_ms / tk_ms, 4)}


def summary(rows: list[dict]) -> dict:
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if not ratios:
        return {"shapes": len(rows), "timed": 0}
    return {"shapes": len(rows), "timed": len(ratios),
            "geomean": round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 4),
            "min": min(ratios), "max": max(ratios)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--part", action="append", choices=PARTS, default=None,
                   help="which parts to run (repeatable; default: all four)")
    p.add_argument("--seed", type=int, default=31, help="seed of the token counts drawn between the grid's")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = tilekiln.load(args.bundle)
    parts = args.part or list(PARTS)
    counts = token_counts(args.seed)
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "bundle": bundle.name, "seed": args.seed, "parts": {}}

    def record(part: str, row: dict, line: str) -> None:
        section = report["parts"].setdefault(part, {"results": []})
        section["results"].append(row)
        section["summary"] = summary(section["results"])
        if part == "linear":
            section["summary_m_ge_512"] = summary([r for r in section["results"] if r["m"] >= 512])
        print(f"{part:8s} {line} ratio {row.get('ratio', 'n/a')}", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")

    if "linear" in parts:
        for name, n, k in LLAMA3_8B_LAYERS:
            for act in ACTIVATIONS:
                for m in counts:
                    row = linear_row(bundle, m, n, k, act)
                    record("linear", {"layer": name, **row}, f"{name:8s} {act:9s} {m:6d}x{n}x{k} {row['kernel']}")
    if "mlp" in parts:
        for model, hidden, inter in MLPS:
            for m in (512, 1024, 2048, 4096, 8192):
                row = mlp_row(bundle, model, hidden, inter, m)
                record("mlp", row, f"{model} M {m} ({row['route']})")
                torch.cuda.empty_cache()
    if "rowwise" in parts:
        for m, n, k in ROWWISE_SHAPES:
            row = rowwise_row(bundle, m, n, k)
            record("rowwise", row, f"{m}x{n}x{k}")
    if "addmm" in parts:
        for name, n, k in LLAMA3_8B_LAYERS:
            if name not in ("o_proj", "down"):
                continue
            for alpha, beta in ADDMM_SCALARS:
                for m in ADDMM_M:
                    row = addmm_row(bundle, m, n, k, alpha, beta)
                    record("addmm", {"layer": name, **row},
                           f"{name:8s} alpha {alpha} beta {beta} {m:6d}x{n}x{k} {row['kernel']}")
    print(json.dumps({part: s["summary"] for part, s in report["parts"].items()}))


if __name__ == "__main__":
    main()
