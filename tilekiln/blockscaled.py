"""Block-scaled formats (mxfp8, nvfp4, mxfp4, fp4-e5m3-b32): a CPU float64 reference of each, the scale-factor
layout the tcgen05 block-scaled MMA reads, and the checks of a ``scaled_gemm`` call's scales.

A block-scaled operand is a matrix of narrow elements and one scale factor per ``block``
consecutive elements of a row along K (tilekiln/spec.py, BLOCK_SCALE_FORMATS):

* mxfp8 (OCP MX): e4m3 elements, an e8m0 (power-of-two) scale per 32;
* mxfp4 (OCP MX): e2m1 elements, an e8m0 scale per 32;
* nvfp4: e2m1 elements, an e4m3 scale per 16;
* fp4-e5m3-b32 (SM 10.7 only): e2m1 elements, an unsigned e5m3 scale per 32. torch has no e5m3
  dtype, so these scales are uint8 tensors of the codes (:func:`e5m3_codes`, :func:`e5m3_values`).

The value of element (r, k) is ``element * scale[r, k // block]``. Scales are made row-major,
(rows, K / block); the kernels read them in the hardware's layout (docs/runtime.md), which
:func:`to_blocked` makes: rows padded to 128 and scale blocks to 4, cut into 512-byte atoms
of 128 rows x 4 blocks, atoms in row-band-major, block-minor order; inside an atom, row r and
block j sit at byte ``(r % 32) * 16 + (r // 32) * 4 + j``. Its shape, (ceil(rows / 128),
ceil(K / block / 4), 32, 4, 4), spells that order, so a contiguous tensor of it is the layout.

e2m1 elements are held here as one 4-bit code per uint8 (sign in bit 3); :func:`pack_fp4`
packs two per byte, the even element in the low nibble, as torch.float4_e2m1fn_x2 holds them,
and :func:`pack_operand` makes the tensor ``scaled_gemm`` takes: an (M, K) e2m1 operand is an
(M, K / 2) float4_e2m1fn_x2 tensor, K counted in elements everywhere else (scale shapes, the
multiple of 64 or 128). :func:`quantize_operand` does both from bf16 or float32.
Pure torch; the reference runs on any device in float64.
"""

from __future__ import annotations

import math

import torch

from tilekiln.spec import BLOCK_SCALE_FORMATS, DTYPES, BlockScaleCodec

# Rows and scale blocks (along K) of one scale-factor atom (catalog/hardware/sm100.yaml:
# block_scale_atom_rows, block_scale_atom_k_blocks); 32 rows per 16-byte line.
ATOM_ROWS, ATOM_BLOCKS, ATOM_LINES = 128, 4, 32

# The magnitudes of the e2m1 codes 0-7 (code 8-15: the same, negative).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Largest magnitudes of the element types, and the exponent of each one's largest power of two
# (OCP MX's emax_elem: the shared exponent is floor(log2(amax)) - emax).
_MAX = {"e4m3": 448.0, "e2m1": 6.0}
_EMAX = {"e4m3": 8, "e2m1": 2}
E8M0_BIAS = 127
# Unsigned e5m3 (the DSL's FloatNV8E5M3FNU, MLIR fnv8E5M3FNU): 5 exponent bits biased by 15, 3
# mantissa bits, subnormals below 2**-14, code 0xFF NaN and no infinity, so the largest value is
# code 0xFE, 1.75 * 2**16. Measured with MLIR's own semantics of the type in the pinned DSL
# (ir.DenseElementsAttr of each code): 0x01 = 2**-17, 0x08 = 2**-14, 0x78 = 1, 0x79 = 1.125,
# 0xF8 = 2**16, 0xFE = 114688, 0xFF = NaN.
E5M3_BIAS, E5M3_MAX_CODE, E5M3_NAN = 15, 0xFE, 0xFF

# The formats scaled_gemm takes (all of spec.py's): e4m3 elements as torch.float8_e4m3fn, e2m1
# elements packed two per byte as torch.float4_e2m1fn_x2 (:func:`pack_operand`).
RUNTIME_BLOCK_FORMATS = tuple(BLOCK_SCALE_FORMATS)
_SCALE_DTYPES = {"e8m0": torch.float8_e8m0fnu, "e4m3": torch.float8_e4m3fn, "e5m3": torch.uint8}


