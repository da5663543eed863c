"""The torch operators, their fakes and their autograd; importing this module registers them:

    tilekiln::gemm(a, b, bundle, kernel, fallback, activation, bias=None, residual=None) -> Tensor
                                                                  autograd: dA = dC·Bᵀ, dB = Aᵀ·dC
                                                                  (swiglu: dC from the recomputed GEMM)
    tilekiln::gemm_out(a, b, out!, bundle, kernel)
    tilekiln::addmm(input, mat1, mat2, beta, alpha, bundle) -> Tensor
                                                                  autograd: d input = beta * grad summed to
                                                                  input's shape, d mat1 = alpha * grad·mat2ᵀ,
                                                                  d mat2 = alpha * mat1ᵀ·grad
    tilekiln::scaled_gemm(a, b, scale_a, scale_b, out_dtype, bundle, kernel, scale_format, bias=None,
                          scale_result=None, activation="none") -> Tensor
    tilekiln::scaled_gemm_out(a, b, scale_a, scale_b, out!, bundle, kernel, scale_format, bias=None,
                              scale_result=None, activation="none")
    tilekiln::grouped_gemm(a, b, offs, scale_a, scale_b, bundle, kernel, activation="none", scale_format="") -> Tensor
    tilekiln::grouped_gemm_out(a, b, offs, scale_a, scale_b, out!, bundle, kernel, activation="none", scale_format="")
    tilekiln::grouped_gemm_masked(a, b, masked_m, scale_a, scale_b, bundle, kernel, activation="none",
                                  scale_format="") -> Tensor
    tilekiln::grouped_gemm_masked_out(a, b, masked_m, scale_a, scale_b, out!, bundle, kernel, activation="none",
                                      scale_format="")

``bundle`` is the bundle's reference string (tilekiln/_torch/streams.py). The fakes allocate
through the same :func:`tilekiln.problem.result_strides` as the real calls, so traced strides
equal real ones.

The backward GEMMs run through ``tilekiln::gemm`` with ``fallback`` set: on the bundle's kernels
where one accepts the layout (sm90 has all four), else ``torch.matmul``; ``explain`` says which.
Being operators themselves, they are differentiable again.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tilekiln._torch.checks import bias_token, check_addmm
from tilekiln._torch.epilogue import add_residual, swiglu_grad
from tilekiln._torch.results import allocate, as_rows, new_result
from tilekiln._torch.run import run_addmm, run_gemm, run_scaled_gemm
from tilekiln._torch.run_grouped import run_grouped_gemm
from tilekiln._torch.scales import check_rowwise_scales, scaled_request
from tilekiln._torch.streams import resolve
from tilekiln.errors import NoKernelError
from tilekiln.problem import requested_epilogue, result_shape, result_strides


@torch.library.custom_op("tilekiln::gemm", mutates_args=())
def gemm_op(a: Tensor, b: Tensor, bundle: str, kernel: str, fallback: bool, activation: str,
            bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    """``activation(a @ b + bias) + residual`` on ``bundle``'s kernels (each fused where one computes
    it, else applied by torch; ``bias`` an (N,) vector or None; ``residual`` None or an (M, N)
    tensor of the result's type, fused where its strides are the result's, else added in fp32
    and rounded once); with ``fallback``, through ``torch.matmul`` where no kernel accepts the
    operands (the backward GEMMs, whose layouts the caller did not choose)."""
    target = resolve(bundle, a.get_device())
    if not fallback:
        bias_type = "none" if bias is None else bias_token(bias, a, b.shape[-1])
        if residual is None:
            return run_gemm(target, a, b, None, None, kernel or None,
                            requested_epilogue(bias=bias_type, activation=activation), bias)
        _check_op_residual(a, b, residual)
        shape, k = result_shape(tuple(a.shape), tuple(b.shape))
        if all(size <= 1 or got == want
               for size, got, want in zip(shape, residual.stride(), result_strides(shape, k, a.dtype.itemsize))):
            return run_gemm(target, a, b, None, None, kernel or None,
                            requested_epilogue(bias=bias_type, activation=activation, residual="add"), bias,
                            residual)
        y = run_gemm(target, a, b, None, None, kernel or None, requested_epilogue(bias=bias_type, activation=activation),
                     bias)
        return y.copy_(add_residual(y, residual))
    try:
        return run_gemm(target, a, b, None, None, None)
    except (NoKernelError, ValueError, TypeError):  # raised before any launch: no kernel takes these operands
        y = torch.matmul(a, b)
        shape, k = result_shape(tuple(a.shape), tuple(b.shape))
        # At the strides the fake promises: torch's are contiguous, tilekiln's rows 16-byte padded.
        return y if y.stride() == result_strides(shape, k, y.dtype.itemsize) else new_result(a, b, a.dtype).copy_(y)


def _check_op_residual(a: Tensor, b: Tensor, residual: Tensor) -> None:
    """gemm_op's residual: the 2-D result's shape, a's dtype and device."""
    shape, _ = result_shape(tuple(a.shape), tuple(b.shape))
    if len(shape) != 2 or tuple(residual.shape) != shape or residual.dtype != a.dtype or residual.device != a.device:
        raise ValueError(f"residual: expected a tensor of the 2-D result's shape {list(shape)}, dtype {a.dtype} and "
                         f"device {a.device}; got shape {list(residual.shape)}, dtype {residual.dtype}, device "
                         f"{residual.device}")


