"""The kernel spec: each kernel field, element type, layout letter, contract, family argument list
and manifest record, stated once for the builder and the runtime.

Standard library only. What is derived from it, and where:

- the catalog's pydantic models, the JSON Schema and the template manifests'
  ``supports`` (builder/load/models.py) from :class:`KernelConfig`'s fields;
- the kernel id grammar (:func:`format_kernel_id`, :func:`parse_kernel_id`) from
  each field's codec;
- the render context's config values (builder/render.py) from the fields;
- the glue's argument structs (templates/link/glue.c.j2), the ctypes packing
  (tilekiln/_native.py) and each template's ``__call__`` and fake arguments
  (templates/common/) from :data:`FAMILIES`;
- the manifest's kernel records, written by the builder and read by the
  runtime, from :class:`KernelRecord`;
- the element sizes the runtime checks strides with, from :data:`DTYPES`.

Adding a kernel field is one line in :class:`KernelConfig` (its codec, default
and description); adding an operand is one entry in a family's arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Callable

# -- element types -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DTypeSpec:
    """One element type: its token (in YAML, ids, manifests and the runtime), width and other names."""

    token: str
    bits: int
    cutlass: str  # the CuTe DSL type the templates use
    torch: str | None  # the torch dtype's name, where torch has one
    typestr: str | None = None  # __cuda_array_interface__ typestr, where numpy has one


DTYPES: dict[str, DTypeSpec] = {d.token: d for d in (
    DTypeSpec("bf16", 16, "BFloat16", "bfloat16"),
    DTypeSpec("f16", 16, "Float16", "float16", "<f2"),
    DTypeSpec("f32", 32, "Float32", "float32", "<f4"),
    DTypeSpec("tf32", 32, "TFloat32", None),
    DTypeSpec("e4m3", 8, "Float8E4M3FN", "float8_e4m3fn"),
    DTypeSpec("e5m2", 8, "Float8E5M2", "float8_e5m2"),
    DTypeSpec("i8", 8, "Int8", "int8", "|i1"),
    DTypeSpec("u8", 8, "Uint8", "uint8", "|u1"),
    DTypeSpec("i32", 32, "Int32", "int32", "<i4"),
    DTypeSpec("e2m1", 4, "Float4E2M1FN", "float4_e2m1fn_x2"),
    DTypeSpec("e8m0", 8, "Float8E8M0FNU", "float8_e8m0fnu"),
    DTypeSpec("e5m3", 8, "FloatNV8E5M3FNU", None),
)}


class _DTypeMembers(str, enum.Enum):
    @property
    def bits(self) -> int:
        return DTYPES[self.value].bits

    @property
    def cutlass_name(self) -> str:
        return DTYPES[self.value].cutlass

    def elements_per(self, nbytes: int) -> int:
        """How many elements fill ``nbytes`` bytes (16 B of bf16 = 8)."""
        return nbytes * 8 // self.bits


DType = _DTypeMembers("DType", [(t.upper(), t) for t in DTYPES], module=__name__)
DType.__doc__ = "An element type, spelled by its token (DType('bf16'))."


# The element types a scaled (fp8) GEMM takes.
SCALED_INPUTS = ("e4m3", "e5m2")
# The output types an epilogue writes through a per-tensor output scale (scale_result), each with
# the largest finite value it saturates to (torch._scaled_mm's fp8 outputs).
SCALED_OUTPUTS = {"e4m3": 448.0}


def itemsize(token: str) -> int:
    """Bytes per element of a byte-addressable type (the runtime's operands)."""
    return DTYPES[token].bits // 8


# -- enumerations and value types of the fields --------------------------------------------------


class Schedule(str, enum.Enum):
    """How the consumer warpgroups share work (sm90). cooperative: all work on one CTA tile,
    split along M. pingpong: each owns whole tiles and the two alternate, so one's epilogue
    overlaps the other's mainloop."""

    COOPERATIVE = "cooperative"
    PINGPONG = "pingpong"


class Raster(str, enum.Enum):
    """Order in which a persistent CTA walks output tiles: down M first or along N first."""

    M = "m"
    N = "n"


class Scheduler(str, enum.Enum):
    """How a persistent kernel's clusters find their output tiles. static: a grid of as many clusters
    as the device holds at once, cluster p walking work items p, p + P, ... . clc: a grid of every
    output cluster tile (a grouped kernel's: of the host's bound on them, clusters past the device's
    count stopping at once); a running cluster takes the next tile by cancelling a cluster not yet
    launched (cluster launch control, ``clusterlaunchcontrol.try_cancel``, SM 10.x), so clusters
    that finish early take more tiles."""

    STATIC = "static"
    CLC = "clc"


class Activation(str, enum.Enum):
    """The elementwise function the epilogue applies to the scaled fp32 accumulator before it rounds
    it to the output type. gelutanh is GELU's tanh approximation, geluerf the exact (erf) form.
    swiglu is gated: B's rows interleave gate and up in blocks of :data:`GLU_BLOCK`, and the kernel
    writes ``silu(gate) * up``, N/2 columns (docs/runtime.md, the SwiGLU weight layout)."""

    NONE = "none"
    RELU = "relu"
    SILU = "silu"
    GELU_TANH = "gelutanh"
    GELU_ERF = "geluerf"
    SWIGLU = "swiglu"

    @property
    def gated(self) -> bool:
        """It pairs two of the GEMM's columns into one output column: C has N/2 columns."""
        return self is Activation.SWIGLU


# Rows of a gated (swiglu) weight per gate or up block: rows [gate 0, up 0, gate 1, up 1, ...]
# of GLU_BLOCK each, so output column j of block b pairs GEMM columns 2*b*GLU_BLOCK + j (gate) and
# (2*b + 1)*GLU_BLOCK + j (up). A kernel fuses it when I (N/2) is a multiple of it.
GLU_BLOCK = 64


class Scaling(str, enum.Enum):
    """How an 8-bit float GEMM's scales apply. tensor: one float32 factor per operand, applied to
    the accumulator in the epilogue (torch._scaled_mm's per-tensor mode). blockwise: a float32
    factor per row of A and 128 elements of K, and per 128x128 block of B (the DeepSeek-V3 recipe);
    each 128-wide K block's partial sum is scaled and added into an fp32 accumulator in registers.
    rowwise: a float32 factor per row of A (scale_a (M, 1)) and per column of B (scale_b (1, N)),
    both applied to the fp32 accumulator in the epilogue (torch._scaled_mm's row-wise mode)."""

    TENSOR = "tensor"
    BLOCKWISE = "blockwise"
    ROWWISE = "rowwise"


# Elements of K (and of B's N) one blockwise scale covers; the tile K of a blockwise kernel.
BLOCKWISE_BLOCK = 128
# How a blockwise call asks for its kernels (GemmProblem.requested holds it).
BLOCKWISE_REQUEST = ("scaling", Scaling.BLOCKWISE.value)


def blockwise_b_blocks(tile_m: int, tile_n: int, swap_ab: bool = False) -> int:
    """The B scale blocks one blockwise tile spans along the problem's N: one where the tile's extent
    there divides the block; unswapped, two where tile N is a multiple of half a block up to two
    blocks (tile N 192: a tile starts at column 0 or 64 of a block and ends in the next), split at a
    multiple of 64 columns; 0 for any other extent, which rule BLOCKWISE refuses. A swapped kernel's
    tile M runs along N, and its promotion takes one B scale for all its rows, so only a tile M that
    divides the block serves."""
    if swap_ab:
        return 1 if BLOCKWISE_BLOCK % tile_m == 0 else 0
    if BLOCKWISE_BLOCK % tile_n == 0:
        return 1
    return 2 if tile_n % (BLOCKWISE_BLOCK // 2) == 0 and tile_n <= 2 * BLOCKWISE_BLOCK else 0


def blockwise_partials(tile_m: int, tile_n: int, swap_ab: bool = False) -> int:
    """The fp32 partial sums a blockwise kernel's consumer holds beside its accumulator. Two where a
    tile lies in one B scale block: one K block's WGMMAs write one while the other is promoted. One
    where it spans two (tile N 192): three sets of 96 registers would not fit the 232 a consumer
    thread gets, so each block's WGMMAs finish before their promotion, which the other consumer
    warpgroup's WGMMAs overlap (rule REGISTER-BUDGET counts the sets)."""
    return 2 if blockwise_b_blocks(tile_m, tile_n, swap_ab) == 1 else 1


class Bias(str, enum.Enum):
    """The element type of the per-column bias vector (length N) the epilogue adds to the scaled fp32
    accumulator before the activation, as ``F.linear`` does; none: the kernel adds no bias and never
    reads the argument."""

    NONE = "none"
    BF16 = "bf16"
    F32 = "f32"

    @property
    def dtype(self) -> DType | None:
        """The bias vector's element type; None for none."""
        return None if self is Bias.NONE else DType(self.value)


class Residual(str, enum.Enum):
    """Whether the epilogue adds a residual C (M, N) of the output's type to its result, after the
    activation: ``out = act(acc * scales + bias) + C`` (the down projection of an MLP block added to
    its input). none: the kernel never reads the argument."""

    NONE = "none"
    ADD = "add"


class Scalars(str, enum.Enum):
    """The epilogue's by-value coefficients (the gemm family's ValueArgs alpha and beta, Python numbers
    in the call). alphabeta: ``out = act(alpha * acc * scales + bias) + beta * residual``: alpha scales
    the product before the bias and the activation, beta the residual after them, so with neither bias
    nor activation it is torch.addmm's ``beta * input + alpha * (mat1 @ mat2)``; a kernel without a
    residual never reads beta. none: the kernel never reads either."""

    NONE = "none"
    ALPHA_BETA = "alphabeta"


class Operand(str, enum.Enum):
    """A GEMM input in the problem's terms: A (M x K) or B (K x N)."""

    A = "a"
    B = "b"


@dataclass(frozen=True)
class DTypes:
    a: DType
    b: DType
    acc: DType
    c: DType

    @property
    def tokens(self) -> tuple[str, str, str, str]:
        return (self.a.value, self.b.value, self.acc.value, self.c.value)

    @property
    def scaled(self) -> bool:
        """8-bit float inputs carry per-tensor scales, which the epilogue applies."""
        return self.a.value in SCALED_INPUTS

    @property
    def scaled_output(self) -> bool:
        """C is an 8-bit float: the epilogue multiplies its fp32 result by scale_result and
        saturates it to C's finite range."""
        return self.c.value in SCALED_OUTPUTS


# BLAS letters: A ``t`` = row-major (K-major), ``n`` = M-major; B ``n`` = column-major K x N
# (K-major), ``t`` = N-major. C is always row-major. Majorness in the runtime's terms: A "k"|"m",
# B "k"|"n", C "n".
LAYOUT_CODES = ("tn", "nn", "nt", "tt")


@dataclass(frozen=True)
class Layout:
    a_k_major: bool
    b_k_major: bool

    @property
    def swapped(self) -> Layout:
        """The layout of the swapped product B^T A^T: its A is this B and its B this A."""
        return Layout(a_k_major=self.b_k_major, b_k_major=self.a_k_major)

    @property
    def code(self) -> str:
        return ("t" if self.a_k_major else "n") + ("n" if self.b_k_major else "t")

    @property
    def majors(self) -> tuple[str, str, str]:
        """Majorness of A, B and C in the runtime's letters."""
        return ("k" if self.a_k_major else "m", "k" if self.b_k_major else "n", "n")

    @classmethod
    def from_code(cls, code: str) -> Layout:
        if code not in LAYOUT_CODES:
            raise ValueError(f"layout must be one of {', '.join(LAYOUT_CODES)}, got {code!r}")
        return cls(a_k_major=code[0] == "t", b_k_major=code[1] == "n")


@dataclass(frozen=True)
class Tile:
    """The CTA tile: the M x N output block one CTA computes and the K elements of one
    pipeline stage. Under a 2-CTA MMA a CTA pair covers 2M x N."""

    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Cluster:
    m: int
    n: int

    @property
    def size(self) -> int:
        return self.m * self.n


@dataclass(frozen=True)
class BlockScale:
    """Block-scaled operands: one ``scale``-typed factor per ``block`` consecutive K elements."""

    scale: DType
    block: int


@dataclass(frozen=True)
class BlockScaleFormat:
    """A named block-scaled format: the element type of A and B and their block scale."""

    data: DType
    scale: BlockScale


# The block-scaled formats (tilekiln/blockscaled.py; scaled_gemm's scale_format): OCP MX mxfp8 and
# mxfp4 (a power-of-two e8m0 scale per 32 elements), NVIDIA's nvfp4 (an e4m3 scale per 16), and
# fp4 with an unsigned e5m3 scale per 32, which only SM 10.7 has (named as the block_scale_combos
# of catalog/hardware/sm107.yaml name it).
BLOCK_SCALE_FORMATS = {
    "mxfp8": BlockScaleFormat(DType("e4m3"), BlockScale(DType("e8m0"), 32)),
    "nvfp4": BlockScaleFormat(DType("e2m1"), BlockScale(DType("e4m3"), 16)),
    "mxfp4": BlockScaleFormat(DType("e2m1"), BlockScale(DType("e8m0"), 32)),
    "fp4-e5m3-b32": BlockScaleFormat(DType("e2m1"), BlockScale(DType("e5m3"), 32)),
}
# The element types of the block-scaled formats (a block-scaled call's inputs besides SCALED_INPUTS).
BLOCK_SCALED_INPUTS = tuple(dict.fromkeys(f.data.value for f in BLOCK_SCALE_FORMATS.values()))


# -- codecs: how a field's value is spelled in YAML/JSON, in ids, and held ---------------------


class Codec:
    """One kind of field value. ``plain`` is its JSON/YAML spelling, ``token`` its spelling in a
    kernel id (``pattern`` matches it, ``form`` describes it to people), ``shape`` names the
    YAML type the builder validates."""

    shape: str
    pattern: str
    form: str

    def plain(self, value: Any) -> Any:
        return value

    def typed(self, plain: Any) -> Any:
        return plain

    def request(self, value: Any) -> Any:
        """The value as a call asks for it (``GemmProblem.requested``): hashable, since requests key
        the runtime's plan cache, and equal exactly for equal values."""
        return self.plain(value)

    def token(self, value: Any) -> str:
        return str(value)

    def untoken(self, text: str) -> Any:
        return self.typed(text)

    def describe(self, value: Any) -> str:
        """The value in a message."""
        return self.token(value)


class EnumCodec(Codec):
    def __init__(self, enum_type: type[enum.Enum], prefix: str = ""):
        self.enum, self.prefix, self.shape = enum_type, prefix, enum_type.__name__
        self.pattern = re.escape(prefix) + "(?:" + "|".join(re.escape(m.value) for m in enum_type) + ")"
        values = "|".join(m.value for m in enum_type)
        self.form = f"{prefix}<{values}>" if prefix else values

    def plain(self, value):
        return value.value

    def typed(self, plain):
        return self.enum(plain)

    def token(self, value):
        return self.prefix + value.value

    def untoken(self, text):
        return self.enum(text[len(self.prefix):])

    def describe(self, value):
        return value.value


class FlagCodec(Codec):
    """A boolean whose id token is a word, present when true."""

    shape = "bool"

    def __init__(self, word: str):
        self.word, self.pattern, self.form = word, re.escape(word), word

    def token(self, value):
        return self.word

    def untoken(self, text):
        return True

    def describe(self, value):
        return "true" if value else "false"


class CountCodec(Codec):
    """A positive integer, spelled ``<prefix><n><suffix>`` in ids."""

    shape = "positive_int"

    def __init__(self, prefix: str = "", suffix: str = ""):
        self.prefix, self.suffix = prefix, suffix
        self.pattern = re.escape(prefix) + r"[1-9][0-9]*" + re.escape(suffix)
        self.form = f"{prefix}<n>{suffix}"

    def token(self, value):
        return f"{self.prefix}{value}{self.suffix}"

    def untoken(self, text):
        return int(text[len(self.prefix):len(text) - len(self.suffix)])

    def describe(self, value):
        return str(value)


class StagesCodec(CountCodec):
    """A positive stage count, or ``auto`` (None: as many as shared memory holds)."""

    shape = "stages"

    def __init__(self):
        super().__init__("s")

    def plain(self, value):
        return "auto" if value is None else value

    def typed(self, plain):
        return None if plain == "auto" else plain


class ExtentsCodec(Codec):
    """A small dataclass of positive integers, spelled ``<prefix>AxBxC`` in ids and as a list in YAML."""

    def __init__(self, value_type: type, prefix: str = ""):
        self.type, self.prefix = value_type, prefix
        self.names = tuple(f.name for f in dataclasses.fields(value_type))
        self.shape = f"positive_ints{len(self.names)}"
        self.pattern = re.escape(prefix) + "x".join([r"[1-9][0-9]*"] * len(self.names))
        self.form = prefix + "x".join(f"<{n.upper()}>" for n in self.names)

    def plain(self, value):
        return [getattr(value, n) for n in self.names]

    def typed(self, plain):
        return self.type(*plain)

    def token(self, value):
        return self.prefix + "x".join(str(getattr(value, n)) for n in self.names)

    def untoken(self, text):
        return self.type(*(int(p) for p in text[len(self.prefix):].split("x")))


_DT = "(?:" + "|".join(sorted((re.escape(t) for t in DTYPES), key=len, reverse=True)) + ")"


class DTypesCodec(Codec):
    shape = "dtypes"
    pattern = "_".join([_DT] * 4)
    form = "<a>_<b>_<acc>_<c>"

    def plain(self, value):
        return {"a": value.a.value, "b": value.b.value, "acc": value.acc.value, "c": value.c.value}

    def typed(self, plain):
        return DTypes(DType(plain["a"]), DType(plain["b"]), DType(plain["acc"]), DType(plain["c"]))

    def token(self, value):
        return "_".join(value.tokens)

    def untoken(self, text):
        return DTypes(*(DType(t) for t in text.split("_")))

    def describe(self, value):
        return "/".join(value.tokens)


class LayoutCodec(Codec):
    shape = "layout"
    pattern = "(?:" + "|".join(LAYOUT_CODES) + ")"
    form = "|".join(LAYOUT_CODES)

    def plain(self, value):
        return value.code

    def typed(self, plain):
        return Layout.from_code(plain)

    def token(self, value):
        return value.code


class BlockScaleCodec(Codec):
    shape = "block_scale"
    pattern = "sf" + _DT + r"x[1-9][0-9]*"
    form = "sf<scale>x<block>"

    def plain(self, value):
        return None if value is None else {"scale": value.scale.value, "block": value.block}

    def typed(self, plain):
        return None if plain is None else BlockScale(DType(plain["scale"]), plain["block"])

    def token(self, value):
        return f"sf{value.scale.value}x{value.block}"

    def untoken(self, text):
        scale, block = text[2:].rsplit("x", 1)
        return BlockScale(DType(scale), int(block))

    def describe(self, value):
        return "none" if value is None else f"{value.scale.value}x{value.block}"

    def request(self, value):
        return None if value is None else self.token(value)


class OperandsCodec(Codec):
    """A set of problem operands, spelled ``<prefix><letters>`` in ids (sorted) and as a list in YAML."""

    shape = "operands"

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.pattern = re.escape(prefix) + "a?b?"
        self.form = f"{prefix}<a|b|ab>"

    def plain(self, value):
        return sorted(o.value for o in value)

    def typed(self, plain):
        return frozenset(Operand(o) for o in plain)

    def token(self, value):
        return self.prefix + "".join(sorted(o.value for o in value))

    def untoken(self, text):
        return frozenset(Operand(c) for c in text[len(self.prefix):])


class NameCodec(Codec):
    def __init__(self, shape: str, pattern: str, form: str):
        self.shape, self.pattern, self.form = shape, pattern, form


# -- kernel fields ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """What the spec says of one kernel field.

    ``positional``: always in the id, in field order; the others appear as options in field order,
    only when they differ from the default. ``selection``: the runtime tells kernels apart by it
    (``selection_view`` narrows the value to the part it sees). ``support``: the template manifest
    key that lists the values a template builds (``"values"``), or that allows a non-default value
    at all (``"flag"``); None: any template builds any value the rules accept. ``requested``: it
    changes what the kernel computes, and the caller says which value it wants (the runtime's
    ``GemmProblem.requested``). ``applied_after``: where no kernel computes a requested value,
    torch can apply it to a kernel's result (an epilogue); False: only a kernel with exactly the
    value can run the call (blockwise scaling changes the mainloop).
    """

    codec: Codec
    description: str
    positional: bool = False
    selection: bool = False
    selection_view: Callable[[Any], Any] | None = None
    support: tuple[str, str] | None = None  # (supports key, "values" | "flag")
    requested: bool = False  # the call asks for a value; a kernel runs the call only with exactly that one
    applied_after: bool = True  # a requested value no kernel computes is applied by torch after one


def _field(codec: Codec, description: str, default: Any = dataclasses.MISSING, **spec: Any):
    return field(default=default, metadata={"spec": FieldSpec(codec, description, **spec)})


FAMILY_NAMES = ("gemm", "grouped", "grouped_masked")
# ASCII digits only (`\d` also matches Arabic-Indic and full-width digits), at most four:
# a pipeline name is part of every kernel id, which names files.
PIPELINE_PATTERN = r"sm[1-9][0-9]{1,3}"


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """One kernel: C[M,N] = A[M,K] @ B[K,N], batched over L, as its family computes it.

    Canonical: a choice equal to its default is the default, so equal kernels compare and
    name equal. tile, cluster and stages are in the MMA's terms (under swap_ab, its M runs
    along the problem's N); dtypes, layout and the kernel's arguments stay the problem's.
    """

    family: str = _field(NameCodec("family", "|".join(FAMILY_NAMES), "|".join(FAMILY_NAMES)), "kernel family (its arguments: FAMILIES)",
                         "gemm", positional=True, selection=True)
    pipeline: str = _field(NameCodec("pipeline", PIPELINE_PATTERN, "sm<NN>"), "GPU pipeline, e.g. sm90",
                           positional=True, selection=True)
    dtypes: DTypes = _field(DTypesCodec(), "element types of A, B, the accumulator and C",
                            positional=True, selection=True, support=("dtypes", "values"))
    layout: Layout = _field(LayoutCodec(), "BLAS letters: A t=K-major/n=M-major, B n=K-major/t=N-major",
                            positional=True, selection=True, support=("layouts", "values"))
    tile: Tile = _field(ExtentsCodec(Tile), "CTA tile [M, N, K]", positional=True, selection=True,
                        selection_view=lambda t: (t.m, t.n))
    cluster: Cluster = _field(ExtentsCodec(Cluster, "c"), "cluster shape [M, N] in CTAs", positional=True,
                              selection=True)
    schedule: Schedule = _field(EnumCodec(Schedule), "how consumer warpgroups share work", Schedule.COOPERATIVE,
                                support=("schedules", "values"))
    # C^T = B^T A^T: a skinny M (a decode batch) fills the MMA's N instead of padding its 64-row M.
    swap_ab: bool = _field(FlagCodec("swapab"), "compute C^T = B^T A^T; tile and cluster in the MMA's terms",
                           False, selection=True, support=("swap_ab", "flag"))
    cta_group: int = _field(CountCodec(suffix="cta"), "CTAs per MMA instruction: 1, or 2 for a CTA pair", 1,
                            support=("cta_groups", "values"))
    # The MMA itself multiplies by the block scales: only a kernel with exactly the call's runs it.
    block_scale: BlockScale | None = _field(BlockScaleCodec(), "block-scaled operands: scale type and block", None,
                                            selection=True, support=("block_scales", "values"), requested=True,
                                            applied_after=False)
    scaling: Scaling = _field(EnumCodec(Scaling), "how an fp8 GEMM's scales apply: per tensor or per block",
                              Scaling.TENSOR, selection=True, support=("scalings", "values"), requested=True,
                              applied_after=False)
    # Added before the activation: act(acc * scale + bias), as F.linear followed by the activation.
    bias: Bias = _field(EnumCodec(Bias, "bias"), "element type of the per-column bias the epilogue adds before "
                        "the activation, or none", Bias.NONE, selection=True, support=("biases", "values"),
                        requested=True)
    activation: Activation = _field(EnumCodec(Activation), "the epilogue's elementwise function of the accumulator",
                                    Activation.NONE, selection=True, support=("activations", "values"),
                                    requested=True)
    # Added after the activation: act(acc * scale + bias) + residual, as F.linear, the activation,
    # then the residual add of a transformer block.
    residual: Residual = _field(EnumCodec(Residual, "res"), "whether the epilogue adds a residual of C's shape "
                                "and type after the activation", Residual.NONE, selection=True,
                                support=("residuals", "values"), requested=True)
    # alpha scales the product, beta the residual: act(alpha * acc * scale + bias) + beta * residual.
    # Only a kernel with them runs a call that passes them: torch cannot apply alpha after a bias or
    # an activation.
    scalars: Scalars = _field(EnumCodec(Scalars), "whether the epilogue multiplies the product by alpha and the "
                              "residual by beta, numbers passed by value", Scalars.NONE, selection=True,
                              support=("scalars", "values"), requested=True, applied_after=False)
    # The runtime tells the two apart: it prefers clc where a kernel differs only by it (tilekiln/select.py).
    scheduler: Scheduler = _field(EnumCodec(Scheduler), "how persistent clusters find their tiles: a static "
                                  "walk, or cluster launch control (clc)", Scheduler.STATIC, selection=True,
                                  support=("schedulers", "values"))
    raster: Raster = _field(EnumCodec(Raster, "r"), "order of the persistent tile walk", Raster.M)
    swizzle: int = _field(CountCodec("sw"), "tiles per band in the raster walk (L2 reuse)", 1)
    # Data read once (the weights of a skinny GEMM) gives way first, so the operand every CTA
    # re-reads stays in the L2.
    evict_first: frozenset[Operand] = _field(
        OperandsCodec("ef"), "operands (a, b) whose loads hint the L2 to evict them first: data read once",
        frozenset(), support=("evict_first", "flag"))
    stages: int | None = _field(StagesCodec(), "shared-memory pipeline depth, or auto", None)

    @property
    def mma_evict_first(self) -> tuple[bool, bool]:
        """Whether the MMA's own A and B loads are hinted EVICT_FIRST (the problem's B and A when swapped)."""
        a, b = Operand.A in self.evict_first, Operand.B in self.evict_first
        return (b, a) if self.swap_ab else (a, b)

    @property
    def mma_dtypes(self) -> DTypes:
        """The types of the MMA's own A and B operands (the problem's B and A when swapped)."""
        d = self.dtypes
        return DTypes(d.b, d.a, d.acc, d.c) if self.swap_ab else d

    @property
    def mma_layout(self) -> Layout:
        """The majorness of the MMA's own A and B operands."""
        return self.layout.swapped if self.swap_ab else self.layout

    def plain(self) -> dict[str, Any]:
        """Every field in its JSON spelling (the manifest's ``config``)."""
        return {f.name: spec_of(f).codec.plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> KernelConfig:
        """The inverse of :meth:`plain`; fields it lacks take their defaults (an older writer's)."""
        return cls(**{f.name: spec_of(f).codec.typed(data[f.name]) for f in dataclasses.fields(cls)
                      if f.name in data})

    def selection_key(self) -> tuple:
        """What the runtime's selection sees of the kernel (besides its contract)."""
        out = []
        for f in dataclasses.fields(self):
            s = spec_of(f)
            if s.selection:
                value = getattr(self, f.name)
                out.append(s.selection_view(value) if s.selection_view else value)
        return tuple(out)


def spec_of(f: dataclasses.Field) -> FieldSpec:
    return f.metadata["spec"]


def config_fields() -> tuple[tuple[dataclasses.Field, FieldSpec], ...]:
    """Every kernel field with its spec, in id order."""
    return tuple((f, spec_of(f)) for f in dataclasses.fields(KernelConfig))


def requested_fields() -> tuple[tuple[dataclasses.Field, FieldSpec], ...]:
    """The fields a call asks for by value (FieldSpec.requested), in id order."""
    return tuple((f, s) for f, s in config_fields() if s.requested)


# -- kernel ids --------------------------------------------------------------------------------


class KernelIdError(ValueError):
    """The string is not a canonical kernel id."""


def format_kernel_id(config: KernelConfig) -> str:
    """``<family>_<pipeline>_<a>_<b>_<acc>_<c>_<layout>_<M>x<N>x<K>_c<CM>x<CN>[_<option>...]``: the
    positional fields, then each option that differs from its default, in field order."""
    parts = []
    for f, s in config_fields():
        value = getattr(config, f.name)
        if s.positional or value != f.default:
            parts.append(s.codec.token(value))
    return "_".join(parts)


def _id_pattern() -> re.Pattern:
    parts = []
    for f, s in config_fields():
        group = f"(?P<{f.name}>{s.codec.pattern})"
        parts.append(f"_{group}" if s.positional else f"(?:_{group})?")
    return re.compile("^" + "".join(parts)[1:] + "$")


_ID = _id_pattern()


def parse_kernel_id(kernel_id: str) -> KernelConfig:
    """The config ``kernel_id`` names; raises :class:`KernelIdError` unless the id is canonical
    (every field spelled as :func:`format_kernel_id` spells it, options in order, no default spelled out)."""
    match = _ID.match(kernel_id)
    if not match:
        fields = config_fields()
        head = "_".join(s.codec.form for _, s in fields if s.positional)
        options = ", ".join(s.codec.form for _, s in fields if not s.positional)
        raise KernelIdError(f"{kernel_id!r} is not a kernel id; expected {head}[_options] with the options "
                            f"that differ from their defaults in this order: {options}")
    values = {name: spec_of(f).codec.untoken(text) for f in dataclasses.fields(KernelConfig)
              if (name := f.name) and (text := match.group(name)) is not None}
    try:
        config = KernelConfig(**values)
    except (TypeError, ValueError) as exc:
        raise KernelIdError(f"{kernel_id!r}: {exc}") from None
    canonical = format_kernel_id(config)
    if canonical != kernel_id:
        raise KernelIdError(f"{kernel_id!r} is not canonical; it is spelled {canonical!r}")
    return config


# -- the contract ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """What a kernel requires of its operands; the runtime checks it before every launch."""

    base_alignment: int  # bytes, for every data pointer
    stride_divisibility: tuple[int, int, int]  # elements, for A, B and C's non-unit strides
    max_extent: int  # M, N, K and L, which the kernel indexes as 32-bit integers

    def plain(self) -> dict[str, Any]:
        a, b, c = self.stride_divisibility
        return {"base_alignment_bytes": self.base_alignment, "stride_divisibility": {"a": a, "b": b, "c": c},
                "max_extent": self.max_extent}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Contract:
        sd = data["stride_divisibility"]
        return cls(plain_int(data["base_alignment_bytes"], "contract.base_alignment_bytes", 1),
                   tuple(plain_int(sd[t], f"contract.stride_divisibility.{t}", 1) for t in "abc"),
                   plain_int(data["max_extent"], "contract.max_extent", 1, MAX_EXTENT))


# -- families: the kernel's arguments ----------------------------------------------------------


@dataclass(frozen=True)
class TensorArg:
    """A strided matrix batch: its data pointer goes in the call block, its two non-unit strides
    (elements) in the plan block, its extents are the problem's named ones. ``k_major_of``: the
    problem operand ("a" or "b") whose layout letter decides whether its second extent is the
    contiguous one; None: always (C is row-major)."""

    name: str
    extents: tuple[str, str, str]
    k_major_of: str | None = None

    def row_major(self, config: KernelConfig) -> bool:
        """Whether the second of its extents is the contiguous one, under ``config``'s layout."""
        return True if self.k_major_of is None else getattr(config.layout, f"{self.k_major_of}_k_major")


@dataclass(frozen=True)
class ScaleArg:
    """An operand's float32 scales in device memory. Per-tensor (Scaling.TENSOR): one element, its
    pointer in the call block. Blockwise: a strided matrix batch of per-block factors whose
    extents ``blocks`` name the problem's extents or :data:`BLOCK_EXTENTS`; dimension ``unit`` (0
    or 1) is the contiguous one, and the other two strides (elements) go in the plan block.
    Row-wise: a contiguous vector of one factor per index of the problem extents ``per`` (scale_a
    per row of A, scale_b per column of B; a grouped kernel's per group and column of B), its length
    the product of the plan's extents."""

    name: str
    blocks: tuple[str, str, str]
    unit: int
    per: tuple[str, ...]


# Extents counted in blockwise scale blocks: the problem extent each divides, rounded up.
BLOCK_EXTENTS = {"kb": "k", "nb": "n"}


@dataclass(frozen=True)
class IndexArg:
    """An int32 vector in device memory with one entry per index of the problem extent ``extent``
    (a grouped GEMM's cumulative row ends), passed by its pointer: the kernel takes its length
    from the extent, which may be at most ``limit``."""

    name: str
    extent: str
    limit: int


@dataclass(frozen=True)
class VectorArg:
    """A contiguous vector along one problem extent (a per-column bias): its data pointer goes in the
    call block and its length is the plan's ``extent``. Its element type is the kernel's (the
    template's ``<NAME>_DTYPE``); a kernel that does not use it never reads it."""

    name: str
    extent: str


@dataclass(frozen=True)
class LikeArg:
    """A matrix batch with the extents and strides of the family's tensor ``like`` (a residual of
    C's shape): its data pointer goes in the call block, and the glue builds its descriptor from
    ``like``'s plan strides, so the runtime passes only one whose strides equal those. Its element
    type is ``like``'s; a kernel that does not use it never reads it."""

    name: str
    like: str


@dataclass(frozen=True)
class ScalarArg:
    """One float32 in device memory (an 8-bit output's scale): its pointer goes in the call block
    and the launcher takes it as a one-element tensor. Only kernels that use it read it (for
    scale_result: those whose C is an 8-bit float, :data:`SCALED_OUTPUTS`)."""

    name: str


@dataclass(frozen=True)
class ValueArg:
    """One float32 passed by value (a coefficient such as torch.addmm's alpha, a Python number in the
    call): it goes in the call block after the pointers, and the launcher takes it as a
    ``cutlass.Float32``. Only kernels that use it pass it on to their device kernel, so the others'
    cubins are as they were without it. ``neutral``: the value the runtime passes for a call that
    does not ask for one (the value that leaves the result as it is)."""

    name: str
    neutral: float = 1.0


@dataclass(frozen=True)
class Family:
    """A kernel family's launch: ``tensors``, then ``indices``, then ``scales``, then ``vectors``, then
    ``likes``, then ``scalars``, then ``values``, then the resident cluster count (an int32 the runtime
    computes per device) and the stream, in that order. A kernel's ``scaling`` decides how its scales
    are passed (:class:`ScaleArg`)."""

    name: str
    extents: tuple[str, ...]  # the problem extents, int32 each in the plan block
    tensors: tuple[TensorArg, ...]
    scales: tuple[ScaleArg, ...]
    indices: tuple[IndexArg, ...] = ()
    vectors: tuple[VectorArg, ...] = ()
    likes: tuple[LikeArg, ...] = ()
    scalars: tuple[ScalarArg, ...] = ()
    values: tuple[ValueArg, ...] = ()

    @property
    def arguments(self) -> tuple[str, ...]:
        """The names of the exported launcher's arguments, in order."""
        return (*(t.name for t in self.tensors), *(i.name for i in self.indices), *(s.name for s in self.scales),
                *(v.name for v in self.vectors), *(x.name for x in self.likes), *(x.name for x in self.scalars),
                *(x.name for x in self.values), "resident_clusters", "stream")

    @property
    def neutral_values(self) -> tuple[float, ...]:
        """Each value's :attr:`ValueArg.neutral`, in order: what a call that asks for none passes."""
        return tuple(x.neutral for x in self.values)

    @property
    def plan_format(self) -> str:
        """struct format of the plan block (tk_plan_<family>_t): each tensor's (lead, batch) strides, each
        scale's two non-unit strides (blockwise; zeros for per-tensor scales), the extents, the
        resident clusters, the device ordinal, the kernel index, padding to 8 bytes."""
        ints = len(self.extents) + 3
        return "<" + "q" * (2 * len(self.tensors) + 2 * len(self.scales)) + "i" * (ints + ints % 2)

    @property
    def call_format(self) -> str:
        """struct format of the call block (tk_call_<family>_t): tensor, index, scale, vector, like and
        scalar pointers, then the float32 values, padded to 8 bytes, then the stream."""
        pointers = (len(self.tensors) + len(self.indices) + len(self.scales) + len(self.vectors)
                    + len(self.likes) + len(self.scalars))
        values = len(self.values)
        return "<" + "Q" * pointers + "f" * values + "x" * (4 * (values % 2)) + "Q"


MAX_EXTENT = 2**31 - 1  # the plan block's extents are int32 (Family.plan_format)
# Most groups of a grouped GEMM: its kernels build a table of every group's row end and first
# work item in shared memory (2 x 4 bytes per group, plus one entry each) at launch.
MAX_GROUPS = 256


def plain_int(value: Any, what: str, low: int = 0, high: int = MAX_EXTENT) -> int:
    """An integer field of a record read back from JSON: ``ValueError`` naming ``what`` unless it
    is an int (not a bool or a float) in [low, high]. The default range is int32's non-negative
    half, what the library's kernel table, launch blocks and driver queries take."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} is {str(value)[:40]!r}, not an integer in [{low}, {high}]")
    return value

# A grouped kernel's scales: per tensor; row-wise, as torch._scaled_grouped_mm takes them: scale_b
# (G, N), one per group and column of B, scale_a one per row of A, (total_M,) in the contiguous layout
# and (G, M_max) in the masked one; blockwise: scale_b (G, ceil(N/128), K/128), one per group and
# 128x128 block of B, K/128 contiguous, scale_a one per row of A and 128 K, (total_M, K/128) or
# (G, M_max, K/128), rows contiguous (docs/runtime.md, "Blockwise fp8").
GROUPED_SCALE_B = ScaleArg("scale_b", ("nb", "kb", "g"), 1, ("n", "g"))

FAMILIES: dict[str, Family] = {
    "gemm": Family(
        "gemm", extents=("m", "n", "k", "l"),
        tensors=(TensorArg("a", ("m", "k", "l"), "a"), TensorArg("b", ("n", "k", "l"), "b"),
                 TensorArg("c", ("m", "n", "l"))),
        # Blockwise: scale_a (M, K/128) M-major, one per row and 128 K; scale_b (ceil(N/128), K/128)
        # K-contiguous, one per 128x128 block of B (docs/runtime.md).
        # Row-wise: scale_a (M, 1) and scale_b (1, N), contiguous, as torch._scaled_mm takes them.
        scales=(ScaleArg("scale_a", ("m", "kb", "l"), 0, ("m",)), ScaleArg("scale_b", ("nb", "kb", "l"), 1, ("n",))),
        vectors=(VectorArg("bias", "n"),),
        # A residual of C's extents, read at C's strides (the runtime fuses one that has them).
        likes=(LikeArg("residual", "c"),),
        # An 8-bit float C's per-tensor scale: C = saturate(value * scale_result) (torch._scaled_mm).
        scalars=(ScalarArg("scale_result"),),
        # torch.addmm's coefficients, Python numbers in the call: out = alpha * (A @ B) + beta * C.
        values=(ValueArg("alpha"), ValueArg("beta")),
    ),
    # G GEMMs sharing N and K (a mixture-of-experts layer): A's rows are sorted by group and
    # offs[g] is the end of group g's rows (torch._grouped_mm's contiguous layout); B holds one
    # N x K matrix per group, C one row per row of A. A and C are single matrices: the kernel
    # ignores their batch mode, whose extent is G only so that every tensor has three.
    "grouped": Family(
        "grouped", extents=("m", "n", "k", "g"),
        tensors=(TensorArg("a", ("m", "k", "g"), "a"), TensorArg("b", ("n", "k", "g"), "b"),
                 TensorArg("c", ("m", "n", "g"))),
        scales=(ScaleArg("scale_a", ("m", "kb", "g"), 0, ("m",)), GROUPED_SCALE_B),
        indices=(IndexArg("offs", "g", MAX_GROUPS),),
    ),
    # The same G GEMMs with every group's rows in its own batch entry of A and C, (G, M_max, K)
    # and (G, M_max, N), and masked_m[g] the rows of entry g that are group g's (DeepGEMM's
    # masked layout, for decode under CUDA graphs).
    "grouped_masked": Family(
        "grouped_masked", extents=("m", "n", "k", "g"),
        tensors=(TensorArg("a", ("m", "k", "g"), "a"), TensorArg("b", ("n", "k", "g"), "b"),
                 TensorArg("c", ("m", "n", "g"))),
        scales=(ScaleArg("scale_a", ("m", "kb", "g"), 0, ("m", "g")), GROUPED_SCALE_B),
        indices=(IndexArg("masked_m", "g", MAX_GROUPS),),
    ),
}


# -- the manifest's kernel record ------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """What the compiled kernel uses (from the cubin; sass: the SASS census, instruction -> count)."""

    registers: int
    smem_bytes: int  # per CTA, static included
    static_smem_bytes: int
    stack_bytes: int
    local_bytes: int
    spills: bool
    sass: dict[str, int]
    # Loaded on the oversized shared-memory carveout (its stages need more than the opt-in limit):
    # the glue sets the shared-memory mode attribute, which only a newer driver knows.
    oversized_smem: bool = False


@dataclass(frozen=True)
class Blob:
    """A file's identity: its sha256 and size (bytes); ``file`` where the bundle holds it as a file."""

    sha256: str
    bytes: int
    file: str | None = None


@dataclass(frozen=True)
class Symbols:
    """The exported object's entry points (the glue's kernel table)."""

    prefix: str
    init: str
    load: str
    launch: str


@dataclass(frozen=True)
class CatalogRef:
    """The catalog file and item the kernel was expanded from."""

    file: str
    item: int


@dataclass(frozen=True)
class TemplateRef:
    """The template that rendered the kernel, and the sha256 of it and the macros it may import."""

    name: str
    sha256: str


@dataclass(frozen=True)
class Verified:
    """One card model on which exactly this cubin passed ``tilekiln verify``."""

    sku: str
    date: str
    driver: str
    max_rel_error: float


@dataclass(frozen=True)
class KernelRecord:
    """One kernel of a bundle, as the manifest records it (docs/bundle-format.md)."""

    index: int
    id: str
    config: KernelConfig
    stages: int  # as built (config.stages None: as many as fit)
    threads: int  # per CTA, as the kernel launches
    contract: Contract
    resources: Resources
    cubin: Blob
    source: Blob
    symbols: Symbols
    catalog: CatalogRef
    template: TemplateRef
    verified_on: tuple[Verified, ...] = ()

    @property
    def family(self) -> Family:
        return FAMILIES[self.config.family]

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.resources.smem_bytes - self.resources.static_smem_bytes

    @property
    def cluster_size(self) -> int:
        return self.config.cluster.size

    @property
    def verification_label(self) -> str:
        """``hardware-verified on H100 80GB HBM3, H200``, or ``compile-verified`` for code never run on a GPU."""
        if not self.verified_on:
            return "compile-verified"
        return f"hardware-verified on {', '.join(v.sku for v in self.verified_on)}"

    def plain(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "config": self.config.plain(), "stages": self.stages,
                "threads": self.threads, "contract": self.contract.plain(),
                "resources": _resources(self.resources), "cubin": _blob(self.cubin),
                "source": _blob(self.source), "symbols": dataclasses.asdict(self.symbols),
                "catalog": dataclasses.asdict(self.catalog), "template": dataclasses.asdict(self.template),
                "verification": "hardware-verified" if self.verified_on else "compile-verified",
                "verified_on": [dataclasses.asdict(v) for v in self.verified_on]}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> KernelRecord:
        """The inverse of :meth:`plain`; ``ValueError`` for an integer the runtime passes to the
        library (index, stages, threads, contract, resources, tile, cluster) that is not an int32."""
        config = KernelConfig.from_plain(data["config"])
        for name in ("tile", "cluster"):
            for value in dataclasses.astuple(getattr(config, name)):
                plain_int(value, f"config.{name}", 1)
        resources = dict(data["resources"])
        for name in ("registers", "smem_bytes", "static_smem_bytes", "stack_bytes", "local_bytes"):
            resources[name] = plain_int(resources[name], f"resources.{name}")
        return cls(
            index=plain_int(data["index"], "index"), id=str(data["id"]), config=config,
            stages=plain_int(data["stages"], "stages", 1), threads=plain_int(data["threads"], "threads", 1),
            contract=Contract.from_plain(data["contract"]),
            resources=Resources(**resources), cubin=Blob(**data["cubin"]), source=Blob(**data["source"]),
            symbols=Symbols(**data["symbols"]), catalog=CatalogRef(**data["catalog"]),
            template=TemplateRef(**data["template"]),
            verified_on=tuple(Verified(**v) for v in data.get("verified_on", [])))


def _resources(resources: Resources) -> dict[str, Any]:
    # oversized_smem only where true: every other kernel's record reads as schema 2.5 wrote it.
    return {k: v for k, v in dataclasses.asdict(resources).items() if k != "oversized_smem" or v}


def _blob(blob: Blob) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(blob).items() if v is not None}
