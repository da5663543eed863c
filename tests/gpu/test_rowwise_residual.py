"""Row-wise fp8 scales and the fused residual on the GPU: every rowwise and residual kernel, pinned,
against a float64 reference of the unfused computation on fresh random inputs, NaN-poisoned
outputs, odd M and N not a multiple of the tile; the residual in place (out is the residual);
row-wise calls after per-tensor calls of the same shape; and the selection tilekiln.scaled_gemm
and tilekiln.linear make."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu

# (M, K, N): decode rows and odd M on the swapped tiles (their MMA rows are the problem's N, so
# the row scales and residual rows run along the MMA's columns), N not a multiple of 16, 64, 128
# or 256 (the last tile's reads stop at N), odd M on the ping-pong tiles, a large problem.
SHAPES = ((1, 512, 1000), (13, 1024, 520), (37, 768, 1000), (300, 2048, 1544), (2048, 4096, 1032))


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def activation(torch, name):
    f = torch.nn.functional
    return {"none": lambda y: y, "relu": torch.relu, "silu": f.silu,
            "gelutanh": lambda y: f.gelu(y, approximate="tanh"), "geluerf": f.gelu}[name]


def poisoned(torch, m, n, dtype):
    """An (m, n) NaN-filled tensor whose rows are padded to 16 bytes, as TMA needs."""
    per16 = 16 // torch.empty((), dtype=dtype).element_size()
    return torch.full((m, -(-n // per16) * per16), float("nan"), device="cuda", dtype=dtype)[:, :n]


def fp8_operands(torch, gen, m, k, n):
    fp8 = torch.float8_e4m3fn
    a = torch.randn(m, k, device="cuda", generator=gen).to(fp8)
    w = torch.randn(n, k, device="cuda", generator=gen).to(fp8)
    sa = torch.rand(m, 1, device="cuda", generator=gen) + 0.5
    sb = torch.rand(1, n, device="cuda", generator=gen) + 0.5
    return a, w, sa, sb


def requested_of(kernel):
    from tilekiln.spec import requested_fields

    cfg = kernel.config
    return tuple((f.name, spec.codec.request(getattr(cfg, f.name))) for f, spec in requested_fields()
                 if getattr(cfg, f.name) != f.default)


def test_every_rowwise_kernel_matches_float64(bundle, torch):
    """Each row-wise kernel, pinned, writes every element of a NaN-poisoned output with
    (a @ w^T) * scale_a[m] * scale_b[n] (+ bias) on every shape."""
    from tilekiln._torch.run import run_scaled_gemm

    # The e4m3-result ones: tests/gpu/test_fp8_output.py.
    kernels = [k for k in bundle.kernels if k.config.family == "gemm" and k.config.scaling.value == "rowwise"
               and k.config.dtypes.c.value == "bf16"]
    assert kernels and any(k.config.swap_ab for k in kernels) and any(k.config.bias.value != "none" for k in kernels)
    gen = torch.Generator(device="cuda").manual_seed(41)
    failures = []
    for kernel in kernels:
        cfg = kernel.config
        for m, k, n in SHAPES:
            a, w, sa, sb = fp8_operands(torch, gen, m, k, n)
            bias = None if cfg.bias.value == "none" else torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
            out = poisoned(torch, m, n, torch.bfloat16)
            run_scaled_gemm(bundle, a, w.t(), sa, sb, torch.bfloat16, out, None, kernel.id,
                            requested_of(kernel), bias)
            ref = (a.double() @ w.double().t()) * sa.double() * sb.double()
            if bias is not None:
                ref = ref + bias.double()
            err = rel_err(out, activation(torch, cfg.activation.value)(ref))
            if not err < 1e-2:  # NaN fails too
                failures.append(f"{kernel.id} {m}x{k}x{n}: error {err:.3g}")
    assert not failures, failures


def test_rowwise_scaled_gemm_is_selected_from_the_scales_and_follows_per_tensor_calls(bundle, torch):
    """tilekiln.scaled_gemm reads (M, 1) and (1, N) scales as row-wise (torch._scaled_mm's rule) and
    runs a rowwise kernel; a per-tensor call of the same shape before or after it keeps its own plan."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(42)
    one, two = torch.tensor([1.0], device="cuda"), torch.tensor([2.0], device="cuda")
    for m, k, n in SHAPES:
        a, w, sa, sb = fp8_operands(torch, gen, m, k, n)
        product = a.double() @ w.double().t()
        choice = tilekiln.explain(a, w.t(), bundle=bundle, scale_format="rowwise")
        assert choice.kernel.config.scaling.value == "rowwise", choice
        for _ in range(2):
            assert rel_err(tilekiln.scaled_gemm(a, w.t(), two, one, bundle=bundle), product * 2) < 1e-2
            got = tilekiln.scaled_gemm(a, w.t(), sa, sb, bundle=bundle)
            assert got.dtype == torch.bfloat16 and rel_err(got, product * sa.double() * sb.double()) < 1e-2
        bias = torch.randn(n, device="cuda", generator=gen)
        got = tilekiln.scaled_gemm(a, w.t(), sa, sb, bias=bias, bundle=bundle)
        assert rel_err(got, product * sa.double() * sb.double() + bias.double()) < 1e-2


def test_bad_rowwise_scales_are_refused_naming_the_argument(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(43)
    a, w, sa, sb = fp8_operands(torch, gen, 64, 256, 128)
    cases = (
        ((sa.double(), sb), "scale_a: expected a float32 tensor (M, 1) = (64, 1)"),
        ((sa, sb.to(torch.bfloat16)), "scale_b: expected a float32 tensor (1, N) = (1, 128)"),
        ((torch.rand(65, 1, device="cuda"), sb), "got shape [65, 1]"),
        ((sa, torch.rand(128, 2, device="cuda")[:, :1].t()), "got strides [1, 2]"),
        ((sa, sb.cpu()), "got device cpu"),
    )
    for (bad_a, bad_b), text in cases:
        with pytest.raises(ValueError, match=re.escape(text)):
            tilekiln.scaled_gemm(a, w.t(), bad_a, bad_b, bundle=bundle)
    # The valid call still runs after the refused ones.
    got = tilekiln.scaled_gemm(a, w.t(), sa, sb, bundle=bundle)
    assert rel_err(got, (a.double() @ w.double().t()) * sa.double() * sb.double()) < 1e-2


def test_every_residual_kernel_matches_float64_and_adds_in_place(bundle, torch):
    """Each residual kernel, pinned: act(x @ w^T + bias) + residual into a NaN-poisoned output, then
    with the output being the residual itself."""
    from tilekiln._torch.run import run_gemm

    kernels = [k for k in bundle.kernels if k.config.family == "gemm" and k.config.residual.value != "none"]
    assert kernels and any(k.config.swap_ab for k in kernels) and any(k.config.bias.value != "none" for k in kernels)
    gen = torch.Generator(device="cuda").manual_seed(44)
    failures = []
    for kernel in kernels:
        cfg = kernel.config
        for m, k, n in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
            bias = None if cfg.bias.value == "none" else torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
            residual = poisoned(torch, m, n, torch.bfloat16)  # the output's strides, which the kernel reads it at
            residual.copy_(torch.randn(m, n, device="cuda", generator=gen))
            z = x.double() @ w.double().t() + (0 if bias is None else bias.double())
            ref = activation(torch, cfg.activation.value)(z) + residual.double()
            out = poisoned(torch, m, n, torch.bfloat16)
            run_gemm(bundle, x, w.t(), out, None, kernel.id, requested_of(kernel), bias, residual)
            err = rel_err(out, ref)
            run_gemm(bundle, x, w.t(), residual, None, kernel.id, requested_of(kernel), bias, residual)
            in_place = rel_err(residual, ref)
            if not (err < 1e-2 and in_place < 1e-2):  # NaN fails too
                failures.append(f"{kernel.id} {m}x{k}x{n}: error {err:.3g}, in place {in_place:.3g}")
    assert not failures, failures


def test_linear_fuses_the_residual_and_adds_in_place(bundle, torch):
    """linear(x, w, b, residual=r) runs a resadd kernel where r has the result's strides (explain
    says so), also in place (out=r) and for batched x; elsewhere torch adds it, with the same result."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(45)
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
        r = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
        ref = x.double() @ w.double().t() + b.double() + r.double()
        choice = tilekiln.explain(x, w.t(), bundle=bundle, bias=b, residual=r)
        assert choice.kernel.config.residual.value == "add" and not choice.notes, choice
        assert rel_err(tilekiln.linear(x, w, b, residual=r, bundle=bundle), ref) < 1e-2
        h = r.clone()
        assert tilekiln.linear(x, w, b, residual=h, out=h, bundle=bundle) is h
        assert rel_err(h, ref) < 1e-2
        # With an activation no residual kernel computes, a bias-and-relu kernel runs and torch adds
        # the residual.
        got = tilekiln.linear(x, w, b, activation="relu", residual=r, bundle=bundle)
        assert rel_err(got, torch.relu(ref - r.double()) + r.double()) < 1e-2
    x = torch.randn(3, 50, 768, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(1024, 768, device="cuda", generator=gen) / 28).to(torch.bfloat16)
    h = torch.randn(3, 50, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = x.double() @ w.double().t() + h.double()
    assert tilekiln.linear(x, w, residual=h, out=h, bundle=bundle) is h and rel_err(h, ref) < 1e-2
    # N = 1001: the result tilekiln allocates pads its rows, a contiguous residual's strides differ
    # and torch adds it.
    x = torch.randn(37, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(1001, 512, device="cuda", generator=gen) / 22).to(torch.bfloat16)
    r = torch.randn(37, 1001, device="cuda", dtype=torch.bfloat16, generator=gen)
    assert rel_err(tilekiln.linear(x, w, residual=r, bundle=bundle), x.double() @ w.double().t() + r.double()) < 1e-2