def format_of(name: str):
    """The :data:`~tilekiln.spec.BLOCK_SCALE_FORMATS` entry ``name``; ValueError naming the argument."""
    if name not in BLOCK_SCALE_FORMATS:
        raise ValueError(f"scale_format: {name!r} is not a block-scaled format "
                         f"({', '.join(map(repr, BLOCK_SCALE_FORMATS))})")
    return BLOCK_SCALE_FORMATS[name]


def scale_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``name``'s scale factors (uint8 codes for e5m3, which torch lacks)."""
    return _SCALE_DTYPES[format_of(name).scale.scale.value]


# -- element and scale encodings ------------------------------------------------------------------


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to e2m1 (nearest, ties to the even code, saturating at 6) as uint8 codes."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=x.device)
    mag = x.double().abs().clamp(max=_MAX["e2m1"])
    dist = (mag.unsqueeze(-1) - values).abs()
    best = dist.min(dim=-1, keepdim=True).values
    # Among equally near codes (a tie), the even one: add the code's low bit as a tie-breaker.
    codes = torch.arange(8, device=x.device)
    score = torch.where(dist == best, (codes & 1).to(torch.float64), torch.inf)
    code = score.argmin(dim=-1).to(torch.uint8)
    return torch.where(x.double() < 0, code | 8, code)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """The float64 values of uint8 e2m1 codes."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=codes.device)
    mag = values[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """(…, K) uint8 e2m1 codes -> (…, K / 2) uint8, element 2i in the low nibble of byte i."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: the last dimension ({codes.shape[-1]}) must be even to pack two per byte")
    return (codes[..., 0::2] & 15) | ((codes[..., 1::2] & 15) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_fp4`."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)


def e8m0(exponents: torch.Tensor) -> torch.Tensor:
    """Power-of-two scales 2**exponents (integers in [-127, 127]) as torch.float8_e8m0fnu."""
    return (exponents.to(torch.int32) + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_values(scales: torch.Tensor) -> torch.Tensor:
    """The float64 values of float8_e8m0fnu scales (2**(bits - 127); bits 255 is NaN)."""
    bits = scales.view(torch.uint8).to(torch.float64)
    return torch.where(bits == 255, torch.nan, torch.exp2(bits - E8M0_BIAS))


def e5m3_values(codes: torch.Tensor) -> torch.Tensor:
    """The float64 values of uint8 unsigned-e5m3 codes (:data:`E5M3_BIAS`)."""
    bits = codes.view(torch.uint8).to(torch.int64)
    exponent, mantissa = bits >> 3, (bits & 7).to(torch.float64)
    normal = (1 + mantissa / 8) * torch.exp2((exponent - E5M3_BIAS).to(torch.float64))
    subnormal = mantissa / 8 * 2.0 ** (1 - E5M3_BIAS)
    return torch.where(bits == E5M3_NAN, torch.nan, torch.where(exponent == 0, subnormal, normal))


# Every e5m3 value but NaN, ascending with the code.
_E5M3_TABLE = e5m3_values(torch.arange(E5M3_MAX_CODE + 1, dtype=torch.uint8))


def e5m3_codes(x: torch.Tensor) -> torch.Tensor:
    """Non-negative ``x`` rounded up to the next e5m3 value (saturating at 114688) as uint8 codes.
    Up, as the DSL converts to e5m3 scale factors (cvt with rounding to +inf, nvvm_wrappers
    cvt_f32x4_to_fnv8e5m3x4), so a block's largest element never exceeds e2m1's 6 after scaling."""
    if (x < 0).any():
        raise ValueError("x: e5m3 scale factors are unsigned; got a negative value")
    table = _E5M3_TABLE.to(x.device)
    codes = torch.searchsorted(table, x.double().contiguous(), right=False)
    return codes.clamp(max=E5M3_MAX_CODE).to(torch.uint8)


def _scale_values(name: str, scales: torch.Tensor) -> torch.Tensor:
    scale = format_of(name).scale.scale.value
    if scale == "e8m0":
        return e8m0_values(scales)
    if scale == "e5m3":
        return e5m3_values(scales)
    return scales.to(torch.float64)


# -- the float64 reference ------------------------------------------------------------------------


def quantize(x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(elements, scales)`` of ``x`` (…, K) in format ``name``; K a multiple of its block.

    MX formats (OCP MX 1.0): a block's scale is 2**(floor(log2(amax)) - emax) of its largest
    magnitude amax (2**-127 for an all-zero block), and each element is x / scale rounded to
    the element type, saturating. nvfp4: the scale is amax / 6 rounded to e4m3, and each element
    x / scale rounded to e2m1 (0 where the scale is 0). fp4-e5m3-b32: the scale is amax / 6 rounded
    up to e5m3 (:func:`e5m3_codes`), the elements as nvfp4's. Elements: float8_e4m3fn (mxfp8) or
    uint8 e2m1 codes; scales: float8_e8m0fnu, float8_e4m3fn or uint8 e5m3 codes, (…, K / block)
    row-major."""
    fmt = format_of(name)
    block, data = fmt.scale.block, fmt.data.value
    if x.shape[-1] % block:
        raise ValueError(f"x: K = {x.shape[-1]} is not a multiple of the {name} block of {block}")
    blocks = x.double().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = blocks.abs().amax(dim=-1)
    if fmt.scale.scale.value == "e8m0":
        exp = torch.floor(torch.log2(amax.clamp(min=2.0 ** -E8M0_BIAS))) - _EMAX[data]
        exp = exp.clamp(-E8M0_BIAS, E8M0_BIAS)
        scales = e8m0(exp)
        scale_values = torch.exp2(exp)
    elif fmt.scale.scale.value == "e5m3":
        scales = e5m3_codes(amax / _MAX[data])
        scale_values = e5m3_values(scales)
    else:
        scales = (amax / _MAX[data]).clamp(max=_MAX["e4m3"]).to(torch.float8_e4m3fn)
        scale_values = scales.to(torch.float64)
    safe = torch.where(scale_values == 0, 1.0, scale_values)
    scaled = torch.where(scale_values.unsqueeze(-1) == 0, 0.0, blocks / safe.unsqueeze(-1)).reshape(x.shape)
    if data == "e4m3":
        elements = scaled.clamp(-_MAX[data], _MAX[data]).to(torch.float8_e4m3fn)
    else:
        elements = e2m1_codes(scaled)
    return elements, scales


def pack_operand(elements: torch.Tensor, name: str) -> torch.Tensor:
    """:func:`quantize`'s elements as ``scaled_gemm`` takes them: e4m3 as they are; e2m1 codes
    (…, K) packed two per byte into a contiguous (…, K / 2) torch.float4_e2m1fn_x2 tensor."""
    if format_of(name).data.value != "e2m1":
        return elements
    return pack_fp4(elements).contiguous().view(torch.float4_e2m1fn_x2)


def quantize_operand(x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(elements, scales)`` of ``x`` (…, K) in format ``name`` as ``scaled_gemm`` takes them:
    :func:`quantize`, its elements through :func:`pack_operand`; scales row-major (…, K / block),
    for :func:`to_blocked`."""
    elements, scales = quantize(x, name)
    return pack_operand(elements, name), scales


def _codes(elements: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes, one per element, of codes or of a packed (…, K / 2) float4_e2m1fn_x2 tensor."""
    if elements.dtype != torch.float4_e2m1fn_x2:
        return elements
    return unpack_fp4(elements.view(torch.uint8))


def dequantize(elements: torch.Tensor, scales: torch.Tensor, name: str) -> torch.Tensor:
    """``elements * scales`` per block, in float64: the operand a block-scaled GEMM multiplies.
    e2m1 elements: uint8 codes or packed (:func:`pack_operand`)."""
    fmt = format_of(name)
    values = e2m1_values(_codes(elements)) if fmt.data.value == "e2m1" else elements.to(torch.float64)
    return values * _scale_values(name, scales).repeat_interleave(fmt.scale.block, dim=-1)


def reference_mm(a: torch.Tensor, scale_a: torch.Tensor, w: torch.Tensor, scale_w: torch.Tensor,
                 name: str) -> torch.Tensor:
    """The float64 product of block-scaled ``a`` (M, K) and ``w`` (N, K) transposed: what
    ``scaled_gemm(a, w.t(), blocked scale_a, blocked scale_w, scale_format=name)`` computes
    before it rounds to its output type."""
    return dequantize(a, scale_a, name) @ dequantize(w, scale_w, name).t()


# -- the hardware layout --------------------------------------------------------------------------


def blocked_shape(rows: int, k: int, name: str) -> tuple[int, int, int, int, int]:
    """The shape of :func:`to_blocked`'s result for the scales of a (rows, K) operand."""
    blocks = k // format_of(name).scale.block
    return (math.ceil(rows / ATOM_ROWS), math.ceil(blocks / ATOM_BLOCKS), ATOM_LINES, ATOM_ROWS // ATOM_LINES,
            ATOM_BLOCKS)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Row-major (rows, K / block) scales in the layout the tcgen05 block-scaled MMA reads (module
    doc): a contiguous (ceil(rows / 128), ceil(blocks / 4), 32, 4, 4) tensor of the same dtype
    and device, padding zero. A batch (G, rows, K / block), one operand per group (the grouped
    calls' weights, the masked layout's activations): each entry's, stacked, (G, ...)."""
    if scales.dim() == 3:
        return torch.stack([to_blocked(entry) for entry in scales])
    if scales.dim() != 2:
        raise ValueError(f"scales: expected row-major (rows, K / block) scale factors (or a (G, rows, K / block) "
                         f"batch), got shape {list(scales.shape)}")
    rows, blocks = scales.shape
    bands, groups = math.ceil(rows / ATOM_ROWS), math.ceil(blocks / ATOM_BLOCKS)
    raw = scales.view(torch.uint8)
    padded = torch.zeros(bands * ATOM_ROWS, groups * ATOM_BLOCKS, dtype=torch.uint8, device=scales.device)
    padded[:rows, :blocks] = raw
    # padded[band * 128 + quarter * 32 + line, group * 4 + j] -> [band, group, line, quarter, j]
    out = padded.view(bands, ATOM_ROWS // ATOM_LINES, ATOM_LINES, groups, ATOM_BLOCKS).permute(0, 3, 2, 1, 4)
    return out.contiguous().view(scales.dtype)


def from_blocked(blocked: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """The inverse of :func:`to_blocked`: the row-major (rows, blocks) scales."""
    bands, groups = blocked.shape[:2]
    raw = blocked.view(torch.uint8).permute(0, 3, 2, 1, 4).reshape(bands * ATOM_ROWS, groups * ATOM_BLOCKS)
    return raw[:rows, :blocks].contiguous().view(blocked.dtype)


def grouped_bands(total_m: int, groups: int) -> int:
    """The 128-row bands of a contiguous grouped call's ``scale_a`` (:func:`to_blocked_grouped`):
    each group's rows start a band of their own, so G groups of total_M rows in all fill at most
    ceil(total_M / 128) + G - 1 of them, whatever the split (the kernel's bound: it never reads
    offs on the host)."""
    return math.ceil(total_m / ATOM_ROWS) + groups - 1


def group_row_ends(offs, total_m: int) -> list[int]:
    """The row ends of a contiguous grouped call's groups as its kernel reads ``offs`` (G cumulative
    row ends): each clamped into [previous end, total_M] (tilekiln/grouped.py)."""
    ends, previous = [], 0
    for end in (offs.tolist() if isinstance(offs, torch.Tensor) else offs):
        previous = min(max(int(end), previous), total_m)
        ends.append(previous)
    return ends


def to_blocked_grouped(scales: torch.Tensor, offs) -> torch.Tensor:
    """A contiguous grouped call's ``scale_a``: row-major (total_M, K / block) scales of its
    activations, ``offs`` its G cumulative row ends (a sequence, or a tensor, which is read on the
    host: a CUDA one synchronizes, so convert when the routing is made). Each group's rows are
    padded to a multiple of 128 and put after the previous group's bands, then laid out as
    :func:`to_blocked`: a contiguous (:func:`grouped_bands`, ceil(blocks / 4), 32, 4, 4) tensor,
    padding zero. Group g's rows start at band sum over h < g of ceil(rows_h / 128), where the
    kernel's tiles of group g read them."""
    if scales.dim() != 2:
        raise ValueError(f"scales: expected row-major (total_M, K / block) scale factors of every group's rows, "
                         f"got shape {list(scales.shape)}")
    rows, blocks = scales.shape
    ends = group_row_ends(offs, rows)
    raw = scales.view(torch.uint8)
    padded = torch.zeros(grouped_bands(rows, len(ends)) * ATOM_ROWS, blocks, dtype=torch.uint8, device=scales.device)
    start = band = 0
    for end in ends:
        padded[band * ATOM_ROWS:band * ATOM_ROWS + end - start] = raw[start:end]
        band += math.ceil((end - start) / ATOM_ROWS)
        start = end
    return to_blocked(padded.view(scales.dtype))


def reference_grouped_mm(a: torch.Tensor, scale_a: torch.Tensor, w: torch.Tensor, scale_w: torch.Tensor,
                         rows, name: str, masked: bool = False) -> torch.Tensor:
    """The float64 result of a block-scaled grouped call before it rounds to its output type, rows no
    group owns zero. Contiguous: ``a`` (total_M, K) with row-major ``scale_a`` (total_M, K / block),
    ``rows`` the G cumulative row ends; masked: ``a`` (G, M_max, K), ``scale_a`` (G, M_max, K / block),
    ``rows`` the G row counts. ``w`` (G, N, K) and ``scale_w`` (G, N, K / block): the experts'
    weights (``grouped_gemm`` takes ``w.transpose(1, 2)``). Elements and scales as :func:`dequantize`."""
    weights = [dequantize(w[g], scale_w[g], name) for g in range(w.shape[0])]
    if masked:
        out = torch.zeros(a.shape[0], a.shape[1], w.shape[1], dtype=torch.float64, device=a.device)
        for g, count in enumerate(rows.tolist() if isinstance(rows, torch.Tensor) else rows):
            count = min(max(int(count), 0), a.shape[1])
            out[g, :count] = dequantize(a[g, :count], scale_a[g, :count], name) @ weights[g].t()
        return out
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float64, device=a.device)
    start = 0
    for g, end in enumerate(group_row_ends(rows, a.shape[0])):
        out[start:end] = dequantize(a[start:end], scale_a[start:end], name) @ weights[g].t()
        start = end
    return out


# -- a call's checks ------------------------------------------------------------------------------


def block_request(name: str) -> tuple[tuple[str, object], ...]:
    """What a ``scale_format=name`` call asks of a kernel (GemmProblem.requested): its block scale."""
    return (("block_scale", BlockScaleCodec().request(format_of(name).scale)),)


def requested_format(requested: tuple[tuple[str, object], ...], element: torch.dtype) -> str | None:
    """The block-scaled format (of :data:`RUNTIME_BLOCK_FORMATS`) a call's ``requested`` asks for, or
    None. mxfp8 and mxfp4 ask for the same block scale (e8m0 per 32); the call's ``element`` type
    (a's dtype) tells them apart, and where it is neither's, the first is named, whose checks refuse it."""
    asked = dict(requested).get("block_scale")
    if asked is None:
        return None
    names = [name for name in RUNTIME_BLOCK_FORMATS if block_request(name)[0][1] == asked]
    return next((name for name in names if _element_dtype(name) == element), names[0])


def grouped_block_format(scale_format) -> str | None:
    """A grouped call's ``scale_format`` other than ``"blockwise"`` (which the caller takes first,
    tilekiln/blockwise.py): None (per-tensor or row-wise scales, as their shapes say,
    torch._scaled_grouped_mm's way) or a block-scaled format (mxfp8, nvfp4, ...: the CC 10.x bundles'
    block-scaled grouped kernels, this module); ValueError naming the argument otherwise."""
    if scale_format is None or scale_format in RUNTIME_BLOCK_FORMATS:
        return scale_format
    raise ValueError(f"scale_format: grouped calls read per-tensor or row-wise scales from their shapes (pass None), "
                     f"or take 'blockwise' or a block-scaled format ({', '.join(map(repr, RUNTIME_BLOCK_FORMATS))}); "
                     f"got {scale_format!r}")


def _element_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``name``'s operands (float4_e2m1fn_x2 holds two e2m1 elements)."""
    return getattr(torch, DTYPES[format_of(name).data.value].torch)


def k_elements(a: torch.Tensor, name: str) -> int:
    """K of a block-scaled call in elements: ``a``'s second extent, twice it for packed e2m1."""
    return a.shape[1] * (2 if format_of(name).data.value == "e2m1" else 1)


def check_block_scales(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, name: str) -> None:
    """Check a block-scaled call's operands and scales; an error names the argument, what is wrong
    and how to fix it. ``a`` (M, K) and ``b`` (K, N) K-major (``weight.t()``), ``scale_a`` and
    ``scale_b`` :func:`to_blocked` of their row-major scales (of a and of weight)."""
    check_block_operands(a, b, name)
    check_block_scale_tensors(a, b, scale_a, scale_b, name)


def check_block_elements(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    """Both operands hold ``name``'s element type (TypeError naming the argument)."""
    element = _element_dtype(name)
    packed = " packed two per byte" if element == torch.float4_e2m1fn_x2 else ""
    for which, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != element:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{which}: {name} takes {element} elements{packed}, got {got}; quantize it with "
                            f"tilekiln.blockscaled.quantize_operand(x, {name!r})")


def check_block_operands(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    """The operands' part of :func:`check_block_scales`: element type, 2-D, K, both K-major (packed
    e2m1 along K, so K counts twice a's second extent)."""
    fmt = format_of(name)
    block, step = fmt.scale.block, ATOM_BLOCKS * fmt.scale.block
    check_block_elements(a, b, name)
    for which, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"{which}: {name} scaled_gemm takes 2-D operands a (M, K) and b (K, N), got "
                             f"{which} of shape {list(t.shape)}")
    packed = fmt.data.value == "e2m1"
    if packed and a.stride(1) != 1:
        raise ValueError(f"a: {name} scaled_gemm takes a row-major (M, K / 2) float4_e2m1fn_x2 tensor, two elements "
                         f"of K per byte; got strides {list(a.stride())}")
    k = k_elements(a, name)
    if k % step:
        extent = f" (a.shape[1] = {a.shape[1]} bytes of two elements)" if packed else ""
        raise ValueError(f"a: K = {k}{extent} is not a multiple of {step}; {name} kernels read scale factors in "
                         f"groups of {ATOM_BLOCKS} blocks of {block} (pad K with zeros to a multiple of {step})")
    if (b.shape[0] > 1 or packed) and b.stride(0) != 1:
        raise ValueError(f"b: {name} scaled_gemm takes b K-major, a (N, K) row-major weight's transpose "
                         f"(weight.t()); got strides {list(b.stride())}")


def check_block_scale_tensors(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, name: str) -> None:
    """The scales' part of :func:`check_block_scales`: dtype, blocked shape, contiguity, device."""
    fmt = format_of(name)
    block = fmt.scale.block
    m, k = a.shape[0], k_elements(a, name)
    n = b.shape[1]
    device = a.get_device()
    dtype = scale_dtype(name)
    for which, scale, rows, source in (("scale_a", scale_a, m, "a's"), ("scale_b", scale_b, n, "the weight's")):
        fix = (f"pass to_blocked(s) of {source} row-major ({rows}, {k // block}) {fmt.scale.scale.value} scales "
               f"(tilekiln.blockscaled.to_blocked)")
        _check_blocked(which, scale, blocked_shape(rows, k, name), dtype, device, fix)


def _check_blocked(which: str, scale, shape: tuple[int, ...], dtype: torch.dtype, device: int, fix: str) -> None:
    """``scale`` is a contiguous ``dtype`` tensor of ``shape`` on ``device``: TypeError or ValueError
    naming ``which``, listing what is wrong, then ``fix``."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{which}: expected a {dtype} CUDA tensor of shape {list(shape)}; got "
                        f"{type(scale).__name__}; {fix}")
    problems = []
    if scale.dtype != dtype:
        problems.append(f"dtype {scale.dtype}, not {dtype}")
    if tuple(scale.shape) != shape:
        problems.append(f"shape {list(scale.shape)}, not {list(shape)}")
    elif not scale.is_contiguous():
        problems.append(f"strides {list(scale.stride())}: not contiguous, so not the hardware's layout")
    if scale.get_device() != device:
        problems.append(f"on {scale.device}, not the inputs' device")
    if problems:
        raise ValueError(f"{which}: {'; '.join(problems)}; {fix}")


def check_grouped_block_operands(a: torch.Tensor, b: torch.Tensor, name: str, masked: bool) -> None:
    """A block-scaled grouped call's operands: ``name``'s element type, ``a`` (total_M, K) (masked:
    (G, M_max, K)) row-major and ``b`` (G, K, N) K-major (a (G, N, K) weight's ``.transpose(1, 2)``),
    K a multiple of 4 blocks; packed e2m1 along K, so K counts twice a's last extent. The shapes'
    agreement is make_grouped_problem's (tilekiln/grouped.py)."""
    fmt = format_of(name)
    step = ATOM_BLOCKS * fmt.scale.block
    check_block_elements(a, b, name)
    dims, layout = (3, "(G, M_max, K)") if masked else (2, "(total_M, K)")
    if a.dim() != dims:
        raise ValueError(f"a: a {name} grouped call takes a {layout}, got shape {list(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"b: a {name} grouped call takes b (G, K, N), a (G, N, K) weight's .transpose(1, 2), got "
                         f"shape {list(b.shape)}")
    packed = fmt.data.value == "e2m1"
    if packed and a.stride(-1) != 1:
        raise ValueError(f"a: {name} takes row-major float4_e2m1fn_x2 activations, two elements of K per byte; got "
                         f"strides {list(a.stride())}")
    k = a.shape[-1] * (2 if packed else 1)
    if k % step:
        raise ValueError(f"a: K = {k} is not a multiple of {step}; {name} kernels read scale factors in groups of "
                         f"{ATOM_BLOCKS} blocks of {fmt.scale.block} (pad K with zeros to a multiple of {step})")
    if (b.shape[1] > 1 or packed) and b.stride(1) != 1:
        raise ValueError(f"b: {name} grouped calls take b K-major, a (G, N, K) weight's .transpose(1, 2); got strides "
                         f"{list(b.stride())}")


def check_grouped_block_scales(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, name: str, masked: bool) -> None:
    """A block-scaled grouped call's scales (after :func:`check_grouped_block_operands`): ``scale_b``
    :func:`to_blocked` of the (G, N, K / block) weight scales, (G, ceil(N / 128), ceil(K / block / 4),
    32, 4, 4); ``scale_a`` :func:`to_blocked_grouped` of the (total_M, K / block) activation scales,
    (:func:`grouped_bands`, ceil(K / block / 4), 32, 4, 4), or masked, :func:`to_blocked` of the (G,
    M_max, K / block) ones; each of the format's scale dtype, contiguous, on a's device."""
    fmt = format_of(name)
    block, scale_name = fmt.scale.block, fmt.scale.scale.value
    groups, n = b.shape[0], b.shape[-1]
    k = a.shape[-1] * (2 if fmt.data.value == "e2m1" else 1)
    dtype, device = scale_dtype(name), a.get_device()
    _check_blocked("scale_b", scale_b, (groups, *blocked_shape(n, k, name)), dtype, device,
                   f"pass to_blocked(s) of the weights' row-major ({groups}, {n}, {k // block}) {scale_name} scales "
                   "(tilekiln.blockscaled.to_blocked)")
    if masked:
        rows = a.shape[1]
        _check_blocked("scale_a", scale_a, (groups, *blocked_shape(rows, k, name)), dtype, device,
                       f"pass to_blocked(s) of a's row-major ({groups}, {rows}, {k // block}) {scale_name} scales "
                       "(tilekiln.blockscaled.to_blocked)")
        return
    rows = a.shape[0]
    _check_blocked("scale_a", scale_a, blocked_shape(grouped_bands(rows, groups) * ATOM_ROWS, k, name), dtype, device,
                   f"pass to_blocked_grouped(s, offs) of a's row-major ({rows}, {k // block}) {scale_name} scales, "
                   f"each group's rows padded to a multiple of {ATOM_ROWS} (tilekiln.blockscaled.to_blocked_grouped)")


def check_scale_pointers(scale_a: torch.Tensor, scale_b: torch.Tensor) -> None:
    """The scale factors' base addresses are 16-byte aligned, as TMA reads them (every call)."""
    for which, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if scale.data_ptr() % 16:
            raise ValueError(f"{which}: data pointer is not 16-byte aligned (a view at an offset); pass a fresh "
                             "tensor from to_blocked")
