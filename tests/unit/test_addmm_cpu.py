"""tilekiln.addmm without a GPU: the checks of every call (errors name the argument), what it asks a
kernel for, the torch epilogue around a kernel (a CPU stand-in for run_gemm that computes what the
kernel would), the operator's fake, trace and gradients, and explain."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tilekiln
from tests.records import kernel_record, manifest
from tests.unit.test_torch_ops import OpLog, meta, traced
from tilekiln._torch import ops, run
from tilekiln._torch.checks import check_addmm
from tilekiln._torch.epilogue import UNFUSED, VALUE_INDEX
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.errors import NoKernelError
from tilekiln.problem import addmm_request

BF16 = torch.bfloat16
ALPHA_BETA = ("scalars", "alphabeta")
RESIDUAL = ("residual", "add")


def test_addmm_asks_for_the_residual_only_when_input_fuses_and_beta_is_not_0():
    assert addmm_request(1.0, 1.0, False) == ()
    assert addmm_request(1.0, 1.0, True) == (RESIDUAL,)
    assert addmm_request(0.5, 1.0, True) == (RESIDUAL, ALPHA_BETA)
    assert addmm_request(1.0, 2.0, False) == (ALPHA_BETA,)
    # beta 0: input is never read, so neither the residual nor, for alpha 1, the coefficients.
    assert addmm_request(0.0, 1.0, True) == ()
    assert addmm_request(0.0, -3.0, True) == (ALPHA_BETA,)
    # beta matters only for a fused input: torch scales an unfused one.
    assert addmm_request(0.5, 1.0, False) == ()


def _args(m=6, k=5, n=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, n, generator=g, dtype=dtype), torch.randn(m, k, generator=g, dtype=dtype),
            torch.randn(k, n, generator=g, dtype=dtype))


@pytest.mark.parametrize("change, error, text", [
    (lambda i, a, b: (i, a, b, 1, 1, None), None, None),
    (lambda i, a, b: (i.tolist(), a, b, 1, 1, None), TypeError, "input: expected a torch tensor, got list"),
    (lambda i, a, b: (i, a[None], b, 1, 1, None), ValueError, "mat1: expected a 2-D matrix, got shape [1, 6, 5]"),
    (lambda i, a, b: (i, a, b[0], 1, 1, None), ValueError, "mat2: expected a 2-D matrix, got shape [4] (1-D)"),
    (lambda i, a, b: (i, a, b[:3], 1, 1, None), ValueError, "mat1 and mat2 shapes cannot be multiplied (6x5 and 3x4)"),
    (lambda i, a, b: (i, a, b.double(), 1, 1, None), TypeError, "mat2: dtype torch.float64 is not mat1's"),
    (lambda i, a, b: (i.double(), a, b, 1, 1, None), TypeError, "input: dtype torch.float64 is not mat1's"),
    (lambda i, a, b: (i.to("meta"), a, b, 1, 1, None), ValueError, "input: on meta while mat1 is on cpu"),
    (lambda i, a, b: (i, a, b.to("meta"), 1, 1, None), ValueError, "mat2: on meta while mat1 is on cpu"),
    (lambda i, a, b: (i[:, :3], a, b, 1, 1, None), ValueError,
     "input: shape [6, 3] does not broadcast to the product's (M, N) = [6, 4]"),
    (lambda i, a, b: (i[None], a, b, 1, 1, None), ValueError, "input: shape [1, 6, 4] does not broadcast"),
    (lambda i, a, b: (i[0], a, b, 1, 1, None), None, None),  # a row (N,)
    (lambda i, a, b: (i[:, :1], a, b, 1, 1, None), None, None),  # a column (M, 1)
    (lambda i, a, b: (i[0, 0], a, b, 1, 1, None), None, None),  # a scalar
    (lambda i, a, b: (i, a, b, "1", 1, None), TypeError, "beta: expected a real number (int or float), as "
     "torch.addmm takes it; got str"),
    (lambda i, a, b: (i, a, b, 1, torch.tensor(2.0), None), TypeError, "alpha: expected a real number (int or "
     "float), as torch.addmm takes it; got Tensor; pass alpha.item()"),
    (lambda i, a, b: (i, a, b, 1, 1j, None), TypeError, "alpha: expected a real number"),
    (lambda i, a, b: (i, a, b, True, 2, None), None, None),
    (lambda i, a, b: (i, a, b, 1, 1, i.t()), ValueError, "out: expected shape [6, 4], dtype torch.float32 on cpu, "
     "got [4, 6], torch.float32 on cpu"),
    (lambda i, a, b: (i, a, b, 1, 1, i.double()), ValueError, "out: expected shape [6, 4], dtype torch.float32"),
    (lambda i, a, b: (i, a, b, 1, 1, "out"), TypeError, "out: expected a torch tensor or None, got str"),
])
def test_every_argument_is_checked_and_named(change, error, text):
    args = change(*_args())
    if error is None:
        assert check_addmm(*args) == (float(args[3]), float(args[4]))
        return
    with pytest.raises(error, match=_literal(text)):
        check_addmm(*args)


def _literal(text):
    import re

    return re.escape(text)


def test_the_public_call_checks_before_it_looks_for_a_bundle():
    i, a, b = _args()
    with pytest.raises(TypeError, match="addmm takes torch tensors"):
        tilekiln.addmm(i, a.tolist(), b)
    with pytest.raises(ValueError, match="input: shape"):
        tilekiln.addmm(i[:, :3], a, b, bundle="nowhere")


class Kernels:
    """A CPU stand-in for run_gemm: what a kernel computes for a request, in float64 rounded once,
    and the requests it saw; ``alpha_beta``: whether the bundle has alpha and beta kernels."""

    def __init__(self, alpha_beta: bool):
        self.alpha_beta, self.requests = alpha_beta, []

    def __call__(self, bundle, a, b, out, stream, kernel=None, requested=(), bias=None, residual=None,
                 values=(1.0, 1.0)):
        self.requests.append(requested)
        asked = dict(requested)
        if "scalars" in asked and not self.alpha_beta:
            raise NoKernelError("no kernel computes scalars alphabeta")
        alpha, beta = values if "scalars" in asked else (1.0, 1.0)
        y = alpha * (a.double() @ b.double())
        if "residual" in asked:
            y = y + beta * residual.double()
        y = y.to(a.dtype)
        return y if out is None else out.copy_(y)


def reference(i, a, b, beta, alpha):
    product = alpha * (a.double() @ b.double())
    return product if beta == 0 else product + beta * i.double()


@pytest.mark.parametrize("alpha_beta", [True, False])
@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, -2.0), (0, 1), (0, 0.25), (-1.5, 0), (2, 1)])
@pytest.mark.parametrize("form", ["full", "row", "column", "in place"])
def test_the_result_is_torchs_whatever_the_kernel_fuses(monkeypatch, alpha_beta, beta, alpha, form):
    kernels = Kernels(alpha_beta)
    monkeypatch.setattr(run, "run_gemm", kernels)
    i, a, b = _args()
    i = {"full": i, "row": i[0], "column": i[:, :1], "in place": i.clone()}[form]
    want = reference(i, a, b, beta, alpha)
    out = i if form == "in place" else None
    got = run.run_addmm(None, i, a, b, float(beta), float(alpha), out)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)
    if form == "in place":
        assert got is i
    asked = kernels.requests[0]
    fused = form in ("full", "in place") and beta != 0
    assert (RESIDUAL in asked) == fused
    assert (ALPHA_BETA in asked) == (alpha != 1 or (fused and beta != 1))
    if not alpha_beta and ALPHA_BETA in asked:
        assert kernels.requests[1] == ()  # then the plain product, torch applying alpha and beta


def test_beta_0_never_reads_input_so_nan_and_inf_do_not_propagate(monkeypatch):
    monkeypatch.setattr(run, "run_gemm", Kernels(True))
    i, a, b = _args()
    i[0, 0], i[1, 1] = float("nan"), float("inf")
    got = run.run_addmm(None, i, a, b, 0.0, 0.5, None)
    assert torch.isfinite(got).all()
    assert torch.allclose(got.double(), 0.5 * (a.double() @ b.double()), rtol=1e-5, atol=1e-5)


def test_an_empty_sum_is_beta_times_input_without_a_launch(monkeypatch):
    kernels = Kernels(True)
    monkeypatch.setattr(run, "run_gemm", kernels)
    i, a, b = _args(k=0)
    assert torch.equal(run.run_addmm(None, i[0], a, b, 2.0, 3.0, None), (2 * i[0]).expand(6, 4))
    assert not run.run_addmm(None, i, a, b, 0.0, 3.0, None).any()
    assert run.run_addmm(None, i[:0], a[:0], b, 1.0, 1.0, None).shape == (0, 4)
    assert kernels.requests == []


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return Bundle(tmp_path, manifest(), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))


def test_addmm_is_one_graph_node_with_the_real_strides(bundle):
    with FakeTensorMode():
        c, row, narrow, a, w = (torch.empty(s, dtype=BF16, device="cuda")
                                for s in ((64, 100), (100,), (64, 3), (64, 32), (100, 32)))
        for call in (lambda: tilekiln.addmm(c, a, w.t(), beta=0.5, alpha=2, bundle=bundle),
                     lambda: bundle.addmm(row, a, w.t(), alpha=-1)):
            y, ops = traced(call)
            assert ops == ["tilekiln.addmm.default"]
            # (64, 100) bf16: rows padded to 16 bytes, as the eager result is allocated.
            assert y.shape == (64, 100) and y.stride() == (104, 1) and y.dtype == BF16
        # out= adds a copy into out after the node (tests/gpu/test_addmm.py compiles it: a CPU-only torch
        # cannot copy between fake CUDA tensors).
        with pytest.raises(Exception, match="input: shape"):
            traced(lambda: tilekiln.addmm(narrow, a, w.t(), bundle=bundle))


def test_gradients_are_torch_addmms(bundle):
    for shape in ((64, 96), (96,), (64, 1), ()):
        i = meta(*shape, requires_grad=True)
        a, w = meta(64, 32, requires_grad=True), meta(96, 32, requires_grad=True)
        with OpLog() as log:
            tilekiln.addmm(i, a, w.t(), beta=0.5, alpha=2.0, bundle=bundle).sum().backward()
        assert i.grad.shape == i.shape and a.grad.shape == a.shape and w.grad.shape == w.shape
        # the forward node, then d mat1 and d mat2 through tilekiln::gemm (with torch's fallback)
        assert [c for c in log.calls if c[0] == "gemm.default"] == [("gemm.default", True)] * 2
    a = meta(64, 32, requires_grad=True)
    with OpLog() as log:
        tilekiln.addmm(meta(64, 96), a, meta(32, 96), bundle=bundle).sum().backward()
    assert len([c for c in log.calls if c[0] == "gemm.default"]) == 1  # only d mat1
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
        tilekiln.addmm(meta(64, 96), a, meta(32, 96), out=meta(64, 96), bundle=bundle)


def test_the_backward_scales_and_reduces_as_torch_does(monkeypatch):
    """The gradients' values, on CPU, with torch.matmul standing in for the GEMM operator."""
    monkeypatch.setattr(ops, "gemm_op", lambda a, b, *rest: a @ b)

    class Ctx:
        needs_input_grad = (True, True, True)
        saved_tensors = _args()[1:]
        input_shape, beta, alpha, bundle = torch.Size([4]), 0.5, -2.0, ""

    i, a, b = _args()
    grad = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    gi, ga, gb, *rest = ops._addmm_backward(Ctx, grad)
    x, m1, m2 = i[0].clone().requires_grad_(), a.clone().requires_grad_(), b.clone().requires_grad_()
    torch.addmm(x, m1, m2, beta=0.5, alpha=-2.0).backward(grad)
    for got, want in ((gi, x.grad), (ga, m1.grad), (gb, m2.grad)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert rest == [None, None, None]


KERNELS = (kernel_record(0, "k0", (128, 256, 64)), kernel_record(1, "k1_resadd", (128, 256, 64), residual="add"),
           kernel_record(2, "k2_alphabeta", (128, 256, 64), scalars="alphabeta"),
           kernel_record(3, "k3_resadd_alphabeta", (128, 256, 64), residual="add", scalars="alphabeta"))


def test_explain_says_whether_alpha_beta_and_the_input_fuse(tmp_path):
    full = Bundle(tmp_path, manifest(KERNELS), device_query=lambda o: DeviceInfo(o, (9, 0), 132, "NVIDIA H200", 143156))
    plain = Bundle(tmp_path, manifest(KERNELS[:2]), device_query=lambda o: DeviceInfo(o, (9, 0), 132, "NVIDIA H200", 143156))
    with FakeTensorMode():
        c, row, a, w = (torch.empty(s, dtype=BF16, device="cuda")
                        for s in ((1024, 1024), (1024,), (1024, 512), (1024, 512)))
        assert tilekiln.explain(a, w.t(), residual=c, beta=0.5, alpha=2, bundle=full).kernel.id == \
            "k3_resadd_alphabeta"
        assert tilekiln.explain(a, w.t(), residual=row, beta=0.5, alpha=2, bundle=full).kernel.id == "k2_alphabeta"
        assert tilekiln.explain(a, w.t(), residual=c, beta=0, alpha=2, bundle=full).kernel.id == "k2_alphabeta"
        assert tilekiln.explain(a, w.t(), residual=True, beta=1, alpha=1, bundle=full).kernel.id == "k1_resadd"
        choice = tilekiln.explain(a, w.t(), residual=True, beta=0.5, bundle=plain)
        assert choice.kernel.id == "k0"
        assert choice.notes[-1] == "unfused: no kernel computes alpha and beta; addmm runs k0 and torch applies " \
                                   "them after it"


def test_a_residual_torch_adds_after_an_alpha_kernel_is_scaled_by_beta():
    """run_gemm's unfused residual (an alpha kernel without the residual ran): beta * residual in fp32,
    rounded once."""
    y = torch.tensor([[1.0, 2.0]], dtype=BF16)
    r = torch.tensor([[4.0, -8.0]], dtype=BF16)
    add = UNFUSED["residual"]
    assert torch.equal(add("add", y, None, r, (3.0, -0.5)), torch.tensor([[-1.0, 6.0]], dtype=BF16))
    assert torch.equal(add("add", y, None, r, (3.0, 1.0)), torch.tensor([[5.0, -6.0]], dtype=BF16))
    assert VALUE_INDEX == {"alpha": 0, "beta": 1}
