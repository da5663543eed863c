"""The checks of the entry points' arguments that are not scales (activation, bias, addmm's
operands and coefficients, a gate_up weight): TypeError or ValueError naming the argument, what is
wrong and how to fix it, raised before anything runs.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from tilekiln._tensors import torch_dtype_token
from tilekiln._torch.epilogue import ACTIVATIONS
from tilekiln._torch.results import check_out


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


def scaled_activation_token(activation) -> str:
    """A scaled call's ``activation`` as its token: None (or "none"), or "swiglu", whose B columns
    interleave gate and up (:func:`swiglu_weight`); ValueError naming the argument otherwise."""
    value = "none" if activation is None else getattr(activation, "value", activation)
    if value not in ("none", "swiglu"):
        raise ValueError(f"activation: scaled_gemm takes None or 'swiglu', got {activation!r}")
    return value


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
