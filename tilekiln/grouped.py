"""Grouped GEMM (mixture-of-experts layers) in two layouts, one persistent launch each.

Contiguous (torch._grouped_mm's):

    out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]      for g in 0..G-1 (offs[-1] = 0)

``a`` is (total_M, K) with its rows sorted by group, ``offs`` an int32 device tensor of G
cumulative row ends, ``out`` (total_M, N).

Masked (DeepGEMM's, for decode under CUDA graphs, where the counts are not known on the host):

    out[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]

``a`` is (G, M_max, K), ``masked_m`` an int32 device tensor of G row counts, ``out``
(G, M_max, N).

``b`` is (G, K, N) in both (nn.Linear's weights stored (G, N, K) are passed as
``w.transpose(1, 2)``, a K-major view; a contiguous (G, K, N) is N-major; neither is
copied). The kernels read ``offs`` and ``masked_m`` on the device, so nothing here reads
device memory or synchronizes, and a call can be captured in a CUDA graph and replayed with
new routing.

The epilogue an expert MLP asks for (``requested``, as GemmProblem.requested): SwiGLU on the
gate_up GEMM (b's N columns interleave gate and up in blocks of GLU_BLOCK; the result has N/2),
fused where a kernel computes it, else the GEMM and then torch's pairing (GroupedPlan.unfused);
row-wise fp8 scales, scale_a per row of a and scale_b (G, N) per group and column of b; and
blockwise fp8 scales (``scaling`` blockwise: scale_a per row of a and 128 K, scale_b per group and
128x128 block of b, tilekiln/blockwise.py), each of which only a kernel with them runs. Block-scaled experts (mxfp8, nvfp4, ...: a ``block_scale`` request)
run only on the block-scaled grouped kernels, their elements and scales checked by
tilekiln/blockscaled.py.

What is checked on every call, before any launch (a violation raises ``TypeError`` or
``ValueError`` naming the argument): every tensor's shape, dtype, device and strides; ``offs``
or ``masked_m`` int32, 1-D, G entries, contiguous, on the inputs' device, with 1 <= G <=
MAX_GROUPS (tilekiln/spec.py); the scales (tilekiln/_torch/scales.py, check_grouped_scales; blockwise ones
tilekiln/blockwise.py, check_grouped_scales). Their values live in device memory and are not checked:
the kernels clamp each end into [previous end, total_M] and each count into [0, M_max], so values
that break the contract shorten or empty groups instead of reading or writing out of bounds.
Rows past the last end, or past a group's count, are not written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilekiln._native import CALL, NativeLibrary
from tilekiln._tensors import Operand
from tilekiln.bundle import out_rows_hint, raise_misaligned
from tilekiln.errors import LaunchError, NoKernelError
from tilekiln.problem import GemmProblem, Layout2, gated, padded_lead
from tilekiln.select import Choice, choose_fused
from tilekiln.spec import BLOCK_SCALED_INPUTS, FAMILIES, MAX_EXTENT, SCALED_INPUTS

MAX_GROUPS = FAMILIES["grouped"].indices[0].limit


@dataclass(frozen=True)
class GroupedProblem(GemmProblem):
    """A grouped GEMM: ``m`` is total_M, ``groups`` is G; ``batch`` is 1 (one launch)."""

    groups: int = 1
    masked: bool = False  # the masked layout: m is M_max, every group's rows in its own batch entry

    @property
    def family(self) -> str:
        return "grouped_masked" if self.masked else "grouped"

    def extent(self, name: str) -> int:
        return self.groups if name == "g" else super().extent(name)

    def row_tiles(self, tile_m: int) -> int:
        """Row tiles of ``tile_m`` rows (every group full when masked). The split of the rows over
        the groups lives on the device, so the host takes each group's rows as exponentially
        distributed about their mean (routed tokens are: a few experts take many, most few), whose
        expected count of tiles is 1 / (1 - exp(-tile_m / mean)): the mean's tiles plus half a
        tile of padding for large groups, one tile for small ones."""
        if self.masked:
            return self.groups * math.ceil(self.m / tile_m)
        if not self.m:
            return 0
        return round(self.groups / -math.expm1(-tile_m * self.groups / self.m))

    def exceeds(self, tile_m: int, tile_n: int) -> str | None:
        """Why a kernel of this tile cannot index the problem's work items as int32, or None."""
        row_tiles = self.row_tiles(tile_m) if self.masked else math.ceil(self.m / tile_m) + self.groups
        items = row_tiles * math.ceil(self.n / tile_n)
        if items > MAX_EXTENT:
            return f"extent: up to {items} work items exceed the kernel's int32 item index"
        return None


def _fail(exc: type, name: str, what: str) -> None:
    raise exc(f"{name}: {what}")


