"""Host time per GEMM call on a tiny problem: tilekiln next to torch.matmul and torch._scaled_mm, same run.

A tiny problem (64x64x64) keeps the GPU far ahead of the host, so the time
per call is the host's: argument checks, kernel selection (cached after the
first call), and the launch. Calls are issued in blocks of 256, shorter than
the launch queue, so the host never waits for the GPU inside a block; the
median over blocks is reported. Both sides are timed alternately, with and
without a preallocated output.

    python3 bench/overhead.py --bundle artifacts/sm90a --json bench/results/overhead-h200-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/overhead.py")
import tilekiln  # noqa: E402

BLOCK = 256


def per_call_us(fn, blocks: int) -> list[float]:
    out = []
    for _ in range(blocks):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(BLOCK):
            fn()
        out.append((time.perf_counter() - start) / BLOCK * 1e6)
    torch.cuda.synchronize()
    return out


def breakdown(bundle, a, w, c, blocks: int) -> dict[str, float]:
    """Median us of the pieces of a cached ``gemm(a, w, c)`` call, each timed alone."""
    from tilekiln._native import CALL

    pack = CALL["gemm"].pack_into  # a, b, c, scale_a, scale_b, bias, stream (tilekiln/spec.py FAMILIES)
    bundle._plans.clear()
    bundle.gemm(a, w, c)
    ((key, plan),) = bundle._plans.items()  # the one plan that call made, under the key the runtime built
    lib = bundle._lib
    buf = lib.call_buffer("gemm")
    run = lib.run["gemm"]
    stream = torch.cuda.current_stream().cuda_stream
    pack(buf, 0, a.data_ptr(), w.data_ptr(), c.data_ptr(), 0, 0, 0, stream)
    plans = bundle._plans

    def make_key():  # as tilekiln._torch.run.run_gemm builds it for a call with out
        return (a.shape, a.stride(), a.dtype, a.get_device(), w.shape, w.stride(), w.dtype, w.get_device(), None, (),
                c.shape, c.stride(), c.dtype, c.get_device())
    if make_key() != key:
        raise SystemExit("bench/overhead.py: the runtime's plan key is not the one timed here; update make_key")
    pieces = {
        "ctypes call of a no-op C function": lambda: lib._lib.tk_abi_version(),
        "tk_run with packed blocks (C launch path)": lambda: run(plan.block, buf),
        "plan-cache key and look-up": lambda: plans.get(make_key()),
        "three data_ptr() reads": lambda: (a.data_ptr(), w.data_ptr(), c.data_ptr()),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "pack the call block": lambda: pack(buf, 0, 16, 32, 48, 0, 0, 0, stream),
    }
    return {name: round(statistics.median(per_call_us(fn, blocks)), 3) for name, fn in pieces.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    bundle = tilekiln.load(args.bundle)
    s = args.size
    a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(s, s, device="cuda", dtype=torch.bfloat16)
    # fp8 with per-tensor scales, bf16 out; b8 is K-major, as torch._scaled_mm needs.
    a8, b8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
    cases = {
        "tilekiln.gemm(a, b, out)": lambda: bundle.gemm(a, w, c),
        "torch.matmul(a, b, out=)": lambda: torch.matmul(a, w, out=c),
        "tilekiln.gemm(a, b)": lambda: bundle.gemm(a, w),
        "torch.matmul(a, b)": lambda: torch.matmul(a, w),
        "tilekiln.scaled_gemm(a8, b8, out=)": lambda: bundle.scaled_gemm(a8, b8, sa, sb, out=c),
        "torch._scaled_mm(a8, b8)": lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb,
                                                              out_dtype=torch.bfloat16, use_fast_accum=True),
    }
    for fn in cases.values():
        for _ in range(500):
            fn()
    samples = {name: [] for name in cases}
    for _ in range(4):  # alternate so clock and allocator state drift evenly
        for name, fn in cases.items():
            samples[name] += per_call_us(fn, args.blocks // 4)
    result = {name: {"median_us": round(statistics.median(v), 3), "min_us": round(min(v), 3),
                     "max_us": round(max(v), 3)} for name, v in samples.items()}
    parts = breakdown(bundle, a, w, c, args.blocks)
    ref = torch.matmul(a.double(), w.double())
    err = ((bundle.gemm(a, w).double() - ref).norm() / ref.norm()).item()
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "problem": [s, s, s], "block": BLOCK, "relative_error": err,
              "kernel": tilekiln.explain(a, w, bundle=bundle).kernel.id, "results": result, "parts": parts}
    for name, r in result.items():
        print(f"{name:36s} median {r['median_us']:7.2f} us  (min {r['min_us']:.2f}, max {r['max_us']:.2f})")
    for name, us in parts.items():
        print(f"  part: {name:44s} {us:7.3f} us")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
