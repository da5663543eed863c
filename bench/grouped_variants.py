"""Grouped c2x1 (B multicast along M) vs c1x1 vs torch._grouped_mm vs dense; correctness of c2x1 first."""
import json, statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent)); sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import torch, tilekiln
from moe import LAYERS, routing, timer
main = tilekiln.load(sys.argv[3] if len(sys.argv) > 3 else "artifacts-main/sm90a")  # main's build
clu = tilekiln.load(sys.argv[2] if len(sys.argv) > 2 else "artifacts/sm90a")  # this branch's build
G = "grouped_sm90_bf16_bf16_f32_bf16_tn_"
sides = {"c1_128x256": (main, G + "128x256x64_c1x1"), "c1_128x128": (main, G + "128x128x64_c1x1"),
         "pp_64x128": (main, G + "64x128x64_c1x1_pingpong"),
         "c2_128x256": (clu, G + "128x256x64_c2x1"), "c2_128x128": (clu, G + "128x128x64_c2x1"),
         "s1_128x256": (clu, G + "128x256x64_c1x1"), "s1_128x128": (clu, G + "128x128x64_c1x1")}
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
# correctness: odd tile counts, empty groups, one-row groups
for counts in ([0, 1, 129, 300, 0, 257, 5, 640], [1000, 0, 0, 17], [3] * 16, [0, 0, 0]):
    c = torch.tensor(counts, device="cuda")
    g = len(counts); n, k = 384, 256
    a = torch.randn(int(c.sum()), k, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", generator=gen).to(torch.bfloat16)
    offs = c.cumsum(0).to(torch.int32)
    ends = [0] + offs.tolist()
    ref = torch.cat([a[ends[i]:ends[i + 1]].double() @ w[i].double().t() for i in range(g)]) if a.shape[0] else None
    for s in ("c2_128x256", "c2_128x128", "s1_128x256", "s1_128x128"):
        b, kid = sides[s]
        out = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
        b.grouped_gemm(a, w.transpose(1, 2), offs, out=out, kernel=kid)
        torch.cuda.synchronize()
        if ref is not None:
            err = ((out.double() - ref).norm() / ref.norm()).item()
            print("check", s, counts[:6], "err", err, "nan", bool(torch.isnan(out).any()), flush=True)
rows_out = []
for name in ("qwen3-30b-a3b", "olmoe-1b-7b", "deepseek-v3-ep8", "mixtral-8x7b"):
    groups, hidden, n, top_k = LAYERS[name]
    for tokens in (4096, 16384):
        skew = routing(groups, tokens, top_k, 1.0, gen)
        aligned = ((skew + 127) // 128) * 128
        w = (torch.randn(groups, n, hidden, device="cuda", generator=gen) / hidden**0.5).to(torch.bfloat16)
        b = w.transpose(1, 2)
        for rname, counts in (("skewed", skew), ("aligned128", aligned)):
            if tokens == 16384 and rname == "aligned128":
                continue
            rows = int(counts.sum())
            offs = counts.cumsum(0).to(torch.int32)
            a = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
            flops = 2 * rows * n * hidden
            iters = max(5, min(100, int(1e13 / flops)))
            fns = {s: (lambda bb=bb, kid=kid: bb.grouped_gemm(a, b, offs, out=out, kernel=kid)) for s, (bb, kid) in sides.items()}
            fns["auto"] = lambda: main.grouped_gemm(a, b, offs, out=out)
            fns["torch_grouped_mm"] = lambda: torch._grouped_mm(a, b, offs=offs)
            dense_b = w[0].t()
            fns["dense_torch"] = lambda: torch.mm(a, dense_b, out=out)
            fns["dense_tilekiln"] = lambda: main.gemm(a, dense_b, out=out)
            timers = {s: timer(f, iters, 10.0, s) for s, f in fns.items()}
            times = {s: [] for s in timers}
            for _ in range(3):
                for s, t in timers.items():
                    times[s].append(t())
            tf = {s: round(flops / statistics.median(v) / 1e9, 1) for s, v in times.items()}
            row = dict(layer=name, tokens=tokens, routing=rname, rows=rows, tflops=tf)
            print(json.dumps(row), flush=True)
            rows_out.append(row)
Path(sys.argv[1]).write_text(json.dumps(dict(card=torch.cuda.get_device_name(), rows=rows_out), indent=1))