@gemm_op.register_fake
def _gemm_fake(a: Tensor, b: Tensor, bundle: str, kernel: str, fallback: bool, activation: str,
               bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    if residual is not None:
        _check_op_residual(a, b, residual)
    return new_result(a, b, a.dtype, activation)


def _sum_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """Reduce a gradient over the batch dimension its input was broadcast along."""
    if grad.shape == shape:
        return grad
    if len(shape) == 2:
        return grad.sum(0)
    return grad.sum(0, keepdim=True)


def _gemm_setup(ctx, inputs, output) -> None:
    a, b, bundle, _, _, activation, bias, residual = inputs
    ctx.swiglu = activation == "swiglu" and bias is None
    ctx.epilogue = (activation != "none" or bias is not None or residual is not None) and not ctx.swiglu
    # SwiGLU's gradient needs the GEMM's result, which the backward recomputes from both inputs.
    ctx.save_for_backward(a if ctx.needs_input_grad[1] or ctx.swiglu else None,
                          b if ctx.needs_input_grad[0] or ctx.swiglu else None)
    ctx.shapes = (a.shape, b.shape)
    ctx.bundle = bundle


def _gemm_backward(ctx, grad: Tensor):
    if ctx.epilogue:
        raise RuntimeError("tilekiln::gemm with a bias, activation or residual has no gradient; tilekiln.linear "
                           "applies them unfused, through torch, when an input requires grad")
    a, b = ctx.saved_tensors
    if ctx.swiglu:
        grad = swiglu_grad(gemm_op(a, b, ctx.bundle, "", True, "none"), grad)
    a_shape, b_shape = ctx.shapes
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = _sum_to(gemm_op(grad, b.mT, ctx.bundle, "", True, "none"), a_shape)
    if ctx.needs_input_grad[1]:
        if a.dim() == 3 and len(b_shape) == 2:
            # One B for every batch entry: its gradient is one GEMM over all the rows.
            grad_b = gemm_op(as_rows(a).mT, as_rows(grad), ctx.bundle, "", True,
                             "none")
        else:
            grad_b = _sum_to(gemm_op(a.mT, grad, ctx.bundle, "", True, "none"), b_shape)
    return grad_a, grad_b, None, None, None, None, None, None


gemm_op.register_autograd(_gemm_backward, setup_context=_gemm_setup)


@torch.library.custom_op("tilekiln::gemm_out", mutates_args=("out",))
def gemm_out_op(a: Tensor, b: Tensor, out: Tensor, bundle: str, kernel: str) -> None:
    run_gemm(resolve(bundle, a.get_device()), a, b, out, None, kernel or None)


@gemm_out_op.register_fake
def _gemm_out_fake(a: Tensor, b: Tensor, out: Tensor, bundle: str, kernel: str) -> None:
    return None


@torch.library.custom_op("tilekiln::addmm", mutates_args=())
def addmm_op(input: Tensor, mat1: Tensor, mat2: Tensor, beta: float, alpha: float, bundle: str) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)`` on ``bundle``'s kernels (:func:`run_addmm`)."""
    return run_addmm(resolve(bundle, mat1.get_device()), input, mat1, mat2, beta, alpha, None)


