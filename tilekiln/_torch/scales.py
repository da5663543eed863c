"""The scales of a scaled or grouped call: which format the scales' shapes say, the checks of
per-tensor, row-wise, blockwise and block-scaled scales and of an fp8 result's ``scale_result``,
and the epilogue a scaled call requests (:func:`scaled_request`). Errors name the argument.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tilekiln._tensors import torch_dtype_token
from tilekiln._torch.checks import bias_token
from tilekiln._torch.epilogue import SCALED_RESULTS
from tilekiln._torch.results import result_dtype
from tilekiln.blockscaled import RUNTIME_BLOCK_FORMATS, block_request, check_block_elements, format_of
from tilekiln.blockwise import BLOCK, check_scale_tensor, grouped_scale_shapes, scale_format_token
from tilekiln.bundle import Bundle
from tilekiln.errors import NoKernelError
from tilekiln.problem import requested_epilogue, result_shape
from tilekiln.spec import DTYPES, MAX_EXTENT

_SCALE_ERROR = ("{name}: expected a one-element float32 CUDA tensor on the inputs' device "
                "(a per-tensor scale, as torch._scaled_mm takes), got {what}")


def check_tensor_scale(name: str, scale, device: int) -> None:
    """A per-tensor scale ``name``: a one-element float32 tensor on ``device``; TypeError or ValueError."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(_SCALE_ERROR.format(name=name, what=type(scale).__name__))
    if scale.dtype != torch.float32 or scale.numel() != 1 or scale.get_device() != device:
        raise ValueError(_SCALE_ERROR.format(
            name=name, what=f"{scale.dtype} with {scale.numel()} elements on {scale.device}"))


