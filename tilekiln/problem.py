"""From operands to a GEMM problem, with torch.matmul semantics.

``a`` is (M, K) or (L, M, K), ``b`` is (K, N) or (L, K, N); a 2-D operand or a
batch of 1 broadcasts over the other's batch. The result is (M, N), or
(L, M, N) if either input is 3-D. Transposed views are not copied: an
operand whose last dimension is contiguous is K-major (A) or N-major (B),
one whose second-to-last is contiguous is the other majorness, and padded
leading dimensions are kept. Every rejection raises ``ValueError`` or
``TypeError`` naming the argument, the value and the requirement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tilekiln._tensors import Operand
from tilekiln.spec import BLOCK_SCALED_INPUTS, SCALED_INPUTS, Activation, itemsize, requested_fields


@dataclass(frozen=True)
class Layout2:
    """One operand as the kernels see it: majorness and the two non-unit strides (elements)."""

    major: str  # A: "k" | "m"; B: "k" | "n"; C: "n"
    lead: int  # stride between rows (K-major A: along M; M-major A: along K; ...)
    batch: int  # stride between batch entries, 0 when broadcast


@dataclass(frozen=True)
class GemmProblem:
    a_dtype: str
    b_dtype: str
    out_dtype: str
    m: int
    n: int
    k: int
    batch: int
    a: Layout2
    b: Layout2
    c: Layout2
    out_shape: tuple[int, ...]
    device: int
    fold_batch: bool  # a 3-D A times a 2-D B computed as one (L*M) x K GEMM
    # What the call asks the kernel to compute beyond the product, by spec field
    # (tilekiln/spec.py, FieldSpec.requested): (field, value as the manifest spells it), in the
    # spec's field order, which is the order the epilogue applies them (requested_epilogue).
    requested: tuple[tuple[str, object], ...] = ()

    @property
    def family(self) -> str:
        """The kernel family that computes it (tilekiln/spec.py): a dense (batched) GEMM."""
        return "gemm"

    @property
    def dtype(self) -> str:
        """``a/b->out`` spelling used in messages and the tuning-table key."""
        return f"{self.a_dtype}/{self.b_dtype}->{self.out_dtype}"

    @property
    def out_n(self) -> int:
        """The result's columns: N, or N/2 for a gated (swiglu) epilogue, which pairs two."""
        return self.out_shape[-1]

    @property
    def alloc_shape(self) -> tuple[int, ...]:
        """Shape of the buffer to allocate for the result (rows padded to ``c.lead``)."""
        return self.out_shape[:-1] + (max(self.c.lead, self.out_n),)

    @property
    def empty(self) -> bool:
        return self.m == 0 or self.n == 0 or self.batch == 0

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def extent(self, name: str) -> int:
        """A problem extent by the name the kernel families give it (tilekiln/spec.py): m, n, k, l."""
        return {"m": self.m, "n": self.n, "k": self.k, "l": self.batch}[name]

    def row_tiles(self, tile_m: int) -> int:
        """Tiles of ``tile_m`` rows that cover M (the selection model's count)."""
        return -(-self.m // tile_m)

    def exceeds(self, tile_m: int, tile_n: int) -> str | None:
        """Why a kernel of this tile cannot index the problem beyond its extents, or None."""
        return None


def gated(requested: tuple[tuple[str, object], ...]) -> bool:
    """Whether ``requested`` asks for a gated activation (swiglu), whose result has N/2 columns."""
    return any(name == "activation" and Activation(value).gated for name, value in requested)


def ungated(problem: GemmProblem) -> GemmProblem:
    """The plain GEMM a gated ``problem`` runs when no kernel fuses its activation: all N columns,
    into a result tilekiln allocates (torch then pairs them into the caller's)."""
    if problem.out_n == problem.n:
        return problem
    lead = padded_lead(problem.n, itemsize(problem.out_dtype))
    return dataclasses.replace(problem, out_shape=problem.out_shape[:-1] + (problem.n,),
                               c=Layout2("n", lead, problem.m * lead))


def requested_epilogue(**asked: object) -> tuple[tuple[str, object], ...]:
    """GemmProblem.requested for the requested fields ``asked`` (name=value as the manifest spells
    it, e.g. ``bias="bf16", activation="silu"``): each value other than its field's default, in
    the spec's field order (bias before activation, the order the epilogue applies them)."""
    out = []
    for f, spec in requested_fields():
        value = asked.get(f.name, spec.codec.request(f.default))
        if value != spec.codec.request(f.default):
            out.append((f.name, value))
    return tuple(out)


def addmm_request(beta: float, alpha: float, fused_input: bool) -> tuple[tuple[str, object], ...]:
    """What ``tilekiln.addmm`` asks a kernel for: the residual where it hands ``input`` to the
    epilogue (``fused_input``, and beta not 0: torch.addmm ignores input then, NaN and inf
    included, which 0 * input would not), and alpha and beta where they change the result (alpha
    not 1, or a fused input's beta not 1)."""
    residual = fused_input and beta != 0
    scalars = alpha != 1 or (residual and beta != 1)
    return requested_epilogue(residual="add" if residual else "none", scalars="alphabeta" if scalars else "none")


# A row stride that is never used (the matrix has one row) still reaches the
# TMA descriptor; this value is a multiple of 16 bytes for every element size.
_UNUSED_STRIDE_ALIGN = 16


def _unused_lead(length: int) -> int:
    return max(1, -(-length // _UNUSED_STRIDE_ALIGN)) * _UNUSED_STRIDE_ALIGN


def _matrix_layout(op: Operand, rows: int, cols: int, row_major: str, col_major: str) -> Layout2:
    """Majorness and strides of a (rows, cols) matrix; a size-1 dimension fits either majorness."""
    s_rows, s_cols = op.strides[-2], op.strides[-1]
    batch = op.strides[0] if len(op.shape) == 3 else 0
    options = []
    if (s_cols == 1 or cols == 1) and (rows == 1 or s_rows >= cols):
        options.append(Layout2(row_major, s_rows if rows > 1 else _unused_lead(cols), batch))
    if (s_rows == 1 or rows == 1) and (cols == 1 or s_cols >= rows):
        options.append(Layout2(col_major, s_cols if cols > 1 else _unused_lead(rows), batch))
    if not options:
        raise ValueError(f"{op.name}: strides {list(op.strides)} for shape {list(op.shape)} are not supported; "
                         "one of the last two dimensions must be contiguous (stride 1), e.g. a transposed view "
                         "is fine but a strided slice of both is not; call .contiguous() first")
    # Prefer the reading whose row stride is 16-byte friendly (a vector is both).
    return max(options, key=lambda o: (o.lead % _UNUSED_STRIDE_ALIGN == 0, o.lead % 8 == 0, o.major == row_major))




def padded_lead(n: int, itemsize: int) -> int:
    """Row stride (elements) of a result tilekiln allocates: N rounded up so that every row
    starts on a 16-byte boundary, which TMA stores need."""
    return -(-n * itemsize // _UNUSED_STRIDE_ALIGN) * _UNUSED_STRIDE_ALIGN // itemsize


def result_strides(shape: tuple[int, ...], k: int, itemsize: int) -> tuple[int, ...]:
    """Strides of the result tilekiln allocates for ``shape`` (torch.matmul's result shape):
    contiguous, except that rows are padded to :func:`padded_lead` when there is anything to
    compute, so a result whose N * itemsize is not a multiple of 16 bytes is a view with
    strides (lead, 1). The eager path and the torch.compile fakes both allocate through this."""
    m, n = shape[-2], shape[-1]
    lead = n if 0 in shape or k == 0 else padded_lead(n, itemsize)
    return (m * lead, lead, 1) if len(shape) == 3 else (lead, 1)


def result_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """torch.matmul's result shape for a 2-D or 3-D ``a`` and ``b``, and K; raises ``ValueError``
    naming the argument when they do not multiply or their batches do not broadcast."""
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if len(shape) not in (2, 3):
            raise ValueError(f"{name}: expected a 2-D or 3-D tensor, got shape {list(shape)} ({len(shape)}-D); "
                             "tilekiln.gemm follows torch.matmul for 2-D and batched 3-D inputs")
    m, k = a_shape[-2], a_shape[-1]
    k2, n = b_shape[-2], b_shape[-1]
    if k != k2:
        raise ValueError(f"a and b shapes cannot be multiplied: a is {list(a_shape)} and b is {list(b_shape)} "
                         f"(a's last dimension {k} must equal b's second-to-last {k2})")
    la = a_shape[0] if len(a_shape) == 3 else None
    lb = b_shape[0] if len(b_shape) == 3 else None
    if la is not None and lb is not None and la != lb and 1 not in (la, lb):
        raise ValueError(f"batch dimensions do not broadcast: a has {la} and b has {lb}")
    if la is None and lb is None:
        return (m, n), k
    return (max(la or 1, lb or 1), m, n), k


def make_problem(a: Operand, b: Operand, out: Operand | None, out_dtype: str | None = None,
                 requested: tuple[tuple[str, object], ...] = ()) -> GemmProblem:
    """``out_dtype`` None: torch.matmul (same dtype in and out); else a scaled fp8 GEMM (or, where
    ``requested`` asks for a block scale, fp8 or fp4: :data:`~tilekiln.spec.BLOCK_SCALED_INPUTS`).
    ``requested``: the epilogue the call asks for (GemmProblem.requested); a gated activation
    halves the result's columns (N must be even)."""
    inputs = tuple(dict.fromkeys(SCALED_INPUTS + (BLOCK_SCALED_INPUTS if dict(requested).get("block_scale") else ())))
    return dataclasses.replace(_make_problem(a, b, out, out_dtype, gated(requested), inputs), requested=requested)


def _make_problem(a: Operand, b: Operand, out: Operand | None, out_dtype: str | None,
                  halve: bool = False, scaled_inputs: tuple[str, ...] = SCALED_INPUTS) -> GemmProblem:
    out_shape, k = result_shape(a.shape, b.shape)
    if halve:
        if out_shape[-1] % 2:
            raise ValueError(f"b: {out_shape[-1]} columns, an odd count; a gated (swiglu) GEMM pairs a gate and an "
                             "up column into each output column, so N = 2 x I")
        out_shape = out_shape[:-1] + (out_shape[-1] // 2,)
    if out_dtype is None:
        if a.dtype != b.dtype:
            raise TypeError(f"a and b must have the same dtype, got a {a.dtype} and b {b.dtype}")
        out_dtype = a.dtype
    else:
        for x in (a, b):
            if x.dtype not in scaled_inputs:
                kind = "8-bit float" if scaled_inputs == SCALED_INPUTS else "block-scaled"
                raise TypeError(f"{x.name}: scaled GEMMs take {kind} inputs ({', '.join(scaled_inputs)}), "
                                f"got {x.dtype}")
    if a.device < 0 or b.device < 0:
        which = "a" if a.device < 0 else "b"
        raise ValueError(f"{which}: tensor is in host memory; tilekiln runs on CUDA devices, move it with .cuda()")
    if a.device != b.device:
        raise ValueError(f"a is on cuda:{a.device} but b is on cuda:{b.device}; both must be on the same device")
    m, n = out_shape[-2], b.shape[-1]
    out_n = out_shape[-1]
    la = a.shape[0] if len(a.shape) == 3 else None
    lb = b.shape[0] if len(b.shape) == 3 else None
    batch = out_shape[0] if len(out_shape) == 3 else 1
    if 0 in (m, n, k, batch):
        # Nothing to load: the result is empty, or all zeros when only K is 0.
        if out is not None:
            _check_out_shape(out, a, out_shape, out_dtype)
        none = Layout2("", 0, 0)
        return GemmProblem(a.dtype, b.dtype, out_dtype, m, n, k, batch, none, none, none, out_shape, a.device,
                           False)
    la_op = _matrix_layout(a, m, k, "k", "m")
    lb_op = _matrix_layout(b, k, n, "n", "k")
    if (la or 1) == 1 and batch > 1:
        la_op = Layout2(la_op.major, la_op.lead, 0)
    if (lb or 1) == 1 and batch > 1:
        lb_op = Layout2(lb_op.major, lb_op.lead, 0)
    if out is None:
        # Rows of a result we allocate start on 16-byte boundaries (TMA); when N
        # is not a multiple of that, the result is a view of a padded buffer.
        lead = padded_lead(out_n, itemsize(out_dtype))
        lc_op = Layout2("n", lead, m * lead)
    else:
        lc_op = _check_out(out, a, out_shape, out_dtype)
    # A batch of A rows times one B is a single taller GEMM when the batch
    # entries of A and C are laid out back to back: one launch, no stride-0 operand.
    fold = (batch > 1 and lb_op.batch == 0 and la_op.major == "k" and la == batch
            and la_op.batch == m * la_op.lead and lc_op.batch == m * lc_op.lead)
    if fold:
        return GemmProblem(a.dtype, b.dtype, out_dtype, m * batch, n, k, 1,
                           Layout2("k", la_op.lead, m * batch * la_op.lead),
                           Layout2(lb_op.major, lb_op.lead, 0), Layout2("n", lc_op.lead, m * batch * lc_op.lead),
                           out_shape, a.device, True)
    if batch == 1:
        # The batch stride of a single batch is never used; give it a value
        # the TMA descriptor accepts (a non-zero multiple of the row stride).
        la_op = Layout2(la_op.major, la_op.lead, la_op.lead * (m if la_op.major == "k" else k))
        lb_op = Layout2(lb_op.major, lb_op.lead, lb_op.lead * (k if lb_op.major == "n" else n))
        lc_op = Layout2("n", lc_op.lead, lc_op.lead * m)
    return GemmProblem(a.dtype, b.dtype, out_dtype, m, n, k, batch, la_op, lb_op, lc_op, out_shape,
                       a.device, False)


def _check_out_shape(out: Operand, a: Operand, shape: tuple[int, ...], dtype: str) -> None:
    if out.shape != shape:
        raise ValueError(f"out: shape {list(out.shape)} does not match the result shape {list(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out: dtype {out.dtype} does not match the result dtype {dtype}")
    if out.device != a.device:
        raise ValueError(f"out is on cuda:{out.device} but the inputs are on cuda:{a.device}")


def _check_out(out: Operand, a: Operand, shape: tuple[int, ...], dtype: str) -> Layout2:
    _check_out_shape(out, a, shape, dtype)
    rows, cols = shape[-2], shape[-1]
    s_rows, s_cols = out.strides[-2], out.strides[-1]
    if not ((s_cols == 1 or cols == 1) and (rows == 1 or s_rows >= cols)):
        raise ValueError(f"out: strides {list(out.strides)} are not supported; the result must be row-major "
                         "(last dimension contiguous), padding of the leading dimension is allowed")
    lead = s_rows if rows > 1 else _unused_lead(cols)
    batch = out.strides[0] if len(out.shape) == 3 and out.shape[0] > 1 else lead * rows
    return Layout2("n", lead, batch)
