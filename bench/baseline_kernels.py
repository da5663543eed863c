"""Which kernels the baseline (cuBLAS through torch) runs for each shape of ``gemm.py``'s suite.

For every shape, three calls of torch.matmul (bf16, f16) or torch._scaled_mm
(e4m3, the same call ``gemm.py`` times) run under the torch profiler; the
report lists each GPU kernel they launched with its mean device time. The
kernel names carry cuBLAS's tile, stage count and cluster choice (on the H200,
``nvjet_sm90_tst_64x16_64x16_2x1_v_bz_TNT`` at 16x8192x8192 bf16: a 64x16 tile
in 2x1 clusters), which is what a catalog sweep has to match or beat.

    python3 bench/baseline_kernels.py --dtype bf16 --json bench/results/baseline-kernels-h200-<date>-bf16.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import baseline_call, require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/baseline_kernels.py")
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import FP8, SCALE_A, SCALE_B, shape_suite  # noqa: E402


def kernels_for(m: int, n: int, k: int, dtype) -> list[dict]:
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(n, k, device="cuda").to(dtype).t()  # K-major B, as gemm.py times it
    out_dtype = torch.bfloat16 if dtype == FP8 else dtype
    c = torch.empty(m, n, device="cuda", dtype=out_dtype)
    scales = None
    if dtype == FP8:
        scales = (torch.tensor([SCALE_A], device="cuda"), torch.tensor([SCALE_B], device="cuda"))
    baseline_call(a, b, c, scales)  # cuBLAS picks and caches its algorithm outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            baseline_call(a, b, c, scales)
        torch.cuda.synchronize()
    return sorted(({"kernel": e.key, "launches": e.count, "mean_us": round(e.device_time_total / e.count, 1)}
                   for e in prof.key_averages() if e.device_time_total > 0), key=lambda r: -r["mean_us"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "e4m3"])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": FP8}[args.dtype]
    rows = []
    for (m, n, k) in dict.fromkeys(shape_suite()):
        kernels = kernels_for(m, n, k, dtype)
        rows.append({"m": m, "n": n, "k": k, "kernels": kernels})
        names = ", ".join(f"{r['kernel']} {r['mean_us']} us" for r in kernels)
        print(f"{m:6d}x{n:6d}x{k:6d}  {names}", flush=True)
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "dtype": args.dtype, "results": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