@addmm_op.register_fake
def _addmm_fake(input: Tensor, mat1: Tensor, mat2: Tensor, beta: float, alpha: float, bundle: str) -> Tensor:
    check_addmm(input, mat1, mat2, beta, alpha, None)
    return allocate((mat1.shape[0], mat2.shape[1]), mat1.shape[1], mat1.dtype, mat1.device)


def _addmm_setup(ctx, inputs, output) -> None:
    input, mat1, mat2, beta, alpha, bundle = inputs
    ctx.save_for_backward(mat1 if ctx.needs_input_grad[2] else None, mat2 if ctx.needs_input_grad[1] else None)
    ctx.input_shape, ctx.beta, ctx.alpha, ctx.bundle = input.shape, beta, alpha, bundle


def _addmm_backward(ctx, grad: Tensor):
    """torch.addmm's gradients: d input = beta * grad summed to input's shape, d mat1 = alpha * grad ·
    mat2ᵀ, d mat2 = alpha * mat1ᵀ · grad (the GEMMs through tilekiln::gemm, falling back to torch)."""
    mat1, mat2 = ctx.saved_tensors
    grad_input = grad_mat1 = grad_mat2 = None
    if ctx.needs_input_grad[0]:
        grad_input = (grad * ctx.beta).sum_to_size(ctx.input_shape)
    if ctx.needs_input_grad[1]:
        grad_mat1 = gemm_op(grad, mat2.mT, ctx.bundle, "", True, "none")
        grad_mat1 = grad_mat1 if ctx.alpha == 1 else grad_mat1 * ctx.alpha
    if ctx.needs_input_grad[2]:
        grad_mat2 = gemm_op(mat1.mT, grad, ctx.bundle, "", True, "none")
        grad_mat2 = grad_mat2 if ctx.alpha == 1 else grad_mat2 * ctx.alpha
    return grad_input, grad_mat1, grad_mat2, None, None, None


addmm_op.register_autograd(_addmm_backward, setup_context=_addmm_setup)


@torch.library.custom_op("tilekiln::scaled_gemm", mutates_args=())
def scaled_gemm_op(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out_dtype: torch.dtype | None,
                   bundle: str, kernel: str, scale_format: str, bias: Tensor | None = None,
                   scale_result: Tensor | None = None, activation: str = "none") -> Tensor:
    return run_scaled_gemm(resolve(bundle, a.get_device()), a, b, scale_a, scale_b, out_dtype, None, None,
                           kernel or None,
                           scaled_request(a, b, scale_format, out_dtype, None, bias, scale_result, activation),
                           bias, scale_result)


def _check_traced(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, scale_format: str, out_dtype, out,
                  bias: Tensor | None, scale_result: Tensor | None, activation: str) -> None:
    """The checks of a scaled call that shapes, dtypes and devices decide, while torch.compile traces
    it: a bad row-wise scale, bias, scale_result or swiglu N fails the trace with the eager call's message."""
    if scale_format == "rowwise":
        check_rowwise_scales(a, b, scale_a, scale_b)
    scaled_request(a, b, scale_format, out_dtype, out, bias, scale_result, activation)


@scaled_gemm_op.register_fake
def _scaled_gemm_fake(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out_dtype: torch.dtype | None,
                      bundle: str, kernel: str, scale_format: str, bias: Tensor | None = None,
                      scale_result: Tensor | None = None, activation: str = "none") -> Tensor:
    _check_traced(a, b, scale_a, scale_b, scale_format, out_dtype, None, bias, scale_result, activation)
    return new_result(a, b, torch.bfloat16 if out_dtype is None else out_dtype, activation)


@torch.library.custom_op("tilekiln::scaled_gemm_out", mutates_args=("out",))
def scaled_gemm_out_op(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out: Tensor, bundle: str,
                       kernel: str, scale_format: str, bias: Tensor | None = None,
                       scale_result: Tensor | None = None, activation: str = "none") -> None:
    run_scaled_gemm(resolve(bundle, a.get_device()), a, b, scale_a, scale_b, out.dtype, out, None,
                    kernel or None, scaled_request(a, b, scale_format, out.dtype, out, bias, scale_result, activation),
                    bias, scale_result)


@scaled_gemm_out_op.register_fake
def _scaled_gemm_out_fake(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out: Tensor, bundle: str,
                          kernel: str, scale_format: str, bias: Tensor | None = None,
                          scale_result: Tensor | None = None, activation: str = "none") -> None:
    _check_traced(a, b, scale_a, scale_b, scale_format, out.dtype, out, bias, scale_result, activation)
    return None


