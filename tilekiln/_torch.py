"""The torch path: the eager hot path of ``gemm``, ``addmm`` and ``scaled_gemm``, and their torch operators.

Imported only when torch tensors are passed; importing it registers nine operators:

    tilekiln::gemm(a, b, bundle, kernel, fallback, activation, bias=None) -> Tensor
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

``bundle`` names the bundle as a string (:func:`bundle_ref`: a loaded bundle's
directory, a name or path given by the caller, or ``""`` for the default
bundle of the inputs' device), so that torch.compile can put the call in a
graph. An eager call goes through an operator only when autograd must record
it (an input requires grad while grad mode is on); otherwise it takes the hot
path. While torch.compile traces, every call becomes one of these nodes. The
fakes allocate through the same :func:`tilekiln.problem.result_strides` as the
real calls, so traced strides equal real ones.

The backward GEMMs run through ``tilekiln::gemm`` with ``fallback`` set: on
the bundle's kernels where one accepts the layout (sm90 has all four), else
``torch.matmul``; ``explain`` says which. Being operators themselves, they are
differentiable again.

A cached eager call costs the signature key (shape, strides, dtype and device
of each operand, and of each scale), one dictionary look-up, three pointer
reads, the current raw stream handle (the private
``torch._C._cuda_getCurrentRawStream``, about 0.2 us, where
``torch.cuda.current_stream()`` costs about 4 us on the H200) and one ctypes call.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch

from tilekiln._native import CALL
from tilekiln._tensors import describe, torch_dtype_token
from tilekiln.blockscaled import (RUNTIME_BLOCK_FORMATS, block_request, check_block_elements, check_block_operands,
                                  check_block_scale_tensors, check_grouped_block_operands, check_grouped_block_scales,
                                  check_scale_pointers, format_of, grouped_block_format,
                                  requested_format)
from tilekiln.blockwise import BLOCK, check_scale_tensor, check_scales, scale_format_token
from tilekiln.blockwise import check_grouped_scales as check_grouped_blockwise_scales
from tilekiln.bundle import NEUTRAL_VALUES, Bundle, raise_misaligned
from tilekiln.errors import LaunchError, NoKernelError
from tilekiln.problem import addmm_request, requested_epilogue, result_shape, result_strides
from tilekiln.spec import DTYPES, FAMILIES, GLU_BLOCK, MAX_EXTENT, SCALED_OUTPUTS

Tensor = torch.Tensor
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_pack_call = CALL["gemm"].pack_into  # the gemm family's call block

# Bundles that were passed as objects, by their reference string, so an operator
# finds the very object (and its plan cache) again.
_bundles: dict[str, Bundle] = {}


def bundle_ref(bundle) -> str:
    """The operators' name for ``bundle`` (a Bundle, a name or path, or None for the device default)."""
    if bundle is None:
        return ""
    if isinstance(bundle, Bundle):
        ref = bundle.ref
        _bundles.setdefault(ref, bundle)
        return ref
    return str(bundle)


def resolve(ref: str, device: int) -> Bundle:
    """The bundle an operator's ``bundle`` argument names, for inputs on ``device``."""
    import tilekiln

    if not ref:
        if device < 0:
            raise ValueError("a: tensor is in host memory; tilekiln runs on CUDA devices, move it with .cuda()")
        return tilekiln._default_bundle(device)
    bundle = _bundles.get(ref)
    if bundle is None:
        bundle = _bundles.setdefault(ref, tilekiln.load(ref))
    return bundle


