"""Duck-typed views of GEMM operands: torch tensors, ``__cuda_array_interface__``
objects (CuPy, Numba) and ``__dlpack__`` producers.

Only this module and ``_torch`` touch tensor objects; everything else sees an
:class:`Operand` (shape, strides in elements, dtype token, pointer, device); a 4-bit type's
elements are its own, two to a byte, not torch's (:func:`_unpacked`).
torch is imported only when a torch tensor is passed or ``__dlpack__`` needs it.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Mapping
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
    dtype = torch_dtype_token(t.dtype)
    if dtype in DTYPES and DTYPES[dtype].bits == 4:
        return _unpacked(t, name, dtype, device)
    return Operand(name, tuple(t.shape), tuple(t.stride()), dtype, t.data_ptr(), device, t)


def _unpacked(t, name: str, dtype: str, device: int) -> Operand:
    """A tensor of a 4-bit type (torch.float4_e2m1fn_x2) described in its 4-bit elements. Each byte holds two elements
    consecutive along the tensor's unit-stride dimension (the last one where both are), the even
    one in the low nibble, so that dimension's extent doubles and every other stride doubles."""
    shape, strides = list(t.shape), list(t.stride())
    packed = next((d for d in range(len(shape) - 1, len(shape) - 3, -1) if d >= 0 and strides[d] == 1), None)
    if packed is None:
        raise ValueError(f"{name}: a {t.dtype} tensor packs two elements along a unit-stride dimension, and "
                         f"neither of its last two has stride 1 (strides {strides}); pass a contiguous tensor or "
                         "its transpose")
    shape[packed] *= 2
    strides = [s if d == packed else 2 * s for d, s in enumerate(strides)]
    return Operand(name, tuple(shape), tuple(strides), dtype, t.data_ptr(), device, t)


def _from_cai(obj: object, cai: object, name: str) -> Operand:
    shape = _cai_ints(cai, "shape", name)
    typestr = _cai_entry(cai, "typestr", name)
    if not isinstance(typestr, str):
        raise _cai_error(name, "typestr", f"must be a numpy type string such as '<f2', got {type(typestr).__name__}")
    dtype = _CAI_DTYPES.get(typestr, typestr)
    itemsize = int(typestr[2:]) if typestr[2:].isdecimal() and typestr[2:].isascii() else 1
    if cai.get("strides") is None:
        strides = contiguous_strides(shape)
    else:
        raw = _cai_ints(cai, "strides", name)
        if len(raw) != len(shape):
            raise _cai_error(name, "strides", f"has {len(raw)} entries for {len(shape)} dimensions")
        if any(s % itemsize for s in raw):
            raise ValueError(f"{name}: strides {raw} (bytes) are not multiples of the {itemsize}-byte item size")
        strides = tuple(s // itemsize for s in raw)
    data = _cai_entry(cai, "data", name)
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise _cai_error(name, "data", f"must be a (pointer, read_only) pair, got {data!r:.60}")
    try:
        ptr = operator.index(data[0])
        if ptr < 0 or isinstance(data[0], bool):
            raise TypeError
    except TypeError:
        raise _cai_error(name, "data", f"must start with a non-negative integer pointer, got {data[0]!r:.40}") from None
    return Operand(name, shape, strides, dtype, ptr, _cai_device(ptr), obj)


def _cai_entry(cai: object, key: str, name: str) -> object:
    if not isinstance(cai, Mapping):
        raise TypeError(f"{name}: __cuda_array_interface__ must be a dict (CUDA Array Interface v3), "
                        f"got {type(cai).__name__}")
    if key not in cai:
        raise _cai_error(name, key, "is missing; the interface needs shape, typestr and data")
    return cai[key]


def _cai_ints(cai: object, key: str, name: str) -> tuple[int, ...]:
    """A tuple of integers of the interface; bools, floats and strings are refused, not converted."""
    value = _cai_entry(cai, key, name)
    try:
        if not isinstance(value, (tuple, list)) or any(isinstance(v, bool) for v in value):
            raise TypeError
        return tuple(operator.index(v) for v in value)
    except TypeError:
        raise _cai_error(name, key, f"must be a tuple of integers, got {value!r:.60}") from None


def _cai_error(name: str, key: str, problem: str) -> TypeError:
    return TypeError(f"{name}: __cuda_array_interface__[{key!r}] {problem}")


def _cai_device(ptr: int) -> int:
    """The CUDA ordinal owning ``ptr``, via the driver (no torch)."""
    from tilekiln._driver import pointer_device

    return pointer_device(ptr)
