"""Blockwise fp8 (1x128 activation, 128x128 weight scales) next to tilekiln's per-tensor fp8 and
torch's bf16 matmul (cuBLAS), same run, same data.

Method as bench/gemm.py: every side is checked against a float64 reference before it is timed;
the three sides are timed interleaved, shape by shape, each block replayed from CUDA graphs
(``tilekiln.tuning.timing.graphed``) after ``--settle-ms`` of untimed launches of its own side,
inputs rotated when a problem is smaller than the L2; the median of each side's blocks, over
``--repeats`` passes of the suite. Shapes: bench/gemm.py's suite and DeepSeek-V3's projections
(N, K from 7168, 2048, 1536, 576, 18432, 24576) at M = 64, 128, 4096, 16384.

Accuracy, on the same data: A is bf16 normals with the outliers of LLM activations (four
channels 20x larger in every token, one token in 64 1000x larger), the weight plain normals; each
side's error is against the float64 product of the bf16 inputs themselves, so it counts
quantization error too: over the whole result (||out - ref|| / ||ref||) and per token (the mean
of each row's relative error, which the massive tokens do not hide). Per-tensor fp8 scales each
operand by its largest magnitude; blockwise by each block's.

    python3 bench/blockwise.py --bundle artifacts/sm90a --json bench/results/blockwise-<card>-<date>.json

``--all-kernels`` times every plain dense bf16-result blockwise kernel of the bundle, each pinned (``kernel=``), as
sides of their own beside the selection's pick, per-tensor fp8 and bf16, interleaved in the same
blocks, so one run tells which kernel wins where. Its shapes (``ALL_KERNEL_SHAPES`` unless
``--quick`` or ``--deepseek-only``) are the large DeepSeek-V3 projections and three square-ish
suite shapes; each kernel is checked against a float64 reference of sampled rows (a full float64
product of 16384x18432x7168 takes over a minute), and the accuracy comparison is left out.

    python3 bench/blockwise.py --all-kernels --repeats 1 --json bench/results/blockwise-kernels-<card>-<date>.json

``--deepgemm`` runs the 18 dense shapes of DeepGEMM's published table (:data:`DEEPGEMM_H800`);
every shape of a run that is in that table also reports the blockwise side against DeepGEMM's
published throughput (``ratio_vs_deepgemm_h800``). That is a comparison across runs and cards,
not a paired one: DeepGEMM is not installed here (it compiles its kernels at run time with nvcc).

    python3 bench/blockwise.py --deepgemm --json bench/results/blockwise-deepgemm-<card>-<date>.json

``--grouped`` times the grouped kernels instead, on the shapes of DeepGEMM's published grouped
tables (:data:`DEEPGEMM_GROUPED_H800`; every group full, as there): tilekiln's blockwise grouped
call against its per-tensor fp8 one and torch's bf16 (``torch._grouped_mm`` for the contiguous
layout, ``torch.bmm`` for the masked one, whose groups are full), same data, interleaved, each
checked first against float64 on rows sampled from every group.

    python3 bench/blockwise.py --grouped --json bench/results/blockwise-grouped-<card>-<date>.json
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/blockwise.py")
import tilekiln  # noqa: E402
from gemm import block_timer, shape_suite  # noqa: E402
from tilekiln.blockwise import BLOCK, E4M3_MAX  # noqa: E402
from tilekiln.tuning.timing import L2_BYTES, CaptureError, block_launches  # noqa: E402

SIDES = ("blockwise", "tensor", "bf16")
# DeepSeek-V3 (N, K): MLA's kv_a (576) and q_a (1536) from the 7168 hidden size, q_b (24576 from
# 1536), the dense MLP's up (18432) and down, and an MoE expert's down (K = 2048).
DEEPSEEK_NK = ((576, 7168), (1536, 7168), (24576, 1536), (18432, 7168), (7168, 18432), (7168, 2048))
DEEPSEEK_M = (64, 128, 4096, 16384)
# --all-kernels: the DeepSeek-V3 projections at M 64 (the swapped decode tiles), 128, 4096 and 16384
# (the last reads A from HBM once per pass of the raster walk) and three suite shapes.
ALL_KERNEL_SHAPES = tuple((m, n, k) for n, k in DEEPSEEK_NK for m in (64, 128, 4096, 16384)) + (
    (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096))
# DeepGEMM's published dense throughput with these scales (TFLOP/s, by (M, N, K)): the table "Normal
# GEMMs for dense models" of deepseek-ai/DeepGEMM's README at 327ec92 (2025-04-09, its last with
# the table), measured on an H800 SXM5 with NVCC 12.8. An H800 SXM5 is an H100 SXM5 (132 SMs at the
# same clocks, 80 GB of HBM3 at 3.35 TB/s) with less NVLink bandwidth, so one GPU's GEMM on an H100
# SXM5 compares directly; an H200 (HBM3e, 4.8 TB/s) streams 1.43x faster, which the weight-bound
# rows at M 64 and 128 feel. N 2112 is DeepSeek-V3's fused q_a and kv_a projection (1536 + 576).
DEEPGEMM_H800 = {
    (64, 2112, 7168): 206, (64, 24576, 1536): 289, (64, 32768, 512): 219, (64, 7168, 16384): 336,
    (64, 4096, 7168): 287, (64, 7168, 2048): 295,
    (128, 2112, 7168): 352, (128, 24576, 1536): 535, (128, 32768, 512): 358, (128, 7168, 16384): 645,
    (128, 4096, 7168): 533, (128, 7168, 2048): 510,
    (4096, 2112, 7168): 1127, (4096, 24576, 1536): 1212, (4096, 32768, 512): 775, (4096, 7168, 16384): 1520,
    (4096, 4096, 7168): 1410, (4096, 7168, 2048): 1168,
}
# Its grouped tables, same README and card: (layout, groups, rows per group, N, K) -> TFLOP/s.
DEEPGEMM_GROUPED_H800 = {
    ("contiguous", 4, 8192, 4096, 7168): 1346, ("contiguous", 4, 8192, 7168, 2048): 1214,
    ("contiguous", 8, 4096, 4096, 7168): 1346, ("contiguous", 8, 4096, 7168, 2048): 1214,
    ("masked", 1, 1024, 4096, 7168): 1233, ("masked", 1, 1024, 7168, 2048): 925,
    ("masked", 2, 512, 4096, 7168): 1040, ("masked", 2, 512, 7168, 2048): 916,
    ("masked", 4, 256, 4096, 7168): 932, ("masked", 4, 256, 7168, 2048): 815,
}
DEEPGEMM_SOURCE = "deepseek-ai/DeepGEMM README at 327ec92 (2025-04-09), H800 SXM5, NVCC 12.8"
# Rows of the result that --all-kernels checks against float64, spread over every M tile.
CHECK_ROWS = 256
OUTLIER_CHANNELS, CHANNEL_SCALE = 4, 20.0
MASSIVE_TOKEN_EVERY, TOKEN_SCALE = 64, 1000.0


def deepseek_suite() -> list[tuple[int, int, int]]:
    return [(m, n, k) for n, k in DEEPSEEK_NK for m in DEEPSEEK_M]


def activations(m: int, k: int) -> torch.Tensor:
    """bf16 normals with outlier channels and massive tokens (at least one)."""
    a = torch.randn(m, k, device="cuda")
    a[:, torch.randint(0, k, (OUTLIER_CHANNELS,), device="cuda")] *= CHANNEL_SCALE
    a[torch.randint(0, m, (max(1, m // MASSIVE_TOKEN_EVERY),), device="cuda")] *= TOKEN_SCALE
    return a.to(torch.bfloat16)


def per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.float().abs().amax() / E4M3_MAX).clamp_min(1e-12).reshape(1)
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def operand_set(m: int, n: int, k: int) -> dict:
    a, w = activations(m, k), torch.randn(n, k, device="cuda").to(torch.bfloat16)
    a_bw, sa_bw = tilekiln.quantize_fp8_blockwise(a, (1, BLOCK))
    w_bw, sb_bw = tilekiln.quantize_fp8_blockwise(w, (BLOCK, BLOCK))
    (a_t, sa_t), (w_t, sb_t) = per_tensor(a), per_tensor(w)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return {"bf16": (a, w), "blockwise": (a_bw, w_bw, sa_bw, sb_bw), "tensor": (a_t, w_t, sa_t, sb_t), "out": out}


def calls(bundle, s: dict, pinned: tuple[str, ...] = ()) -> dict:
    """Each side's call on operand set ``s``: the selection's blockwise pick, per-tensor fp8, bf16,
    then one per kernel id in ``pinned`` (a blockwise kernel run with ``kernel=``)."""
    a_bw, w_bw, sa_bw, sb_bw = s["blockwise"]
    a_t, w_t, sa_t, sb_t = s["tensor"]
    a, w = s["bf16"]
    out = s["out"]
    sides = {
        "blockwise": lambda: bundle.scaled_gemm(a_bw, w_bw.t(), sa_bw, sb_bw, out=out, scale_format="blockwise"),
        "tensor": lambda: bundle.scaled_gemm(a_t, w_t.t(), sa_t, sb_t, out=out),
        "bf16": lambda: torch.matmul(a, w.t(), out=out),
    }
    for kid in pinned:
        sides[kid] = lambda kid=kid: bundle.scaled_gemm(a_bw, w_bw.t(), sa_bw, sb_bw, out=out, kernel=kid,
                                                        scale_format="blockwise")
    return sides


def errors(bundle, s: dict) -> dict:
    """Each side's error against the float64 product of the bf16 inputs: over the whole result
    and the mean per row."""
    a, w = s["bf16"]
    ref = a.double() @ w.double().t()
    out = {}
    for side, fn in calls(bundle, s).items():
        s["out"].fill_(float("nan"))
        diff = fn().double() - ref
        whole = (diff.norm() / ref.norm()).item()
        rows = (diff.norm(dim=1) / ref.norm(dim=1)).mean().item()
        if math.isnan(whole):
            raise SystemExit(f"{side} {tuple(a.shape)}x{tuple(w.shape)}: NaN in the output")
        out[side] = {"whole": float(f"{whole:.4g}"), "rows": float(f"{rows:.4g}")}
    return out


def check_kernels(bundle, s: dict) -> None:
    """Each fp8 side against the float64 product of its own dequantized inputs (what it computes)."""
    from tilekiln.blockwise import dequantize

    a_bw, w_bw, sa_bw, sb_bw = s["blockwise"]
    a_t, w_t, sa_t, sb_t = s["tensor"]
    refs = {"blockwise": dequantize(a_bw, sa_bw, (1, BLOCK)) @ dequantize(w_bw, sb_bw, (BLOCK, BLOCK)).t(),
            "tensor": (a_t.double() @ w_t.double().t()) * (sa_t.double() * sb_t.double())}
    for side, fn in calls(bundle, s).items():
        if side in refs:
            s["out"].fill_(float("nan"))
            y = fn()
            err = ((y.double() - refs[side]).norm() / refs[side].norm()).item()
            if not err < 1e-2:
                raise SystemExit(f"numerics check failed for {side} {tuple(a_t.shape)}x{tuple(w_t.shape)}: "
                                 f"relative error {err}")


def check_pinned(bundle, s: dict, pinned: tuple[str, ...]) -> None:
    """Each pinned blockwise kernel against the float64 product of its dequantized inputs, on
    CHECK_ROWS rows spread over the result (every M tile where M allows)."""
    from tilekiln.blockwise import dequantize

    a_bw, w_bw, sa_bw, sb_bw = s["blockwise"]
    m = a_bw.shape[0]
    rows = torch.linspace(0, m - 1, min(m, CHECK_ROWS), device="cuda").long().unique()
    ref = dequantize(a_bw[rows], sa_bw[rows], (1, BLOCK)) @ dequantize(w_bw, sb_bw, (BLOCK, BLOCK)).t()
    sides = calls(bundle, s, pinned)
    for kid in pinned:
        s["out"].fill_(float("nan"))
        got = sides[kid]()[rows].double()
        err = ((got - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            raise SystemExit(f"numerics check failed for {kid} {tuple(a_bw.shape)}x{tuple(w_bw.shape)}: "
                             f"relative error {err} on {len(rows)} rows")


def timed_blocks(per_set: list[dict], sides: tuple[str, ...], iters: int, settle_ms: float, what: str) -> dict:
    """Each side's ms per call in four blocks, the sides interleaved, call i on operand set i mod the
    sets (``per_set``: each set's calls by side, from :func:`calls` or :func:`grouped_calls`)."""
    timers = {side: block_timer(lambda i, side=side: per_set[i % len(per_set)][side](), iters, settle_ms, True,
                                f"{what} {side}") for side in sides}
    times = {side: [] for side in sides}
    for block in range(4):
        # Rotate the order so each side follows each other side alike (three sides: shifts 0, 1, 2,
        # 0; more: spread over the four blocks, a quarter of the sides apart).
        shift = (block * len(sides) + 3) // 4 % len(sides)
        for side in sides[shift:] + sides[:shift]:
            times[side].append(timers[side]())
    return times


def run(args) -> dict:
    bundle = tilekiln.load(args.bundle)
    shapes = deepseek_suite() + ([] if args.deepseek_only else shape_suite())
    pinned = ()
    if args.all_kernels:
        # The plain bf16-result ones: the fp32-partial ones run split, as the selection's side may pick
        # them, and a SwiGLU one computes another result.
        pinned = tuple(k.id for k in bundle.kernels if k.config.scaling.value == "blockwise"
                       and k.config.family == "gemm" and k.config.dtypes.c.value == "bf16"
                       and k.config.activation.value == "none")
        if not pinned:
            raise SystemExit(f"bench/blockwise.py: bundle {bundle.name} has no dense blockwise kernel")
        shapes = deepseek_suite() if args.deepseek_only else list(ALL_KERNEL_SHAPES)
    if args.deepgemm:
        shapes = sorted(DEEPGEMM_H800)
    if args.quick:
        shapes = [(4096, 7168, 2048), (128, 24576, 1536), (8192, 8192, 8192)]
    sides = SIDES + pinned
    rows = {s: {side: [] for side in sides} for s in shapes}
    info = {}
    for rep in range(args.repeats):
        for (m, n, k) in shapes:
            one = (m * k + n * k) * 3 + m * n * 2  # bytes per set: bf16 and two fp8 copies, and the output
            sets = [operand_set(m, n, k) for _ in range(max(1, min(8, math.ceil(2 * L2_BYTES / one))))]
            if rep == 0:
                if pinned:
                    check_pinned(bundle, sets[0], pinned)
                else:
                    check_kernels(bundle, sets[0])
                a_bw, w_bw, sa_bw, sb_bw = sets[0]["blockwise"]
                a_t, w_t, _, _ = sets[0]["tensor"]
                info[(m, n, k)] = {
                    "kernel_blockwise": bundle.explain(a_bw, w_bw.t(), out_dtype="bf16",
                                                       requested=(("scaling", "blockwise"),)).kernel.id,
                    "kernel_tensor": bundle.explain(a_t, w_t.t(), out_dtype="bf16").kernel.id}
                if not pinned:
                    info[(m, n, k)]["relative_error"] = errors(bundle, sets[0])
            flops = 2 * m * n * k
            per_set = [calls(bundle, s, pinned) for s in sets]
            iters = block_launches(flops)
            times = timed_blocks(per_set, sides, iters, args.settle_ms, f"{m}x{n}x{k}")
            for side in sides:
                rows[(m, n, k)][side].append(flops / statistics.median(times[side]) / 1e9)
            r = rows[(m, n, k)]
            print(f"rep {rep} {m:6d}x{n:6d}x{k:6d}  blockwise {r['blockwise'][-1]:7.1f}  tensor "
                  f"{r['tensor'][-1]:7.1f}  bf16 {r['bf16'][-1]:7.1f}  vs tensor "
                  f"{r['blockwise'][-1] / r['tensor'][-1]:.3f}  vs bf16 {r['blockwise'][-1] / r['bf16'][-1]:.3f}",
                  flush=True)
            for kid in pinned:
                print(f"      {kid:66s} {r[kid][-1]:7.1f}  vs tensor {r[kid][-1] / r['tensor'][-1]:.3f}  "
                      f"vs bf16 {r[kid][-1] / r['bf16'][-1]:.3f}", flush=True)
            sets = per_set = None  # free the operands before the next shape (the graphs went with timed_blocks)
    results = []
    for (m, n, k), r in rows.items():
        med = {side: statistics.median(r[side]) for side in sides}
        row = {
            "m": m, "n": n, "k": k,
            "suite": ("deepseek-v3" if (m, n, k) in deepseek_suite() else
                      "deepgemm" if (m, n, k) in DEEPGEMM_H800 else "bench"),
            **info[(m, n, k)],
            **{f"{side}_tflops": round(med[side], 1) for side in SIDES},
            "ratio_vs_tensor": round(med["blockwise"] / med["tensor"], 4),
            "ratio_vs_bf16": round(med["blockwise"] / med["bf16"], 4),
            "runs": {side: [round(x, 1) for x in r[side]] for side in sides},
        }
        if (m, n, k) in DEEPGEMM_H800:
            row["deepgemm_h800_tflops"] = DEEPGEMM_H800[m, n, k]
            row["ratio_vs_deepgemm_h800"] = round(med["blockwise"] / DEEPGEMM_H800[m, n, k], 4)
        if pinned:
            row["kernels_tflops"] = {kid: round(med[kid], 1) for kid in pinned}
            row["kernels_vs_tensor"] = {kid: round(med[kid] / med["tensor"], 4) for kid in pinned}
            row["fastest_kernel"] = max(pinned, key=lambda kid: med[kid])
        results.append(row)

    def geomean(key: str) -> float:
        return round(math.exp(statistics.fmean(math.log(x[key]) for x in results)), 4)

    summary = {"geomean_vs_tensor": geomean("ratio_vs_tensor"), "geomean_vs_bf16": geomean("ratio_vs_bf16"),
               "min_vs_tensor": min(x["ratio_vs_tensor"] for x in results),
               "min_vs_bf16": min(x["ratio_vs_bf16"] for x in results),
               "shapes": len(results)}
    published = [x for x in results if "ratio_vs_deepgemm_h800" in x]
    if published:
        summary["geomean_vs_deepgemm_h800"] = round(math.exp(statistics.fmean(
            math.log(x["ratio_vs_deepgemm_h800"]) for x in published)), 4)
        summary["deepgemm_shapes"] = len(published)
    if pinned:
        # Per kernel: its geomean against per-tensor fp8 over the shapes, and on how many it was fastest.
        summary["kernels"] = {kid: {
            "geomean_vs_tensor": round(math.exp(statistics.fmean(
                math.log(x["kernels_vs_tensor"][kid]) for x in results)), 4),
            "fastest_on": sum(x["fastest_kernel"] == kid for x in results)} for kid in pinned}
    else:
        summary["blockwise_more_accurate_per_row"] = sum(
            x["relative_error"]["blockwise"]["rows"] < x["relative_error"]["tensor"]["rows"] for x in results)
    return {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "bundle": bundle.name, "bundle_version": bundle.version,
            "repeats": args.repeats, "settle_ms": args.settle_ms, "timing": "graph",
            "outliers": {"channels": OUTLIER_CHANNELS, "channel_scale": CHANNEL_SCALE,
                         "massive_token_every": MASSIVE_TOKEN_EVERY, "token_scale": TOKEN_SCALE},
            "deepgemm_reference": DEEPGEMM_SOURCE, "summary": summary, "results": results}


def grouped_operands(layout: str, groups: int, rows: int, n: int, k: int) -> dict:
    """One problem of DeepGEMM's grouped tables, every group full: bf16 inputs, their blockwise and
    per-tensor fp8 copies (a's rows, each group's weight quantized as tilekiln.quantize_fp8_blockwise
    does), ``ends`` (offs) or ``counts`` (masked_m) and a bf16 result."""
    masked = layout == "masked"
    a = activations(groups * rows, k)
    w = torch.randn(groups, n, k, device="cuda").to(torch.bfloat16)
    a_bw, sa_bw = tilekiln.quantize_fp8_blockwise(a, (1, BLOCK))
    weights = [tilekiln.quantize_fp8_blockwise(w[g], (BLOCK, BLOCK)) for g in range(groups)]
    w_bw, sb_bw = torch.stack([x for x, _ in weights]), torch.stack([x for _, x in weights])
    (a_t, sa_t), (w_t, sb_t) = per_tensor(a), per_tensor(w)
    sizes = torch.full((groups,), rows, dtype=torch.int32, device="cuda")
    if masked:
        # (G, M_max, K) with each group's scale rows in its slot, M_max contiguous.
        a, a_bw, a_t = (x.view(groups, rows, k) for x in (a, a_bw, a_t))
        sa_bw = sa_bw.view(groups, rows, k // BLOCK)
    return {"masked": masked, "bf16": (a, w), "blockwise": (a_bw, w_bw, sa_bw, sb_bw), "tensor": (a_t, w_t, sa_t, sb_t),
            "rows": sizes if masked else sizes.cumsum(0).to(torch.int32),
            "out": torch.empty(*a.shape[:-1], n, device="cuda", dtype=torch.bfloat16)}


def grouped_calls(bundle, s: dict) -> dict:
    """Each side's call: tilekiln's blockwise and per-tensor fp8 grouped calls, torch's bf16."""
    a_bw, w_bw, sa_bw, sb_bw = s["blockwise"]
    a_t, w_t, sa_t, sb_t = s["tensor"]
    a, w = s["bf16"]
    rows, out = s["rows"], s["out"]
    call = bundle.grouped_gemm_masked if s["masked"] else bundle.grouped_gemm
    return {
        "blockwise": lambda: call(a_bw, w_bw.transpose(1, 2), rows, scale_a=sa_bw, scale_b=sb_bw, out=out,
                                  scale_format="blockwise"),
        "tensor": lambda: call(a_t, w_t.transpose(1, 2), rows, scale_a=sa_t, scale_b=sb_t, out=out),
        "bf16": (lambda: torch.bmm(a, w.transpose(1, 2), out=out)) if s["masked"] else
                (lambda: torch._grouped_mm(a, w.transpose(1, 2), offs=rows)),
    }


def check_grouped(bundle, s: dict, what: str) -> None:
    """The blockwise side against the float64 product of its dequantized inputs, the per-tensor side
    against its own, on CHECK_ROWS rows spread over every group."""
    from tilekiln.blockwise import dequantize

    a_bw, w_bw, sa_bw, sb_bw = s["blockwise"]
    a_t, w_t, sa_t, sb_t = s["tensor"]
    groups = w_bw.shape[0]
    flat = a_bw.reshape(-1, a_bw.shape[-1])
    per_group = flat.shape[0] // groups
    pick = torch.linspace(0, per_group - 1, max(1, min(per_group, CHECK_ROWS // groups)), device="cuda").long().unique()
    sa_rows, flat_t = sa_bw.reshape(-1, sa_bw.shape[-1]), a_t.reshape(-1, a_t.shape[-1])
    sides = grouped_calls(bundle, s)
    for side in ("blockwise", "tensor"):
        s["out"].fill_(float("nan"))
        got = sides[side]().reshape(-1, s["out"].shape[-1])
        num = den = 0.0
        for g in range(groups):
            rows = g * per_group + pick
            if side == "blockwise":
                weight = dequantize(w_bw[g], sb_bw[g], (BLOCK, BLOCK))
                ref = dequantize(flat[rows], sa_rows[rows], (1, BLOCK)) @ weight.t()
            else:
                ref = (flat_t[rows].double() @ w_t[g].double().t()) * (sa_t * sb_t).double()
            num += (got[rows].double() - ref).norm().item() ** 2
            den += ref.norm().item() ** 2
        err = math.sqrt(num / den)
        if not err < 1e-2:
            raise SystemExit(f"numerics check failed for {side} {what}: relative error {err}")


def run_grouped(args) -> dict:
    bundle = tilekiln.load(args.bundle)
    rows = []
    for rep in range(args.repeats):
        for index, (layout, groups, per_group, n, k) in enumerate(sorted(DEEPGEMM_GROUPED_H800)):
            what = f"{layout} {groups}x{per_group}x{n}x{k}"
            total = groups * per_group
            one = (total * k + groups * n * k) * 3 + total * n * 2  # bf16 and two fp8 copies, and the output
            # As run() does: operand sets rotated where one fits the L2 twice (the small masked ones).
            sets = [grouped_operands(layout, groups, per_group, n, k)
                    for _ in range(max(1, min(8, math.ceil(2 * L2_BYTES / one))))]
            s = sets[0]
            if rep == 0:
                check_grouped(bundle, s, what)
                a_bw, w_bw, *_ = s["blockwise"]
                explain_rows = {"masked_m" if s["masked"] else "offs": s["rows"]}
                rows.append({"layout": layout, "groups": groups, "rows_per_group": per_group, "n": n, "k": k,
                             "kernel_blockwise": tilekiln.explain(a_bw, w_bw.transpose(1, 2), bundle=bundle,
                                                                  scale_format="blockwise", **explain_rows).label,
                             "runs": {side: [] for side in SIDES}})
            flops = 2 * total * n * k
            per_set = [grouped_calls(bundle, x) for x in sets]
            iters = block_launches(flops)
            times = timed_blocks(per_set, SIDES, iters, args.settle_ms, what)
            row = rows[index]
            for side in SIDES:
                row["runs"][side].append(round(flops / statistics.median(times[side]) / 1e9, 1))
            r = row["runs"]
            print(f"rep {rep} {what:32s} blockwise {r['blockwise'][-1]:7.1f}  tensor {r['tensor'][-1]:7.1f}  "
                  f"bf16 {r['bf16'][-1]:7.1f}  vs tensor {r['blockwise'][-1] / r['tensor'][-1]:.3f}", flush=True)
            s = sets = per_set = None  # free the operands before the next shape (the graphs went with timed_blocks)
    for row in rows:
        key = (row["layout"], row["groups"], row["rows_per_group"], row["n"], row["k"])
        med = {side: statistics.median(row["runs"][side]) for side in SIDES}
        row.update({f"{side}_tflops": round(med[side], 1) for side in SIDES})
        row.update(ratio_vs_tensor=round(med["blockwise"] / med["tensor"], 4),
                   ratio_vs_bf16=round(med["blockwise"] / med["bf16"], 4),
                   deepgemm_h800_tflops=DEEPGEMM_GROUPED_H800[key],
                   ratio_vs_deepgemm_h800=round(med["blockwise"] / DEEPGEMM_GROUPED_H800[key], 4))

    def geomean(key: str) -> float:
        return round(math.exp(statistics.fmean(math.log(x[key]) for x in rows)), 4)

    summary = {"geomean_vs_tensor": geomean("ratio_vs_tensor"), "geomean_vs_bf16": geomean("ratio_vs_bf16"),
               "geomean_vs_deepgemm_h800": geomean("ratio_vs_deepgemm_h800"),
               "min_vs_tensor": min(x["ratio_vs_tensor"] for x in rows), "shapes": len(rows)}
    return {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "bundle": bundle.name, "bundle_version": bundle.version,
            "repeats": args.repeats, "settle_ms": args.settle_ms, "timing": "graph", "grouped": True,
            "deepgemm_reference": DEEPGEMM_SOURCE, "summary": summary, "results": rows}


def main() -> None:
    from tilekiln.tuning.timing import SETTLE_MS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="three shapes only")
    p.add_argument("--deepseek-only", action="store_true", help="the DeepSeek-V3 shapes only")
    p.add_argument("--deepgemm", action="store_true",
                   help="the 18 shapes of DeepGEMM's published dense table only (DEEPGEMM_H800)")
    p.add_argument("--grouped", action="store_true",
                   help="the grouped kernels on DeepGEMM's published grouped shapes (DEEPGEMM_GROUPED_H800)")
    p.add_argument("--all-kernels", action="store_true",
                   help="also time every dense blockwise kernel of the bundle, pinned, on ALL_KERNEL_SHAPES")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS,
                   help="untimed launches of the same side before each timed block (0: none)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.grouped and (args.quick or args.deepseek_only or args.all_kernels or args.deepgemm):
        p.error("--grouped runs DeepGEMM's grouped shapes on the selection's kernels; drop --quick, "
                "--deepseek-only, --all-kernels and --deepgemm")
    try:
        report = run_grouped(args) if args.grouped else run(args)
    except CaptureError as exc:
        raise SystemExit(f"bench/blockwise.py: {exc}")
    print(json.dumps(report["summary"]))
    if args.grouped:
        print(f"{'layout':>10s} {'G x rows x N x K':>24s} {'blockwise':>9s} {'tensor':>9s} {'bf16':>9s} "
              f"{'/tensor':>8s} {'/DeepGEMM':>9s}  kernel")
        for r in report["results"]:
            shape = f"{r['groups']}x{r['rows_per_group']}x{r['n']}x{r['k']}"
            print(f"{r['layout']:>10s} {shape:>24s} {r['blockwise_tflops']:9.1f} {r['tensor_tflops']:9.1f} "
                  f"{r['bf16_tflops']:9.1f} {r['ratio_vs_tensor']:8.3f} {r['ratio_vs_deepgemm_h800']:9.3f}  "
                  f"{r['kernel_blockwise']}")
        print(f"/DeepGEMM: the blockwise side over {DEEPGEMM_SOURCE}")
    elif args.all_kernels:
        print(f"{'shape':>22s} {'blockwise':>9s} {'tensor':>9s} {'bf16':>9s} {'/tensor':>8s}  fastest pinned kernel")
        for r in report["results"]:
            best = r["fastest_kernel"]
            print(f"{r['m']:6d}x{r['n']:6d}x{r['k']:6d} {r['blockwise_tflops']:9.1f} {r['tensor_tflops']:9.1f} "
                  f"{r['bf16_tflops']:9.1f} {r['ratio_vs_tensor']:8.3f}  {best} "
                  f"{r['kernels_tflops'][best]:.1f} ({r['kernels_vs_tensor'][best]:.3f})")
    else:
        print(f"{'shape':>22s} {'blockwise':>9s} {'tensor':>9s} {'bf16':>9s} {'/tensor':>8s} {'/bf16':>7s} "
              f"{'/DeepGEMM':>9s} {'row err bw':>10s} {'row err pt':>10s}  kernel")
        for r in report["results"]:
            e = r["relative_error"]
            published = f"{r['ratio_vs_deepgemm_h800']:9.3f}" if "ratio_vs_deepgemm_h800" in r else f"{'':9s}"
            print(f"{r['m']:6d}x{r['n']:6d}x{r['k']:6d} {r['blockwise_tflops']:9.1f} {r['tensor_tflops']:9.1f} "
                  f"{r['bf16_tflops']:9.1f} {r['ratio_vs_tensor']:8.3f} {r['ratio_vs_bf16']:7.3f} {published} "
                  f"{e['blockwise']['rows']:10.2e} {e['tensor']['rows']:10.2e}  {r['kernel_blockwise']}")
        if "geomean_vs_deepgemm_h800" in report["summary"]:
            print(f"/DeepGEMM: the blockwise side over {DEEPGEMM_SOURCE}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