def current_stream(device: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def _stream_handle(stream, device: int) -> int:
    if stream is None:
        return current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    return int(stream)


def _torch_stream(stream, device: int):
    if isinstance(stream, torch.cuda.Stream):
        return stream
    return torch.cuda.ExternalStream(int(stream), device=device)


def _on_stream(stream, device: int):
    """A context that makes ``stream`` current for operator calls (which run on the current stream)."""
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(_torch_stream(stream, device))


_SCALE_ERROR = ("{name}: expected a one-element float32 CUDA tensor on the inputs' device "
                "(a per-tensor scale, as torch._scaled_mm takes), got {what}")


def _check_scale(name: str, scale, device: int) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(_SCALE_ERROR.format(name=name, what=type(scale).__name__))
    if scale.dtype != torch.float32 or scale.numel() != 1 or scale.get_device() != device:
        raise ValueError(_SCALE_ERROR.format(
            name=name, what=f"{scale.dtype} with {scale.numel()} elements on {scale.device}"))


def as_rows(t: Tensor) -> Tensor:
    """``t`` (..., D) as a matrix (rows, D). Unlike ``reshape(-1, D)`` this holds for D = 0 too
    (an empty K or N), where -1 is ambiguous."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


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


def _scale_signature(scale) -> tuple:
    """What of a scale its check (and a blockwise plan's strides) depends on; part of the plan key,
    so a cached plan is never reused for a scale the check would refuse."""
    if isinstance(scale, torch.Tensor):
        return scale.dtype, scale.shape, scale.stride(), scale.get_device()
    return (type(scale),)


def _allocate(shape: tuple[int, ...], k: int, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.empty_strided(shape, result_strides(shape, k, dtype.itemsize), dtype=dtype, device=device)


def _stage_for(out: Tensor, stream, keep: bool = False) -> Tensor:
    """What the kernel writes in place of ``out``: ``out`` itself, or a buffer of tilekiln's at
    ``out``'s strides (a copy of it where ``keep``: a grouped call leaves rows no group owns as they
    were), which torch then copies into ``out`` (:func:`_finish`).

    TMA stores write a row in whole 16-byte chunks (a hardware limit: measured on the H100, an out of
    N = 100 bf16 columns in rows of 104 had columns 100 to 103 zeroed by every sm90 kernel), so where
    N * itemsize is no multiple of 16 the chunk that holds a row's last column also covers columns
    that are the caller's. The buffer has ``out``'s strides, so the plan made for ``out`` launches
    into it unchanged (a fused residual is read at the same strides), and room for the last row's
    chunk past its end."""
    itemsize = out.element_size()
    if not out.numel() or out.shape[-1] * itemsize % 16 == 0:
        return out
    extent = 1 + sum((size - 1) * stride for size, stride in zip(out.shape, out.stride()))
    with _on_stream(stream, out.get_device()):
        flat = torch.empty(extent + (-out.shape[-1] * itemsize) % 16 // itemsize, dtype=out.dtype, device=out.device)
        stage = flat.as_strided(tuple(out.shape), out.stride())
        return stage.copy_(out) if keep else stage


def _finish(target: Tensor, out: Tensor, stream) -> Tensor:
    """``out``, with what the kernel wrote into ``target`` (:func:`_stage_for`) copied in if that was a stage."""
    if target is not out:
        with _on_stream(stream, out.get_device()):
            out.copy_(target)
    return out


# torch's definition of each Activation (tilekiln/spec.py): the fallback where no kernel fuses it,
# the autograd path, and the reference the GPU tests compare the fused kernels with.
ACTIVATIONS = {
    "none": lambda y: y,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "gelutanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    "geluerf": torch.nn.functional.gelu,
}


def add_residual(y: Tensor, residual: Tensor, beta: float = 1.0) -> Tensor:
    """``y + beta * residual`` computed in float32 (or ``y``'s wider type) and rounded once to ``y``'s
    type, as the fused epilogue adds the residual to its fp32 value."""
    wide = y.to(torch.promote_types(y.dtype, torch.float32))
    return (wide + residual if beta == 1 else torch.add(wide, residual.to(wide.dtype), alpha=beta)).to(y.dtype)


def add_bias(y: Tensor, bias: Tensor) -> Tensor:
    """``y + bias`` computed in the wider of the two types and returned in ``y``'s, as the fused
    epilogue adds an f32 bias to the fp32 accumulator and rounds once to the output type."""
    wide = torch.promote_types(y.dtype, bias.dtype)
    return (y.to(wide) + bias).to(y.dtype)


def glu_halves(y: Tensor) -> tuple[Tensor, Tensor]:
    """The gate and up halves, (..., I) each, of ``y`` (..., 2I) whose columns interleave gate and
    up in blocks of GLU_BLOCK (the last pair of blocks shorter where GLU_BLOCK does not divide I):
    the layout :func:`swiglu_weight` gives a weight's rows."""
    inter = y.shape[-1] // 2
    whole = inter // GLU_BLOCK * GLU_BLOCK
    pairs = y[..., :2 * whole].unflatten(-1, (whole // GLU_BLOCK, 2, GLU_BLOCK))
    gate = torch.cat((pairs[..., 0, :].flatten(-2), y[..., 2 * whole:whole + inter]), dim=-1)
    up = torch.cat((pairs[..., 1, :].flatten(-2), y[..., whole + inter:]), dim=-1)
    return gate, up


def glu_interleave(gate: Tensor, up: Tensor) -> Tensor:
    """The inverse of :func:`glu_halves`: gate and up (..., I) interleaved into (..., 2I)."""
    inter = gate.shape[-1]
    whole = inter // GLU_BLOCK * GLU_BLOCK
    blocks = (whole // GLU_BLOCK, GLU_BLOCK)
    pairs = torch.stack((gate[..., :whole].unflatten(-1, blocks), up[..., :whole].unflatten(-1, blocks)), dim=-2)
    return torch.cat((pairs.flatten(-3), gate[..., whole:], up[..., whole:]), dim=-1)


def swiglu_unfused(y: Tensor) -> Tensor:
    """``silu(gate) * up`` of a gate_up GEMM result ``y`` (..., 2I) in the interleaved layout,
    computed in fp32 (or ``y``'s wider type) and rounded once to ``y``'s type, as the fused
    epilogue does."""
    wide = torch.promote_types(y.dtype, torch.float32)
    gate, up = glu_halves(y)
    return (torch.nn.functional.silu(gate.to(wide)) * up.to(wide)).to(y.dtype)


def swiglu_weight(w_gate: Tensor, w_up: Tensor | None = None) -> Tensor:
    """The gate_up weight ``tilekiln.swiglu`` takes, (2I, K) with rows interleaving gate and up in
    blocks of GLU_BLOCK, from ``w_gate`` and ``w_up`` (I, K) each, or from ``w_gate`` alone holding
    ``[gate; up]`` (2I, K) stacked; with a leading expert dimension, (G, I, K) each or (G, 2I, K)
    stacked, the (G, 2I, K) weight ``tilekiln.grouped_swiglu`` takes. A contiguous copy in the
    weights' dtype and device."""
    if not isinstance(w_gate, Tensor) or (w_up is not None and not isinstance(w_up, Tensor)):
        bad = "w_gate" if not isinstance(w_gate, Tensor) else "w_up"
        raise TypeError(f"{bad}: expected a torch tensor, got {type(w_gate if bad == 'w_gate' else w_up).__name__}")
    if w_up is None:
        if w_gate.dim() not in (2, 3) or w_gate.shape[-2] % 2:
            raise ValueError(f"w_gate: without w_up, expected the stacked [gate; up] weight (2I, K) or (G, 2I, K), an "
                             f"even number of rows, got shape {list(w_gate.shape)}")
        inter = w_gate.shape[-2] // 2
        gate, up = w_gate[..., :inter, :], w_gate[..., inter:, :]
    else:
        gate, up = w_gate, w_up
        if gate.dim() not in (2, 3) or up.shape != gate.shape:
            raise ValueError(f"w_up: expected the shape of w_gate, (I, K) or (G, I, K), got w_gate {list(gate.shape)} "
                             f"and w_up {list(up.shape)}")
        if up.dtype != gate.dtype or up.device != gate.device:
            raise ValueError(f"w_up: {up.dtype} on {up.device}, while w_gate is {gate.dtype} on {gate.device}; "
                             "pass both in one dtype on one device")
    return glu_interleave(gate.transpose(-1, -2), up.transpose(-1, -2)).transpose(-1, -2).contiguous()


# What torch computes for a requested activation no kernel fuses: ACTIVATIONS and the gated one.
EPILOGUE_ACTIVATIONS = {**ACTIVATIONS, "swiglu": swiglu_unfused}

# The gemm family's by-value arguments by name (tilekiln/spec.py, ValueArg), in a call's ``values``.
VALUE_INDEX = {x.name: i for i, x in enumerate(FAMILIES["gemm"].values)}

# Per requested spec field, how torch applies it to a GEMM's result (Plan.unfused), given the
# call's bias and residual tensors and its by-value arguments: in the spec's field order, the
# order the epilogue applies them. The residual is scaled by beta, which a kernel that computes
# alpha (and leaves the residual) passes on.
UNFUSED = {"bias": lambda value, y, bias, residual, values: add_bias(y, bias),
           "activation": lambda value, y, bias, residual, values: EPILOGUE_ACTIVATIONS[value](y),
           "residual": lambda value, y, bias, residual, values: add_residual(y, residual,
                                                                              values[VALUE_INDEX["beta"]])}


def activation_token(activation) -> str:
    """``activation`` (None, a name or an Activation) as its token; ValueError naming the argument."""
    value = "none" if activation is None else getattr(activation, "value", activation)
    if value == "swiglu":
        raise ValueError("activation: 'swiglu' pairs gate and up columns into half as many; call "
                         "tilekiln.swiglu(x, tilekiln.swiglu_weight(w_gate, w_up)) instead of linear")
    if value not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} is not one of {', '.join(repr(a) for a in ACTIVATIONS)} "
                         "(or None)")
    return value


def bias_token(bias: Tensor, x: Tensor, n: int, dtype: torch.dtype | None = None, what: str = "x's") -> str:
    """The bias's element type as a kernel's ``bias`` field spells it, after checking it as every
    ``linear`` (and ``scaled_gemm``) call does: a contiguous (N,) vector on ``x``'s device, of the
    result's type (``dtype``, by default ``x``'s; ``what`` names it) or float32. TypeError or
    ValueError naming ``bias`` otherwise."""
    dtype = x.dtype if dtype is None else dtype
    if not isinstance(bias, Tensor):
        raise TypeError(f"bias: expected a torch tensor of shape ({n},) or None, got {type(bias).__name__}")
    if bias.dim() != 1 or bias.shape[0] != n:
        raise ValueError(f"bias: expected shape ({n},), one value per output feature (weight's N), got "
                         f"{list(bias.shape)}")
    if bias.dtype != dtype and bias.dtype != torch.float32:
        raise ValueError(f"bias: dtype {bias.dtype} is neither {what} ({dtype}) nor torch.float32; convert it "
                         f"with bias.to({dtype})")
    if bias.device != x.device:
        raise ValueError(f"bias: on {bias.device} while x is on {x.device}; move it with bias.to(x.device)")
    if n > 1 and bias.stride(0) != 1:
        raise ValueError(f"bias: stride {bias.stride(0)} is not contiguous (the epilogue reads bias[n] at "
                         "n elements from its start); pass bias.contiguous()")
    return torch_dtype_token(bias.dtype)


def _refuse_out_with_grad(name: str, out, *inputs) -> None:
    if out is not None and _grad_enabled() and any(t.requires_grad for t in inputs):
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad")


# -- the eager entry points ------------------------------------------------------------------------


def gemm(bundle, a: Tensor, b: Tensor, out: Tensor | None, stream, kernel: str | None = None):
    """``gemm`` for torch tensors. ``bundle``: a Bundle, a name or path, or None (the device default)."""
    if _is_compiling():
        if stream is not None:
            raise TypeError("stream=: not supported while torch.compile traces; make the stream current "
                            "with torch.cuda.stream(...) instead")
        return _gemm_node(bundle_ref(bundle), a, b, out, kernel or "")
    if (a.requires_grad or b.requires_grad) and _grad_enabled():
        _refuse_out_with_grad("gemm", out, a, b)
        with _on_stream(stream, a.get_device()):
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
                           _scaled_request(a, b, scale_format, out_dtype, out, bias, scale_result, activation), bias,
                           scale_result)


def scaled_activation_token(activation) -> str:
    """A scaled call's ``activation`` as its token: None (or "none"), or "swiglu", whose B columns
    interleave gate and up (:func:`swiglu_weight`); ValueError naming the argument otherwise."""
    value = "none" if activation is None else getattr(activation, "value", activation)
    if value not in ("none", "swiglu"):
        raise ValueError(f"activation: scaled_gemm takes None or 'swiglu', got {activation!r}")
    return value


# torch dtypes of the results an epilogue writes through scale_result (tilekiln/spec.py, SCALED_OUTPUTS).
SCALED_RESULTS = {getattr(torch, DTYPES[t].torch): t for t in SCALED_OUTPUTS}


def _result_dtype(out_dtype, out: Tensor | None) -> torch.dtype:
    """A scaled call's result type: out's, or out_dtype, bf16 by default."""
    return out.dtype if out is not None else torch.bfloat16 if out_dtype is None else out_dtype


def saturate_result(value: Tensor, scale_result, dtype: torch.dtype) -> Tensor:
    """``value * scale_result`` saturated to ``dtype``'s finite range and rounded to it, as an fp8
    epilogue writes it (the references of tilekiln.verify and the GPU tests)."""
    limit = torch.finfo(dtype).max
    return (value * scale_result).clamp(-limit, limit).to(dtype)


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


_BLOCKWISE = ("scaling", "blockwise")
_ROWWISE = ("scaling", "rowwise")


def _scaled_request(a: Tensor, b: Tensor, scale_format: str, out_dtype, out: Tensor | None,
                    bias: Tensor | None, scale_result: Tensor | None = None,
                    activation: str = "none") -> tuple[tuple[str, object], ...]:
    """The requested fields of a scaled call: its scale format (the per-tensor default asks for
    nothing; a block-scaled format, its block scale), then its bias, checked against the result's
    type (out's, or out_dtype, bf16 by default), then its activation (a token of
    :func:`scaled_activation_token`). An fp8 result takes its ``scale_result``
    (:func:`check_scale_result`), a per-tensor or row-wise scale format and no bias, which the
    fp8 epilogue would have to add before the output scale, and no swiglu, whose pairing no fp8
    epilogue computes before its output scale. swiglu needs an even N (gate and up columns)."""
    dtype = _result_dtype(out_dtype, out)
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


def _check_block_kernels(bundle: Bundle, name: str, result: torch.dtype | None = None) -> None:
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


def fusable_residual(x: Tensor, weight: Tensor, residual: Tensor | None, out: Tensor | None
                     ) -> tuple[Tensor | None, Tensor] | None:
    """Where ``linear`` can hand its residual to the GEMM's epilogue: (the (M, N) view of ``out`` to
    write, or None to allocate, and the (M, N) view of the residual); None where torch adds it
    after. The kernel reads the residual at the result's strides, so it fuses a residual of the
    result's shape, type and device whose strides are those of ``out`` (which may be the residual
    itself), or, without ``out``, those of the result tilekiln allocates."""
    n = weight.shape[0]
    shape = (*x.shape[:-1], n)
    if (residual is None or not isinstance(residual, Tensor) or tuple(residual.shape) != shape
            or residual.dtype != x.dtype or residual.device != x.device):
        return None
    rows = residual.view(-1, n) if residual.is_contiguous() or residual.dim() == 2 else None
    if rows is None:
        return None
    if out is None:
        target = None
        strides = result_strides((rows.shape[0], n), x.shape[-1], x.dtype.itemsize)
    else:
        if tuple(out.shape) != shape or out.dtype != x.dtype or not (out.is_contiguous() or out.dim() == 2):
            return None
        target = out.view(-1, n)
        strides = target.stride()
    if any(size > 1 and got != want for size, got, want in zip(rows.shape, rows.stride(), strides)):
        return None
    return target, rows


def _linear_result(y: Tensor, x: Tensor, weight: Tensor, out: Tensor | None) -> Tensor:
    """The fused GEMM's (M, N) result as ``linear`` returns it: ``out`` itself, or shaped as x's rows."""
    return out if out is not None else y.reshape(*x.shape[:-1], weight.shape[0])


# -- addmm ------------------------------------------------------------------------------------------

# What addmm asks for when alpha or beta change the result (tilekiln/problem.py, addmm_request).
_ALPHA_BETA = ("scalars", "alphabeta")


def _coefficient(name: str, value) -> float:
    """``beta`` or ``alpha`` as torch.addmm takes it: a real Python number (bool, int or float)."""
    if isinstance(value, Tensor) or not isinstance(value, numbers.Real):
        hint = f"; pass {name}.item()" if isinstance(value, Tensor) and value.numel() == 1 else ""
        raise TypeError(f"{name}: expected a real number (int or float), as torch.addmm takes it; got "
                        f"{type(value).__name__}{hint}")
    return float(value)


def check_addmm(input, mat1, mat2, beta, alpha, out) -> tuple[float, float]:
    """The checks of every addmm call, as torch.addmm makes them: 2-D ``mat1`` (M, K) and ``mat2`` (K, N)
    of one dtype on one device; ``input`` of that dtype and device, broadcastable to (M, N); ``out``
    None or (M, N) of that dtype and device; ``beta`` and ``alpha`` real numbers, returned as floats.
    TypeError or ValueError naming the argument."""
    for name, t in (("input", input), ("mat1", mat1), ("mat2", mat2)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(t).__name__}")
    for name, t in (("mat1", mat1), ("mat2", mat2)):
        if t.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D matrix, got shape {list(t.shape)} ({t.dim()}-D); torch.addmm "
                             "multiplies matrices (tilekiln.gemm takes batches)")
    if mat1.shape[1] != mat2.shape[0]:
        raise ValueError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} and "
                         f"{mat2.shape[0]}x{mat2.shape[1]})")
    if mat2.dtype != mat1.dtype:
        raise TypeError(f"mat2: dtype {mat2.dtype} is not mat1's ({mat1.dtype}); convert one of them")
    if mat2.device != mat1.device:
        raise ValueError(f"mat2: on {mat2.device} while mat1 is on {mat1.device}; move it with mat2.to(mat1.device)")
    shape = (mat1.shape[0], mat2.shape[1])
    if input.dtype != mat1.dtype:
        raise TypeError(f"input: dtype {input.dtype} is not mat1's ({mat1.dtype}); torch.addmm takes one dtype, "
                        f"convert it with input.to({mat1.dtype})")
    if input.device != mat1.device:
        raise ValueError(f"input: on {input.device} while mat1 is on {mat1.device}; move it with "
                         "input.to(mat1.device)")
    # Broadcast to (M, N) by torch's rule, in plain Python (a traced call keeps no shape node).
    if input.dim() > 2 or any(s not in (1, t) for s, t in zip(reversed(input.shape), reversed(shape))):
        raise ValueError(f"input: shape {list(input.shape)} does not broadcast to the product's (M, N) = "
                         f"{list(shape)}")
    check_out(out, shape, mat1)
    return _coefficient("beta", beta), _coefficient("alpha", alpha)


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
    target = out if out is not None else _allocate(shape, k, mat1.dtype, mat1.device)
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


