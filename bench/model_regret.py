"""How well the selection model ranks kernels, scored on measurements tunes recorded (no GPU).

For every shape of the tuning tables' ``measurements`` (``catalog/tuning/sm90a/*.json``: per card,
the times of each candidate the tune's screen kept, and how much slower the ones it cut probed),
the model (tilekiln/select.py, ``estimate``) ranks the measured choices that are still in the
bundle, split-K ones included, and the measured time of its pick is compared with the fastest
(tilekiln/tuning/fit.py, ``regret``). The ratio is what a user pays where no tuned entry covers
the shape and the model decides, which is most of the M a server sends (issue 30). Each table is
scored with the default constants and with those ``tilekiln tune`` would fit on it.

    python3 bench/model_regret.py --bundle artifacts/sm90a --json bench/results/model-regret-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.manifest import TuningTable, read_manifest  # noqa: E402
from tilekiln.model import DEFAULT_MODEL  # noqa: E402
from tilekiln.tuning.fit import fit, model_pick, samples  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def rows(shapes, kernels, sm_count, model) -> list[dict]:
    out = []
    for s in shapes:
        pick = model_pick(s, kernels, sm_count, model)
        best = min(s.times, key=s.times.get)
        out.append({"bucket": s.bucket, "model": pick, "fastest": best, "candidates": len(s.times),
                    "ratio": round(s.times[pick] / s.times[best], 4)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", type=Path, default=ROOT / "artifacts" / "sm90a")
    p.add_argument("--tuning", type=Path, nargs="+", default=sorted((ROOT / "catalog" / "tuning" / "sm90a").glob("*.json")))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    kernels = {k.id: k for k in read_manifest(args.bundle, verify=False).kernels}
    report = {"date": datetime.date.today().isoformat(), "tables": []}
    for path in args.tuning:
        table = TuningTable.from_plain(json.loads(path.read_text()))
        for dtype in ("bf16", "e4m3"):
            shapes = [s for s in samples(table.measurements, kernels) if s.bucket.startswith(dtype)]
            if not shapes:
                continue
            fitted = fit(shapes, kernels, table.sku.sm_count)
            entry = {"table": path.name, "device": table.device, "dtype": dtype, "shapes": len(shapes),
                     "default": {"geomean": round(fitted.before[0], 4), "worst": round(fitted.before[1], 4)},
                     "fitted": {"geomean": round(fitted.after[0], 4), "worst": round(fitted.after[1], 4),
                                "constants": dict(fitted.fitted)},
                     "results": rows(shapes, kernels, table.sku.sm_count, DEFAULT_MODEL)}
            report["tables"].append(entry)
            print(f"{table.device} {dtype}: {len(shapes)} shapes, default {entry['default']}, fitted {entry['fitted']}")
            for r in sorted(entry["results"], key=lambda r: -r["ratio"])[:5]:
                print(f"  {r['ratio']:.3f} {r['bucket']:42s} model {r['model']}  fastest {r['fastest']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