def _row_major(op: Operand, what: str) -> int:
    """The row stride of a row-major (last dimension contiguous) matrix ``op``."""
    rows, cols = op.shape[-2], op.shape[-1]
    s_rows, s_cols = op.strides[-2], op.strides[-1]
    if not ((s_cols == 1 or cols == 1) and (rows <= 1 or s_rows >= cols)):
        _fail(ValueError, op.name, f"strides {list(op.strides)} for shape {list(op.shape)} are not supported; "
              f"{what} must be row-major (last dimension contiguous, padded rows allowed); call .contiguous()")
    return s_rows if rows > 1 else padded_lead(cols, op.itemsize)


def _check_rows(rows: Operand, groups: int, what: str) -> None:
    """``rows`` (offs or masked_m): int32, 1-D, one entry per group, contiguous."""
    if len(rows.shape) != 1 or rows.shape[0] != groups:
        _fail(ValueError, rows.name, f"expected a 1-D tensor of G = {groups} {what} (one per group of b), "
              f"got shape {list(rows.shape)}")
    if rows.dtype != "i32":
        _fail(TypeError, rows.name, f"expected int32 {what}, got {rows.dtype}; use .to(torch.int32)")
    if groups > 1 and rows.strides[0] != 1:
        _fail(ValueError, rows.name, f"must be contiguous (stride 1), got stride {rows.strides[0]}; call .contiguous()")


def _check_common(a: Operand, b: Operand, rows: Operand, out: Operand | None, out_shape: tuple[int, ...],
                  scaled: bool, what: str, block_scaled: bool = False) -> str:
    """The checks both layouts share (``a``'s own shape is checked by the caller); returns the
    result's dtype. ``block_scaled``: the call asks for a block scale (its fp8 or fp4 elements and
    scales are tilekiln/blockscaled.py's to check)."""
    if len(b.shape) != 3:
        _fail(ValueError, "b", f"expected a 3-D (G, K, N) tensor, one (K, N) matrix per group, got shape "
              f"{list(b.shape)}; nn.Linear-style weights (G, N, K) are passed as w.transpose(1, 2)")
    groups, k, _ = b.shape
    if a.shape[-1] != k:
        _fail(ValueError, "b", f"shape {list(b.shape)} does not multiply a {list(a.shape)} (b's K {k} must equal "
              f"a's last dimension {a.shape[-1]})")
    _check_rows(rows, groups, what)
    if not 1 <= groups <= MAX_GROUPS:
        _fail(ValueError, "b", f"{groups} groups; the grouped kernels take 1 to {MAX_GROUPS} groups per call "
              "(split the experts over several calls)")
    if a.dtype != b.dtype:
        _fail(TypeError, "b", f"dtype {b.dtype} differs from a's {a.dtype}; both must have the same dtype")
    inputs = tuple(dict.fromkeys(SCALED_INPUTS + (BLOCK_SCALED_INPUTS if block_scaled else ())))
    if scaled and a.dtype not in inputs:
        _fail(TypeError, "scale_a", f"scales are for 8-bit float inputs ({', '.join(inputs)}); a is {a.dtype}")
    if a.dtype in SCALED_INPUTS and not scaled:
        _fail(TypeError, "scale_a", f"{a.dtype} inputs need scales: pass scale_a and scale_b (one-element float32 "
              "tensors, or row-wise ones as torch._scaled_grouped_mm takes them)")
    for op in (a, b, rows):
        if op.device < 0:
            _fail(ValueError, op.name, "tensor is in host memory; tilekiln runs on CUDA devices, move it with .cuda()")
        if op.device != a.device:
            _fail(ValueError, op.name, f"is on cuda:{op.device} but a is on cuda:{a.device}; all must be on one device")
    out_dtype = "bf16" if scaled else a.dtype
    if out is not None:
        if out.shape != out_shape:
            _fail(ValueError, "out", f"shape {list(out.shape)} does not match the result shape {list(out_shape)}")
        if out.dtype != out_dtype:
            _fail(TypeError, "out", f"dtype {out.dtype} does not match the result dtype {out_dtype}")
        if out.device != a.device:
            _fail(ValueError, "out", f"is on cuda:{out.device} but the inputs are on cuda:{a.device}")
    return out_dtype


def _block_scaled(requested: tuple[tuple[str, object], ...]) -> bool:
    """The call asks for block-scaled kernels (its scale_format is mxfp8, nvfp4, ...)."""
    return dict(requested).get("block_scale") is not None


