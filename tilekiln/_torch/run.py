"""The hot path of the dense torch calls: plan look-up by signature, then one launch.

A cached eager call costs the signature key (shape, strides, dtype and device of each operand,
and of each scale), one dictionary look-up, three pointer reads, the current raw stream handle
(tilekiln/_torch/streams.py) and one ctypes call. What no kernel fuses of a requested epilogue,
torch applies after the launch (tilekiln/_torch/epilogue.py); a split-K plan launches into an fp32
workspace that torch sums in order.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from tilekiln._native import CALL
from tilekiln._tensors import describe, torch_dtype_token
from tilekiln._torch.epilogue import SCALED_RESULTS, apply_unfused
from tilekiln._torch.results import allocate, fusable_residual, partials, result_dtype, stage_for, unstage
from tilekiln._torch.scales import (check_block_kernels, check_float_pointers, check_rowwise_scales, check_tensor_scale,
                                    scale_signature)
from tilekiln._torch.streams import current_stream, on_stream, raw_stream, stream_handle
from tilekiln.blockscaled import check_block_operands, check_block_scale_tensors, check_scale_pointers, requested_format
from tilekiln.blockwise import check_scales
from tilekiln.bundle import NEUTRAL_VALUES, Bundle, Plan, raise_misaligned
from tilekiln.errors import LaunchError, NoKernelError
from tilekiln.problem import addmm_request
from tilekiln.spec import BLOCKWISE_REQUEST

_pack_call = CALL["gemm"].pack_into  # the gemm family's call block
# run_gemm reads the raw stream through this module's own binding of streams.raw_stream (one global
# look-up on the hot path); stream_handle and current_stream read streams'.

# The requests of the scale formats whose scales are tensors checked by shape and strides (the
# per-tensor default requests nothing; its scales are one element each): row-wise, and blockwise
# (BLOCKWISE_REQUEST).
_ROWWISE = ("scaling", "rowwise")

# What addmm asks for when alpha or beta change the result (tilekiln/problem.py, addmm_request).
_ALPHA_BETA = ("scalars", "alphabeta")


def through_result(exc: ValueError, out: Tensor | None, plan_without_out) -> Plan:
    """The plan without ``out`` (``plan_without_out()``), marked ``via_result``, where planning with
    ``out`` raised ``exc`` and only ``out``'s layout was in the way (its rows not 16 bytes apart, or
    column-major, as torch.matmul's out= allows): ``out`` has the shape, dtype and device of that
    plan's result. The call then runs as an unfused one (Plan.unfused) into a result of tilekiln's,
    which torch finishes into ``out``; a requested residual joins what torch applies, since the
    caller checked it at ``out``'s strides, where no kernel reads it. Else ``exc`` again, which
    names what is wrong."""
    if out is None:
        raise exc
    try:
        plan = plan_without_out()
    except ValueError:
        raise exc from None
    problem, op = plan.problem, describe(out, "out")
    if (op.shape, op.dtype, op.device) != (problem.out_shape, problem.out_dtype, problem.device):
        raise exc
    residual = tuple(r for r in problem.requested if r[0] == "residual" and r not in plan.unfused)
    return dataclasses.replace(plan, via_result=True, unfused=plan.unfused + residual)


def addmm_plan(input: Tensor, mat1: Tensor, mat2: Tensor, beta: float, alpha: float, target: Tensor
               ) -> tuple[tuple[tuple[str, object], ...], Tensor | None]:
    """What an addmm call writing ``target`` asks a kernel for (:func:`addmm_request`) and the
    residual it hands it: ``input`` itself where beta is not 0 and input is an (M, N) tensor at
    ``target``'s strides (:func:`fusable_residual`), else None (torch adds ``beta * input`` after
    the kernel; where beta is 0, nothing reads input)."""
    fused = fusable_residual(mat1, mat2.t(), input, target) if beta != 0 else None
    return addmm_request(beta, alpha, fused is not None), None if fused is None else fused[1]


def run_addmm(bundle: Bundle, input: Tensor, mat1: Tensor, mat2: Tensor, beta: float, alpha: float,
              out: Tensor | None) -> Tensor:
    """The checked call, into ``out`` (which may be ``input``) or a result allocated as the fakes
    allocate it. The kernel computes as much as it can: ``alpha * (mat1 @ mat2) + beta * input``
    whole where input fuses (:func:`addmm_plan`) and a kernel has alpha and beta; ``alpha * (mat1 @
    mat2)`` where input does not fuse, torch then adding ``beta * input`` in fp32; where the bundle
    has no alpha and beta kernel, the plain product, torch applying both. Every torch epilogue works
    in fp32 and rounds once. beta 0: input is never read (torch.addmm ignores it, NaN and inf
    included); an empty product (K 0) is zero."""
    m, k = mat1.shape
    shape = (m, mat2.shape[1])
    target = out if out is not None else allocate(shape, k, mat1.dtype, mat1.device)
    if target.numel() == 0:
        return target
    wide = torch.promote_types(mat1.dtype, torch.float32)
    if k == 0:
        return target.zero_() if beta == 0 else target.copy_(input.to(wide) * beta)
    requested, residual = addmm_plan(input, mat1, mat2, beta, alpha, target)
    scale = 1.0
    try:
        if residual is not None:
            return run_gemm(bundle, mat1, mat2, target, None, None, requested, None, residual, (alpha, beta))
        product = run_gemm(bundle, mat1, mat2, target if beta == 0 else None, None, None, requested,
                           values=(alpha, beta))
    except NoKernelError:
        if _ALPHA_BETA not in requested:
            raise
        # No kernel of the bundle computes alpha and beta: the plain product, and torch applies both.
        product, scale = run_gemm(bundle, mat1, mat2, None, None), alpha
    if beta == 0 and scale == 1:
        return product
    value = product.to(wide)
    if scale != 1:
        value = value * scale
    if beta != 0:
        value = torch.add(value, input.to(wide), alpha=beta)
    return target.copy_(value)


def run_gemm(bundle: Bundle, a: Tensor, b: Tensor, out: Tensor | None, stream, kernel=None, requested=(),
             bias: Tensor | None = None, residual: Tensor | None = None, values: tuple[float, ...] = NEUTRAL_VALUES):
    """``bundle.gemm`` for torch tensors, written out in one function. ``requested``: the epilogue
    the call asks for (GemmProblem.requested); what no kernel computes, torch applies after it.
    ``bias``: the (N,) vector a requested ``bias`` adds, checked by the caller (:func:`bias_token`).
    ``residual``: the (M, N) tensor a requested ``residual`` adds, checked by the caller
    (:func:`fusable_residual`: the result's type, and the strides of ``out``, or of the result this
    call allocates, which the kernel reads it at). ``values``: the gemm family's by-value float32
    arguments (tilekiln/spec.py, ValueArg), which only a kernel that uses them reads.

    A cached call costs the signature key, one dictionary look-up, three or four
    pointer reads, the current stream, one pack into the thread's call
    block and one ctypes call.
    """
    if out is None:
        key = (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(), kernel,
               requested)
    else:
        key = (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(), kernel,
               requested, out.shape, out.stride(), out.dtype, out.get_device())
    plan = bundle._plans.get(key)
    if plan is None:
        a_op, b_op = describe(a, "a"), describe(b, "b")

        def plan_for(out_op):
            return bundle.plan(a_op, b_op, out_op, kernel, allow_split=True, requested=requested)

        try:
            plan = plan_for(None if out is None else describe(out, "out"))
        except ValueError as exc:
            plan = through_result(exc, out, lambda: plan_for(None))
        bundle.remember(key, plan)
    if plan.unfused or plan.via_result:
        fused = tuple(r for r in requested if r not in plan.unfused)
        if out is None:
            # A result torch finishes is allocated as a fused one would be (and as the fakes say):
            # torch's own results of a padded one are contiguous.
            out = allocate(plan.problem.out_shape, plan.problem.k, a.dtype, a.device)
        return apply_unfused(plan, run_gemm(bundle, a, b, None, stream, kernel, fused, bias, residual, values), out,
                             stream, bias, residual, values)
    given = out is not None  # only a caller's out can have row padding that is not tilekiln's
    if out is None:
        out = allocate(plan.problem.out_shape, plan.problem.k, a.dtype, a.device)
    block = plan.block
    if block is None:
        if plan.problem.k == 0:
            out.zero_()
        return out
    if plan.split > 1:
        return _split_k(bundle, plan, a, b, out, stream)
    target = stage_for(out, stream) if given else out
    pa, pb, pc = a.data_ptr(), b.data_ptr(), target.data_ptr()
    if (pa | pb | pc) & plan.align_mask:
        raise_misaligned(pa, pb, pc, plan.align_mask + 1)
    if stream is None and raw_stream is not None:
        handle = raw_stream(plan.problem.device)
    else:
        handle = stream_handle(stream, plan.problem.device)
    lib = bundle._lib
    buf = lib.call_buffer("gemm")
    _pack_call(buf, 0, pa, pb, pc, 0, 0, 0 if bias is None else bias.data_ptr(),
               0 if residual is None else residual.data_ptr(), 0, *values, handle)
    status = lib.run["gemm"](block, buf)
    if status:
        raise LaunchError(plan.kernel_id, lib.error_name(status), lib.error_string(status))
    return unstage(target, out, stream)


def run_scaled_gemm(bundle: Bundle, a: Tensor, b: Tensor, scale_a, scale_b, out_dtype, out, stream, kernel,
                    requested=(), bias: Tensor | None = None, scale_result: Tensor | None = None):
    """The scaled call, checked (the scales' and bias's shape, dtype, strides and device are part of
    the cached plan's key, so a cached plan never serves a call its checks would refuse) and launched.
    ``requested`` (:func:`scaled_request`): the scale format, then the bias, whose type the caller
    checked, as it checked ``scale_result`` against the result's type. An fp8 result runs unsplit:
    split-K's fp32 partial sums would be added after the kernel's output scale. ``out_dtype`` None:
    out's type, else bf16 (:func:`result_dtype`, as scaled_gemm_out_op passes it under torch.compile)."""
    out_dtype = result_dtype(out_dtype, out) if out_dtype is None else out_dtype
    fp8_result = (out_dtype if out is None else out.dtype) in SCALED_RESULTS
    blockwise, rowwise = BLOCKWISE_REQUEST in requested, _ROWWISE in requested
    block_format = requested_format(requested, a.dtype)
    key = ("scaled", a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(), a.get_device(), b.get_device(),
           None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()), kernel, out_dtype,
           scale_signature(scale_a), scale_signature(scale_b), requested, scale_signature(scale_result))
    plan = bundle._plans.get(key)
    if plan is None:
        if block_format is not None:
            check_block_kernels(bundle, block_format, out_dtype)
            check_block_operands(a, b, block_format)
        a_op, b_op = describe(a, "a"), describe(b, "b")
        # Blockwise scales are strided tensors, whose strides go in the plan block.
        scale_strides = check_scales(a, b, scale_a, scale_b) if blockwise else ()
        if rowwise:
            check_rowwise_scales(a, b, scale_a, scale_b)
        def plan_for(out_op):
            return bundle.plan(a_op, b_op, out_op, kernel, torch_dtype_token(out_dtype), allow_split=not fp8_result,
                               requested=requested, scale_strides=scale_strides)

        try:
            try:
                plan = plan_for(None if out is None else describe(out, "out"))
            except ValueError as exc:
                plan = through_result(exc, out, lambda: plan_for(None))
        except NoKernelError as exc:
            if not rowwise:
                raise
            raise NoKernelError(f"scale_a, scale_b: row-wise scales ((M, 1) and (1, N)) need a kernel with "
                                f"scaling rowwise, and bundle {bundle.name} has none for these operands; pass "
                                f"one-element (per-tensor) scales, or build a rowwise kernel (docs/catalog.md)"
                                f"\n{exc}") from None
        # The operands' own checks (device, dtype, shapes) came with the plan; then their scales'.
        if block_format is not None:
            check_block_scale_tensors(a, b, scale_a, scale_b, block_format)
        elif not (blockwise or rowwise):
            for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
                check_tensor_scale(name, scale, plan.problem.device)
        bundle.remember(key, plan)
    if plan.unfused or plan.via_result:
        fused = tuple(r for r in requested if r not in plan.unfused)
        if out is None:
            out = allocate(plan.problem.out_shape, plan.problem.k, out_dtype, a.device)
        return apply_unfused(plan, run_scaled_gemm(bundle, a, b, scale_a, scale_b, out_dtype, None, stream, kernel,
                                                    fused, bias, scale_result), out, stream, bias)
    given = out is not None  # only a caller's out can have row padding that is not tilekiln's
    if out is None:
        out = allocate(plan.problem.out_shape, plan.problem.k, out_dtype, a.device)
    if plan.block is None:
        if plan.problem.k == 0:
            out.zero_()
        return out
    pa, pb = scale_a.data_ptr(), scale_b.data_ptr()
    if block_format is not None:
        check_scale_pointers(scale_a, scale_b)
    if blockwise or rowwise:
        check_float_pointers(scale_a=scale_a, scale_b=scale_b)
    if fp8_result:
        check_float_pointers(scale_result=scale_result)
    if plan.split > 1:
        return _split_k(bundle, plan, a, b, out, stream, pa, pb)
    target = stage_for(out, stream) if given else out
    bundle.launch(plan, a.data_ptr(), b.data_ptr(), target.data_ptr(), stream_handle(stream, plan.problem.device),
                  pa, pb, 0 if bias is None else bias.data_ptr(), 0,
                  scale_result.data_ptr() if fp8_result else 0)
    return unstage(target, out, stream)


def _split_k(bundle, plan, a, b, out, stream, scale_a: int = 0, scale_b: int = 0):
    """Launch the plan's K slices into an fp32 workspace, then add the planes in order in fp32 and
    round the sum once into ``out``."""
    device = plan.problem.device
    with on_stream(stream, device):
        run = plan.run
        work = partials(run.out_shape, out.device)
        bundle.launch(plan, a.data_ptr(), b.data_ptr(), work.data_ptr(), current_stream(device), scale_a, scale_b)
        planes, target = work[..., :run.n], out if out.dim() == 2 else out[0]
        if target.dtype == torch.float32:
            torch.sum(planes, dim=0, out=target)
        else:
            # torch.sum into a narrower out reduces in out's type: it copies every plane into it
            # first (ATen's make_reduction_from_out_ty), a rounding per plane (bf16 planes of
            # magnitude 64 summed 2.0 off) and a second kernel anyway; this second kernel rounds once.
            target.copy_(planes.sum(dim=0))
    return out
