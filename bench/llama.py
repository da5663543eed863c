"""The real-client check: a transformers Llama whose linear layers and MLPs run on tilekiln.

A ``LlamaForCausalLM`` with Llama-3-8B's dimensions (hidden 4096, 32 query and 8 key/value heads,
intermediate 14336, vocabulary 128256) but only ``--layers`` decoder layers, random bf16
weights. Every ``nn.Linear`` is switched to ``tilekiln.linear`` and every MLP to tilekiln's
route (gate and up as one GEMM with SwiGLU in its epilogue, ``tilekiln.swiglu`` on the weight
``tilekiln.swiglu_weight`` converts once; then down); a switch flips the same model between torch and
tilekiln, so both run the same weights. The logits of a prefill are compared at bf16
tolerance, then prefills are timed interleaved (CUDA events around whole forward passes, eager,
as a serving stack without graphs runs prefill), side by side, per sequence length.

    python3 bench/llama.py --bundle artifacts/sm90a --json bench/results/llama-<card>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tilekiln.tuning.timing import require_cuda_torch  # noqa: E402

torch = require_cuda_torch("bench/llama.py")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import tilekiln  # noqa: E402

ROUNDS = 5
# Relative Frobenius error of tilekiln's logits against torch's: both compute in bf16 with fp32
# accumulation, so they differ by rounding at every layer's outputs (about 2^-8 each).
LOGITS_TOLERANCE = 3e-2


class Switch:
    """Which side the patched modules run: torch (as transformers wrote them) or tilekiln."""

    def __init__(self, bundle):
        self.bundle = bundle
        self.tilekiln = False


def patch_linear(module: torch.nn.Linear, switch: Switch) -> None:
    torch_forward = module.forward

    def forward(x):
        if not switch.tilekiln:
            return torch_forward(x)
        return tilekiln.linear(x, module.weight, module.bias, bundle=switch.bundle)
    module.forward = forward


def patch_mlp(mlp, switch: Switch) -> None:
    """Gate and up as one GEMM of their interleaved weights (converted once) with SwiGLU in its
    epilogue, then down."""
    torch_forward = mlp.forward
    w_swiglu = tilekiln.swiglu_weight(mlp.gate_proj.weight, mlp.up_proj.weight)

    def forward(x):
        if not switch.tilekiln:
            return torch_forward(x)
        h = tilekiln.swiglu(x, w_swiglu, bundle=switch.bundle)
        return tilekiln.linear(h, mlp.down_proj.weight, bundle=switch.bundle)
    mlp.forward = forward


def build(layers: int, switch: Switch):
    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                         num_hidden_layers=layers, vocab_size=128256, max_position_embeddings=8192,
                         rope_theta=500000.0, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    for layer in model.model.layers:
        patch_mlp(layer.mlp, switch)
    mlp_linears = {id(m) for layer in model.model.layers
                   for m in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module) not in mlp_linears:
            patch_linear(module, switch)
    return model


def prefill_ms(model, ids) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(ids, use_cache=False)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default="artifacts/sm90a")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, action="append", default=None, help="prefill lengths (default 512, 2048, 4096)")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    switch = Switch(tilekiln.load(args.bundle))
    model = build(args.layers, switch)
    rows = []
    with torch.inference_mode():
        for seq in args.seq or [512, 2048, 4096]:
            ids = torch.randint(0, model.config.vocab_size, (1, seq), device="cuda")
            switch.tilekiln = False
            ref = model(ids, use_cache=False).logits.double()
            switch.tilekiln = True
            got = model(ids, use_cache=False).logits.double()
            err = ((got - ref).norm() / ref.norm()).item()
            if not err < LOGITS_TOLERANCE:
                raise SystemExit(f"bench/llama.py: logits at sequence {seq}: relative error {err:.3g} "
                                 f"(tolerance {LOGITS_TOLERANCE})")
            times = {False: [], True: []}
            for side in (False, True):  # warm-up, outside the timed rounds
                switch.tilekiln = side
                prefill_ms(model, ids)
            for r in range(ROUNDS):
                for side in ((False, True) if r % 2 == 0 else (True, False)):
                    switch.tilekiln = side
                    times[side].append(prefill_ms(model, ids))
            torch_ms, tk_ms = statistics.median(times[False]), statistics.median(times[True])
            rows.append({"seq": seq, "logits_relative_error": err, "torch_ms": round(torch_ms, 3),
                         "tilekiln_ms": round(tk_ms, 3), "ratio": round(torch_ms / tk_ms, 4),
                         "torch_samples_ms": [round(t, 3) for t in times[False]],
                         "tilekiln_samples_ms": [round(t, 3) for t in times[True]]})
            print(f"seq {seq:5d}: logits error {err:.2e}; torch {torch_ms:.2f} ms, tilekiln {tk_ms:.2f} ms, "
                  f"ratio {torch_ms / tk_ms:.3f}", flush=True)
            report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                      "torch": torch.__version__, "bundle": switch.bundle.name, "layers": args.layers,
                      "mlp_route": "swiglu", "results": rows}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