_SWIGLU = requested_epilogue(activation="swiglu")


def check_out(out, shape: tuple, like: Tensor) -> None:
    """``out`` None, or a tensor of ``shape`` with ``like``'s dtype and device: else ``TypeError``/``ValueError``
    naming out and what it should be."""
    if out is None:
        return
    if not isinstance(out, Tensor):
        raise TypeError(f"out: expected a torch tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"out: expected shape {list(shape)}, dtype {like.dtype} on {like.device}, got "
                         f"{list(out.shape)}, {out.dtype} on {out.device}")


def check_gate_up(w_gate_up, x: Tensor, x_name: str, grouped: bool) -> None:
    """``w_gate_up`` as swiglu (2I, K) or grouped_swiglu (G, 2I, K) takes it, next to the activations
    ``x`` named ``x_name``: a tensor of x's dtype and device, K = x's last dimension, an even row count
    (gate and up interleaved: tilekiln.swiglu_weight). ``TypeError``/``ValueError`` naming w_gate_up."""
    if not isinstance(w_gate_up, Tensor):
        raise TypeError(f"w_gate_up: expected a torch tensor, got {type(w_gate_up).__name__}")
    dims, shape = (3, "(G, 2I, K)") if grouped else (2, "(2I, K)")
    if w_gate_up.dim() != dims or x.dim() < 1 or x.shape[-1] != w_gate_up.shape[-1] or w_gate_up.shape[-2] % 2:
        raise ValueError(f"w_gate_up: expected {shape} with K = {x_name}'s last dimension and an even row count "
                         f"(gate and up rows interleaved{' per expert' if grouped else ''}: tilekiln.swiglu_weight), got w_gate_up {list(w_gate_up.shape)} and {x_name} {list(x.shape)}")
    if w_gate_up.dtype != x.dtype:
        raise TypeError(f"w_gate_up: dtype {w_gate_up.dtype} is not {x_name}'s ({x.dtype}); convert one of them")
    if w_gate_up.device != x.device:
        raise ValueError(f"w_gate_up: on {w_gate_up.device} while {x_name} is on {x.device}; move it with "
                         f"w_gate_up.to({x_name}.device)")


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


