"""Duck-typed views of GEMM operands: torch tensors, ``__cuda_array_interface__``
objects (CuPy, Numba) and ``__dlpack__`` producers.

Only this module and ``_torch`` touch tensor objects; everything else sees an
:class:`Operand` (shape, strides in elements, dtype token, pointer, device).
torch is imported only when a torch tensor is passed or ``__dlpack__`` needs it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from tilekiln.spec import DTYPES, itemsize

# Names other libraries give the dtype tokens (tilekiln/spec.py): numpy typestrs of
# __cuda_array_interface__ (which has no bf16) and torch dtype names.
_CAI_DTYPES = {d.typestr: d.token for d in DTYPES.values() if d.typestr}
_TORCH_NAMES = {d.torch: d.token for d in DTYPES.values() if d.torch}


@dataclass(frozen=True)
class Operand:
    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    ptr: int
    device: int  # CUDA ordinal; -1 for host memory
    obj: object

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype) if self.dtype in DTYPES else 0


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def transposed(op: Operand) -> Operand:
    """``op`` with its last two dimensions swapped (``.mT``), as a description only."""
    shape, strides = list(op.shape), list(op.strides)
    shape[-2:], strides[-2:] = shape[:-3:-1], strides[:-3:-1]
    return Operand(op.name, tuple(shape), tuple(strides), op.dtype, op.ptr, op.device, None)


def is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def torch_dtype_token(dtype: object) -> str:
    return _TORCH_NAMES.get(str(dtype).removeprefix("torch."), str(dtype).removeprefix("torch."))


def describe(obj: object, name: str) -> Operand:
    """Read an operand; raises TypeError naming the argument if it is not an array."""
    if is_torch_tensor(obj):
        return _from_torch(obj, name)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(obj, cai, name)
    if hasattr(obj, "__dlpack__"):
        try:
            import torch
        except ImportError:
            raise TypeError(f"{name}: __dlpack__ objects need torch to be read; pass a torch tensor or an "
                            "object with __cuda_array_interface__") from None
        return _from_torch(torch.from_dlpack(obj), name)
    raise TypeError(f"{name}: expected a torch tensor or an object with __cuda_array_interface__ or "
                    f"__dlpack__, got {type(obj).__name__}")


def _from_torch(t, name: str) -> Operand:
    device = t.get_device() if t.is_cuda else -1
    return Operand(name, tuple(t.shape), tuple(t.stride()), torch_dtype_token(t.dtype), t.data_ptr(), device, t)


def _from_cai(obj: object, cai: dict, name: str) -> Operand:
    shape = tuple(int(s) for s in cai["shape"])
    typestr = cai["typestr"]
    dtype = _CAI_DTYPES.get(typestr, typestr)
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
    if cai.get("strides") is None:
        strides = contiguous_strides(shape)
    else:
        raw = tuple(int(s) for s in cai["strides"])
        if any(s % itemsize for s in raw):
            raise ValueError(f"{name}: strides {raw} (bytes) are not multiples of the {itemsize}-byte item size")
        strides = tuple(s // itemsize for s in raw)
    ptr = int(cai["data"][0])
    return Operand(name, shape, strides, dtype, ptr, _cai_device(ptr), obj)


def _cai_device(ptr: int) -> int:
    """The CUDA ordinal owning ``ptr``, via the driver (no torch)."""
    from tilekiln._driver import pointer_device

    return pointer_device(ptr)
