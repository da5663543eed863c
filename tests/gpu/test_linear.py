"""tilekiln.linear on the GPU: fused activations and biases against float64, the unfused remainder,
gradients, and torch.compile."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

ACTIVATIONS = ("relu", "silu", "gelutanh", "geluerf")
# (M, K, N): decode rows, odd M, N not a multiple of any tile, and a large problem.
SHAPES = ((1, 512, 1024), (37, 1024, 520), (300, 2048, 1536), (2048, 4096, 1024))
# (M, K, N) for the bias kernels: decode rows and odd M on the swapped 64x16 tile (its bias runs
# along the MMA's rows), N not a multiple of 16, 64, 128 or 256 (the last tile's bias read stops
# at N), odd M on the ping-pong tiles, a large problem.
BIAS_SHAPES = ((1, 512, 1000), (13, 1024, 520), (37, 768, 1000), (300, 2048, 1544), (2048, 4096, 1032))
BIAS_TYPES = ("bf16", "f32")


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


def _poisoned(torch, m, n, dtype):
    """An (m, n) NaN-filled output whose rows are padded to 16 bytes, as TMA needs."""
    per16 = 16 // torch.empty((), dtype=dtype).element_size()
    return torch.full((m, -(-n // per16) * per16), float("nan"), device="cuda", dtype=dtype)[:, :n]


def test_every_bias_kernel_matches_float64(bundle, torch):
    """Each kernel that adds a bias, pinned, writes every element of a NaN-poisoned output with
    act(x @ w^T + bias) on every shape."""
    from tilekiln._torch.run import run_gemm

    # bf16 operands with no other scaling (the rowwise fp8 bias kernels: tests/gpu/test_rowwise_residual.py).
    kernels = [k for k in bundle.kernels if k.config.family == "gemm" and k.config.bias.value != "none"
               and k.config.dtypes.a.value == "bf16"]
    assert {k.config.bias.value for k in kernels} == set(BIAS_TYPES)
    assert any(k.config.swap_ab for k in kernels)
    gen = torch.Generator(device="cuda").manual_seed(35)
    failures = []
    for kernel in kernels:
        cfg = kernel.config
        residual = cfg.residual.value != "none"
        requested = (("bias", cfg.bias.value),) + (
            (("activation", cfg.activation.value),) if cfg.activation.value != "none" else ()) + (
            (("residual", cfg.residual.value),) if residual else ())
        for m, k, n in BIAS_SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            w = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5).to(torch.bfloat16)
            b = torch.randn(n, device="cuda", generator=gen).to(
                torch.bfloat16 if cfg.bias.value == "bf16" else torch.float32)
            out = _poisoned(torch, m, n, torch.bfloat16)
            # The residual is read at the result's strides, so it shares out's padded rows.
            r = _poisoned(torch, m, n, torch.bfloat16).normal_(generator=gen) if residual else None
            run_gemm(bundle, x, w.t(), out, None, kernel.id, requested, b, r)
            ref = reference(torch, cfg.activation.value)(x.double() @ w.double().t() + b.double())
            if residual:
                ref = ref + r.double()
            err = rel_err(out, ref)
            if not err < 1e-2:  # NaN fails too
                failures.append(f"{kernel.id} {m}x{k}x{n}: error {err:.3g}")
    assert not failures, failures


def test_linear_fuses_the_bias_and_as_much_of_the_epilogue_as_a_kernel_computes(bundle, torch):
    """A bf16 bias is fused before every activation, an f32 bias before none and silu; with any other
    activation the f32-bias kernel runs and torch applies the activation. The result has x's dtype."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(36)
    failures = []
    for m, k, n in BIAS_SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5).to(torch.bfloat16)
        z = x.double() @ w.double().t()
        for bias_type in BIAS_TYPES:
            b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16 if bias_type == "bf16" else torch.float32)
            for act in ("none", *ACTIVATIONS):
                choice = tilekiln.explain(x, w.t(), bundle=bundle, bias=b, activation=act)
                cfg = choice.kernel.config
                want_act = act if bias_type == "bf16" or act in ("none", "silu") else "none"
                fused = cfg.bias.value == bias_type and cfg.activation.value == want_act
                got = tilekiln.linear(x, w, b, activation=act, bundle=bundle)
                err = rel_err(got, reference(torch, act)(z + b.double()))
                if not err < 1e-2 or not fused or got.dtype != torch.bfloat16:
                    failures.append(f"bias {bias_type} {act} {m}x{k}x{n}: error {err:.3g}, {got.dtype}, "
                                    f"chosen {choice.label}")
    assert not failures, failures


def test_a_bias_over_an_empty_k_is_the_bias(bundle, torch):
    """K = 0: the product is zero, and the epilogue still adds the bias and applies the activation."""
    import tilekiln

    x = torch.empty(5, 0, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(24, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(24, device="cuda", dtype=torch.bfloat16)
    got = tilekiln.linear(x, w, b, activation="relu", bundle=bundle)
    assert torch.equal(got, torch.relu(b).expand(5, 24))


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
    text = str(tilekiln.explain(x.reshape(-1, 768), w.t(), bundle=bundle, bias=b, activation="silu"))
    assert "_biasbf16_silu" in text.splitlines()[0] and "unfused" not in text, text


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
    b1 = torch.randn(2816, device="cuda", dtype=torch.bfloat16, generator=gen)
    b2 = torch.randn(1024, device="cuda", dtype=torch.float32, generator=gen)

    def mlp(x):
        return tilekiln.linear(tilekiln.linear(x, w1, b1, activation="gelutanh", bundle=bundle), w2, b2, residual=x,
                               bundle=bundle)

    eager = mlp(x)
    torch._dynamo.reset()
    assert rel_err(torch.compile(mlp, fullgraph=True)(x), eager.double()) < 1e-3
    h = torch.nn.functional.gelu(x.double() @ w1.double().t() + b1.double(), approximate="tanh")
    assert rel_err(eager, h @ w2.double().t() + b2.double() + x.double()) < 2e-2


def test_a_compiled_linear_fuses_its_residual_as_the_eager_call_does(bundle, torch):
    """Under torch.compile the residual rides in the tilekiln::gemm node: a residual at the result's
    strides runs the fused kernel, bitwise the eager call's; one at other strides (a padded view) is
    added inside the node in fp32, rounded once, against float64."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(35)
    x = torch.randn(2, 300, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(1536, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    b = torch.randn(1536, device="cuda", dtype=torch.bfloat16, generator=gen)
    r = torch.randn(2, 300, 1536, device="cuda", dtype=torch.bfloat16, generator=gen)
    padded = torch.randn(2, 300, 1600, device="cuda", dtype=torch.bfloat16, generator=gen)[..., :1536]

    def f(x, r):
        return tilekiln.linear(x, w, b, residual=r, bundle=bundle)

    eager = f(x, r)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(x, r), eager)
    ref = x.double() @ w.double().t() + b.double()
    assert rel_err(compiled(x, padded), ref + padded.double()) < 1e-2