# -- the hot path ----------------------------------------------------------------------------------


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
        plan = bundle.plan(describe(a, "a"), describe(b, "b"), None if out is None else describe(out, "out"),
                           kernel, allow_split=True, requested=requested)
        bundle.remember(key, plan)
    if plan.unfused:
        fused = tuple(r for r in requested if r not in plan.unfused)
        if out is None:
            # A result torch finishes is allocated as a fused one would be (and as the fakes say):
            # torch's own results of a padded one are contiguous.
            out = _allocate(plan.problem.out_shape, plan.problem.k, a.dtype, a.device)
        return _apply_unfused(plan, run_gemm(bundle, a, b, None, stream, kernel, fused, bias, residual, values), out,
                              stream, bias, residual, values)
    given = out is not None  # only a caller's out can have row padding that is not tilekiln's
    if out is None:
        out = _allocate(plan.problem.out_shape, plan.problem.k, a.dtype, a.device)
    block = plan.block
    if block is None:
        if plan.problem.k == 0:
            out.zero_()
        return out
    if plan.split > 1:
        return _split_k(bundle, plan, a, b, out, stream)
    target = _stage_for(out, stream) if given else out
    pa, pb, pc = a.data_ptr(), b.data_ptr(), target.data_ptr()
    if (pa | pb | pc) & plan.align_mask:
        raise_misaligned(pa, pb, pc, plan.align_mask + 1)
    if stream is None and _raw_stream is not None:
        handle = _raw_stream(plan.problem.device)
    else:
        handle = _stream_handle(stream, plan.problem.device)
    lib = bundle._lib
    buf = lib.call_buffer("gemm")
    _pack_call(buf, 0, pa, pb, pc, 0, 0, 0 if bias is None else bias.data_ptr(),
               0 if residual is None else residual.data_ptr(), 0, *values, handle)
    status = lib.run["gemm"](block, buf)
    if status:
        raise LaunchError(plan.kernel_id, lib.error_name(status), lib.error_string(status))
    return _finish(target, out, stream)


