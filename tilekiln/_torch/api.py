"""The entry points for torch tensors (``gemm``, ``scaled_gemm``, ``linear``, ``addmm``, ``swiglu``,
``grouped_gemm``, ``grouped_swiglu``), which tilekiln.Bundle calls: each decides whether the call
runs on the hot path (tilekiln/_torch/run.py) or through an operator (tilekiln/_torch/ops.py).

An eager call goes through an operator only when autograd must record it (an input requires grad
while grad mode is on); otherwise it takes the hot path. While torch.compile traces, every call
becomes one operator node.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tilekiln._torch.checks import activation_token, bias_token, check_addmm, check_gate_up, scaled_activation_token
from tilekiln._torch.epilogue import ACTIVATIONS, add_bias
from tilekiln._torch.ops import (addmm_op, gemm_op, gemm_out_op, grouped_gemm_masked_op, grouped_gemm_masked_out_op,
                                 grouped_gemm_op, grouped_gemm_out_op, scaled_gemm_op, scaled_gemm_out_op)
from tilekiln._torch.results import as_rows, check_out, fusable_residual
from tilekiln._torch.run import run_addmm, run_gemm, run_scaled_gemm
from tilekiln._torch.run_grouped import run_grouped_gemm
from tilekiln._torch.scales import scale_format_of, scaled_request
from tilekiln._torch.streams import bundle_ref, on_stream, resolve
from tilekiln.blockscaled import grouped_block_format
from tilekiln.bundle import Bundle
from tilekiln.problem import requested_epilogue

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def _refuse_out_with_grad(name: str, out, *inputs) -> None:
    if out is not None and _grad_enabled() and any(t.requires_grad for t in inputs):
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad")


def gemm(bundle, a: Tensor, b: Tensor, out: Tensor | None, stream, kernel: str | None = None):
    """``gemm`` for torch tensors. ``bundle``: a Bundle, a name or path, or None (the device default)."""
    if _is_compiling():
        if stream is not None:
            raise TypeError("stream=: not supported while torch.compile traces; make the stream current "
                            "with torch.cuda.stream(...) instead")
        return _gemm_node(bundle_ref(bundle), a, b, out, kernel or "")
    if (a.requires_grad or b.requires_grad) and _grad_enabled():
        _refuse_out_with_grad("gemm", out, a, b)
        with on_stream(stream, a.get_device()):
            return gemm_op(a, b, bundle_ref(bundle), kernel or "", False, "none")
    if not isinstance(bundle, Bundle):
        bundle = resolve(bundle_ref(bundle), a.get_device())
    return run_gemm(bundle, a, b, out, stream, kernel)


def scaled_gemm(bundle, a: Tensor, b: Tensor, scale_a, scale_b, out_dtype, out: Tensor | None, stream,
                kernel: str | None = None, scale_format: str | None = None, bias: Tensor | None = None,
                scale_result: Tensor | None = None, activation=None):
    """``scaled_gemm`` for torch tensors; not differentiable, like ``torch._scaled_mm``. ``scale_format``
    None: per-tensor, row-wise or blockwise, as the scales' shapes say (:func:`scale_format_of`).
    ``scale_result``: an fp8 result's one-element float32 scale (:func:`check_scale_result`).
    ``activation``: None or "swiglu" (:func:`scaled_activation_token`)."""
    scale_format = scale_format_of(scale_format, a, b, scale_a, scale_b)
    activation = scaled_activation_token(activation)
    if _is_compiling():
        if stream is not None:
            raise TypeError("stream=: not supported while torch.compile traces; make the stream current "
                            "with torch.cuda.stream(...) instead")
        ref = bundle_ref(bundle)
        if out is None:
            return scaled_gemm_op(a, b, scale_a, scale_b, out_dtype, ref, kernel or "", scale_format, bias,
                                  scale_result, activation)
        scaled_gemm_out_op(a, b, scale_a, scale_b, out, ref, kernel or "", scale_format, bias, scale_result,
                           activation)
        return out
    if _grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                               for t in (a, b, scale_a, scale_b, bias, scale_result)):
        raise RuntimeError("scaled_gemm is not differentiable (as torch._scaled_mm is not); "
                           "detach its inputs or call it under torch.no_grad()")
    if not isinstance(bundle, Bundle):
        bundle = resolve(bundle_ref(bundle), a.get_device())
    return run_scaled_gemm(bundle, a, b, scale_a, scale_b, out_dtype, out, stream, kernel,
                           scaled_request(a, b, scale_format, out_dtype, out, bias, scale_result, activation), bias,
                           scale_result)


def linear(bundle, x: Tensor, weight: Tensor, bias: Tensor | None, activation, residual: Tensor | None,
           out: Tensor | None):
    """``activation(F.linear(x, weight, bias)) + residual``: the GEMM, its bias and its activation fused
    where a kernel computes them; what no kernel fuses (a kernel may fuse the bias and leave the
    activation), and the residual, torch applies after it. The result has x's dtype. Differentiable
    (unfused when an input requires grad)."""
    act = activation_token(activation)
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"weight: expected (N, K) with K = x's last dimension, got weight {list(weight.shape)} "
                         f"and x {list(x.shape)} (F.linear semantics: x (..., K) @ weight.T)")
    bias_type = "none" if bias is None else bias_token(bias, x, weight.shape[0])
    needs_grad = _grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, residual))
    _refuse_out_with_grad("linear", out, *(t for t in (x, weight, bias, residual) if t is not None))
    rows = as_rows(x)
    if needs_grad:
        y = gemm_op(rows, weight.t(), bundle_ref(bundle), "", False, "none")
        if bias is not None:
            y = add_bias(y, bias)
        y = ACTIVATIONS[act](y)
    elif _is_compiling():
        n = weight.shape[0]
        if isinstance(residual, Tensor) and tuple(residual.shape) == (*x.shape[:-1], n) \
                and residual.dtype == x.dtype and residual.device == x.device:
            # The graph's one node adds the residual too (fused where its strides allow, gemm_op).
            y = gemm_op(rows, weight.t(), bundle_ref(bundle), "", False, act, bias, as_rows(residual))
            return _linear_result(y, x, weight, None) if out is None else out.copy_(y.reshape(out.shape))
        y = gemm_op(rows, weight.t(), bundle_ref(bundle), "", False, act, bias)
    else:
        if not isinstance(bundle, Bundle):
            bundle = resolve(bundle_ref(bundle), x.get_device())
        fused = fusable_residual(x, weight, residual, out)
        if fused is not None:
            target, rows_residual = fused
            return _linear_result(run_gemm(bundle, rows, weight.t(), target, None, None,
                                           requested_epilogue(bias=bias_type, activation=act, residual="add"),
                                           bias, rows_residual), x, weight, out)
        y = run_gemm(bundle, rows, weight.t(), None, None, None, requested_epilogue(bias=bias_type, activation=act),
                     bias)
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    if residual is not None:
        y = y + residual
    if out is None:
        return y
    out.copy_(y)
    return out


def _linear_result(y: Tensor, x: Tensor, weight: Tensor, out: Tensor | None) -> Tensor:
    """The fused GEMM's (M, N) result as ``linear`` returns it: ``out`` itself, or shaped as x's rows."""
    return out if out is not None else y.reshape(*x.shape[:-1], weight.shape[0])


def addmm(bundle, input: Tensor, mat1: Tensor, mat2: Tensor, beta, alpha, out: Tensor | None):
    """``beta * input + alpha * (mat1 @ mat2)`` with torch.addmm's semantics (:func:`run_addmm`).
    Differentiable; one node (``tilekiln::addmm``) under torch.compile."""
    beta, alpha = check_addmm(input, mat1, mat2, beta, alpha, out)
    if _is_compiling():
        y = addmm_op(input, mat1, mat2, beta, alpha, bundle_ref(bundle))
        return y if out is None else out.copy_(y)
    if _grad_enabled() and any(t.requires_grad for t in (input, mat1, mat2)):
        _refuse_out_with_grad("addmm", out, input, mat1, mat2)
        return addmm_op(input, mat1, mat2, beta, alpha, bundle_ref(bundle))
    if not isinstance(bundle, Bundle):
        bundle = resolve(bundle_ref(bundle), mat1.get_device())
    return run_addmm(bundle, input, mat1, mat2, beta, alpha, out)


_SWIGLU = requested_epilogue(activation="swiglu")


def swiglu(bundle, x: Tensor, w_gate_up: Tensor, out: Tensor | None):
    """``silu(x @ gate.T) * (x @ up.T)``, (..., I), from ``w_gate_up`` (2I, K) in the interleaved layout
    (:func:`swiglu_weight`): one GEMM whose epilogue writes the product where a kernel fuses it,
    else the GEMM and the product in torch. Differentiable (the backward recomputes the GEMM)."""
    check_gate_up(w_gate_up, x, "x", grouped=False)
    shape = (*x.shape[:-1], w_gate_up.shape[0] // 2)
    check_out(out, shape, x)
    _refuse_out_with_grad("swiglu", out, x, w_gate_up)
    rows = as_rows(x)
    if _is_compiling() or (_grad_enabled() and (x.requires_grad or w_gate_up.requires_grad)):
        y = gemm_op(rows, w_gate_up.t(), bundle_ref(bundle), "", False, "swiglu")
    else:
        if not isinstance(bundle, Bundle):
            bundle = resolve(bundle_ref(bundle), x.get_device())
        y = run_gemm(bundle, rows, w_gate_up.t(), out if out is not None and out.dim() == 2 else None, None, None,
                     _SWIGLU)
    if y is out:
        return out
    y = y.reshape(shape)
    if out is None:
        return y
    out.copy_(y)
    return out


def _gemm_node(ref: str, a: Tensor, b: Tensor, out: Tensor | None, kernel: str):
    if out is None:
        return gemm_op(a, b, ref, kernel, False, "none")
    gemm_out_op(a, b, out, ref, kernel)
    return out


def grouped_gemm(bundle, a: Tensor, b: Tensor, rows: Tensor, scale_a, scale_b, out: Tensor | None, stream,
                 kernel: str | None = None, masked: bool = False, activation: str = "none",
                 scale_format: str | None = None):
    """``grouped_gemm`` (``rows`` is offs) or, with ``masked``, ``grouped_gemm_masked`` (``rows`` is
    masked_m) for torch tensors; ``activation`` "swiglu": ``grouped_swiglu`` (b's columns interleave
    gate and up); ``scale_format`` None (per-tensor, row-wise or blockwise scales, read from their shapes),
    ``"blockwise"`` (tilekiln/blockwise.py, the sm90 blockwise grouped kernels) or a block-scaled format
    (:func:`grouped_block_format`). Not differentiable."""
    name = ("grouped_swiglu" if activation == "swiglu" else "grouped_gemm") + ("_masked" if masked else "")
    scale_format = scale_format if scale_format == "blockwise" else grouped_block_format(scale_format)
    if _is_compiling():
        if stream is not None:
            raise TypeError("stream=: not supported while torch.compile traces; make the stream current "
                            "with torch.cuda.stream(...) instead")
        ref = bundle_ref(bundle)
        op, out_op = ((grouped_gemm_masked_op, grouped_gemm_masked_out_op) if masked else
                      (grouped_gemm_op, grouped_gemm_out_op))
        if out is None:
            return op(a, b, rows, scale_a, scale_b, ref, kernel or "", activation, scale_format or "")
        out_op(a, b, rows, scale_a, scale_b, out, ref, kernel or "", activation, scale_format or "")
        return out
    if _grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (a, b, scale_a, scale_b)):
        raise RuntimeError(f"{name} is not differentiable; detach its inputs or call it under torch.no_grad()")
    if not isinstance(bundle, Bundle):
        bundle = resolve(bundle_ref(bundle), a.get_device())
    return run_grouped_gemm(bundle, a, b, rows, scale_a, scale_b, out, stream, kernel, masked, activation,
                            scale_format)


def grouped_swiglu(bundle, a: Tensor, w_gate_up: Tensor, rows: Tensor, scale_a, scale_b, out: Tensor | None,
                   stream, kernel: str | None = None, masked: bool = False, scale_format: str | None = None):
    """``grouped_swiglu`` (``rows`` is offs) or ``grouped_swiglu_masked`` (masked_m): ``w_gate_up``
    (G, 2I, K), each expert's gate and up rows interleaved (:func:`swiglu_weight`), checked here so
    that errors name it; the grouped GEMM of ``a`` and ``w_gate_up.transpose(1, 2)`` with SwiGLU, its
    scales as ``grouped_gemm`` takes them for ``scale_format``."""
    check_gate_up(w_gate_up, a, "a", grouped=True)
    return grouped_gemm(bundle, a, w_gate_up.transpose(1, 2), rows, scale_a, scale_b, out, stream, kernel, masked,
                        "swiglu", scale_format)
