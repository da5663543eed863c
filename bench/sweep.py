"""tilekiln's own selection against torch on every linear layer of real models, at every M.

For the model configs under bench/models/ (Hugging Face style: Llama-3 8B and 70B, Mistral 7B,
Qwen2.5 7B, Gemma-2 9B, Phi-3 mini, DeepSeek-V3's projections), each layer's (N, K)
(tilekiln/tuning/models.py) at token counts M from 1 to 16384 on a geometric grid with random M
between (``token_grid``), bf16 against torch.matmul (cuBLAS) and fp8 e4m3 against
torch._scaled_mm, both sides replayed from CUDA graphs and timed interleaved, shape by shape
(the method of bench/gemm.py). Every shape is checked against float64 first. The grid's halves
are reported apart: the tuning half (what ``tilekiln tune --model`` measures) and the held-out
half, which no table saw and which is the number that counts.

    python3 bench/sweep.py --bundle artifacts/sm90a --dtype bf16 --json bench/results/sweep-<card>-bf16.json
    python3 bench/sweep.py ... --shard 1/4        # a quarter of the shapes, for one device call

Results are written after every shape, so a run cut short keeps what it measured; ``--resume``
skips the shapes a JSON file already holds.
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

torch = require_cuda_torch("bench/sweep.py")
import tilekiln  # noqa: E402
from tilekiln.tuning.models import linear_layers, read_config, split_held_out, token_grid  # noqa: E402
from tilekiln.tuning.timing import (GRAPH_LAUNCHES, SETTLE_MS, baseline_call, block_launches, graph_ms,  # noqa: E402
                                    graphed, operand_sets, settle_launches, tilekiln_call, warm_ms)

MODELS = Path(__file__).resolve().parent / "models"
FP8 = torch.float8_e4m3fn
ROUNDS = 3


def timer(fn, iters: int, settle_ms: float, side: str):
    """Per-call ms of replays of ``fn`` captured in a CUDA graph, after ``settle_ms`` of untimed ones."""
    warm_ms(fn)
    replay = graphed(fn, side)
    settle = settle_launches(warm_ms(replay) / GRAPH_LAUNCHES, settle_ms)
    return lambda: graph_ms(replay, iters, settle)


def measure(bundle, m: int, n: int, k: int, fp8: bool, settle_ms: float) -> dict:
    dtype = FP8 if fp8 else torch.bfloat16
    scales = (torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")) if fp8 else None
    sets = operand_sets(m, n, k, dtype, torch.bfloat16)
    a0, b0, _ = sets[0]
    choice = bundle.explain(a0, b0, out_dtype="bf16" if fp8 else None)
    out = tilekiln_call(bundle, a0, b0, None, scales)
    ref = (a0.double() @ b0.double()) * (0.125 if fp8 else 1.0)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise SystemExit(f"bench/sweep.py: {m}x{n}x{k}: relative error {err:.3g} on {choice.label}")
    iters = block_launches(2 * m * n * k)
    tk = timer(lambda i: tilekiln_call(bundle, *sets[i % len(sets)], scales), iters, settle_ms, "tilekiln")
    th = timer(lambda i: baseline_call(*sets[i % len(sets)], scales), iters, settle_ms, "torch")
    t_tk, t_th = [], []
    for _ in range(ROUNDS):  # interleaved, so clock drift weighs on both sides alike
        t_tk.append(tk())
        t_th.append(th())
    ms_tk, ms_th = statistics.median(t_tk), statistics.median(t_th)
    return {"m": m, "n": n, "k": k, "kernel": choice.label, "how": choice.how, "relative_error": err,
            "tilekiln_us": round(1000 * ms_tk, 3), "torch_us": round(1000 * ms_th, 3),
            "ratio": round(ms_th / ms_tk, 4)}


def distribution(rows: list[dict]) -> dict:
    """Geometric mean, 10th percentile and minimum of the ratios, and the ten worst shapes."""
    if not rows:
        return {"shapes": 0}
    ratios = sorted(r["ratio"] for r in rows)
    worst = sorted(rows, key=lambda r: r["ratio"])[:10]
    return {"shapes": len(rows), "geomean": round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 4),
            "p10": ratios[max(0, math.ceil(0.1 * len(ratios)) - 1)], "min": ratios[0],
            "worst": [{k: r[k] for k in ("model", "layer", "m", "n", "k", "ratio", "kernel")} for r in worst]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "e4m3"])
    p.add_argument("--model", type=Path, action="append", default=None, metavar="CONFIG.json",
                   help="model configs (default: every file under bench/models/)")
    p.add_argument("--shard", default="1/1", help="I/N: every N-th shape from the I-th (1-based)")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--resume", action="store_true", help="skip the shapes --json already holds")
    args = p.parse_args()
    index, count = (int(x) for x in args.shard.split("/"))
    bundle = tilekiln.load(args.bundle)
    tuning, held_out = split_held_out(token_grid())
    half = {m: "tuning" for m in tuning} | {m: "held_out" for m in held_out}
    work = []
    for path in args.model or sorted(MODELS.glob("*.json")):
        for layer in linear_layers(read_config(path), str(path)):
            work += [(path.stem, layer, m) for m in sorted(half)]
    work = work[index - 1::count]
    rows = json.loads(args.json.read_text())["results"] if args.resume and args.json.exists() else []
    done = {(r["model"], r["layer"], r["m"]) for r in rows}
    for model, layer, m in work:
        if (model, layer.name, m) in done:
            continue
        row = measure(bundle, m, layer.n, layer.k, args.dtype == "e4m3", args.settle_ms)
        rows.append({"model": model, "layer": layer.name, "half": half[m], **row})
        print(f"{model:14s} {layer.name:20s} {m:6d}x{layer.n:6d}x{layer.k:6d} ratio {row['ratio']:.3f} "
              f"{row['kernel']} ({row['how']})", flush=True)
        report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "bundle": bundle.name, "dtype": args.dtype, "shard": args.shard,
                  "summary": {h: distribution([r for r in rows if r["half"] == h]) for h in ("held_out", "tuning")},
                  "results": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({h: {k: v for k, v in s.items() if k != "worst"}
                      for h, s in json.loads(args.json.read_text())["summary"].items()}))


if __name__ == "__main__":
    main()