def _apply_unfused(plan, result: Tensor, out: Tensor | None, stream, bias: Tensor | None = None,
                   residual: Tensor | None = None, values: tuple[float, ...] = NEUTRAL_VALUES) -> Tensor:
    """``result`` (what a kernel computed of the GEMM and its epilogue) with the rest of the requested
    epilogue, which no kernel computes, applied by torch, into ``out`` if given (which may be the
    residual: it is read before ``out`` is written)."""
    with _on_stream(stream, result.get_device()):
        for name, value in plan.unfused:
            result = UNFUSED[name](value, result, bias, residual, values)
        if out is None:
            return result
        out.copy_(result)
    return out


def run_scaled_gemm(bundle: Bundle, a: Tensor, b: Tensor, scale_a, scale_b, out_dtype, out, stream, kernel,
                    requested=(), bias: Tensor | None = None, scale_result: Tensor | None = None):
    """The scaled call, checked (the scales' and bias's shape, dtype, strides and device are part of
    the cached plan's key, so a cached plan never serves a call its checks would refuse) and launched.
    ``requested`` (:func:`_scaled_request`): the scale format, then the bias, whose type the caller
    checked, as it checked ``scale_result`` against the result's type. An fp8 result runs unsplit:
    split-K's fp32 partial sums would be added after the kernel's output scale. ``out_dtype`` None:
    out's type, else bf16 (:func:`_result_dtype`, as scaled_gemm_out_op passes it under torch.compile)."""
    out_dtype = _result_dtype(out_dtype, out) if out_dtype is None else out_dtype
    fp8_result = (out_dtype if out is None else out.dtype) in SCALED_RESULTS
    blockwise, rowwise = _BLOCKWISE in requested, _ROWWISE in requested
    block_format = requested_format(requested, a.dtype)
    key = ("scaled", a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(), a.get_device(), b.get_device(),
           None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()), kernel, out_dtype,
           _scale_signature(scale_a), _scale_signature(scale_b), requested, _scale_signature(scale_result))
    plan = bundle._plans.get(key)
    if plan is None:
        if block_format is not None:
            _check_block_kernels(bundle, block_format, out_dtype)
            check_block_operands(a, b, block_format)
        a_op, b_op = describe(a, "a"), describe(b, "b")
        # Blockwise scales are strided tensors, whose strides go in the plan block.
        scale_strides = check_scales(a, b, scale_a, scale_b) if blockwise else ()
        if rowwise:
            check_rowwise_scales(a, b, scale_a, scale_b)
        try:
            plan = bundle.plan(a_op, b_op, None if out is None else describe(out, "out"),
                               kernel, torch_dtype_token(out_dtype), allow_split=not fp8_result,
                               requested=requested, scale_strides=scale_strides)
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
                _check_scale(name, scale, plan.problem.device)
        bundle.remember(key, plan)
    if plan.unfused:
        fused = tuple(r for r in requested if r not in plan.unfused)
        if out is None:
            out = _allocate(plan.problem.out_shape, plan.problem.k, out_dtype, a.device)
        return _apply_unfused(plan, run_scaled_gemm(bundle, a, b, scale_a, scale_b, out_dtype, None, stream, kernel,
                                                    fused, bias), out, stream, bias)
    given = out is not None  # only a caller's out can have row padding that is not tilekiln's
    if out is None:
        out = _allocate(plan.problem.out_shape, plan.problem.k, out_dtype, a.device)
    if plan.block is None:
        if plan.problem.k == 0:
            out.zero_()
        return out
    if plan.split > 1:
        return _split_k(bundle, plan, a, b, out, stream, scale_a.data_ptr(), scale_b.data_ptr())
    pa, pb = scale_a.data_ptr(), scale_b.data_ptr()
    if block_format is not None:
        check_scale_pointers(scale_a, scale_b)
    if blockwise or rowwise:
        _check_float_pointers(scale_a=scale_a, scale_b=scale_b)
    if fp8_result:
        _check_float_pointers(scale_result=scale_result)
    target = _stage_for(out, stream) if given else out
    bundle.launch(plan, a.data_ptr(), b.data_ptr(), target.data_ptr(), _stream_handle(stream, plan.problem.device),
                  pa, pb, 0 if bias is None else bias.data_ptr(), 0,
                  scale_result.data_ptr() if fp8_result else 0)
    return _finish(target, out, stream)


