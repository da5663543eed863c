"""Blockwise fp8 scales (the DeepSeek-V3 recipe): quantization into the layouts the blockwise
kernels read, and the checks of a call's scales. torch only; imported when torch tensors are passed.

The layouts (docs/runtime.md, "Blockwise fp8"), for C = A @ B with A (M, K) row-major and B (K, N)
K-major (``weight.t()`` of an nn.Linear weight (N, K)):

- ``scale_a``: float32 (M, K/128), one factor per row of A and 128 elements of K, **M-major**
  (stride (1, s) with any s; ``quantize_fp8_blockwise(x, (1, 128))`` gives s = M). A warpgroup's
  threads read 16 consecutive rows of one K block together, so M-major reads are coalesced.
- ``scale_b``: float32 (ceil(N/128), K/128), one factor per 128x128 block of the weight,
  K/128 contiguous (stride (s, 1); row-major from ``quantize_fp8_blockwise(w, (128, 128))``).

The grouped calls' (``grouped_gemm(..., scale_format="blockwise")`` and the masked layout's) follow
A's rows and B's groups: ``scale_a`` (total_M, K/128) M-major, as above, or in the masked layout
(G, M_max, K/128) with M_max contiguous (stride (s_g, 1, s_k)); ``scale_b`` (G, ceil(N/128), K/128)
with K/128 contiguous (stride (s_g, s_n, 1)), each group's weight scales as above.

Each is read one float32 at a time with ordinary loads, so 4-byte alignment is all either needs
(no TMA box, no padding of M). K must be a multiple of 128.
"""

from __future__ import annotations

import torch

from tilekiln.problem import result_shape
from tilekiln.blockscaled import RUNTIME_BLOCK_FORMATS
from tilekiln.spec import BLOCKWISE_BLOCK

BLOCK = BLOCKWISE_BLOCK
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
BLOCKS = ((1, BLOCK), (BLOCK, BLOCK))


