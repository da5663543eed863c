"""tilekiln.linear on the GPU: fused activations against float64, the unfused remainder, gradients,
and torch.compile."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

ACTIVATIONS = ("relu", "silu", "gelutanh", "geluerf")
# (M, K, N): decode rows, odd M, N not a multiple of any tile, and a large problem.
SHAPES = ((1, 512, 1024), (37, 1024, 520), (300, 2048, 1536), (2048, 4096, 1024))




def reference(torch, name):
    f = torch.nn.functional
    return {"none": lambda y: y, "relu": torch.relu, "silu": f.silu,
            "gelutanh": lambda y: f.gelu(y, approximate="tanh"), "geluerf": f.gelu}[name]


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_fused_activations_match_float64(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(31)
    failures = []
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5).to(torch.bfloat16)
        z = x.double() @ w.double().t()
        for act in ACTIVATIONS:
            choice = tilekiln.explain(x, w.t(), bundle=bundle, activation=act)
            fused = choice.kernel is not None and choice.kernel.config.activation.value == act
            got = tilekiln.linear(x, w, activation=act, bundle=bundle)
            err = rel_err(got, reference(torch, act)(z))
            if not err < 1e-2 or not fused:
                failures.append(f"{act} {m}x{k}x{n}: error {err:.3g}, fused {fused} ({choice.label})")
    assert not failures, failures


def test_bias_residual_and_batched_inputs_apply_the_rest_in_torch(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(32)
    x = torch.randn(3, 50, 768, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16, generator=gen) / 28
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    r = torch.randn(3, 50, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    for act in ("none", *ACTIVATIONS):
        got = tilekiln.linear(x, w, b, activation=act if act != "none" else None, residual=r, bundle=bundle)
        ref = reference(torch, act)(x.double() @ w.double().t() + b.double()) + r.double()
        assert got.shape == (3, 50, 1024) and rel_err(got, ref) < 1e-2, act
    text = str(tilekiln.explain(x.reshape(-1, 768), w.t(), bundle=bundle, activation="silu"))
    assert "_silu" in text.splitlines()[0], text


def test_linear_gradients_match_float64(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(33)
    x = torch.randn(4, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = (torch.randn(768, 512, device="cuda", dtype=torch.bfloat16, generator=gen) / 22).requires_grad_()
    b = torch.randn(768, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    g = torch.randn(4, 64, 768, device="cuda", dtype=torch.bfloat16, generator=gen)
    tilekiln.linear(x, w, b, activation="silu", bundle=bundle).backward(g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    torch.nn.functional.silu(x64 @ w64.t() + b64).backward(g.double())
    for got, ref in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        assert rel_err(got, ref) < 2e-2


def test_a_compiled_mlp_matches_eager(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(34)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w1 = torch.randn(2816, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    w2 = torch.randn(1024, 2816, device="cuda", dtype=torch.bfloat16, generator=gen) / 53

    def mlp(x):
        return tilekiln.linear(tilekiln.linear(x, w1, activation="gelutanh", bundle=bundle), w2, residual=x,
                               bundle=bundle)

    eager = mlp(x)
    torch._dynamo.reset()
    assert rel_err(torch.compile(mlp, fullgraph=True)(x), eager.double()) < 1e-3