def _check_float_pointers(**scales: Tensor) -> None:
    """Scales the kernels read one float32 at a time (row-wise, blockwise, an fp8 result's
    scale_result) start 4-byte aligned; ValueError naming the argument (its keyword) where not."""
    for name, scale in scales.items():
        if scale.data_ptr() & 3:
            raise ValueError(f"{name}: data pointer is not 4-byte aligned (a float32 view at an odd byte offset); "
                             "pass a fresh float32 tensor")


def _split_k(bundle, plan, a, b, out, stream, scale_a: int = 0, scale_b: int = 0):
    """Launch the plan's K slices into an fp32 workspace, then add the planes in order into ``out``."""
    device = plan.problem.device
    with _on_stream(stream, device):
        run = plan.run
        work = torch.empty(run.out_shape, dtype=torch.float32, device=out.device)
        bundle.launch(plan, a.data_ptr(), b.data_ptr(), work.data_ptr(), current_stream(device), scale_a, scale_b)
        # One kernel: fp32 sums over the planes, rounded once into out's dtype.
        torch.sum(work[..., :run.n], dim=0, out=out if out.dim() == 2 else out[0])
    return out


# -- the operators ---------------------------------------------------------------------------------


def _new_result(a: Tensor, b: Tensor, dtype: torch.dtype, activation: str = "none") -> Tensor:
    """The result a call of ``a`` and ``b`` allocates (and its fake says it does): half of b's
    columns where swiglu pairs them."""
    shape, k = result_shape(tuple(a.shape), tuple(b.shape))
    if activation == "swiglu":
        shape = shape[:-1] + (shape[-1] // 2,)
    return _allocate(shape, k, dtype, a.device)


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
        return y if y.stride() == result_strides(shape, k, y.dtype.itemsize) else _new_result(a, b, a.dtype).copy_(y)


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
    return _new_result(a, b, a.dtype, activation)


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


def _swiglu_grad(pre: Tensor, grad: Tensor) -> Tensor:
    """The gradient at the interleaved gate_up result ``pre`` of ``silu(gate) * up``, given the
    output's ``grad``; in fp32 (or ``pre``'s wider type), returned in ``pre``'s type."""
    wide = torch.promote_types(pre.dtype, torch.float32)
    gate, up = (h.to(wide) for h in glu_halves(pre))
    sig = torch.sigmoid(gate)
    g = grad.to(wide)
    return glu_interleave(g * up * sig * (1 + gate * (1 - sig)), g * gate * sig).to(pre.dtype)


def _gemm_backward(ctx, grad: Tensor):
    if ctx.epilogue:
        raise RuntimeError("tilekiln::gemm with a bias, activation or residual has no gradient; tilekiln.linear "
                           "applies them unfused, through torch, when an input requires grad")
    a, b = ctx.saved_tensors
    if ctx.swiglu:
        grad = _swiglu_grad(gemm_op(a, b, ctx.bundle, "", True, "none"), grad)
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
    return _allocate((mat1.shape[0], mat2.shape[1]), mat1.shape[1], mat1.dtype, mat1.device)


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
                           _scaled_request(a, b, scale_format, out_dtype, None, bias, scale_result, activation),
                           bias, scale_result)


