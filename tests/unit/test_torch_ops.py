"""The torch operators without a GPU: fake tensors trace through torch.compile and autograd.

torch's FakeTensorMode makes CUDA tensors that have shapes, strides and a
device but no memory, so every entry point can be traced with
``fullgraph=True`` on a CPU-only machine; the operators' fakes run instead of
the kernels. A CPU-only torch cannot record autograd for CUDA tensors, even
fake ones (it aborts), so the gradient tests use "meta" tensors, for which the
operators' fakes also stand in. The GPU tests (tests/gpu/test_torch_semantics.py)
run the same functions for real and compare values and strides.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import tilekiln
from tilekiln.bundle import Bundle, DeviceInfo
from tests.records import manifest

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    """A bundle object for the operators to name; tracing never opens its library."""
    return Bundle(tmp_path, manifest(), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))


class Graphs:
    """A torch.compile backend that records the operators of every graph it is given, then runs it."""

    def __init__(self):
        self.ops: list[str] = []

    def __call__(self, gm, example_inputs):
        self.ops += [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return gm.forward


def traced(fn, *args):
    """Compile ``fn`` with fullgraph=True (a graph break fails) and run it on fake CUDA tensors."""
    torch._dynamo.reset()  # each call compiles afresh, not as a recompile of the last one
    graphs = Graphs()
    return torch.compile(fn, fullgraph=True, backend=graphs)(*args), graphs.ops


@pytest.fixture
def fake():
    with FakeTensorMode() as mode:
        yield mode


def cuda(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="cuda")


def meta(*shape, dtype=BF16, requires_grad=False):
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def test_every_entry_point_is_one_graph_node(fake, bundle):
    a, w = cuda(64, 32), cuda(96, 32)
    a8, w8, one = cuda(64, 32, dtype=E4M3), cuda(96, 32, dtype=E4M3), cuda(1, dtype=torch.float32)
    out, out8 = cuda(64, 96), cuda(64, 96)
    calls = {
        "tilekiln.gemm, default bundle": (lambda: tilekiln.gemm(a, w.t()), "tilekiln.gemm.default"),
        "tilekiln.gemm, bundle object": (lambda: tilekiln.gemm(a, w.t(), bundle=bundle), "tilekiln.gemm.default"),
        "tilekiln.gemm, bundle name": (lambda: tilekiln.gemm(a, w.t(), bundle="sm90a"), "tilekiln.gemm.default"),
        "Bundle.gemm": (lambda: bundle.gemm(a, w.t()), "tilekiln.gemm.default"),
        "tilekiln.gemm, out=": (lambda: tilekiln.gemm(a, w.t(), out=out), "tilekiln.gemm_out.default"),
        "Bundle.gemm, out=": (lambda: bundle.gemm(a, w.t(), out), "tilekiln.gemm_out.default"),
        "tilekiln.scaled_gemm": (lambda: tilekiln.scaled_gemm(a8, w8.t(), one, one), "tilekiln.scaled_gemm.default"),
        "Bundle.scaled_gemm": (lambda: bundle.scaled_gemm(a8, w8.t(), one, one), "tilekiln.scaled_gemm.default"),
        "tilekiln.scaled_gemm, out=": (lambda: tilekiln.scaled_gemm(a8, w8.t(), one, one, out=out8),
                                       "tilekiln.scaled_gemm_out.default"),
    }
    for what, (call, op) in calls.items():
        result, ops = traced(lambda: torch.relu(call()))
        assert op in ops, f"{what}: {ops}"
        assert result.shape == (64, 96) and result.device.type == "cuda", what


@pytest.mark.parametrize("a_shape, b_shape, dtype, shape, strides", [
    ((64, 32), (32, 100), BF16, (64, 100), (104, 1)),  # 200-byte rows padded to 208
    ((64, 32), (32, 96), BF16, (64, 96), (96, 1)),
    ((3, 64, 32), (32, 100), BF16, (3, 64, 100), (64 * 104, 104, 1)),
    ((64, 32), (5, 32, 10), torch.float32, (5, 64, 10), (64 * 12, 12, 1)),
    ((64, 0), (0, 100), BF16, (64, 100), (100, 1)),  # K = 0: zeros, nothing padded
    ((0, 32), (32, 100), BF16, (0, 100), (100, 1)),
])
def test_fakes_have_the_real_results_strides(fake, bundle, a_shape, b_shape, dtype, shape, strides):
    """The eager path allocates N-padded rows for TMA; a fake with other strides would let
    inductor compile code for a layout the real call does not return."""
    result, _ = traced(lambda a, b: tilekiln.gemm(a, b, bundle=bundle), cuda(*a_shape, dtype=dtype),
                       cuda(*b_shape, dtype=dtype))
    assert (tuple(result.shape), result.stride()) == (shape, strides)


def test_scaled_fake_takes_the_output_dtype(fake, bundle):
    a8, b8, one = cuda(64, 32, dtype=E4M3), cuda(32, 100, dtype=E4M3), cuda(1, dtype=torch.float32)
    for out_dtype, strides in ((None, (104, 1)), (torch.float32, (100, 1))):
        result, _ = traced(lambda: bundle.scaled_gemm(a8, b8, one, one, out_dtype=out_dtype))
        assert result.dtype == (out_dtype or BF16) and result.stride() == strides


def test_a_traced_call_refuses_shapes_that_do_not_multiply(fake, bundle):
    with pytest.raises(Exception, match="cannot be multiplied"):
        traced(lambda a, b: tilekiln.gemm(a, b, bundle=bundle), cuda(64, 32), cuda(48, 16))


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tilekiln":
            self.calls.append((func.__name__, args[4] if len(args) > 4 else None))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("a_shape, b_shape", [
    ((64, 32), (32, 96)),
    ((4, 64, 32), (32, 96)),  # dB is one GEMM over all rows
    ((64, 32), (4, 32, 96)),  # dA is reduced over the broadcast batch
    ((1, 64, 32), (4, 32, 96)),
    ((4, 64, 32), (4, 32, 96)),
])
def test_gradients_flow_through_the_tilekiln_operator(bundle, a_shape, b_shape):
    a, b = meta(*a_shape, requires_grad=True), meta(*b_shape, requires_grad=True)
    with OpLog() as log:
        c = tilekiln.gemm(a, b, bundle=bundle)
        c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    # the forward call, then dA and dB with torch.matmul as their fallback
    assert log.calls == [("gemm.default", False), ("gemm.default", True), ("gemm.default", True)]


def test_only_the_needed_gradient_is_computed(bundle):
    a, w = meta(64, 32, requires_grad=True), meta(96, 32)
    with OpLog() as log:
        tilekiln.gemm(a, w.t(), bundle=bundle).sum().backward()
    assert a.grad.shape == a.shape and len(log.calls) == 2


def test_out_with_grad_and_scaled_gradients_are_refused_like_torch(bundle):
    a, w = meta(64, 32, requires_grad=True), meta(96, 32)
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
        tilekiln.gemm(a, w.t(), out=meta(64, 96), bundle=bundle)
    a8 = meta(64, 32, dtype=torch.float32, requires_grad=True).to(E4M3)
    one = meta(1, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="scaled_gemm is not differentiable"):
        bundle.scaled_gemm(a8, meta(32, 96, dtype=E4M3), one, one)
    # without grad mode the call takes the eager path, which runs only on CUDA memory
    with torch.no_grad(), pytest.raises(ValueError, match="a: tensor is in host memory"):
        tilekiln.gemm(a, w.t(), out=meta(64, 96), bundle=bundle)


def test_a_compiled_training_step_records_the_backward_gemms(bundle):
    a, w = meta(64, 32, requires_grad=True), meta(96, 32, requires_grad=True)

    def step(a, w):
        loss = torch.relu(tilekiln.gemm(a, w.t(), bundle=bundle)).float().square().mean()
        loss.backward()
        return loss

    graphs = Graphs()
    torch.compile(step, backend=graphs)(a, w)
    assert a.grad.shape == a.shape and w.grad.shape == w.shape
    assert graphs.ops.count("tilekiln.gemm.default") >= 1


@pytest.mark.parametrize("x_shape, bias, residual", [((64, 32), False, False), ((2, 8, 32), True, True)])
def test_linear_is_one_graph_with_its_bias_activation_and_residual_in_the_gemm_node(fake, bundle, x_shape, bias,
                                                                                    residual):
    """The bias, the activation and a residual of the result's shape and type ride in the
    tilekiln::gemm node (fused where a kernel computes them, else applied by torch inside it)."""
    x, w = cuda(*x_shape), cuda(96, 32)
    b = cuda(96) if bias else None
    r = cuda(*x_shape[:-1], 96) if residual else None
    result, ops = traced(lambda: tilekiln.linear(x, w, b, activation="silu", residual=r, bundle=bundle))
    assert tuple(result.shape) == (*x_shape[:-1], 96) and result.dtype == BF16
    assert ops.count("tilekiln.gemm.default") == 1
    assert "silu" not in str(ops) and not any("add" in op for op in ops), ops


def test_a_residual_the_node_cannot_take_follows_as_a_torch_add(fake, bundle):
    """A residual of another type (torch promotes the sum) or a broadcast one stays a torch op."""
    x, w = cuda(2, 8, 32), cuda(96, 32)
    for r in (cuda(2, 8, 96, dtype=torch.float32), cuda(96)):
        result, ops = traced(lambda: tilekiln.linear(x, w, residual=r, bundle=bundle))
        assert ops.count("tilekiln.gemm.default") == 1 and sum("add" in op for op in ops) == 1, ops
        assert result.dtype == torch.promote_types(BF16, r.dtype) and tuple(result.shape) == (2, 8, 96)


def test_the_gemm_node_checks_its_residual(fake, bundle):
    from tilekiln._torch.ops import gemm_op

    x, w = cuda(64, 32), cuda(96, 32)
    with pytest.raises(ValueError, match=re.escape("residual: expected a tensor of the 2-D result's shape [64, 96], "
                                                   "dtype torch.bfloat16")):
        gemm_op(x, w.t(), "sm90a", "", False, "none", None, cuda(64, 95))


def test_linear_gradients_flow_unfused(bundle):
    """With an input that requires grad the activation is a torch op after a plain GEMM node, so
    its gradient is torch's."""
    x, w, b = meta(4, 16, 32, requires_grad=True), meta(64, 32, requires_grad=True), meta(64, requires_grad=True)
    with OpLog() as log:
        tilekiln.linear(x, w, b, activation="gelutanh", bundle=bundle).float().sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape
    assert log.calls[0] == ("gemm.default", False) and len(log.calls) == 3


