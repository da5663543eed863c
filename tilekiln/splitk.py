"""Split-K: a deep-K problem with few output tiles, run as a batch of K slices and one ordered sum.

On 132 SMs, problems with M from 16 to 256 against N of 4096 to 8192 make too
few output tiles to fill the machine however deep K is (16x8192 in 64x128
tiles: 64 CTAs). Split S ways, the problem becomes the batched problem
(M, N, K/S, batch S): slice s of A and of B is a view starting s*K/S along
K, given to the kernel as its batch stride (nothing is copied), and its
result is plane s of an fp32 workspace. The planes are then added in plane
order in fp32 (``torch.sum`` over the first dimension, which uses no atomics)
and the sum rounded once into ``out`` (by a copy where ``out`` is narrower
than fp32: a sum into it would copy every plane into its type first, rounding
each), so the result does not depend on how CTAs were scheduled. fp8 kernels apply the per-tensor scales to each partial,
and a blockwise slice promotes its own K blocks with their scales; scaling is linear, so the planes
sum to the scaled product.

Only torch callers get split plans: the sum runs through torch.
"""

from __future__ import annotations

from dataclasses import replace

from tilekiln.problem import GemmProblem, Layout2, padded_lead
from tilekiln.spec import BLOCKWISE_BLOCK, BLOCKWISE_REQUEST, Family, itemsize

# Seven and fourteen slices serve the K of 7 x 2^k that LLM widths share (DeepSeek-V3's 7168,
# Llama's 14336 and 28672), which no power of two divides into enough slices.
SPLITS = (2, 3, 4, 6, 7, 8, 12, 14, 16)
# Shallower slices make the workspace round trip cost more than the extra CTAs buy.
MIN_SLICE_K = 512
# Problems whose partials would need more than this are large enough in M x N
# to fill the machine unsplit; the bound also caps the workspace each call allocates.
MAX_WORKSPACE_BYTES = 64 * 2**20
PARTIAL_DTYPE = "f32"
_SUFFIX = "/splitk"


def label(kernel_id: str, split: int) -> str:
    """How a choice is named in explain output, tuning tables and ``kernel=`` pins."""
    return kernel_id if split == 1 else f"{kernel_id}{_SUFFIX}{split}"


def parse_label(text: str) -> tuple[str, int]:
    """(kernel id, split) of a :func:`label`."""
    head, sep, tail = text.rpartition(_SUFFIX)
    if sep and tail.isdigit() and int(tail) > 1:
        return head, int(tail)
    return text, 1


def sliced(problem: GemmProblem, split: int) -> GemmProblem | None:
    """The batched problem over ``split`` K slices writing fp32 partials, or None if it cannot be split.
    A scale format the call asks for (blockwise) stays asked of each slice: scales apply per K block
    in the mainloop and linearly, so the scaled partials sum to the scaled product; each slice of a
    blockwise call starts on a scale block."""
    # A requested epilogue (a bias, an activation, a residual) belongs to the sum, not to each partial.
    if problem.batch != 1 or problem.fold_batch or problem.out_dtype == PARTIAL_DTYPE or any(
            name != "scaling" for name, _ in problem.requested):
        return None
    if problem.k % split or problem.k // split < MIN_SLICE_K:
        return None
    kc = problem.k // split
    if BLOCKWISE_REQUEST in problem.requested and kc % BLOCKWISE_BLOCK:
        return None
    lead = padded_lead(problem.n, itemsize(PARTIAL_DTYPE))  # 16-byte rows for TMA
    if split * problem.m * lead * itemsize(PARTIAL_DTYPE) > MAX_WORKSPACE_BYTES:
        return None

    def slice_of(layout: Layout2, k_contiguous: bool) -> Layout2:
        return Layout2(layout.major, layout.lead, kc if k_contiguous else kc * layout.lead)

    return replace(problem, out_dtype=PARTIAL_DTYPE, k=kc, batch=split,
                   a=slice_of(problem.a, problem.a.major == "k"), b=slice_of(problem.b, problem.b.major == "k"),
                   c=Layout2("n", lead, problem.m * lead), out_shape=(split, problem.m, lead))


def sliced_scale_strides(family: Family, strides: tuple[int, ...], slice_k: int) -> tuple[int, ...]:
    """A split plan's blockwise scale strides: each scale's (lead, batch) plan strides (``strides``,
    two per scale of ``family``, in order) with the batch stride moved to one K slice (``slice_k``
    elements, slice_k / 128 scale blocks along the scale's K-block extent), so slice s reads the
    scales of its own K blocks as batch entry s."""
    out = []
    for i, scale in enumerate(family.scales):
        lead = strides[2 * i]
        # The two strides are the non-unit dimensions', in order: the lead one, then the batch.
        kb_stride = 1 if scale.blocks[scale.unit] == "kb" else lead
        out += [lead, slice_k // BLOCKWISE_BLOCK * kb_stride]
    return tuple(out)
