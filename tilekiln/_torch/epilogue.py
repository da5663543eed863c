"""torch's definition of each epilogue a kernel can fuse: what runs where no kernel fuses a
requested field, what autograd differentiates, and the references of tilekiln.verify and the GPU
tests. Also the SwiGLU weight layout (:func:`swiglu_weight`) and its gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tilekiln._torch.streams import on_stream
from tilekiln.bundle import NEUTRAL_VALUES
from tilekiln.spec import DTYPES, FAMILIES, GLU_BLOCK, SCALED_OUTPUTS

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


# torch dtypes of the results an epilogue writes through scale_result (tilekiln/spec.py, SCALED_OUTPUTS).
SCALED_RESULTS = {getattr(torch, DTYPES[t].torch): t for t in SCALED_OUTPUTS}


def saturate_result(value: Tensor, scale_result, dtype: torch.dtype) -> Tensor:
    """``value * scale_result`` saturated to ``dtype``'s finite range and rounded to it, as an fp8
    epilogue writes it (the references of tilekiln.verify and the GPU tests)."""
    limit = torch.finfo(dtype).max
    return (value * scale_result).clamp(-limit, limit).to(dtype)


def apply_unfused(plan, result: Tensor, out: Tensor | None, stream, bias: Tensor | None = None,
                  residual: Tensor | None = None, values: tuple[float, ...] = NEUTRAL_VALUES) -> Tensor:
    """``result`` (what a kernel computed of the GEMM and its epilogue) with the rest of the requested
    epilogue, which no kernel computes, applied by torch, into ``out`` if given (which may be the
    residual: it is read before ``out`` is written)."""
    with on_stream(stream, result.get_device()):
        for name, value in plan.unfused:
            result = UNFUSED[name](value, result, bias, residual, values)
        if out is None:
            return result
        out.copy_(result)
    return out


def swiglu_grad(pre: Tensor, grad: Tensor) -> Tensor:
    """The gradient at the interleaved gate_up result ``pre`` of ``silu(gate) * up``, given the
    output's ``grad``; in fp32 (or ``pre``'s wider type), returned in ``pre``'s type."""
    wide = torch.promote_types(pre.dtype, torch.float32)
    gate, up = (h.to(wide) for h in glu_halves(pre))
    sig = torch.sigmoid(gate)
    g = grad.to(wide)
    return glu_interleave(g * up * sig * (1 + gate * (1 - sig)), g * gate * sig).to(pre.dtype)