def _weights(b: Operand) -> Layout2:
    """B's majorness and strides: K contiguous (nn.Linear weights transposed) or N contiguous."""
    groups, k, n = b.shape
    s_g, s_k, s_n = b.strides
    if s_k == 1 or k == 1:
        lb = Layout2("k", s_n if n > 1 else padded_lead(k, b.itemsize), s_g)
    elif s_n == 1 or n == 1:
        lb = Layout2("n", s_k, s_g)
    else:
        _fail(ValueError, "b", f"strides {list(b.strides)} are not supported; one of the last two dimensions must be "
              "contiguous (a (G, N, K) weight's .transpose(1, 2) is fine); call .contiguous()")
    if groups == 1:
        # A single group's batch stride is never used; TMA still needs a non-zero multiple of 16 bytes.
        lb = Layout2(lb.major, lb.lead, lb.lead * (k if lb.major == "n" else n))
    return lb


def _out_columns(b: Operand, requested: tuple[tuple[str, object], ...]) -> int:
    """The result's columns: b's N, or N/2 where ``requested`` is gated (swiglu pairs two)."""
    n = b.shape[-1] if len(b.shape) == 3 else 0
    if not gated(requested):
        return n
    if n % 2:
        _fail(ValueError, "b", f"{n} columns, an odd count; swiglu pairs a gate and an up column into each output "
              "column, so N = 2 x I (tilekiln.swiglu_weight interleaves them)")
    return n // 2


def make_grouped_problem(a: Operand, b: Operand, offs: Operand, out: Operand | None,
                         scaled: bool, requested: tuple[tuple[str, object], ...] = ()) -> GroupedProblem:
    """The contiguous layout: check every argument's shape, dtype, device and strides (never the
    values of ``offs``). ``scaled``: scales were passed (fp8 inputs, bf16 result). ``requested``:
    the epilogue the call asks for (a gated one halves the result's columns)."""
    if len(a.shape) != 2:
        _fail(ValueError, "a", f"expected a 2-D (total_M, K) tensor of every group's rows, got shape {list(a.shape)}")
    m, k = a.shape
    n = b.shape[-1] if len(b.shape) == 3 else 0
    out_n = _out_columns(b, requested)
    out_dtype = _check_common(a, b, offs, out, (m, out_n), scaled, "cumulative row ends", _block_scaled(requested))
    groups = b.shape[0]
    none = Layout2("", 0, 0)
    if 0 in (m, n, k):
        return GroupedProblem(a.dtype, b.dtype, out_dtype, m, n, k, 1, none, none, none, (m, out_n), a.device,
                              False, requested, groups=groups)
    lead_a = _row_major(a, "a")
    lead_c = padded_lead(out_n, 2 if scaled else a.itemsize) if out is None else _row_major(out, "out")
    # A and C are single matrices: their batch stride only has to satisfy TMA.
    return GroupedProblem(a.dtype, b.dtype, out_dtype, m, n, k, 1, Layout2("k", lead_a, lead_a * m), _weights(b),
                          Layout2("n", lead_c, lead_c * m), (m, out_n), a.device, False, requested, groups=groups)


def make_masked_problem(a: Operand, b: Operand, masked_m: Operand, out: Operand | None,
                        scaled: bool, requested: tuple[tuple[str, object], ...] = ()) -> GroupedProblem:
    """The masked layout: ``a`` (G, M_max, K), ``out`` (G, M_max, N) (N/2 where ``requested`` is
    gated); every argument checked as in :func:`make_grouped_problem` (never the values of
    ``masked_m``)."""
    if len(a.shape) != 3:
        _fail(ValueError, "a", f"expected a 3-D (G, M_max, K) tensor, each group's rows in its own entry, got shape "
              f"{list(a.shape)}")
    groups, m, k = a.shape
    n = b.shape[-1] if len(b.shape) == 3 else 0
    out_n = _out_columns(b, requested)
    out_dtype = _check_common(a, b, masked_m, out, (groups, m, out_n), scaled, "row counts",
                              _block_scaled(requested))
    if b.shape[0] != groups:
        _fail(ValueError, "b", f"has {b.shape[0]} groups but a has {groups}; a is (G, M_max, K) and b (G, K, N)")
    none = Layout2("", 0, 0)
    if 0 in (m, n, k):
        return GroupedProblem(a.dtype, b.dtype, out_dtype, m, n, k, 1, none, none, none, (groups, m, out_n),
                              a.device, False, requested, groups=groups, masked=True)
    lead_a = _row_major(a, "a")
    la = Layout2("k", lead_a, a.strides[0] if groups > 1 else lead_a * m)
    if out is None:
        lead_c = padded_lead(out_n, 2 if scaled else a.itemsize)
        lc = Layout2("n", lead_c, lead_c * m)
    else:
        lead_c = _row_major(out, "out")
        if groups > 1 and out.strides[0] < lead_c * m:
            _fail(ValueError, "out", f"batch stride {out.strides[0]} overlaps the previous group's {m} rows of "
                  f"{lead_c} elements; each group needs rows of its own")
        lc = Layout2("n", lead_c, out.strides[0] if groups > 1 else lead_c * m)
    return GroupedProblem(a.dtype, b.dtype, out_dtype, m, n, k, 1, la, _weights(b), lc, (groups, m, out_n), a.device,
                          False, requested, groups=groups, masked=True)


