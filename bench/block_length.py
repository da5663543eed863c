"""Does the length of a timed block change which kernel is faster? Pinned bf16 kernels next to
cuBLAS (torch.matmul) at blocks of several lengths, with the SM clock and board power.

For every shape and every ``--block-ms`` length, the kernels are timed as
``tilekiln tune`` times them (``tilekiln.tuning.timing.interleaved``: rounds
of round-robin blocks, each candidate block followed by a baseline block,
scored relative to it), with blocks of as many back-to-back launches as take that long at the
baseline's speed (two at least). Blocks of 50 ms or more also get one
``nvidia-smi`` sample of SM clock and power taken 60% of the way in, while
the GPU runs the queued launches and the host is free. A card at its power
cap gives each kernel the clock its own power draw allows only once a block
lasts long enough for the cap to act: short blocks rank kernels by speed at
whatever clock the previous block left, long ones by speed per watt.

    python3 bench/block_length.py --shape 16384x24576x8192 --kernels 128x256x64_c2x1,128x256x64_c2x1_sw8 \
        --block-ms 1,30,150 --json bench/results/block-length-h200-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/block_length.py")
import tilekiln  # noqa: E402
from tilekiln.tune import parse_shapes  # noqa: E402
from tilekiln.tuning.timing import (baseline_call, interleaved, median_event_ms, operand_sets,  # noqa: E402
                                    warm_ms)

PREFIX = "gemm_sm90_bf16_bf16_f32_bf16_tn_"
SAMPLED_MS = 50.0


def smi_sample() -> tuple[float, float]:
    """(SM MHz, board W) now."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    mhz, watts = out.strip().splitlines()[0].split(",")
    return float(mhz), float(watts)


def timed_block(fn, launches: int, expect_ms: float, samples: list) -> float:
    """``timing.median_event_ms`` of ``launches`` calls; one clock sample, 60% into the block,
    if the block is expected to last ``SAMPLED_MS`` or more."""
    def sample():
        time.sleep(0.6 * expect_ms / 1000)
        samples.append(smi_sample())

    return median_event_ms(fn, launches, sample if expect_ms >= SAMPLED_MS else None)


def _median(samples: list, field: int) -> float | None:
    return round(statistics.median(s[field] for s in samples), 1) if samples else None


def measure(bundle, shape, kernels: list[str], block_ms: list[float], rounds: int) -> list[dict]:
    m, n, k = shape
    sets = operand_sets(m, n, k, torch.bfloat16, torch.bfloat16)
    runner = {kid: (lambda kid: lambda i: bundle.gemm(*sets[i % len(sets)], kernel=kid))(kid) for kid in kernels}
    baseline = lambda i: baseline_call(*sets[i % len(sets)], None)  # noqa: E731
    base_ms = warm_ms(baseline)
    for kid in kernels:
        warm_ms(runner[kid])
    flops = 2 * m * n * k
    rows = []
    for ms in block_ms:
        launches = max(2, math.ceil(ms / base_ms))
        expect = launches * base_ms
        samples: dict[str, list] = {kid: [] for kid in kernels}
        base_samples: list = []
        t = interleaved(kernels, lambda kid: timed_block(runner[kid], launches, expect, samples[kid]),
                        lambda: timed_block(baseline, launches, expect, base_samples), rounds)
        row = {"shape": [m, n, k], "block_ms": ms, "launches": launches,
               "baseline": {"tflops": round(flops / t.reference_ms / 1e9, 1),
                            "mhz": _median(base_samples, 0), "w": _median(base_samples, 1)},
               "kernels": {kid.removeprefix(PREFIX): {"tflops": round(flops / t.candidates[kid] / 1e9, 1),
                                                      "ratio": round(t.reference_ms / t.candidates[kid], 4),
                                                      "mhz": _median(samples[kid], 0), "w": _median(samples[kid], 1)}
                           for kid in sorted(kernels, key=t.candidates.get)}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--shape", action="append", required=True, help="MxNxK (repeatable)")
    p.add_argument("--kernels", required=True,
                   help=f"comma-separated kernel ids, or their suffixes after {PREFIX}")
    p.add_argument("--block-ms", default="1,30,150", help="comma-separated block lengths in ms")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    bundle = tilekiln.load(args.bundle)
    built = {kernel.id for kernel in bundle.manifest.kernels}
    wanted = [kid if kid.startswith("gemm_") else PREFIX + kid for kid in args.kernels.split(",")]
    missing = [kid for kid in wanted if kid not in built]
    if missing:
        raise SystemExit(f"--kernels: not in {args.bundle}: {', '.join(missing)}")
    rows = []
    for shape in parse_shapes(",".join(args.shape)):
        rows += measure(bundle, shape, wanted, [float(x) for x in args.block_ms.split(",")], args.rounds)
        if args.json:  # after every shape, so a run cut short keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(),
                                             "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "bundle": bundle.name, "rounds": args.rounds, "rows": rows},
                                            indent=2) + "\n")


if __name__ == "__main__":
    main()
