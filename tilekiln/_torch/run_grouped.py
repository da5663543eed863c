"""The grouped torch calls (contiguous ``offs`` and masked ``masked_m`` layouts): every argument
checked once per signature, then one launch that never reads the row counts on the host
(tilekiln/grouped.py plans and launches).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tilekiln._tensors import describe
from tilekiln._torch.epilogue import apply_unfused
from tilekiln._torch.results import allocate, stage_for, unstage
from tilekiln._torch.scales import (check_block_kernels, check_float_pointers, check_grouped_scales, check_tensor_scale,
                                    grouped_blockwise_shapes, grouped_scaling, scale_signature)
from tilekiln._torch.streams import on_stream, stream_handle
from tilekiln.blockscaled import (block_request, check_grouped_block_operands, check_grouped_block_scales,
                                  check_scale_pointers)
from tilekiln.blockwise import check_grouped_scales as check_grouped_blockwise_scales
from tilekiln.bundle import Bundle
from tilekiln.problem import requested_epilogue
from tilekiln.spec import BLOCKWISE_REQUEST


def grouped_plan(bundle: Bundle, a: Tensor, b: Tensor, rows: Tensor, scale_a, scale_b, out: Tensor | None,
                 kernel: str | None, masked: bool, activation: str, scale_format: str | None = None):
    """The plan of a grouped call, after every check of its arguments (the scales' by their format:
    a block-scaled ``scale_format``'s on the CPU, before any kernel is chosen, but for the bundle's
    arch message; blockwise ones after the operands', their strides going in the plan block)."""
    from tilekiln.grouped import make_grouped_problem, make_masked_problem, plan_grouped

    scale_strides = ()
    if scale_format is None and grouped_blockwise_shapes(a, b, scale_a, scale_b):
        scale_format = "blockwise"
    if scale_format == "blockwise":
        scaling = "blockwise"
        requested = requested_epilogue(scaling="blockwise", activation=activation)
    elif scale_format is not None:
        check_block_kernels(bundle, scale_format)
        check_grouped_block_operands(a, b, scale_format, masked)
        scaling = "block"
        requested = requested_epilogue(**dict(block_request(scale_format)), activation=activation)
    else:
        scaling = grouped_scaling(scale_a, scale_b)
        requested = requested_epilogue(scaling="rowwise" if scaling == "rowwise" else "tensor", activation=activation)
    make = make_masked_problem if masked else make_grouped_problem
    problem = make(describe(a, "a"), describe(b, "b"), describe(rows, "masked_m" if masked else "offs"),
                   None if out is None else describe(out, "out"), scaling != "none", requested)
    if scaling == "block":
        check_grouped_block_scales(a, b, scale_a, scale_b, scale_format, masked)
    elif scaling == "blockwise":
        scale_strides = check_grouped_blockwise_scales(a, b, scale_a, scale_b, masked)
    elif scaling == "tensor":
        for scale_name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
            check_tensor_scale(scale_name, scale, problem.device)
    elif scaling == "rowwise":
        check_grouped_scales(a, b, scale_a, scale_b, masked)
    return plan_grouped(bundle, problem, kernel, scale_strides)


def run_grouped_gemm(bundle: Bundle, a: Tensor, b: Tensor, rows, scale_a, scale_b, out: Tensor | None, stream,
                     kernel: str | None = None, masked: bool = False, activation: str = "none",
                     scale_format: str | None = None):
    """The grouped call, checked (every argument's shape, dtype, device and strides, from the cached plan's
    key) and launched; never reads ``rows`` (offs, or masked_m when ``masked``). A swiglu no kernel
    fuses runs the grouped GEMM into a zeroed buffer, whose rows no group owns stay zero, and torch
    pairs its columns into ``out`` (every row of which it writes)."""
    from tilekiln.grouped import launch_grouped

    name = "masked_m" if masked else "offs"
    if not isinstance(rows, Tensor):
        what = "row counts" if masked else "cumulative row ends"
        raise TypeError(f"{name}: expected an int32 torch tensor of {what}, got {type(rows).__name__}")
    key = ("grouped", masked, a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype,
           b.get_device(), rows.shape, rows.stride(), rows.dtype, rows.get_device(),
           None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()), kernel,
           scale_signature(scale_a), scale_signature(scale_b), activation, scale_format)
    plan = bundle._plans.get(key)
    if plan is None:
        plan = grouped_plan(bundle, a, b, rows, scale_a, scale_b, out, kernel, masked, activation, scale_format)
        bundle.remember(key, plan)
    problem = plan.problem
    dtype = torch.bfloat16 if problem.out_dtype == "bf16" else a.dtype
    given = out is not None  # only a caller's out can have row padding that is not tilekiln's
    if out is None:
        out = allocate(problem.out_shape, problem.k, dtype, a.device)
    if plan.block is None:
        if problem.k == 0 and out.numel():
            with on_stream(stream, problem.device):
                out.zero_()
        return out
    target = out
    if plan.unfused:
        with on_stream(stream, problem.device):
            target = allocate(plan.run.out_shape, problem.k, dtype, a.device).zero_()
    elif given:
        target = stage_for(out, stream, keep=True)
    # The plan's scaling: blockwise as asked, or as the scales' shapes said (grouped_plan).
    if BLOCKWISE_REQUEST in problem.requested:
        check_float_pointers(scale_a=scale_a, scale_b=scale_b)
    elif scale_format is not None:
        check_scale_pointers(scale_a, scale_b)
    launch_grouped(bundle, plan, a.data_ptr(), b.data_ptr(), target.data_ptr(), rows.data_ptr(),
                   stream_handle(stream, problem.device), 0 if scale_a is None else scale_a.data_ptr(),
                   0 if scale_b is None else scale_b.data_ptr())
    if plan.unfused:
        return apply_unfused(plan, target, out, stream)
    return unstage(target, out, stream)