@dataclass(frozen=True)
class GroupedPlan:
    """What a repeated grouped call with the same signature needs."""

    problem: GroupedProblem
    kernel_id: str
    block: object  # the packed tk_plan_grouped_t; None: nothing to launch
    align_mask: int = 0
    run: GroupedProblem | None = None  # what the kernel runs: the problem, or its ungated GEMM
    # The requested epilogue the kernel does not compute (swiglu): torch applies it to the kernel's
    # result, as Plan.unfused (tilekiln/bundle.py).
    unfused: tuple[tuple[str, object], ...] = ()


def choose_grouped(bundle, problem: GroupedProblem, kernel: str | None = None) -> Choice:
    """The grouped kernel for ``problem``; ``kernel`` pins one by id."""
    kernels = bundle.kernels
    if kernel is not None:
        kernels = tuple(k for k in kernels if k.id == kernel)
        if not kernels:
            raise NoKernelError(f"kernel={kernel!r}: bundle {bundle.name} has no such kernel")
    return bundle.choose_among(kernels, problem)


def choose_grouped_fused(bundle, problem: GroupedProblem, kernel: str | None = None
                         ) -> tuple[Choice, tuple[tuple[str, object], ...]]:
    """The grouped kernel for ``problem`` and what of its requested epilogue no kernel computes
    (select.choose_fused: a swiglu no kernel fuses runs as the ungated GEMM); a pinned ``kernel``
    computes all of it or is rejected."""
    if kernel is not None:
        return choose_grouped(bundle, problem, kernel), ()
    return choose_fused(lambda p: choose_grouped(bundle, p), problem)


def plan_grouped(bundle, problem: GroupedProblem, kernel: str | None = None,
                 scale_strides: tuple[int, int, int, int] = ()) -> GroupedPlan:
    """The plan of a problem made by :func:`make_grouped_problem` or :func:`make_masked_problem`.
    ``scale_strides``: blockwise scales' (lead, batch) strides of scale_a then scale_b
    (tilekiln/blockwise.py, check_grouped_scales), in elements; empty for per-tensor or row-wise
    scales, whose strides in the plan block stay zero."""
    if problem.m == 0 or problem.n == 0 or problem.k == 0:
        return GroupedPlan(problem, "", None)
    choice, unfused = choose_grouped_fused(bundle, problem, kernel)
    if choice.kernel is None:
        raise NoKernelError(f"bundle {bundle.name} has no {problem.family} kernel for {problem.dtype} "
                            f"(M {problem.m}, N {problem.n}, K {problem.k}, G {problem.groups}):\n{choice}"
                            f"{out_rows_hint(choice)}")
    k = choice.kernel
    bundle._ensure_ready(k.index, problem.device)
    clusters = bundle.resident_clusters(k, problem.device)
    family = FAMILIES[problem.family]
    run = choice.run
    strides = tuple(s for t in family.tensors for s in (getattr(run, t.name).lead, getattr(run, t.name).batch))
    scales = scale_strides or (0,) * (2 * len(family.scales))
    static = (*strides, *scales, *(run.extent(e) for e in family.extents), clusters)
    return GroupedPlan(problem, k.id, NativeLibrary.plan_block(family, k.index, problem.device, static),
                       k.contract.base_alignment - 1, run, unfused)


def launch_grouped(bundle, plan: GroupedPlan, pa: int, pb: int, pc: int, prows: int, stream: int,
                   scale_a: int = 0, scale_b: int = 0) -> None:
    """Launch ``plan``; ``prows`` points at offs (contiguous layout) or masked_m (masked)."""
    if (pa | pb | pc) & plan.align_mask:
        raise_misaligned(pa, pb, pc, plan.align_mask + 1)
    family = plan.problem.family
    if prows & 3:
        name = FAMILIES[family].indices[0].name
        raise ValueError(f"{name}: data pointer 0x{prows:x} is not 4-byte aligned (int32 entries)")
    lib = bundle._lib
    buf = lib.call_buffer(family)
    CALL[family].pack_into(buf, 0, pa, pb, pc, prows, scale_a, scale_b, stream)
    status = lib.run[family](plan.block, buf)
    if status:
        raise LaunchError(plan.kernel_id, lib.error_name(status), lib.error_string(status))
