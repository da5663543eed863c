"""How well the selection model ranks kernels, scored on measurements a tune recorded (no GPU).

For every shape of a tuning file's ``measurements`` (``catalog/tuning/sm90a/h200.json``: the H200
times of each candidate that passed the tune's screen), the model (tilekiln/select.py,
``estimate``) ranks the measured candidates that are still in the bundle, and the measured time of
its pick is compared with the fastest measured one. The ratio is what a user pays where no tuned
entry covers the shape and the model decides, which is most of the M a server sends (issue 30).
Candidates the screen cut (slower than twice the fastest) are not ranked: the score is of the
model's ordering among plausible kernels, not of a pick it could make outside them.

    python3 bench/model_regret.py --bundle artifacts/sm90a --json bench/results/model-regret-<date>.json
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
from tilekiln._tensors import Operand  # noqa: E402
from tilekiln.manifest import read_manifest  # noqa: E402
from tilekiln.problem import make_problem  # noqa: E402
from tilekiln.select import estimate, nominal_clusters  # noqa: E402
from tilekiln.splitk import parse_label  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _operand(name: str, rows: int, cols: int, row_major: bool, dtype: str) -> Operand:
    strides = (cols, 1) if row_major else (1, rows)
    return Operand(name, (rows, cols), strides, dtype, 0x10000, 0, None)


def problem_of(bucket: str, shape: list[int]):
    """The measured problem of a tuning-table entry (``dtype:layout:bucket:batch`` and its shape)."""
    dtypes, layout, _, _ = bucket.split(":")
    (a_dtype, b_dtype), out_dtype = dtypes.split("->")[0].split("/"), dtypes.split("->")[1]
    m, n, k = shape
    a = _operand("a", m, k, layout[0] == "t", a_dtype)
    b = _operand("b", k, n, layout[1] == "t", b_dtype)
    return make_problem(a, b, None, out_dtype if a_dtype in ("e4m3", "e5m2") else None)


def regret(measurements: dict, kernels: dict, sm_count: int) -> list[dict]:
    rows = []
    for bucket, entry in sorted(measurements.items()):
        times = {label: t for label, t in entry["candidates"].items()
                 if parse_label(label)[1] == 1 and label in kernels}
        if not times:
            continue
        problem = problem_of(bucket, entry["shape"])
        pick = min(times, key=lambda label: (estimate(kernels[label], problem,
                                                      nominal_clusters(kernels[label], sm_count)), label))
        best = min(times, key=times.get)
        rows.append({"bucket": bucket, "shape": entry["shape"], "model": pick, "fastest": best,
                     "candidates": len(times), "ratio": round(times[pick] / times[best], 4)})
    return rows


def summary(rows: list[dict]) -> dict:
    ratios = sorted(r["ratio"] for r in rows)
    return {"shapes": len(ratios), "geomean": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 4),
            "p90": ratios[int(0.9 * (len(ratios) - 1))], "max": ratios[-1],
            "over_1.1": sum(r > 1.1 for r in ratios)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", type=Path, default=ROOT / "artifacts" / "sm90a")
    p.add_argument("--tuning", type=Path, default=ROOT / "catalog" / "tuning" / "sm90a" / "h200.json")
    p.add_argument("--sm-count", type=int, default=None,
                   help="SMs of the card the measurements come from (default: the table's sm_count)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    kernels = {k.id: k for k in read_manifest(args.bundle, verify=False).kernels}
    tuning = json.loads(args.tuning.read_text())
    rows = regret(tuning["measurements"], kernels, args.sm_count or tuning["sm_count"])
    report = {"date": datetime.date.today().isoformat(), "measured_on": tuning.get("device"),
              "summary": {dt: summary([r for r in rows if r["bucket"].startswith(dt)]) for dt in ("bf16", "e4m3")},
              "worst": sorted(rows, key=lambda r: -r["ratio"])[:10], "results": rows}
    for dt, s in report["summary"].items():
        print(f"{dt}: {s}")
    for r in report["worst"]:
        print(f"{r['ratio']:.3f} {r['bucket']:42s} model {r['model']}  fastest {r['fastest']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
