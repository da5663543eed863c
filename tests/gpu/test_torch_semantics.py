"""torch semantics on the GPU: autograd, torch.compile of every entry point, the operators'
own checks (torch.library.opcheck), and argument checks that hold whatever call came before."""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.gpu




def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _operand(torch, shape, transposed, gen):
    """A bf16 tensor of ``shape``, optionally a transposed view of a buffer of the swapped shape."""
    if not transposed:
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    swapped = shape[:-2] + (shape[-1], shape[-2])
    return torch.randn(swapped, device="cuda", dtype=torch.bfloat16, generator=gen).mT


def test_gradients_match_float64_for_random_shapes_transposes_and_batches(bundle, torch):
    import tilekiln

    rng = random.Random(20261206)
    gen = torch.Generator(device="cuda").manual_seed(3)
    failures = []
    for i in range(60):
        m, n, k = (8 * rng.randint(1, 80) for _ in range(3))
        batch = rng.choice([None, None, "both", "a", "b", "a1"])
        la = {"both": 3, "a": 3, "a1": 1}.get(batch)
        lb = {"both": 3, "b": 3, "a1": 3}.get(batch)
        a = _operand(torch, ((la,) if la else ()) + (m, k), rng.random() < 0.4, gen).requires_grad_()
        b = _operand(torch, ((lb,) if lb else ()) + (k, n), rng.random() < 0.4, gen).requires_grad_()
        c = tilekiln.gemm(a, b, bundle=bundle)
        g = torch.randn(c.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        c.backward(g)
        a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        torch.matmul(a64, b64).backward(g.double())
        for name, got, ref in (("dA", a.grad, a64.grad), ("dB", b.grad, b64.grad)):
            if got.shape != ref.shape or not rel_err(got, ref) < 1e-2:
                failures.append(f"{i}: {name} a {tuple(a.shape)} {a.stride()} b {tuple(b.shape)} {b.stride()}")
    assert not failures, failures


def test_explain_names_what_the_backward_runs_on(bundle, torch):
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    text = str(bundle.explain(a, w.t()))
    print(text)
    da, db = (line for line in text.splitlines() if line.startswith("backward"))
    assert "gemm_sm90_" in da and "gemm_sm90_" in db
    # N = 100: dC's 200-byte rows are not TMA-aligned, so its GEMMs go to torch
    w = torch.randn(100, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    assert "torch.matmul" in str(bundle.explain(a, w.t()))
    c = bundle.gemm(a, w.t())
    c.sum().backward()
    assert rel_err(a.grad, torch.ones(512, 100, device="cuda").double() @ w.detach().double()) < 1e-2


def test_every_entry_point_under_torch_compile_matches_eager(bundle, torch, gpu_bundle_dir, monkeypatch):
    import tilekiln

    monkeypatch.setenv("TILEKILN_BUNDLE_PATH", str(gpu_bundle_dir))  # the default bundle of cuda:0

    x = torch.randn(200, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(100, 512, device="cuda", dtype=torch.bfloat16) / 16  # N = 100: a padded result
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    s = torch.tensor([0.5], device="cuda")
    out = torch.empty(200, 104, device="cuda", dtype=torch.bfloat16)[:, :100]  # rows on 16-byte boundaries
    calls = {
        "tilekiln.gemm": lambda: tilekiln.gemm(x, w.t(), bundle=bundle),
        "tilekiln.gemm (default bundle)": lambda: tilekiln.gemm(x, w.t()),
        "Bundle.gemm": lambda: bundle.gemm(x, w.t()),
        "gemm out=": lambda: bundle.gemm(x, w.t(), out),
        "tilekiln.scaled_gemm": lambda: tilekiln.scaled_gemm(x8, w8.t(), s, s, bundle=bundle),
        "scaled_gemm f32": lambda: bundle.scaled_gemm(x8, w8.t(), s, s, out_dtype=torch.float32),
        "scaled_gemm out=": lambda: bundle.scaled_gemm(x8, w8.t(), s, s, out=out),
    }
    for what, call in calls.items():
        result = call()
        layout, eager = (result.shape, result.stride()), result.double()  # out= calls return out itself
        out.fill_(float("nan"))
        torch._dynamo.reset()
        compiled = torch.compile(call, fullgraph=True)()  # inductor
        assert (compiled.shape, compiled.stride()) == layout, what
        assert rel_err(compiled, eager) < 1e-6, what


def test_a_compiled_training_step_matches_eager_gradients(bundle, torch):
    import tilekiln

    def step(x, w1, w2):
        h = torch.nn.functional.silu(tilekiln.gemm(x, w1.t(), bundle=bundle))
        loss = tilekiln.gemm(h, w2.t(), bundle=bundle).float().square().mean()
        loss.backward()
        return loss

    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    params = [(torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen) / 16).requires_grad_()
              for s in ((1024, 512), (256, 1024))]
    step(x, *params)
    eager = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    torch.compile(step)(x, *params)
    for got, ref in zip((p.grad for p in params), eager):
        assert rel_err(got, ref.double()) < 1e-3


def test_operators_pass_torch_library_opcheck(bundle, torch, opcheck):
    from tilekiln._torch.ops import gemm_op, gemm_out_op, scaled_gemm_op, scaled_gemm_out_op
    from tilekiln._torch.streams import bundle_ref

    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # An nn.Linear weight's transpose: K-major, so N = 100 needs no 16-byte rows (a row-major
    # (128, 100) b has none, and no kernel takes it: docs/runtime.md, "What is checked").
    w = torch.randn(100, 128, device="cuda", dtype=torch.bfloat16).t().requires_grad_()
    x8, w8 = x.detach().to(torch.float8_e4m3fn), w.detach().t().contiguous().to(torch.float8_e4m3fn).t()
    s = torch.tensor([1.0], device="cuda")
    # The out= operators take a dense out: opcheck's aot_dispatch check clones its arguments, and
    # the clone of a padded (64, 104)[:, :100] out is a contiguous one whose rows no kernel takes.
    w104 = torch.randn(104, 128, device="cuda", dtype=torch.bfloat16).t()
    w8_104 = w104.t().contiguous().to(torch.float8_e4m3fn).t()
    ref = bundle_ref(bundle)
    checks = [
        (gemm_op, (x, w, ref, "", False, "none")),
        (gemm_op, (x, w, ref, "", True, "none")),
        (gemm_op, (x.detach(), w.detach(), ref, "", False, "silu")),
        (gemm_out_op, (x.detach(), w104, torch.empty(64, 104, device="cuda", dtype=torch.bfloat16), ref, "")),
        (scaled_gemm_op, (x8, w8, s, s, torch.bfloat16, ref, "", "tensor")),
        (scaled_gemm_out_op, (x8, w8_104, s, s, torch.empty(64, 104, device="cuda", dtype=torch.bfloat16),
                                     ref, "", "tensor")),
        # A residual at the result's strides (rows padded to 16 bytes: fused) and at others (added
        # in the node).
        (gemm_op, (x.detach(), w.detach(), ref, "", False, "none", None,
                          torch.randn(64, 104, device="cuda", dtype=torch.bfloat16)[:, :100])),
        (gemm_op, (x.detach(), w.detach(), ref, "", False, "none", None,
                          torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)[:, :100])),
        # Row-wise scales and a bias.
        (scaled_gemm_op, (x8, w8, torch.rand(64, 1, device="cuda"), torch.rand(1, 100, device="cuda"),
                                 torch.bfloat16, ref, "", "rowwise", torch.randn(100, device="cuda"))),
    ]
    for op, args in checks:
        opcheck(op, args)


# -- every check holds on every call, whatever came before ---------------------------------------

M, N, K = 192, 256, 320


def _call_kinds(torch, bundle):
    """Calls of one shape: each returns (result, float64 reference) or raises the documented error."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / 8
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    ref8 = a8.double() @ w8.double().t()

    def scaled(sa, sb, **kw):
        return lambda: (bundle.scaled_gemm(a8, w8.t(), sa, sb, **kw), ref8 * sa.double() * sb.double())

    one = torch.tensor([1.0], device="cuda")
    two = torch.tensor([2.0], device="cuda")
    return {
        "gemm": (lambda: (bundle.gemm(a, w.t()), a.double() @ w.double().t()), None),
        "scaled, per-tensor": (scaled(two, one), None),
        "scaled, f32 out": (scaled(one, two, out_dtype=torch.float32), None),
        "scaled, row-wise scales": (scaled(torch.rand(M, 1, device="cuda"), torch.rand(1, N, device="cuda")), None),
        "scaled, row-wise float64 scales": (scaled(torch.rand(M, 1, device="cuda").double(),
                                                   torch.rand(1, N, device="cuda")),
                                            (ValueError, r"scale_a: expected a float32 tensor \(M, 1\)")),
        "scaled, row-wise scales of the wrong length": (scaled(torch.rand(M, 1, device="cuda"),
                                                               torch.rand(1, N - 8, device="cuda")),
                                                        (ValueError, r"scale_b: expected a float32 tensor \(1, N\)")),
        "scaled, float64 scale": (scaled(one.double(), one), (ValueError, "scale_a: expected a one-element")),
        "scaled, host scale": (scaled(one, one.cpu()), (ValueError, "scale_b: expected a one-element")),
        "scaled, python float": (lambda: bundle.scaled_gemm(a8, w8.t(), 1.0, one), (TypeError, "scale_a")),
        "gemm, unaligned a": (lambda: bundle.gemm(torch.randn(M * K + 1, device="cuda",
                                                              dtype=torch.bfloat16)[1:].view(M, K), w.t()),
                              (ValueError, "16-byte aligned")),
        "gemm, out of the wrong shape": (lambda: bundle.gemm(a, w.t(), torch.empty(M, N + 8, device="cuda",
                                                                                   dtype=torch.bfloat16)),
                                         (ValueError, "out: shape")),
    }


def test_every_call_is_checked_whatever_came_before(bundle, torch):
    """Property test: calls of one shape in random order, valid and invalid; each is correct or
    raises its documented error. A plan cached by an earlier call of the same signature must
    not let a later call skip a check or run another call's kernel (row-wise scales after
    per-tensor ones returned a wrong result before the scales' signature joined the plan key;
    they now run a rowwise kernel)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    kinds = _call_kinds(torch, bundle)

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(st.lists(st.sampled_from(sorted(kinds)), min_size=2, max_size=10))
    def run(order):
        for name in order:
            call, error = kinds[name]
            if error is None:
                got, ref = call()
                assert rel_err(got, ref) < 1e-2, (order, name)
            else:
                with pytest.raises(error[0], match=error[1]):
                    call()

    run()
    # the case that was wrong: row-wise scales right after a per-tensor call of the same shape
    kinds["scaled, per-tensor"][0]()
    got, ref = kinds["scaled, row-wise scales"][0]()
    assert rel_err(got, ref) < 1e-2