def quantize_fp8_blockwise(x: torch.Tensor, block: tuple[int, int] = (1, BLOCK), *, power_of_two: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_fp8, scales)`` with ``x ≈ x_fp8 * scales`` per block, in the layouts the blockwise
    kernels read.

    ``x``: a 2-D floating tensor (R, C) with C a multiple of 128. ``block``: ``(1, 128)`` for
    activations (one scale per row and 128 columns; scales (R, C/128), R-major) or ``(128, 128)``
    for weights (scales (ceil(R/128), C/128), row-major; a last partial row block is scaled by
    its own rows). Each scale is the block's largest magnitude over 448 (float8_e4m3fn's
    largest value), 1 for an all-zero block; ``power_of_two`` rounds it up to a power of two
    (UE8M0-style scales, exact to apply). ``x_fp8`` is float8_e4m3fn, row-major.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch tensor, got {type(x).__name__}")
    if x.dim() != 2 or not x.dtype.is_floating_point or x.dtype.itemsize == 1:
        raise ValueError(f"x: expected a 2-D bfloat16, float16 or float32 tensor, got {x.dtype} of shape "
                         f"{list(x.shape)}")
    block = tuple(block)
    if block not in BLOCKS:
        raise ValueError(f"block: expected (1, {BLOCK}) (activations) or ({BLOCK}, {BLOCK}) (weights), got {block}")
    rows, cols = x.shape
    if cols % BLOCK:
        raise ValueError(f"x: {cols} columns is not a multiple of {BLOCK}; blockwise scaling takes one scale per "
                         f"{BLOCK} elements of K, pad K with zeros to a multiple of {BLOCK}")
    br = block[0]
    padded_rows = -(-rows // br) * br
    xf = x.float()
    if padded_rows != rows:
        xf = torch.cat([xf, xf.new_zeros(padded_rows - rows, cols)])
    blocks = xf.reshape(padded_rows // br, br, cols // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scales = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    if power_of_two:
        scales = _power_of_two_ceil(scales)
    q = (blocks / scales[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    x_fp8 = q.reshape(padded_rows, cols)[:rows].to(torch.float8_e4m3fn).contiguous()
    if br == 1:
        # M-major: the kernel reads a K block's scales of consecutive rows together.
        scales = scales.t().contiguous().t()
    return x_fp8, scales


def _power_of_two_ceil(s: torch.Tensor) -> torch.Tensor:
    """The least power of two >= each positive value of ``s``, exactly."""
    mantissa, exponent = torch.frexp(s)  # s = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.ldexp(torch.ones_like(s), exponent)


def dequantize(x_fp8: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``x_fp8 * scales`` per block, in float64: the operand a blockwise GEMM multiplies."""
    br = block[0]
    rows, cols = x_fp8.shape
    full = scales.double().repeat_interleave(br, 0)[:rows].repeat_interleave(BLOCK, 1)
    return x_fp8.double() * full


_FORMATS = ("tensor", "rowwise", "blockwise", *RUNTIME_BLOCK_FORMATS)


def scale_format_token(scale_format) -> str:
    """``scale_format`` checked: ``"tensor"``, ``"rowwise"``, ``"blockwise"`` or a block-scaled format
    the runtime takes (tilekiln/blockscaled.py); ValueError naming the argument."""
    if scale_format not in _FORMATS:
        raise ValueError(f"scale_format: {scale_format!r} is not one of {', '.join(map(repr, _FORMATS))}")
    return scale_format


def check_scales(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b) -> tuple[int, int, int, int]:
    """Check a blockwise call's operands and scales (error naming the argument, what is wrong and
    how to fix it); returns the scales' (lead, batch) strides for the plan block."""
    result_shape(tuple(a.shape), tuple(b.shape))  # shapes that multiply, as every call checks first
    if a.dim() != 2 or b.dim() != 2:
        which = "a" if a.dim() != 2 else "b"
        raise ValueError(f"{which}: blockwise scaled_gemm takes 2-D operands a (M, K) and b (K, N), got "
                         f"{which} of shape {list((a if which == 'a' else b).shape)}")
    m, k = a.shape
    n = b.shape[1]
    if k % BLOCK:
        raise ValueError(f"a: K = {k} is not a multiple of {BLOCK}; blockwise scaling takes one scale per {BLOCK} "
                         f"elements of K (pad K with zeros to a multiple of {BLOCK})")
    kb, nb = k // BLOCK, -(-n // BLOCK)
    device = a.device
    check_scale_tensor("scale_a", scale_a, (m, kb), 0, device,
               f"(M, K/{BLOCK}) = ({m}, {kb}) M-major (stride (1, s)), as quantize_fp8_blockwise(a, (1, {BLOCK})) "
               "gives; s.t().contiguous().t() makes a row-major one M-major")
    check_scale_tensor("scale_b", scale_b, (nb, kb), 1, device,
               f"(ceil(N/{BLOCK}), K/{BLOCK}) = ({nb}, {kb}) with K/{BLOCK} contiguous (stride (s, 1)), as "
               f"quantize_fp8_blockwise(weight, ({BLOCK}, {BLOCK})) gives for b = weight.t()")
    lead_a, lead_b = scale_a.stride(1), scale_b.stride(0)
    # One batch: its stride is never used; any value the kernel's 64-bit index accepts.
    return lead_a, lead_a * kb, lead_b, lead_b * nb


def check_scale_tensor(name: str, scale, shape: tuple[int, int], unit: int, device, want: str) -> None:
    """Check one float32 scale matrix (or a grouped call's batch of them) of ``shape`` whose dimension
    ``unit`` is contiguous (where it has more than one element), on ``device`` (the inputs' torch device): TypeError or ValueError naming
    ``name``, saying what was expected (``want``: its shape and layout) and what was wrong."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 tensor {want}, on the inputs' device; got {type(scale).__name__}")
    problems = []
    if scale.dtype != torch.float32:
        problems.append(f"dtype {scale.dtype} (convert with .float())")
    if tuple(scale.shape) != shape:
        problems.append(f"shape {list(scale.shape)}")
    elif shape[unit] > 1 and scale.stride(unit) != 1:
        problems.append(f"strides {list(scale.stride())}")
    if scale.device != device:
        problems.append(f"device {scale.device}")
    if problems:
        raise ValueError(f"{name}: expected a float32 tensor {want}, on the inputs' device; got {', '.join(problems)}")


def grouped_scale_shapes(a: torch.Tensor, b: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of a blockwise grouped call's scales for ``a`` (total_M, K), or (G, M_max, K), and
    ``b`` (G, K, N), K a multiple of 128: scale_a one per row of a and 128 K, scale_b (G,
    ceil(N/128), K/128)."""
    groups, k, n = b.shape
    kb = k // BLOCK
    return (*a.shape[:-1], kb), (groups, -(-n // BLOCK), kb)


def check_grouped_scales(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, masked: bool
                         ) -> tuple[int, int, int, int]:
    """Check a blockwise grouped call's scales against its operands (already checked: ``a``
    (total_M, K), or (G, M_max, K) when ``masked``, and ``b`` (G, K, N)); TypeError or ValueError
    naming the argument. Returns the scales' (lead, batch) strides for the plan block, in the
    kernels' (rows, K blocks, group) order for scale_a and (N blocks, K blocks, group) for scale_b."""
    k = b.shape[1]
    if k % BLOCK:
        raise ValueError(f"a: K = {k} is not a multiple of {BLOCK}; blockwise scaling takes one scale per {BLOCK} "
                         f"elements of K (pad K with zeros to a multiple of {BLOCK})")
    a_shape, b_shape = grouped_scale_shapes(a, b)
    groups, nb, kb = b_shape
    device = a.device
    if masked:
        m = a.shape[1]
        check_scale_tensor("scale_a", scale_a, a_shape, 1, device,
                           f"(G, M_max, K/{BLOCK}) = ({groups}, {m}, {kb}) with M_max contiguous "
                           f"(stride (s_g, 1, s_k)), as quantize_fp8_blockwise(a.view(-1, K), (1, {BLOCK}))[1].view(G, M_max, -1) gives")
        lead_a, batch_a = scale_a.stride(2), scale_a.stride(0)
    else:
        m = a.shape[0]
        check_scale_tensor("scale_a", scale_a, a_shape, 0, device,
                           f"(total_M, K/{BLOCK}) = ({m}, {kb}) M-major (stride (1, s)), as "
                           f"quantize_fp8_blockwise(a, (1, {BLOCK})) gives")
        # One matrix: its batch stride is never used.
        lead_a = scale_a.stride(1)
        batch_a = lead_a * kb
    check_scale_tensor("scale_b", scale_b, b_shape, 2, device,
                       f"(G, ceil(N/{BLOCK}), K/{BLOCK}) = ({groups}, {nb}, {kb}) with K/{BLOCK} contiguous (stride "
                       f"(s_g, s_n, 1)), each group's quantize_fp8_blockwise(weight, ({BLOCK}, {BLOCK})) stacked")
    return lead_a, batch_a, scale_b.stride(1), scale_b.stride(0)