def test_linear_names_its_bad_arguments(fake, bundle):
    x, w = cuda(8, 32), cuda(96, 32)
    with pytest.raises(ValueError, match="activation: 'tanh' is not one of"):
        tilekiln.linear(x, w, activation="tanh", bundle=bundle)
    with pytest.raises(ValueError, match=r"weight: expected \(N, K\) with K = x's last dimension"):
        tilekiln.linear(x, cuda(96, 16), bundle=bundle)


def test_linear_names_a_bad_bias(fake, bundle):
    """Every call checks the bias, fused or not: a contiguous (N,) vector of x's type or float32 on
    x's device."""
    x, w = cuda(8, 32), cuda(96, 32)
    cases = (
        (TypeError, r"bias: expected a torch tensor of shape \(96,\) or None, got list", [0.0] * 96),
        (ValueError, r"bias: expected shape \(96,\), one value per output feature \(weight's N\), got \[1, 96\]",
         cuda(1, 96)),
        (ValueError, r"bias: expected shape \(96,\).*got \[95\]", cuda(95)),
        (ValueError, r"bias: dtype torch.float16 is neither x's \(torch.bfloat16\) nor torch.float32",
         cuda(96, dtype=torch.float16)),
        (ValueError, r"bias: on meta while x is on cuda:0; move it with bias.to\(x.device\)", meta(96)),
        (ValueError, r"bias: stride 2 is not contiguous.*pass bias.contiguous\(\)",
         torch.empty_strided((96,), (2,), dtype=BF16, device="cuda")),
    )
    for error, message, bias in cases:
        with pytest.raises(error, match=message):
            tilekiln.linear(x, w, bias, bundle=bundle)
        with pytest.raises(Exception, match=message):  # torch.compile wraps it, message and all
            traced(lambda: tilekiln.linear(x, w, bias, activation="relu", bundle=bundle))


