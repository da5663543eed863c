"""tilekiln.swiglu on the GPU: every swiglu kernel against a float64 reference of the unfused
computation (fresh random inputs, NaN-poisoned outputs, odd M, I not a multiple of the tile), the
unfused fallback, out=, gradients and torch.compile."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (M, K, I): decode rows, odd M, I a multiple of the 64-row gate/up block but not of any tile's
# half (192, 576, 1088), K not a multiple of the tile K, the Llama-3 8B and Qwen2.5 7B MLP widths.
SHAPES = ((1, 512, 128), (37, 1000, 192), (129, 768, 576), (300, 2048, 1088), (1000, 4096, 14336),
          (513, 3584, 18944))


def reference(torch, x, w_gate, w_up):
    """silu(x @ gate^T) * (x @ up^T) in float64, from the weights before conversion."""
    x, w_gate, w_up = (t.double() for t in (x, w_gate, w_up))
    return torch.nn.functional.silu(x @ w_gate.t()) * (x @ w_up.t())


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _poisoned(torch, rows, cols, dtype):
    """A NaN-filled (rows, cols) output whose rows are padded to 16 bytes, as TMA needs."""
    per16 = 16 // torch.empty((), dtype=dtype).element_size()
    return torch.full((rows, -(-cols // per16) * per16), float("nan"), device="cuda", dtype=dtype)[:, :cols]


def _weights(torch, gen, inter, k):
    w_gate, w_up = ((torch.randn(inter, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
                    for _ in range(2))
    return w_gate, w_up


def test_every_swiglu_kernel_matches_float64(bundle, torch):
    """Each swiglu kernel, pinned, writes every element of a NaN-poisoned (M, I) output with the
    float64 silu(gate) * up on every shape, fresh inputs per kernel and shape."""
    import tilekiln
    from tilekiln._torch.run import run_gemm

    # bf16 ones: tests/gpu/test_blockwise.py runs the blockwise fp8 SwiGLU kernel.
    kernels = [k for k in bundle.kernels if k.config.family == "gemm" and k.config.activation.value == "swiglu"
               and k.config.dtypes.a.value == "bf16"]
    assert {(k.config.tile.m, k.config.tile.n) for k in kernels} >= {(128, 128), (128, 256)}
    gen = torch.Generator(device="cuda").manual_seed(41)
    failures = []
    for kernel in kernels:
        for m, k, inter in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            w_gate, w_up = _weights(torch, gen, inter, k)
            w = tilekiln.swiglu_weight(w_gate, w_up)
            out = _poisoned(torch, m, inter, torch.bfloat16)
            run_gemm(bundle, x, w.t(), out, None, kernel.id, (("activation", "swiglu"),))
            err = rel_err(out, reference(torch, x, w_gate, w_up))
            if not err < 1e-2:  # NaN fails too
                failures.append(f"{kernel.id} {m}x{k}x{inter}: error {err:.3g}")
    assert not failures, failures


def test_swiglu_fuses_where_a_kernel_can_and_falls_back_to_torch_where_none_can(bundle, torch):
    """I a multiple of 64: one fused kernel; I = 100 (no kernel pairs its blocks) and an f16 call (no
    f16 swiglu kernel): the plain GEMM and the pairing in torch, which explain says. Every result
    matches float64, 3-D inputs included."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(42)
    for m, k, inter, dtype, fused in ((512, 1024, 1024, torch.bfloat16, True), (77, 512, 100, torch.bfloat16, False),
                                      (64, 512, 256, torch.float16, False)):
        x = torch.randn(2, m, k, device="cuda", generator=gen).to(dtype)
        w_gate, w_up = (w.to(dtype) for w in _weights(torch, gen, inter, k))
        w = tilekiln.swiglu_weight(torch.cat([w_gate, w_up]))
        choice = tilekiln.explain(x[0], w.t(), activation="swiglu", bundle=bundle)
        assert (choice.kernel.config.activation.value == "swiglu") is fused, str(choice)
        assert fused or "unfused: no kernel computes activation swiglu" in str(choice)
        got = tilekiln.swiglu(x, w, bundle=bundle)
        assert got.shape == (2, m, inter) and got.dtype == dtype
        assert rel_err(got, reference(torch, x, w_gate, w_up)) < 1e-2


def test_swiglu_writes_out_and_leaves_its_padding_alone(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(43)
    x = torch.randn(37, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w_gate, w_up = _weights(torch, gen, 192, 1024)
    w = tilekiln.swiglu_weight(w_gate, w_up)
    backing = torch.full((37, 200), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = backing[:, :192]
    assert tilekiln.swiglu(x, w, out=out, bundle=bundle) is out
    assert rel_err(out, reference(torch, x, w_gate, w_up)) < 1e-2
    assert torch.isnan(backing[:, 192:]).all()


def test_swiglu_gradients_match_float64(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(44)
    x = torch.randn(4, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w_gate, w_up = _weights(torch, gen, 384, 512)
    w = tilekiln.swiglu_weight(w_gate, w_up).requires_grad_()
    g = torch.randn(4, 64, 384, device="cuda", dtype=torch.bfloat16, generator=gen)
    tilekiln.swiglu(x, w, bundle=bundle).backward(g)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    from tilekiln._torch.epilogue import swiglu_unfused

    swiglu_unfused(x64 @ w64.t()).backward(g.double())
    for got, ref in ((x.grad, x64.grad), (w.grad, w64.grad)):
        assert rel_err(got, ref) < 2e-2


def test_a_compiled_swiglu_mlp_matches_eager(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(45)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w_gate, w_up = _weights(torch, gen, 2816, 1024)
    w = tilekiln.swiglu_weight(w_gate, w_up)
    w_down = torch.randn(1024, 2816, device="cuda", dtype=torch.bfloat16, generator=gen) / 53

    def mlp(x):
        return tilekiln.linear(tilekiln.swiglu(x, w, bundle=bundle), w_down, residual=x, bundle=bundle)

    eager = mlp(x)
    torch._dynamo.reset()
    assert rel_err(torch.compile(mlp, fullgraph=True)(x), eager.double()) < 1e-3
    h = reference(torch, x, w_gate, w_up)
    assert rel_err(eager, h @ w_down.double().t() + x.double()) < 2e-2
