"""The result tensor of a torch call: its allocation, and the stage an ``out=`` is written through.

Results are allocated through :func:`tilekiln.problem.result_strides`, as the operators' fakes
allocate them, so traced strides equal real ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tilekiln._torch.streams import on_stream
from tilekiln.problem import result_shape, result_strides


def as_rows(t: Tensor) -> Tensor:
    """``t`` (..., D) as a matrix (rows, D). Unlike ``reshape(-1, D)`` this holds for D = 0 too
    (an empty K or N), where -1 is ambiguous."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def allocate(shape: tuple[int, ...], k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized result of ``shape`` at :func:`tilekiln.problem.result_strides` (rows padded to
    16 bytes unless K is 0 or the result is empty), as the operators' fakes allocate it."""
    return torch.empty_strided(shape, result_strides(shape, k, dtype.itemsize), dtype=dtype, device=device)


def partials(shape: tuple[int, ...], device) -> Tensor:
    """The fp32 workspace a split-K plan's K slices write (tilekiln/splitk.py), a plane per slice."""
    return torch.empty(shape, dtype=torch.float32, device=device)


def stage_for(out: Tensor, stream, keep: bool = False) -> Tensor:
    """What the kernel writes in place of ``out``: ``out`` itself, or a buffer of tilekiln's at
    ``out``'s strides (a copy of it where ``keep``: a grouped call leaves rows no group owns as they
    were), which torch then copies into ``out`` (:func:`unstage`).

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
    with on_stream(stream, out.get_device()):
        flat = torch.empty(extent + (-out.shape[-1] * itemsize) % 16 // itemsize, dtype=out.dtype, device=out.device)
        stage = flat.as_strided(tuple(out.shape), out.stride())
        return stage.copy_(out) if keep else stage


def unstage(target: Tensor, out: Tensor, stream) -> Tensor:
    """``out``, with what the kernel wrote into ``target`` (:func:`stage_for`) copied in if that was a stage."""
    if target is not out:
        with on_stream(stream, out.get_device()):
            out.copy_(target)
    return out


def result_dtype(out_dtype, out: Tensor | None) -> torch.dtype:
    """A scaled call's result type: out's, or out_dtype, bf16 by default."""
    return out.dtype if out is not None else torch.bfloat16 if out_dtype is None else out_dtype


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


def new_result(a: Tensor, b: Tensor, dtype: torch.dtype, activation: str = "none") -> Tensor:
    """The result a call of ``a`` and ``b`` allocates (and its fake says it does): half of b's
    columns where swiglu pairs them."""
    shape, k = result_shape(tuple(a.shape), tuple(b.shape))
    if activation == "swiglu":
        shape = shape[:-1] + (shape[-1] // 2,)
    return allocate(shape, k, dtype, a.device)