def _swiglu_reference(x, w_gate, w_up):
    return torch.nn.functional.silu(x @ w_gate.T) * (x @ w_up.T)


@pytest.mark.parametrize("inter", [64, 192, 100, 7])
def test_swiglu_weight_interleaves_gate_and_up_blocks_and_the_unfused_product_matches_torch(inter):
    """On the CPU in float64: the converted weight's rows are gate and up blocks of 64 in turn (a
    shorter last pair where 64 does not divide I), from the two weights or the stacked one, and
    the torch pairing of x @ w.T (the fallback) is silu(x @ gate.T) * (x @ up.T)."""
    from tilekiln._torch.epilogue import swiglu_unfused
    from tilekiln.spec import GLU_BLOCK

    gen = torch.Generator().manual_seed(inter)
    gate, up = (torch.randn(inter, 24, dtype=torch.float64, generator=gen) for _ in range(2))
    w = tilekiln.swiglu_weight(gate, up)
    assert w.shape == (2 * inter, 24) and w.is_contiguous()
    assert torch.equal(w, tilekiln.swiglu_weight(torch.cat([gate, up])))
    whole = inter // GLU_BLOCK * GLU_BLOCK
    for block in range(whole // GLU_BLOCK):
        rows = slice(block * GLU_BLOCK, (block + 1) * GLU_BLOCK)
        assert torch.equal(w[2 * block * GLU_BLOCK:(2 * block + 1) * GLU_BLOCK], gate[rows])
        assert torch.equal(w[(2 * block + 1) * GLU_BLOCK:(2 * block + 2) * GLU_BLOCK], up[rows])
    assert torch.equal(w[2 * whole:whole + inter], gate[whole:]) and torch.equal(w[whole + inter:], up[whole:])
    x = torch.randn(3, 5, 24, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(swiglu_unfused(x @ w.T), _swiglu_reference(x, gate, up))


def test_swiglu_weight_names_its_bad_arguments():
    with pytest.raises(ValueError, match=r"w_gate: without w_up, expected the stacked \[gate; up\] weight"):
        tilekiln.swiglu_weight(torch.empty(7, 4))
    with pytest.raises(ValueError, match=r"w_up: expected the shape of w_gate, \(I, K\) or \(G, I, K\)"):
        tilekiln.swiglu_weight(torch.empty(8, 4), torch.empty(8, 5))
    with pytest.raises(ValueError, match=r"w_gate: without w_up, expected the stacked \[gate; up\] weight"):
        tilekiln.swiglu_weight(torch.empty(2, 4, 3, 4))
    with pytest.raises(ValueError, match="w_up: torch.float16 on cpu, while w_gate is torch.float32"):
        tilekiln.swiglu_weight(torch.empty(8, 4), torch.empty(8, 4, dtype=torch.float16))
    with pytest.raises(TypeError, match="w_up: expected a torch tensor, got list"):
        tilekiln.swiglu_weight(torch.empty(8, 4), [[0.0] * 4] * 8)


def test_the_swiglu_gradient_is_torchs():
    """The backward's gradient at the interleaved GEMM result equals autograd's through the torch
    pairing (float64, CPU)."""
    from tilekiln._torch.epilogue import swiglu_grad, swiglu_unfused

    gen = torch.Generator().manual_seed(3)
    pre = torch.randn(5, 2 * 100, dtype=torch.float64, generator=gen, requires_grad=True)
    grad = torch.randn(5, 100, dtype=torch.float64, generator=gen)
    swiglu_unfused(pre).backward(grad)
    torch.testing.assert_close(swiglu_grad(pre.detach(), grad), pre.grad)


@pytest.mark.parametrize("x_shape", [(64, 32), (2, 8, 32)])
def test_swiglu_is_one_graph_node_with_half_the_columns_and_the_real_strides(fake, bundle, x_shape):
    from tilekiln.problem import result_strides

    x, w = cuda(*x_shape), cuda(2 * 100, 32)
    result, ops = traced(lambda: tilekiln.swiglu(x, w, bundle=bundle))
    assert tuple(result.shape) == (*x_shape[:-1], 100) and result.dtype == BF16
    assert ops.count("tilekiln.gemm.default") == 1 and "silu" not in str(ops), ops
    # the node's own result (rows of x, 100 bf16 columns padded to 104) as run_gemm allocates it
    rows = x.reshape(-1, 32).shape[0]
    node = torch.ops.tilekiln.gemm(x.reshape(-1, 32), w.t(), "", "", False, "swiglu")
    assert node.stride() == result_strides((rows, 100), 32, 2) == (104, 1)


def test_swiglu_gradients_flow_through_one_fused_node(bundle):
    """Under autograd the forward stays the fused node; the backward recomputes the GEMM (with the
    torch fallback), then runs dA and dB."""
    x, w = meta(4, 16, 32, requires_grad=True), meta(2 * 128, 32, requires_grad=True)
    with OpLog() as log:
        y = tilekiln.swiglu(x, w, bundle=bundle)
        assert y.shape == (4, 16, 128)
        y.float().sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    assert log.calls == [("gemm.default", False), ("gemm.default", True), ("gemm.default", True),
                         ("gemm.default", True)]


def test_swiglu_names_its_bad_arguments(fake, bundle):
    from tilekiln._torch.api import swiglu

    x = cuda(8, 32)
    cases = (
        (ValueError, r"w_gate_up: expected \(2I, K\) with K = x's last dimension and an even row count",
         dict(w_gate_up=cuda(201, 32))),
        (ValueError, r"w_gate_up: expected \(2I, K\).*got w_gate_up \[200, 16\] and x \[8, 32\]",
         dict(w_gate_up=cuda(200, 16))),
        (TypeError, r"w_gate_up: dtype torch.float16 is not x's \(torch.bfloat16\)",
         dict(w_gate_up=cuda(200, 32, dtype=torch.float16))),
        (ValueError, r"w_gate_up: on meta while x is on cuda:0", dict(w_gate_up=meta(200, 32))),
        (TypeError, "w_gate_up: expected a torch tensor, got list", dict(w_gate_up=[[0.0] * 32] * 200)),
        (ValueError, r"out: expected shape \[8, 100\], dtype torch.bfloat16 on cuda:0, got \[8, 200\]",
         dict(w_gate_up=cuda(200, 32), out=cuda(8, 200))),
    )
    for error, message, kwargs in cases:
        w = kwargs.pop("w_gate_up")
        if isinstance(w, list):
            with pytest.raises(TypeError, match="swiglu takes torch tensors"):
                tilekiln.swiglu(x, w, bundle=bundle)
            with pytest.raises(error, match=message):
                swiglu(bundle, x, w, None)
            continue
        with pytest.raises(error, match=message):
            tilekiln.swiglu(x, w, bundle=bundle, **kwargs)
    with pytest.raises(ValueError, match=r"activation: 'swiglu' pairs gate and up columns.*tilekiln.swiglu"):
        tilekiln.linear(x, cuda(200, 32), activation="swiglu", bundle=bundle)


def test_an_out_whose_rows_end_short_of_16_bytes_is_written_through_a_buffer_at_its_strides():
    """The stage a kernel writes in place of such an ``out`` (tilekiln/_torch/results.py, stage_for): the
    plan made for ``out`` must fit it, so it has ``out``'s strides, with room for the chunk of the
    last row that a TMA store writes past N; only N columns reach ``out`` (unstage)."""
    from tilekiln._torch.results import stage_for, unstage

    buffer = torch.full((3, 136), 7.0, dtype=BF16)
    out = buffer[:, :100]  # 200-byte rows: the 16-byte chunk of column 99 covers columns 96-103
    stage = stage_for(out, None)
    assert stage is not out and stage.stride() == out.stride() and stage.shape == out.shape
    assert stage.untyped_storage().nbytes() >= 2 * (2 * 136 + 104)  # the last row's chunk fits
    whole = stage.as_strided((3, 104), out.stride())  # what the TMA stores write: whole chunks
    whole.copy_(torch.arange(3 * 104, dtype=torch.float32).reshape(3, 104))
    assert unstage(stage, out, None) is out
    assert torch.equal(out, whole[:, :100]) and bool((buffer[:, 100:] == 7.0).all())
    # A grouped call keeps the rows no group owns: its stage starts as out's copy.
    assert torch.equal(stage_for(out, None, keep=True), out)


@pytest.mark.parametrize("shape, dtype", [((3, 104), BF16), ((2, 4, 64), E4M3), ((0, 100), BF16)])
def test_an_out_that_takes_the_stores_as_they_are_is_written_directly(shape, dtype):
    from tilekiln._torch.results import stage_for, unstage

    out = torch.zeros(shape, dtype=torch.float32).to(dtype)
    assert stage_for(out, None) is out and unstage(out, out, None) is out