def _check_traced(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, scale_format: str, out_dtype, out,
                  bias: Tensor | None, scale_result: Tensor | None, activation: str) -> None:
    """The checks of a scaled call that shapes, dtypes and devices decide, while torch.compile traces
    it: a bad row-wise scale, bias, scale_result or swiglu N fails the trace with the eager call's message."""
    if scale_format == "rowwise":
        check_rowwise_scales(a, b, scale_a, scale_b)
    _scaled_request(a, b, scale_format, out_dtype, out, bias, scale_result, activation)


@scaled_gemm_op.register_fake
def _scaled_gemm_fake(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out_dtype: torch.dtype | None,
                      bundle: str, kernel: str, scale_format: str, bias: Tensor | None = None,
                      scale_result: Tensor | None = None, activation: str = "none") -> Tensor:
    _check_traced(a, b, scale_a, scale_b, scale_format, out_dtype, None, bias, scale_result, activation)
    return _new_result(a, b, torch.bfloat16 if out_dtype is None else out_dtype, activation)


@torch.library.custom_op("tilekiln::scaled_gemm_out", mutates_args=("out",))
def scaled_gemm_out_op(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out: Tensor, bundle: str,
                       kernel: str, scale_format: str, bias: Tensor | None = None,
                       scale_result: Tensor | None = None, activation: str = "none") -> None:
    run_scaled_gemm(resolve(bundle, a.get_device()), a, b, scale_a, scale_b, out.dtype, out, None,
                    kernel or None, _scaled_request(a, b, scale_format, out.dtype, out, bias, scale_result, activation),
                    bias, scale_result)