@torch.library.custom_op("tilekiln::grouped_gemm", mutates_args=())
def grouped_gemm_op(a: Tensor, b: Tensor, offs: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                    bundle: str, kernel: str, activation: str = "none", scale_format: str = "") -> Tensor:
    """torch._grouped_mm(a, b, offs=offs) (contiguous layout) on ``bundle``'s grouped kernels; with fp8
    inputs, times the per-tensor, row-wise or blockwise scales, in bf16; ``activation`` "swiglu": silu(gate) * up
    of b's interleaved columns, N/2 of them."""
    return run_grouped_gemm(resolve(bundle, a.get_device()), a, b, offs, scale_a, scale_b, None, None,
                            kernel or None, activation=activation, scale_format=scale_format or None)


def _grouped_dtype(a: Tensor, scale_a, scale_b) -> torch.dtype:
    return a.dtype if scale_a is None and scale_b is None else torch.bfloat16


def _grouped_columns(b: Tensor, activation: str) -> int:
    """The result's columns: b's N, halved by a gated activation (as make_grouped_problem's)."""
    return b.shape[-1] // 2 if activation == "swiglu" else b.shape[-1]


@grouped_gemm_op.register_fake
def _grouped_gemm_fake(a: Tensor, b: Tensor, offs: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                       bundle: str, kernel: str, activation: str = "none", scale_format: str = "") -> Tensor:
    return allocate((a.shape[0], _grouped_columns(b, activation)), a.shape[-1], _grouped_dtype(a, scale_a, scale_b),
                    a.device)


@torch.library.custom_op("tilekiln::grouped_gemm_out", mutates_args=("out",))
def grouped_gemm_out_op(a: Tensor, b: Tensor, offs: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                        out: Tensor, bundle: str, kernel: str, activation: str = "none",
                        scale_format: str = "") -> None:
    run_grouped_gemm(resolve(bundle, a.get_device()), a, b, offs, scale_a, scale_b, out, None, kernel or None,
                     activation=activation, scale_format=scale_format or None)


@grouped_gemm_out_op.register_fake
def _grouped_gemm_out_fake(a: Tensor, b: Tensor, offs: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                           out: Tensor, bundle: str, kernel: str, activation: str = "none",
                        scale_format: str = "") -> None:
    return None


@torch.library.custom_op("tilekiln::grouped_gemm_masked", mutates_args=())
def grouped_gemm_masked_op(a: Tensor, b: Tensor, masked_m: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                           bundle: str, kernel: str, activation: str = "none", scale_format: str = "") -> Tensor:
    """The masked layout: out[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g] (with ``activation``)."""
    return run_grouped_gemm(resolve(bundle, a.get_device()), a, b, masked_m, scale_a, scale_b, None, None,
                            kernel or None, masked=True, activation=activation, scale_format=scale_format or None)


@grouped_gemm_masked_op.register_fake
def _grouped_gemm_masked_fake(a: Tensor, b: Tensor, masked_m: Tensor, scale_a: Tensor | None,
                              scale_b: Tensor | None, bundle: str, kernel: str, activation: str = "none",
                              scale_format: str = "") -> Tensor:
    return allocate((a.shape[0], a.shape[1], _grouped_columns(b, activation)), a.shape[-1],
                    _grouped_dtype(a, scale_a, scale_b), a.device)


@torch.library.custom_op("tilekiln::grouped_gemm_masked_out", mutates_args=("out",))
def grouped_gemm_masked_out_op(a: Tensor, b: Tensor, masked_m: Tensor, scale_a: Tensor | None,
                               scale_b: Tensor | None, out: Tensor, bundle: str, kernel: str,
                               activation: str = "none", scale_format: str = "") -> None:
    run_grouped_gemm(resolve(bundle, a.get_device()), a, b, masked_m, scale_a, scale_b, out, None, kernel or None,
                     masked=True, activation=activation, scale_format=scale_format or None)


@grouped_gemm_masked_out_op.register_fake
def _grouped_gemm_masked_out_fake(a: Tensor, b: Tensor, masked_m: Tensor, scale_a: Tensor | None,
                                  scale_b: Tensor | None, out: Tensor, bundle: str, kernel: str,
                                  activation: str = "none", scale_format: str = "") -> None:
    return None
