"""Sustained 8192^3 bf16 GEMM: throughput next to the SM clock and power the card holds.

tilekiln and torch.matmul run in alternating blocks of back-to-back calls
(``--block`` seconds each, ``--blocks`` per side) while ``nvidia-smi`` samples
the SM clock, board power and the active clock-event reasons every 100 ms.
Each block reports TFLOP/s (host wall time over the block's calls, the GPU
kept busy), the mean SM clock and power over the block, and the fraction of
the dense tensor-core peak *at that clock* the GEMM reached, so a power-capped
run can be told from an inefficient kernel.

The per-clock peak is Hopper's dense bf16 warpgroup-MMA rate, 4096 flop per
SM per clock (989.4 TFLOP/s at the 1830 MHz boost clock over 132 SMs, NVIDIA
H100 whitepaper; the H200 has the same SM).

    python3 bench/sustained.py --json bench/results/sustained-h200-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/sustained.py")
import tilekiln  # noqa: E402

FLOP_PER_SM_CLOCK = 4096
SMI_FIELDS = "timestamp,clocks.sm,power.draw,power.limit,clocks_event_reasons.active"
# nvidia-smi's clocks_event_reasons bits (nvmlClocksEventReasons).
REASONS = {0x1: "idle", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
           0x80: "hw_power_brake"}


def start_sampler() -> subprocess.Popen:
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                             "-lms", "100"], stdout=subprocess.PIPE, text=True)


def parse_samples(text: str) -> list[tuple[float, float, float, float, int]]:
    """(unix time, SM MHz, watts, power limit W, reason bits) per sample line."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((stamp, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)))
        except ValueError:
            continue
    return rows


def run_block(call, seconds: float) -> tuple[float, float, int]:
    """(start, end, calls): back-to-back calls for about ``seconds``, synchronised at the end."""
    torch.cuda.synchronize()
    start = time.time()
    calls = 0
    while time.time() - start < seconds:
        for _ in range(8):
            call()
        calls += 8
        torch.cuda.synchronize()
    return start, time.time(), calls


def summarise(name, start, end, calls, samples, flops, sms) -> dict:
    inside = [s for s in samples if start <= s[0] <= end]
    mhz = statistics.fmean(s[1] for s in inside) if inside else float("nan")
    watts = statistics.fmean(s[2] for s in inside) if inside else float("nan")
    bits = 0
    for s in inside:
        bits |= s[4]
    tflops = flops * calls / (end - start) / 1e12
    peak = sms * FLOP_PER_SM_CLOCK * mhz * 1e6 / 1e12
    return {"side": name, "seconds": round(end - start, 2), "calls": calls, "tflops": round(tflops, 1),
            "sm_mhz": round(mhz), "watts": round(watts), "samples": len(inside),
            "peak_at_clock_tflops": round(peak, 1), "fraction_of_peak_at_clock": round(tflops / peak, 3),
            "clock_event_reasons": [v for k, v in REASONS.items() if bits & k]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--block", type=float, default=3.0, help="seconds per block")
    p.add_argument("--blocks", type=int, default=3, help="blocks per side")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    bundle = tilekiln.load(args.bundle)
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16).t()
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    choice = bundle.explain(a, b)
    sides = {"tilekiln": lambda: bundle.gemm(a, b, c), "torch": lambda: torch.matmul(a, b, out=c)}
    for call in sides.values():  # warm-up; also loads the kernel
        call()
    torch.cuda.synchronize()

    sampler = start_sampler()
    blocks = []
    try:
        for _ in range(args.blocks):
            for name, call in sides.items():
                blocks.append((name, *run_block(call, args.block)))
    finally:
        time.sleep(0.3)  # the sampler's last lines cover the end of the final block
        sampler.terminate()
        out, _ = sampler.communicate()
    samples = parse_samples(out)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flops = 2 * n ** 3
    rows = [summarise(name, s, e, k, samples, flops, sms) for name, s, e, k in blocks]
    for r in rows:
        print(f"{r['side']:>8}: {r['tflops']:7.1f} TFLOP/s at {r['sm_mhz']:5d} MHz, {r['watts']:4d} W "
              f"({r['fraction_of_peak_at_clock']:.3f} of the {r['peak_at_clock_tflops']:.0f} TFLOP/s peak at that "
              f"clock; {', '.join(r['clock_event_reasons']) or 'no clock events'})")
    report = {"device": torch.cuda.get_device_name(), "shape": [n, n, n], "dtype": "bf16", "sms": sms,
              "flop_per_sm_clock": FLOP_PER_SM_CLOCK, "kernel": f"{choice.label} ({choice.how})", "blocks": rows,
              "power_limit_w": samples[0][3] if samples else None}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
