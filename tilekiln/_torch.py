"""The torch fast path of ``gemm``.

Imported only when torch tensors are passed. The plan cache key is the
operands' dtype, shape, strides and device (plus the ``out`` signature); a
hit costs the key, the data pointers, the current raw stream handle (the
private ``torch._C._cuda_getCurrentRawStream``, about 0.2 us, where
``torch.cuda.current_stream()`` costs about 4 us on the H200) and one
ctypes call.
"""

from __future__ import annotations

import contextlib

import torch

from tilekiln._native import CALL
from tilekiln._tensors import describe, torch_dtype_token
from tilekiln.bundle import raise_misaligned
from tilekiln.errors import LaunchError

Tensor = torch.Tensor
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_compiling = torch.compiler.is_compiling
_pack_call = CALL.pack_into


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


_SCALE_ERROR = ("{name}: expected a one-element float32 CUDA tensor on the inputs' device "
                "(a per-tensor scale, as torch._scaled_mm takes), got {what}")


def _check_scale(name: str, scale, device: int) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(_SCALE_ERROR.format(name=name, what=type(scale).__name__))
    if scale.dtype != torch.float32 or scale.numel() != 1 or scale.get_device() != device:
        raise ValueError(_SCALE_ERROR.format(
            name=name, what=f"{scale.dtype} with {scale.numel()} elements on {scale.device}"))


def _allocate(problem, dtype, device) -> torch.Tensor:
    if problem.empty or problem.k == 0 or problem.c.lead == problem.n:
        return torch.empty(problem.out_shape, dtype=dtype, device=device)
    return torch.empty(problem.alloc_shape, dtype=dtype, device=device)[..., :problem.n]


def torch_scaled_gemm(bundle, a, b, scale_a, scale_b, out_dtype, out, stream, kernel):
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    key = ("scaled", a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(), a.get_device(), b.get_device(),
           None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()), kernel, out_dtype)
    plan = bundle._plans.get(key)
    if plan is None:
        plan = bundle.plan(describe(a, "a"), describe(b, "b"), None if out is None else describe(out, "out"),
                           kernel, torch_dtype_token(out_dtype), allow_split=True)
        for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
            _check_scale(name, scale, plan.problem.device)
        bundle.remember(key, plan)
    if out is None:
        out = _allocate(plan.problem, out_dtype, a.device)
    if plan.block is None:
        if plan.problem.k == 0:
            out.zero_()
        return out
    if plan.split > 1:
        return _split_k(bundle, plan, a, b, out, stream, scale_a.data_ptr(), scale_b.data_ptr())
    bundle.launch(plan, a.data_ptr(), b.data_ptr(), out.data_ptr(), _stream_handle(stream, plan.problem.device),
                  scale_a.data_ptr(), scale_b.data_ptr())
    return out


def _split_k(bundle, plan, a, b, out, stream, scale_a: int = 0, scale_b: int = 0):
    """Launch the plan's K slices into an fp32 workspace, then add the planes in order into ``out``."""
    device = plan.problem.device
    context = contextlib.nullcontext() if stream is None else torch.cuda.stream(_torch_stream(stream, device))
    with context:
        run = plan.run
        work = torch.empty(run.out_shape, dtype=torch.float32, device=out.device)
        bundle.launch(plan, a.data_ptr(), b.data_ptr(), work.data_ptr(), current_stream(device), scale_a, scale_b)
        # One kernel: fp32 sums over the planes, rounded once into out's dtype.
        torch.sum(work[..., :run.n], dim=0, out=out if out.dim() == 2 else out[0])
    return out


def _torch_stream(stream, device: int):
    if isinstance(stream, torch.cuda.Stream):
        return stream
    return torch.cuda.ExternalStream(int(stream), device=device)


def gemm(bundle, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, stream, kernel=None,
         in_operator=False):
    """``bundle.gemm`` for torch tensors: the hot path, written out in one function.

    A cached call costs the signature key (shape, strides, dtype and device of
    each operand), one dictionary look-up, three pointer reads, the current
    stream, one 6-field pack into the thread's call block and one ctypes call.
    While torch.compile traces, the call becomes a ``tilekiln::gemm`` node;
    that operator's body comes back here with ``in_operator``.
    """
    if _is_compiling() and not in_operator and kernel is None and stream is None:
        return compiled_gemm(bundle, a, b, out)
    if out is None:
        key = (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(), kernel)
    else:
        key = (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(), kernel,
               out.shape, out.stride(), out.dtype, out.get_device())
    plan = bundle._plans.get(key)
    if plan is None:
        plan = bundle.plan(describe(a, "a"), describe(b, "b"), None if out is None else describe(out, "out"),
                           kernel, allow_split=True)
        bundle.remember(key, plan)
    if out is None:
        out = _allocate(plan.problem, a.dtype, a.device)
    block = plan.block
    if block is None:
        if plan.problem.k == 0:
            out.zero_()
        return out
    if plan.split > 1:
        return _split_k(bundle, plan, a, b, out, stream)
    pa, pb, pc = a.data_ptr(), b.data_ptr(), out.data_ptr()
    if (pa | pb | pc) & 15:
        raise_misaligned(pa, pb, pc)
    if stream is None and _raw_stream is not None:
        handle = _raw_stream(plan.problem.device)
    else:
        handle = _stream_handle(stream, plan.problem.device)
    lib = bundle._lib
    buf = lib.call_buffer()
    _pack_call(buf, 0, pa, pb, pc, handle, 0, 0)
    status = lib.run(block, buf)
    if status:
        raise LaunchError(plan.kernel_id, lib.error_name(status), lib.error_string(status))
    return out


def result_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return (m, n)
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    return (batch, m, n)


# torch.library operators, so torch.compile records one node per GEMM (with a
# shape-only fake implementation for tracing) instead of tracing into ctypes.
@torch.library.custom_op("tilekiln::gemm", mutates_args=())
def gemm_op(a: torch.Tensor, b: torch.Tensor, bundle_dir: str) -> torch.Tensor:
    from pathlib import Path

    from tilekiln.discovery import open_bundle

    return gemm(open_bundle(Path(bundle_dir)), a, b, None, None, in_operator=True)


@gemm_op.register_fake
def _gemm_fake(a: torch.Tensor, b: torch.Tensor, bundle_dir: str) -> torch.Tensor:
    return a.new_empty(result_shape(a, b))


@torch.library.custom_op("tilekiln::gemm_out", mutates_args=("out",))
def gemm_out_op(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bundle_dir: str) -> None:
    from pathlib import Path

    from tilekiln.discovery import open_bundle

    gemm(open_bundle(Path(bundle_dir)), a, b, out, None, in_operator=True)


@gemm_out_op.register_fake
def _gemm_out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bundle_dir: str) -> None:
    return None


def compiled_gemm(bundle, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None):
    """The path taken while torch.compile traces: call the registered operator."""
    directory = str(bundle.directory)
    if out is None:
        return gemm_op(a, b, directory)
    gemm_out_op(a, b, out, directory)
    return out