def scale_format_of(scale_format, a: Tensor, b: Tensor, scale_a, scale_b) -> str:
    """The call's scale format: ``scale_format`` checked, or where it is None, read from the scales'
    shapes as torch._scaled_mm reads them: per tensor when both have one element; row-wise when they
    are (M, 1) and (1, N); blockwise when they are (M, K/128) and (ceil(N/128), K/128) (torch's 1x128
    and 128x128 blocks); else row-wise, whose check then names what is wrong."""
    if scale_format is not None:
        return scale_format_token(scale_format)
    if not all(isinstance(s, Tensor) for s in (scale_a, scale_b)) or scale_a.numel() == scale_b.numel() == 1:
        return "tensor"
    if a.dim() == 2 and b.dim() == 2 and a.shape[1] % BLOCK == 0:
        (m, k), n = a.shape, b.shape[1]
        rowwise = ((m, 1), (1, n))
        blockwise = ((m, k // BLOCK), (-(-n // BLOCK), k // BLOCK))
        if (tuple(scale_a.shape), tuple(scale_b.shape)) == blockwise != rowwise:
            return "blockwise"
    return "rowwise"


def check_rowwise_scales(a: Tensor, b: Tensor, scale_a, scale_b) -> None:
    """Check a row-wise call's operands and scales: 2-D a (M, K) and b (K, N), float32 scale_a (M, 1)
    and scale_b (1, N), each contiguous, on the inputs' device. TypeError or ValueError naming the
    argument, what is wrong and how to fix it."""
    result_shape(tuple(a.shape), tuple(b.shape))  # shapes that multiply, as every call checks first
    if a.dim() != 2 or b.dim() != 2:
        which = "a" if a.dim() != 2 else "b"
        raise ValueError(f"{which}: row-wise scaled_gemm takes 2-D operands a (M, K) and b (K, N), as "
                         f"torch._scaled_mm does; got {which} of shape {list((a if which == 'a' else b).shape)}")
    m, n = a.shape[0], b.shape[1]
    for name, scale, shape, along, per in (("scale_a", scale_a, (m, 1), 0, "row of a"),
                                           ("scale_b", scale_b, (1, n), 1, "column of b")):
        check_scale_tensor(name, scale, shape, along, a.device,
                           f"{'(M, 1)' if along == 0 else '(1, N)'} = {shape}, contiguous (one scale per {per}) "
                           "for row-wise scaling")


def scale_signature(scale) -> tuple:
    """What of a scale its check (and a blockwise plan's strides) depends on; part of the plan key,
    so a cached plan is never reused for a scale the check would refuse."""
    if isinstance(scale, torch.Tensor):
        return scale.dtype, scale.shape, scale.stride(), scale.get_device()
    return (type(scale),)


def check_scale_result(scale_result, dtype: torch.dtype, device) -> None:
    """Check a scaled call's ``scale_result`` against its result type ``dtype``: an fp8 result
    (float8_e4m3fn) needs a one-element float32 tensor on the inputs' device, as torch._scaled_mm
    takes it; any other result takes none. TypeError or ValueError naming the argument."""
    fp8 = dtype in SCALED_RESULTS
    if scale_result is None:
        if fp8:
            raise ValueError(f"scale_result: a {dtype} result is written as saturate(value * scale_result); pass a "
                             "one-element float32 tensor on the inputs' device (torch.ones(1, device=a.device) "
                             "for none)")
        return
    if not fp8:
        raise ValueError(f"scale_result: applies to a float8_e4m3fn result only, and this call's result is "
                         f"{dtype}; pass out_dtype=torch.float8_e4m3fn, or drop scale_result")
    want = "a one-element float32 tensor on the inputs' device (the fp8 result's scale, as torch._scaled_mm takes it)"
    if not isinstance(scale_result, Tensor):
        raise TypeError(f"scale_result: expected {want}; got {type(scale_result).__name__}")
    problems = []
    if scale_result.dtype != torch.float32:
        problems.append(f"dtype {scale_result.dtype} (convert with .float())")
    if scale_result.numel() != 1:
        problems.append(f"{scale_result.numel()} elements")
    if scale_result.device != device:
        problems.append(f"device {scale_result.device}")
    if problems:
        raise ValueError(f"scale_result: expected {want}; got {', '.join(problems)}")


def scaled_request(a: Tensor, b: Tensor, scale_format: str, out_dtype, out: Tensor | None,
                   bias: Tensor | None, scale_result: Tensor | None = None,
                   activation: str = "none") -> tuple[tuple[str, object], ...]:
    """The requested fields of a scaled call: its scale format (the per-tensor default asks for
    nothing; a block-scaled format, its block scale), then its bias, checked against the result's
    type (out's, or out_dtype, bf16 by default), then its activation (a token of
    :func:`scaled_activation_token`). An fp8 result takes its ``scale_result``
    (:func:`check_scale_result`), a per-tensor or row-wise scale format and no bias, which the
    fp8 epilogue would have to add before the output scale, and no swiglu, whose pairing no fp8
    epilogue computes before its output scale. swiglu needs an even N (gate and up columns)."""
    dtype = result_dtype(out_dtype, out)
    check_scale_result(scale_result, dtype, a.device)
    if activation == "swiglu":
        n = b.shape[-1] if b.dim() >= 1 else 0
        if n % 2:
            raise ValueError(f"activation: 'swiglu' pairs gate and up columns of b, so N must be even; got N = {n} "
                             "(tilekiln.swiglu_weight interleaves them)")
        if dtype in SCALED_RESULTS:
            raise ValueError(f"activation: 'swiglu' with a {dtype} result: no kernel pairs the columns before the "
                             "output scale; pass out_dtype=torch.bfloat16")
    if dtype in SCALED_RESULTS:
        if scale_format not in ("tensor", "rowwise"):
            raise ValueError(f"out_dtype: a {dtype} result is written by per-tensor or row-wise scaled kernels; "
                             f"scale_format={scale_format!r} writes bf16 or fp32, so pass out_dtype=torch.bfloat16 "
                             "and quantize the result")
        if bias is not None:
            raise ValueError(f"bias: a {dtype} result takes no bias (it would be added before the output scale "
                             "and the saturation, which no fp8-output kernel does); add it to a bf16 result, or "
                             "fold it into the next layer")
    if bias is None:
        bias_type = "none"
    else:
        n = b.shape[-1] if b.dim() >= 1 else 0
        bias_type = bias_token(bias, a, n, dtype, "the result's")
    if scale_format in RUNTIME_BLOCK_FORMATS:
        # A block-scaled format asks for its block scale; the scales' scaling stays the default.
        # mxfp8 and mxfp4 ask for the same one, so the elements must be the named format's here.
        check_block_elements(a, b, scale_format)
        return requested_epilogue(**dict(block_request(scale_format)), bias=bias_type, activation=activation)
    return requested_epilogue(scaling=scale_format, bias=bias_type, activation=activation)


def check_block_kernels(bundle: Bundle, name: str, result: torch.dtype | None = None) -> None:
    """A bundle without any kernel of the block-scaled format ``name``: the arch message, not a list
    of every kernel's refusal. ``result`` (a dense call's result type): a bundle whose ``name``
    kernels write other types names ``out_dtype`` and the types they write, where the list of
    refusals would only say "dtype" per kernel; the result is never rounded to another type."""
    fmt = format_of(name)
    kernels = [k for k in bundle.kernels if k.config.block_scale == fmt.scale and k.config.dtypes.a == fmt.data]
    if not kernels:
        raise NoKernelError(f"scale_format={name!r}: bundle {bundle.name} ({bundle.arch}) has no {name} kernels; "
                            "the block-scaled tcgen05 MMA exists on compute capability 10.x, whose bundles "
                            "(sm_100a, sm_103a, sm_107a) hold them")
    written = sorted({k.config.dtypes.c.value for k in kernels if k.config.family == "gemm"})
    if result is not None and written and torch_dtype_token(result) not in written:
        offered = " or ".join(f"torch.{DTYPES[t].torch}" for t in written)
        raise NoKernelError(f"out_dtype: scale_format={name!r} with a {result} result: bundle {bundle.name} "
                            f"({bundle.arch}) has no {name} kernel writing {torch_dtype_token(result)} (its {name} "
                            f"kernels write {', '.join(written)}); pass out_dtype={offered}, or build a "
                            f"kernel with that c (docs/catalog.md)")


def check_float_pointers(**scales: Tensor) -> None:
    """Scales the kernels read one float32 at a time (row-wise, blockwise, an fp8 result's
    scale_result) start 4-byte aligned; ValueError naming the argument (its keyword) where not."""
    for name, scale in scales.items():
        if scale.data_ptr() & 3:
            raise ValueError(f"{name}: data pointer is not 4-byte aligned (a float32 view at an odd byte offset); "
                             "pass a fresh float32 tensor")


def grouped_blockwise_shapes(a: Tensor, b: Tensor, scale_a, scale_b) -> bool:
    """Whether a grouped call's scales have the blockwise shapes and neither per-tensor nor row-wise
    ones (as :func:`scale_format_of` reads a dense call's): scale_a (total_M, K/128) (masked: (G,
    M_max, K/128)) and scale_b (G, ceil(N/128), K/128), where K is a multiple of 128."""
    if not all(isinstance(s, Tensor) for s in (scale_a, scale_b)) or a.dim() < 2 or b.dim() != 3:
        return False
    if scale_a.numel() == scale_b.numel() == 1:
        return False  # per tensor, however shaped
    if a.shape[-1] % BLOCK:
        return False
    rowwise_a, rowwise_b = grouped_rowwise_shapes(a, b)
    shapes = (tuple(scale_a.shape), tuple(scale_b.shape))
    return shapes == grouped_scale_shapes(a, b) and not (shapes[0] in rowwise_a and shapes[1] in rowwise_b)


def grouped_rowwise_shapes(a: Tensor, b: Tensor) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """The shapes a row-wise grouped call's scales may take, as torch._scaled_grouped_mm takes them:
    scale_a one per row of a, (total_M,) or (total_M, 1) (masked: (G, M_max) or (G, M_max, 1)), scale_b
    one per group and column of b, (G, N) or (G, 1, N)."""
    groups, n = b.shape[0], b.shape[-1]
    rows = tuple(a.shape[:-1])
    return (rows, (*rows, 1)), ((groups, n), (groups, 1, n))


def grouped_scaling(scale_a, scale_b) -> str:
    """A grouped call's scaling, read from its scales as torch._scaled_grouped_mm reads them: "none"
    without scales, "rowwise" where both are tensors and one has more than one element, else "tensor"
    (whose check names a missing or wrong scale)."""
    if scale_a is None and scale_b is None:
        return "none"
    if all(isinstance(s, Tensor) for s in (scale_a, scale_b)) and max(scale_a.numel(), scale_b.numel()) > 1:
        return "rowwise"
    return "tensor"


def check_grouped_scales(a: Tensor, b: Tensor, scale_a, scale_b, masked: bool) -> None:
    """Check a row-wise grouped call's scales, as torch._scaled_grouped_mm takes them: float32,
    contiguous, on a's device; scale_a one per row of a, (total_M,) or (total_M, 1) (masked: (G, M_max)
    or (G, M_max, 1)), scale_b one per group and column of b, (G, N) or (G, 1, N). TypeError or
    ValueError naming the argument. Each vector's length must be an int32 (the kernels index it so)."""
    a_shapes, b_shapes = grouped_rowwise_shapes(a, b)
    for name, scale, shapes, per in (
            ("scale_a", scale_a, a_shapes, "row of a"),
            ("scale_b", scale_b, b_shapes, "group and column of b")):
        want = f"{' or '.join(str(tuple(x)) for x in shapes)} (one per {per})"
        if not isinstance(scale, Tensor):
            raise TypeError(f"{name}: expected a contiguous float32 tensor {want} for row-wise scales, got "
                            f"{type(scale).__name__}")
        problems = []
        if scale.dtype != torch.float32:
            problems.append(f"dtype {scale.dtype} (convert with .float())")
        if tuple(scale.shape) not in shapes:
            problems.append(f"shape {list(scale.shape)}")
        elif not scale.is_contiguous():
            problems.append(f"strides {list(scale.stride())} (call .contiguous())")
        if scale.device != a.device:
            problems.append(f"device {scale.device}")
        if problems:
            raise ValueError(f"{name}: expected a contiguous float32 tensor {want} on the inputs' device for row-wise "
                             f"scales; got {', '.join(problems)}")
        if scale.numel() > MAX_EXTENT:
            raise ValueError(f"{name}: {scale.numel()} scales exceed the kernels' int32 index ({MAX_EXTENT}); split "
                             "the experts over several calls")