@scaled_gemm_out_op.register_fake
def _scaled_gemm_out_fake(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out: Tensor, bundle: str,
                          kernel: str, scale_format: str, bias: Tensor | None = None,
                          scale_result: Tensor | None = None, activation: str = "none") -> None:
    _check_traced(a, b, scale_a, scale_b, scale_format, out.dtype, out, bias, scale_result, activation)
    return None


# -- grouped GEMM (tilekiln/grouped.py) --------------------------------------------------------------


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
    groups, n = b.shape[0], b.shape[-1]
    rows = tuple(a.shape[:-1])
    for name, scale, shapes, per in (
            ("scale_a", scale_a, (rows, (*rows, 1)), "row of a"),
            ("scale_b", scale_b, ((groups, n), (groups, 1, n)), "group and column of b")):
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


def grouped_gemm(bundle, a: Tensor, b: Tensor, rows: Tensor, scale_a, scale_b, out: Tensor | None, stream,
                 kernel: str | None = None, masked: bool = False, activation: str = "none",
                 scale_format: str | None = None):
    """``grouped_gemm`` (``rows`` is offs) or, with ``masked``, ``grouped_gemm_masked`` (``rows`` is
    masked_m) for torch tensors; ``activation`` "swiglu": ``grouped_swiglu`` (b's columns interleave
    gate and up); ``scale_format`` None (per-tensor or row-wise scales, read from their shapes),
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
                   stream, kernel: str | None = None, masked: bool = False):
    """``grouped_swiglu`` (``rows`` is offs) or ``grouped_swiglu_masked`` (masked_m): ``w_gate_up``
    (G, 2I, K), each expert's gate and up rows interleaved (:func:`swiglu_weight`), checked here so
    that errors name it; the grouped GEMM of ``a`` and ``w_gate_up.transpose(1, 2)`` with SwiGLU."""
    check_gate_up(w_gate_up, a, "a", grouped=True)
    return grouped_gemm(bundle, a, w_gate_up.transpose(1, 2), rows, scale_a, scale_b, out, stream, kernel, masked,
                        "swiglu")


def _grouped_plan(bundle: Bundle, a: Tensor, b: Tensor, rows: Tensor, scale_a, scale_b, out: Tensor | None,
                  kernel: str | None, masked: bool, activation: str, scale_format: str | None = None):
    """The plan of a grouped call, after every check of its arguments (the scales' by their format:
    a block-scaled ``scale_format``'s on the CPU, before any kernel is chosen, but for the bundle's
    arch message; blockwise ones after the operands', their strides going in the plan block)."""
    from tilekiln.grouped import make_grouped_problem, make_masked_problem, plan_grouped

    scale_strides = ()
    if scale_format == "blockwise":
        scaling = "blockwise"
        requested = requested_epilogue(scaling="blockwise", activation=activation)
    elif scale_format is not None:
        _check_block_kernels(bundle, scale_format)
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
            _check_scale(scale_name, scale, problem.device)
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
           _scale_signature(scale_a), _scale_signature(scale_b), activation, scale_format)
    plan = bundle._plans.get(key)
    if plan is None:
        plan = _grouped_plan(bundle, a, b, rows, scale_a, scale_b, out, kernel, masked, activation, scale_format)
        bundle.remember(key, plan)
    problem = plan.problem
    dtype = torch.bfloat16 if problem.out_dtype == "bf16" else a.dtype
    given = out is not None  # only a caller's out can have row padding that is not tilekiln's
    if out is None:
        out = _allocate(problem.out_shape, problem.k, dtype, a.device)
    if plan.block is None:
        if problem.k == 0 and out.numel():
            with _on_stream(stream, problem.device):
                out.zero_()
        return out
    target = out
    if plan.unfused:
        with _on_stream(stream, problem.device):
            target = _allocate(plan.run.out_shape, problem.k, dtype, a.device).zero_()
    elif given:
        target = _stage_for(out, stream, keep=True)
    if scale_format == "blockwise":
        _check_float_pointers(scale_a=scale_a, scale_b=scale_b)
    elif scale_format is not None:
        check_scale_pointers(scale_a, scale_b)
    launch_grouped(bundle, plan, a.data_ptr(), b.data_ptr(), target.data_ptr(), rows.data_ptr(),
                   _stream_handle(stream, problem.device), 0 if scale_a is None else scale_a.data_ptr(),
                   0 if scale_b is None else scale_b.data_ptr())
    if plan.unfused:
        return _apply_unfused(plan, target, out, stream)
    return _finish(target, out, stream)


@torch.library.custom_op("tilekiln::grouped_gemm", mutates_args=())
def grouped_gemm_op(a: Tensor, b: Tensor, offs: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                    bundle: str, kernel: str, activation: str = "none", scale_format: str = "") -> Tensor:
    """torch._grouped_mm(a, b, offs=offs) (contiguous layout) on ``bundle``'s grouped kernels; with fp8
    inputs, times the per-tensor or row-wise scales, in bf16; ``activation`` "swiglu": silu(gate) * up
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
    return _allocate((a.shape[0], _grouped_columns(b, activation)), a.shape[-1], _grouped_dtype(a, scale_a, scale_b),
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
    return _allocate((a.shape[0], a.shape[1], _grouped_columns(b, activation)), a.shape[-1],
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
