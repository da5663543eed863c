"""alpha and beta on the GPU: every alphabeta kernel, pinned, against a float64 reference
(alpha * (a @ b) + beta * residual) with alpha and beta 0, 1, negative and fractional, odd M and N
not a multiple of the tile, NaN-poisoned outputs; tilekiln.addmm against torch.addmm's float64
result for every form of input (full, row, column, scalar, other strides), in place (out=input),
beta 0 with NaN and inf in input; CUDA-graph replay; torch.compile(fullgraph=True); the gradients
against torch.addmm's; torch.library.opcheck of the operator."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (M, K, N): decode rows and odd M on the swapped 64x16 tile, N not a multiple of 16, 64, 128 or
# 256, odd M on the ping-pong tiles, a large problem.
SHAPES = ((1, 512, 1000), (13, 1024, 520), (37, 768, 1000), (301, 2048, 1544), (2048, 4096, 1032))
# (alpha, beta): the identity, each 0, negative and fractional values, neither 1.
COEFFICIENTS = ((1.0, 1.0), (0.75, -1.5), (-2.0, 0.0), (0.0, 0.5), (1.0, -1.0), (0.3, 2.25))
TOLERANCE = 1e-2


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poisoned(torch, m, n, dtype=None):
    """An (m, n) NaN-filled bf16 tensor whose rows are padded to 16 bytes, as tilekiln allocates."""
    dtype = dtype or torch.bfloat16
    per16 = 16 // torch.empty((), dtype=dtype).element_size()
    return torch.full((m, -(-n // per16) * per16), float("nan"), device="cuda", dtype=dtype)[:, :n]


def operands(torch, gen, m, k, n):
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
    return a, w


def reference(torch, input, a, b, beta, alpha):
    product = alpha * (a.double() @ b.double())
    return product if beta == 0 else product + beta * input.double()


def alpha_beta_kernels(bundle):
    kernels = [k for k in bundle.kernels if k.config.family == "gemm" and k.config.scalars.value == "alphabeta"]
    assert kernels, "the bundle has no alphabeta kernels"
    return kernels


def test_every_alpha_beta_kernel_matches_float64(bundle, torch):
    """Each alphabeta kernel, pinned, writes every element of a NaN-poisoned output with
    alpha * (a @ w^T) (+ beta * residual, in place too) for every (alpha, beta)."""
    from tilekiln._torch.run import run_gemm

    gen = torch.Generator(device="cuda").manual_seed(31)
    for kernel in alpha_beta_kernels(bundle):
        residual_kernel = kernel.config.residual.value == "add"
        requested = (("residual", "add"),) * residual_kernel + (("scalars", "alphabeta"),)
        for m, k, n in SHAPES:
            a, w = operands(torch, gen, m, k, n)
            for alpha, beta in COEFFICIENTS:
                out = poisoned(torch, m, n)
                residual = None
                if residual_kernel:
                    residual = poisoned(torch, m, n)
                    residual.copy_(torch.randn(m, n, device="cuda", generator=gen))
                run_gemm(bundle, a, w.t(), out, None, kernel.id, requested, None, residual, (alpha, beta))
                ref = reference(torch, residual, a, w.t(), beta if residual_kernel else 0.0, alpha)
                assert not torch.isnan(out).any(), (kernel.id, m, n, alpha, beta)
                if alpha == 0 and not residual_kernel:
                    assert not out.any(), (kernel.id, m, n)
                    continue
                assert rel_err(out, ref) < TOLERANCE, (kernel.id, m, k, n, alpha, beta, rel_err(out, ref))
                if residual_kernel:
                    # In place: each element is read before the store that writes it.
                    run_gemm(bundle, a, w.t(), residual, None, kernel.id, requested, None, residual,
                             (alpha, beta))
                    assert rel_err(residual, ref) < TOLERANCE, (kernel.id, "in place", m, n, alpha, beta)


def test_a_kernel_without_the_field_ignores_the_values(bundle, torch):
    """Values in the call block reach only kernels that use them: a plain residual kernel pinned with
    alpha and beta far from 1 still computes a @ w^T + residual."""
    from tilekiln._torch.run import run_gemm

    kernel = next(k for k in bundle.kernels if k.config.residual.value == "add" and k.config.scalars.value == "none"
                  and k.config.bias.value == "none")
    gen = torch.Generator(device="cuda").manual_seed(32)
    a, w = operands(torch, gen, 300, 512, 1000)
    residual = torch.randn(300, 1000, device="cuda", generator=gen).to(torch.bfloat16)
    out = poisoned(torch, 300, 1000)
    run_gemm(bundle, a, w.t(), out, None, kernel.id, (("residual", "add"),), None, residual, (-7.0, 5.0))
    assert rel_err(out, reference(torch, residual, a, w.t(), 1.0, 1.0)) < TOLERANCE


@pytest.mark.parametrize("form", ["full", "row", "column", "scalar", "transposed", "1xN"])
def test_addmm_is_torch_addmm_for_every_form_of_input(bundle, torch, form):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(33)
    for m, k, n in SHAPES:
        a, w = operands(torch, gen, m, k, n)
        full = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
        input = {"full": full, "row": full[0], "column": full[:, :1], "scalar": full[0, 0],
                 "transposed": full.t().contiguous().t(), "1xN": full[:1]}[form]
        for alpha, beta in COEFFICIENTS:
            got = tilekiln.addmm(input, a, w.t(), beta=beta, alpha=alpha, bundle=bundle)
            want = reference(torch, input, a, w.t(), beta, alpha)
            assert got.shape == (m, n) and got.dtype == torch.bfloat16
            if want.abs().max() == 0:
                assert not got.any()
                continue
            assert rel_err(got, want) < TOLERANCE, (form, m, k, n, alpha, beta)
            torch_result = torch.addmm(input, a, w.t(), beta=beta, alpha=alpha)
            assert rel_err(got, torch_result.double()) < TOLERANCE


def test_a_full_input_at_the_results_strides_runs_the_fused_kernel(bundle, torch):
    import tilekiln

    a = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1032, 4096, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(2048, 1032, device="cuda", dtype=torch.bfloat16)
    choice = tilekiln.explain(a, w.t(), residual=c, beta=0.5, alpha=2.0, bundle=bundle)
    assert choice.kernel is not None and choice.kernel.config.scalars.value == "alphabeta"
    assert choice.kernel.config.residual.value == "add" and not choice.notes
    # A broadcast row: the kernel computes alpha * product, torch adds beta * row.
    choice = tilekiln.explain(a, w.t(), residual=c[0], beta=0.5, alpha=2.0, bundle=bundle)
    assert choice.kernel.config.scalars.value == "alphabeta" and choice.kernel.config.residual.value == "none"
    # beta 0 never asks for the residual.
    choice = tilekiln.explain(a, w.t(), residual=c, beta=0, alpha=2.0, bundle=bundle)
    assert choice.kernel.config.residual.value == "none"


def test_in_place_out_is_the_input(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(34)
    for m, k, n in SHAPES:
        a, w = operands(torch, gen, m, k, n)
        for alpha, beta in COEFFICIENTS:
            c = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
            want = reference(torch, c, a, w.t(), beta, alpha)
            got = tilekiln.addmm(c, a, w.t(), beta=beta, alpha=alpha, out=c, bundle=bundle)
            assert got is c
            if want.abs().max() > 0:
                assert rel_err(c, want) < TOLERANCE, (m, n, alpha, beta)


def test_beta_0_ignores_nan_and_inf_in_input_as_torch_does(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(35)
    a, w = operands(torch, gen, 300, 512, 1000)
    c = torch.full((300, 1000), float("nan"), device="cuda", dtype=torch.bfloat16)
    c[::2] = float("inf")
    for alpha in (1.0, 0.5, -3.0):
        got = tilekiln.addmm(c, a, w.t(), beta=0, alpha=alpha, bundle=bundle)
        assert torch.isfinite(got).all()
        assert rel_err(got, alpha * (a.double() @ w.t().double())) < TOLERANCE
        assert torch.isfinite(torch.addmm(c, a, w.t(), beta=0, alpha=alpha)).all()  # torch's own semantics
    out = c.clone()
    tilekiln.addmm(out, a, w.t(), beta=0, alpha=2.0, out=out, bundle=bundle)
    assert torch.isfinite(out).all()


def test_cuda_graph_replay(bundle, torch):
    """A captured addmm replays with the captured alpha and beta on the inputs' new values."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(36)
    a, w = operands(torch, gen, 37, 768, 1000)
    c = torch.randn(37, 1000, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(37, 1000, device="cuda", dtype=torch.bfloat16)
    row = c[0].clone()
    out_row = torch.empty_like(out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up: plans and kernel loads happen outside the capture
        tilekiln.addmm(c, a, w.t(), beta=-0.5, alpha=1.25, out=out, bundle=bundle)
        tilekiln.addmm(row, a, w.t(), beta=2.0, alpha=0.5, out=out_row, bundle=bundle)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilekiln.addmm(c, a, w.t(), beta=-0.5, alpha=1.25, out=out, bundle=bundle)
        tilekiln.addmm(row, a, w.t(), beta=2.0, alpha=0.5, out=out_row, bundle=bundle)
    for _ in range(2):
        a.copy_(torch.randn(a.shape, device="cuda", generator=gen))
        c.copy_(torch.randn(c.shape, device="cuda", generator=gen))
        row.copy_(torch.randn(row.shape, device="cuda", generator=gen))
        out.fill_(float("nan"))
        out_row.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference(torch, c, a, w.t(), -0.5, 1.25)) < TOLERANCE
        assert rel_err(out_row, reference(torch, row, a, w.t(), 2.0, 0.5)) < TOLERANCE


def test_torch_compile_fullgraph(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(37)
    a, w = operands(torch, gen, 301, 2048, 1544)
    c = torch.randn(301, 1544, device="cuda", generator=gen).to(torch.bfloat16)

    def step(c, a, w):
        return torch.relu(tilekiln.addmm(c, a, w.t(), beta=0.75, alpha=-1.5, bundle=bundle)) + 1

    got = torch.compile(step, fullgraph=True)(c, a, w)
    want = torch.relu(reference(torch, c, a, w.t(), 0.75, -1.5)) + 1
    assert rel_err(got, want) < TOLERANCE
    row = c[0].clone()
    got = torch.compile(lambda r, a, w: tilekiln.addmm(r, a, w.t(), beta=2, alpha=0.5, bundle=bundle),
                        fullgraph=True)(row, a, w)
    assert rel_err(got, reference(torch, row, a, w.t(), 2.0, 0.5)) < TOLERANCE
    out = torch.empty(301, 1544, device="cuda", dtype=torch.bfloat16)

    def into(c, a, w, out):
        return tilekiln.addmm(c, a, w.t(), beta=-1, alpha=0.25, out=out, bundle=bundle)

    torch.compile(into, fullgraph=True)(c, a, w, out)
    assert rel_err(out, reference(torch, c, a, w.t(), -1.0, 0.25)) < TOLERANCE


@pytest.mark.parametrize("shape", [(301, 1544), (1544,), (301, 1), ()])
def test_gradients_are_torch_addmms(bundle, torch, shape):
    """d input = beta * grad summed to input's shape, d mat1 = alpha * grad @ mat2^T, d mat2 =
    alpha * mat1^T @ grad, against torch.addmm's gradients in float64."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(38)
    a, w = operands(torch, gen, 301, 512, 1544)
    c = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    grad = torch.randn(301, 1544, device="cuda", generator=gen).to(torch.bfloat16)
    for alpha, beta in ((0.75, -1.5), (1.0, 0.0), (-2.0, 1.0)):
        ours = [t.detach().clone().requires_grad_() for t in (c, a, w)]
        tilekiln.addmm(ours[0], ours[1], ours[2].t(), beta=beta, alpha=alpha, bundle=bundle).backward(grad)
        ref = [t.detach().double().requires_grad_() for t in (c, a, w)]
        torch.addmm(ref[0], ref[1], ref[2].t(), beta=beta, alpha=alpha).backward(grad.double())
        for name, mine, theirs in zip(("input", "mat1", "mat2"), ours, ref):
            assert mine.grad.shape == mine.shape and mine.grad.dtype == torch.bfloat16, name
            if theirs.grad.abs().max() == 0:
                assert not mine.grad.any(), name
            else:
                assert rel_err(mine.grad, theirs.grad) < TOLERANCE, (name, shape, alpha, beta)


def test_the_operator_passes_torch_library_opcheck(bundle, torch, opcheck):
    from tilekiln._torch.ops import addmm_op
    from tilekiln._torch.streams import bundle_ref

    gen = torch.Generator(device="cuda").manual_seed(39)
    a, w = operands(torch, gen, 37, 768, 1000)
    c = torch.randn(37, 1000, device="cuda", generator=gen).to(torch.bfloat16)
    ref = bundle_ref(bundle)
    for args in ((c, a, w.t(), 0.5, 2.0, ref), (c[0], a, w.t(), -1.0, 0.25, ref), (c, a, w.t(), 0.0, 1.0, ref)):
        opcheck(addmm_op, args)
