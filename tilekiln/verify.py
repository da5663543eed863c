"""Run every kernel of a bundle on this GPU against a float64 reference, and record the result.

    python3 -m tilekiln.verify BUNDLE --out catalog/verification/<bundle>.json

Each kernel runs pinned (``kernel=``) on fresh random inputs of several
shapes: tails in every dimension, K not a multiple of the tile, a batch,
one large problem. Inputs are drawn from a seed taken from the operating
system and recorded. Outputs are poisoned with NaN first, so an element the
kernel leaves unwritten fails. The fp32-result kernels run as split-K (bf16)
and, for fp8 (blockwise too), straight into a float32 result. Blockwise-scaled kernels run
on inputs quantized by ``quantize_fp8_blockwise`` (K rounded up to a multiple
of 128), against the product of the dequantized inputs (grouped ones on the grouped routings,
each group's weight quantized on its own); row-wise-scaled ones on
fresh (M, 1) and (1, N) scales (grouped ones on scales per row and per group and column); fp8-result (e4m3 C) ones with a scale_result
that saturates the largest values, against the float64 reference saturated
and rounded to e4m3; residual kernels on a fresh residual, once into a
separate output and once in place (the output is the residual); alpha and beta
kernels with :data:`ALPHA_BETA` (a fractional alpha, a negative beta), the
reference scaling the product by alpha and the residual by beta. SwiGLU kernels (dense and
grouped) run with N rounded up to whole gate/up block pairs (I then not a multiple of their tiles'
half), writing N/2 columns, against the float64 product paired by torch. Block-scaled (mxfp8) kernels run on inputs
quantized by ``tilekiln.blockscaled.quantize_operand`` (K rounded up to whole scale-factor atoms), their
scales passed in the blocked layout, against the product of the dequantized inputs; block-scaled grouped ones on
the grouped routings, their scales blocked per group, against ``reference_grouped_mm``. A kernel passes when every
relative error ||out - ref|| / ||ref|| is under :data:`TOLERANCE` and no
output is NaN.

The record (one per card model, keyed by its SKU) holds the device, driver,
date, seed and, per kernel, its cubin's sha256 and the largest error. ``--out``
merges it into an existing file, replacing that SKU's record; ``--unverified`` runs only the
kernels whose cubin has no passing record for the card's SKU there (those a catalog change added
or changed). Committed as
``catalog/verification/<bundle>.json``, every later build marks the kernels
whose cubin is unchanged ``hardware-verified`` on those SKUs in the manifest
(builder/load/verification.py); ``inspect`` and ``explain`` show it. A kernel
that has never run on a GPU stays ``compile-verified``.

Needs torch and a CUDA GPU; imports no build dependency.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tilekiln._files import write_atomic
from tilekiln.bundle import NEUTRAL_VALUES
from tilekiln.spec import (BLOCK_SCALE_FORMATS, BLOCKWISE_BLOCK, GLU_BLOCK, KernelRecord, Scalars, Scaling,
                           requested_fields)

RECORD_SCHEMA = 1
# bf16/fp16 rounding of the output alone is about 2e-3 relative; fp8 kernels are
# checked against the product of their own fp8 inputs, so the same bound holds.
TOLERANCE = 1e-2
# (batch, M, N, K): tails in every dimension, K not a multiple of any tile K, a batch,
# tiny and large problems. Leading dimensions are padded to 16 bytes, so any extent is valid.
SHAPES = ((1, 512, 512, 256), (1, 1000, 1032, 520), (3, 264, 136, 72), (1, 8, 8, 8), (2, 129, 264, 1000),
          (1, 4096, 4096, 4096))
# The fp32-partial kernels run as split-K: (M, N, K, slices); each slice holds at least
# tilekiln.splitk.MIN_SLICE_K of K.
SPLIT_SHAPES = ((1000, 1032, 4096, 2), (64, 520, 8192, 8), (23, 576, 7168, 14))
FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
HALF = {"bf16": "bfloat16", "f16": "float16"}
SCALES = (0.5, 0.25)
# (alpha, beta) for the kernels with scalars alphabeta: neither 1, beta negative, so a kernel that
# dropped either, or swapped them, fails.
ALPHA_BETA = (0.75, -1.5)
# Rows per group of the grouped kernels' runs, (N, K) shared by the groups: empty groups, a one-row
# group, groups smaller than a tile, one row past a tile, and several tiles; N and K not multiples
# of the tile.
GROUP_ROWS = ((0, 1, 37, 129, 0, 300), (64, 0, 5, 193))
GROUP_NK = ((264, 192), (1032, 528))


@dataclass(frozen=True)
class KernelResult:
    kernel_id: str
    max_rel_error: float
    runs: int
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures and self.runs > 0


def sku(device_name: str) -> str:
    """The card model a record is for: torch's device name without the vendor prefix."""
    return device_name.removeprefix("NVIDIA ").strip()


def linux_driver() -> str:
    """The kernel module's version (``580.159.04``), or ``unknown``."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return "unknown"
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() and p.isascii() for p in parts):
            return word
    return "unknown"


def _matrix(torch, rows: int, cols: int, contiguous_rows: bool, batch: int, dtype, gen):
    """(batch, rows, cols) with its rows or columns contiguous and the leading dimension padded to
    16 bytes, so every extent meets TMA's stride rule."""
    inner, outer = (cols, rows) if contiguous_rows else (rows, cols)
    per16 = 16 // torch.empty((), dtype=dtype).element_size()
    lead = -(-inner // per16) * per16
    data = torch.randn(batch, outer, lead, device="cuda", generator=gen).to(dtype)[..., :inner]
    return data if contiguous_rows else data.transpose(1, 2)


def _error(torch, out, ref) -> float:
    out = out.double()  # isnan has no fp8 kernels
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _poisoned(torch, shape, dtype):
    per16 = 16 // torch.empty((), dtype=dtype).element_size()
    lead = -(-shape[-1] // per16) * per16
    return torch.full((*shape[:-1], lead), float("nan"), device="cuda", dtype=dtype)[..., :shape[-1]]


def _masked_rows(torch, out, rows):
    """The rows a masked call wrote (each group's first ``rows[g]`` of ``out`` (G, M_max, N), in
    order), or NaN in their place where a row past a count was written: those must keep the NaN
    ``_poisoned`` filled them with."""
    got = torch.cat([out[g, :r] for g, r in enumerate(rows)])
    if not all(torch.isnan(out[g, r:]).all() for g, r in enumerate(rows)):
        return torch.full_like(got, float("nan"))
    return got


def _runs(torch, bundle, kernel: KernelRecord, gen):
    """(description, output, float64 reference) for each run of ``kernel``. A kernel that computes a
    requested epilogue (a bias, an activation, a residual) is called asking for it, with a fresh
    random bias and residual per shape, and its reference applies it. Such a kernel with an fp32
    result writes it directly: an epilogue never runs on split-K partials."""
    from tilekiln._torch.epilogue import UNFUSED, VALUE_INDEX, saturate_result
    from tilekiln._torch.run import run_gemm, run_scaled_gemm

    cfg = kernel.config
    requested = tuple((f.name, spec.codec.request(getattr(cfg, f.name))) for f, spec in requested_fields()
                      if getattr(cfg, f.name) != f.default)
    bias_dtype = None if cfg.bias.dtype is None else getattr(torch, HALF.get(cfg.bias.value, "float32"))
    bias = residual = None
    values = ALPHA_BETA if cfg.scalars is Scalars.ALPHA_BETA else NEUTRAL_VALUES
    alpha = values[VALUE_INDEX["alpha"]]

    def epilogue(ref):
        ref = ref * alpha  # alpha scales the product, before the bias and the activation
        for name, value in requested:
            if name in UNFUSED:  # a bias, an activation, a residual; scaling is in the reference's inputs
                ref = UNFUSED[name](value, ref, None if bias is None else bias.double(),
                                    None if residual is None else residual.double(), values)
        return ref

    def gemm(a, b, out=None, pin=kernel.id):
        return run_gemm(bundle, a, b, out, None, pin, requested, bias, residual, values)

    def scaled(a, b, out=None, pin=kernel.id, out_dtype=None, scales=None, scale_result=None):
        sa, sb = scales or (scale_a, scale_b)
        return run_scaled_gemm(bundle, a, b, sa, sb, out_dtype, out, None, pin, requested, bias,
                               scale_result)

    a_dtype = cfg.dtypes.a.value
    fp8 = a_dtype in FP8
    dtype = getattr(torch, FP8[a_dtype] if fp8 else HALF.get(a_dtype, "float32"))
    out_dtype = getattr(torch, FP8.get(cfg.dtypes.c.value) or HALF.get(cfg.dtypes.c.value, "float32"))
    fp8_result = cfg.dtypes.scaled_output
    scale_a, scale_b = (torch.tensor([s], device="cuda") for s in SCALES)
    if cfg.family != "gemm" and _block_format(cfg) is not None:
        yield from _block_scaled_grouped_runs(torch, bundle, kernel, gen, _block_format(cfg))
        return
    if cfg.family != "gemm" and cfg.scaling is Scaling.BLOCKWISE:
        yield from _grouped_blockwise_runs(torch, bundle, kernel, gen)
        return
    if cfg.family != "gemm":
        yield from _grouped_runs(torch, bundle, kernel, gen, dtype, out_dtype, (scale_a, scale_b) if fp8 else None)
        return
    blockwise, rowwise = cfg.scaling is Scaling.BLOCKWISE, cfg.scaling is Scaling.ROWWISE
    if cfg.dtypes.c.value == "f32" and (blockwise or not requested):
        # Split-K partials (a blockwise slice promotes its own scale blocks), and for fp8 a float32 result.
        for m, n, k, split in SPLIT_SHAPES:
            pin = f"{kernel.id}/splitk{split}"
            scales = None
            if blockwise:
                a8, w8, sa, sb, ref = _blockwise_operands(torch, m, n, k, gen)
                a, b, scales = a8, w8.t(), (sa, sb)
            else:
                a = _matrix(torch, m, k, cfg.layout.a_k_major, 1, dtype, gen)[0]
                b = _matrix(torch, k, n, not cfg.layout.b_k_major, 1, dtype, gen)[0]
                ref = epilogue((a.double() @ b.double()) * (SCALES[0] * SCALES[1] if fp8 else 1.0))
            if fp8:
                yield f"{pin} {m}x{n}x{k}", scaled(a, b, pin=pin, scales=scales), ref
                out = _poisoned(torch, (m, n), torch.float32)
                scaled(a, b, out, out_dtype=torch.float32, scales=scales)
                yield f"{kernel.id} {m}x{n}x{k} -> f32", out, ref
            else:
                yield f"{pin} {m}x{n}x{k}", gemm(a, b, pin=pin), ref
        return
    pair = 2 * GLU_BLOCK if cfg.activation.gated else 1
    block_format = _block_format(cfg)
    for batch, m, n, k in SHAPES:
        # A gated kernel pairs whole gate and up blocks; its result has half the columns.
        n = -(-n // pair) * pair
        out_n = n // 2 if cfg.activation.gated else n
        if (fp8 or block_format is not None) and batch != 1:
            continue  # scaled GEMMs are 2-D, as torch._scaled_mm's
        if blockwise:
            k = -(-k // BLOCKWISE_BLOCK) * BLOCKWISE_BLOCK
            a8, w8, sa, sb, ref = _blockwise_operands(torch, m, n, k, gen)
            out = _poisoned(torch, (m, out_n), torch.bfloat16)
            scaled(a8, w8.t(), out, scales=(sa, sb))
            yield f"{kernel.id} {m}x{n}x{k}", out, epilogue(ref)
            continue
        if block_format is not None:
            from tilekiln import blockscaled as bs

            step = bs.ATOM_BLOCKS * cfg.block_scale.block
            k = -(-k // step) * step
            a8, sa = bs.quantize_operand(torch.randn(m, k, device="cuda", generator=gen), block_format)
            w8, sw = bs.quantize_operand(torch.randn(n, k, device="cuda", generator=gen), block_format)
            # In the kernel's own output type (bf16 or fp16), which the call asks for.
            out = _poisoned(torch, (m, out_n), out_dtype)
            scaled(a8, w8.t(), out, out_dtype=out_dtype, scales=(bs.to_blocked(sa), bs.to_blocked(sw)))
            yield f"{kernel.id} {m}x{n}x{k}", out, epilogue(bs.reference_mm(a8, sa, w8, sw, block_format))
            continue
        a = _matrix(torch, m, k, cfg.layout.a_k_major, batch, dtype, gen)
        b = _matrix(torch, k, n, not cfg.layout.b_k_major, batch, dtype, gen)
        if bias_dtype is not None:
            bias = torch.randn(n, device="cuda", generator=gen).to(bias_dtype)
        what = f"{kernel.id} {batch}x{m}x{n}x{k}"
        result = None
        if fp8_result:
            # The products' spread is about sqrt(K) * SCALES (and the row-wise scales' up to 2.25): the
            # tails past 2.5 spreads saturate at +-448.
            factor = 448 / (2.5 * SCALES[0] * SCALES[1] * k ** 0.5)
            result = torch.tensor([factor], device="cuda")

        def finish(ref):
            ref = epilogue(ref)
            return ref if result is None else saturate_result(ref, factor, out_dtype).double()

        if fp8 and rowwise:
            sa = torch.rand(m, 1, device="cuda", generator=gen) + 0.5
            sb = torch.rand(1, n, device="cuda", generator=gen) + 0.5
            out = _poisoned(torch, (m, n), out_dtype)
            scaled(a[0], b[0], out, out_dtype=out_dtype, scales=(sa, sb), scale_result=result)
            yield what, out, finish((a[0].double() @ b[0].double()) * sa.double() * sb.double())
        elif fp8:
            out = _poisoned(torch, (m, out_n), out_dtype)
            scaled(a[0], b[0], out, out_dtype=out_dtype, scale_result=result)
            yield what, out, finish((a[0].double() @ b[0].double()) * (SCALES[0] * SCALES[1]))
        else:
            out = _poisoned(torch, (batch, m, out_n), out_dtype)
            if cfg.residual.value != "none":
                # The residual has the output's strides, as the kernel reads it at C's.
                residual = _poisoned(torch, (batch, m, n), out_dtype)
                residual.copy_(torch.randn(batch, m, n, device="cuda", generator=gen))
            gemm(a, b, out)
            yield what, out, epilogue(a.double() @ b.double())
            if residual is not None:
                ref = epilogue(a.double() @ b.double())
                gemm(a, b, residual)  # in place: each element is read before it is written
                yield f"{what} in place", residual, ref


def _blockwise_operands(torch, m: int, n: int, k: int, gen):
    """(a8, w8, scale_a, scale_b, float64 reference) of a blockwise call: a (M, K) and a weight (N, K),
    K a multiple of 128, quantized by ``quantize_fp8_blockwise``, against the product of the
    dequantized inputs."""
    from tilekiln.blockwise import dequantize, quantize_fp8_blockwise

    rows, blocks = (1, BLOCKWISE_BLOCK), (BLOCKWISE_BLOCK,) * 2
    a8, sa = quantize_fp8_blockwise(torch.randn(m, k, device="cuda", generator=gen), rows)
    w8, sb = quantize_fp8_blockwise(torch.randn(n, k, device="cuda", generator=gen), blocks)
    return a8, w8, sa, sb, dequantize(a8, sa, rows) @ dequantize(w8, sb, blocks).t()


def _block_format(cfg) -> str | None:
    """The block-scaled format (tilekiln/spec.py, BLOCK_SCALE_FORMATS) a kernel computes, or None."""
    return next((name for name, f in BLOCK_SCALE_FORMATS.items()
                 if (f.data, f.scale) == (cfg.dtypes.a, cfg.block_scale)), None)


def _block_scaled_grouped_runs(torch, bundle, kernel: KernelRecord, gen, name: str):
    """Runs of a block-scaled grouped kernel on the routings of GROUP_ROWS (K rounded up to whole
    scale-factor atoms), its operands quantized by ``quantize_operand`` and its scales blocked per
    group (``to_blocked_grouped``, or ``to_blocked`` of each batch entry when masked), each against
    ``reference_grouped_mm``; a masked call's rows past each count must keep their NaN."""
    from tilekiln._torch.run_grouped import run_grouped_gemm
    from tilekiln import blockscaled as bs

    cfg = kernel.config
    masked = cfg.family == "grouped_masked"
    step = bs.ATOM_BLOCKS * cfg.block_scale.block
    for (n, k), rows in zip(GROUP_NK, GROUP_ROWS):
        k = -(-k // step) * step
        groups = len(rows)
        w, sw = bs.quantize_operand(torch.randn(groups, n, k, device="cuda", generator=gen), name)
        what = f"{kernel.id} {groups} groups of {'/'.join(map(str, rows))} rows, N {n}, K {k}"
        if masked:
            a, sa = bs.quantize_operand(torch.randn(groups, max(rows), k, device="cuda", generator=gen), name)
            out = _poisoned(torch, (groups, max(rows), n), torch.bfloat16)
            run_grouped_gemm(bundle, a, w.transpose(1, 2), torch.tensor(rows, dtype=torch.int32, device="cuda"),
                             bs.to_blocked(sa), bs.to_blocked(sw), out, None, kernel.id, masked=True,
                             scale_format=name)
            ref = bs.reference_grouped_mm(a, sa, w, sw, rows, name, masked=True)
            yield what, _masked_rows(torch, out, rows), torch.cat([ref[g, :r] for g, r in enumerate(rows)])
        else:
            a, sa = bs.quantize_operand(torch.randn(sum(rows), k, device="cuda", generator=gen), name)
            ends = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
            out = _poisoned(torch, (sum(rows), n), torch.bfloat16)
            run_grouped_gemm(bundle, a, w.transpose(1, 2), ends, bs.to_blocked_grouped(sa, ends),
                             bs.to_blocked(sw), out, None, kernel.id, scale_format=name)
            yield what, out, bs.reference_grouped_mm(a, sa, w, sw, ends, name)


def _grouped_runs(torch, bundle, kernel: KernelRecord, gen, dtype, out_dtype, scales):
    """Runs of a grouped kernel (contiguous or masked layout, as its family says) on the routings of
    GROUP_ROWS, each against the per-group float64 product; rows a masked call must not write are
    checked to hold the NaN they were poisoned with. A row-wise kernel runs on fresh scales, per row of
    a and per group and column of b; a swiglu kernel with N rounded up to whole gate/up block pairs,
    against the scaled float64 product paired by torch."""
    from tilekiln._torch.epilogue import EPILOGUE_ACTIVATIONS
    from tilekiln._torch.run_grouped import run_grouped_gemm

    cfg = kernel.config
    masked = cfg.family == "grouped_masked"
    rowwise, activation = cfg.scaling is Scaling.ROWWISE, cfg.activation.value
    pair = 2 * GLU_BLOCK if cfg.activation.gated else 1
    for (n, k), rows in zip(GROUP_NK, GROUP_ROWS):
        n = -(-n // pair) * pair
        out_n = n // 2 if cfg.activation.gated else n
        groups = len(rows)
        w = torch.randn(groups, n, k, device="cuda", generator=gen).to(dtype)  # nn.Linear weights per group
        what = f"{kernel.id} {groups} groups of {'/'.join(map(str, rows))} rows, N {n}, K {k}"
        slots = max(rows)
        sa, sb = scales or (None, None)
        # The float64 scale of each (row, column) of a group: per tensor, or its row's and column's.
        row_scales = [torch.full((r, 1), SCALES[0] * SCALES[1] if scales else 1.0, device="cuda", dtype=torch.float64)
                      for r in rows]
        col_scales = [1.0] * groups
        if rowwise:
            sa = torch.rand(groups, slots, device="cuda", generator=gen) + 0.5 if masked else \
                torch.rand(sum(rows), device="cuda", generator=gen) + 0.5
            sb = torch.rand(groups, n, device="cuda", generator=gen) + 0.5
            firsts = [0, *torch.tensor(rows).cumsum(0).tolist()[:-1]]
            row_scales = [(sa[g, :r] if masked else sa[f:f + r]).double()[:, None]
                          for g, (f, r) in enumerate(zip(firsts, rows))]
            col_scales = [sb[g].double() for g in range(groups)]

        def product(g, x):
            return EPILOGUE_ACTIVATIONS[activation](x.double() @ w[g].double().t() * row_scales[g]
                                                           * col_scales[g])

        if masked:
            a = torch.randn(groups, slots, k, device="cuda", generator=gen).to(dtype)
            counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
            out = _poisoned(torch, (groups, slots, out_n), out_dtype)
            run_grouped_gemm(bundle, a, w.transpose(1, 2), counts, sa, sb, out, None, kernel.id, masked=True,
                             activation=activation)
            yield what, _masked_rows(torch, out, rows), torch.cat([product(g, a[g, :r]) for g, r in enumerate(rows)])
        else:
            a = torch.randn(sum(rows), k, device="cuda", generator=gen).to(dtype)
            ends = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
            out = _poisoned(torch, (sum(rows), out_n), out_dtype)
            run_grouped_gemm(bundle, a, w.transpose(1, 2), ends, sa, sb, out, None, kernel.id,
                             activation=activation)
            starts = [0, *ends.tolist()[:-1]]
            yield what, out, torch.cat([product(g, a[s:s + r]) for g, (s, r) in enumerate(zip(starts, rows))])


def _grouped_blockwise_runs(torch, bundle, kernel: KernelRecord, gen):
    """Runs of a blockwise grouped kernel on the routings of GROUP_ROWS, K rounded up to a multiple of
    the scale block: a's rows and each group's weight quantized by quantize_fp8_blockwise, against the
    per-group float64 product of the dequantized inputs (a swiglu kernel's with N rounded up to whole
    gate/up block pairs, paired by torch); rows a masked call must not write are checked to hold the
    NaN they were poisoned with."""
    from tilekiln._torch.epilogue import EPILOGUE_ACTIVATIONS
    from tilekiln._torch.run_grouped import run_grouped_gemm
    from tilekiln.blockwise import dequantize, quantize_fp8_blockwise

    cfg = kernel.config
    masked, activation = cfg.family == "grouped_masked", cfg.activation.value
    pair = 2 * GLU_BLOCK if cfg.activation.gated else 1
    rows_block, weight_block = (1, BLOCKWISE_BLOCK), (BLOCKWISE_BLOCK, BLOCKWISE_BLOCK)
    for (n, k), rows in zip(GROUP_NK, GROUP_ROWS):
        k = -(-k // BLOCKWISE_BLOCK) * BLOCKWISE_BLOCK
        n = -(-n // pair) * pair
        out_n = n // 2 if cfg.activation.gated else n
        groups, slots = len(rows), max(rows)
        weights = [quantize_fp8_blockwise(torch.randn(n, k, device="cuda", generator=gen), weight_block)
                   for _ in range(groups)]
        w8, sb = torch.stack([w for w, _ in weights]), torch.stack([s for _, s in weights])
        w64 = [dequantize(w, s, weight_block) for w, s in weights]
        a8, sa = quantize_fp8_blockwise(
            torch.randn(groups * slots if masked else sum(rows), k, device="cuda", generator=gen), rows_block)
        a64 = dequantize(a8, sa, rows_block)
        what = f"{kernel.id} {groups} groups of {'/'.join(map(str, rows))} rows, N {n}, K {k}"

        def product(g, x):
            return EPILOGUE_ACTIVATIONS[activation](x @ w64[g].t())

        if masked:
            # Each group's rows in its own slot of a, and its scales' rows in the same slot.
            a8, a64 = a8.view(groups, slots, k), a64.view(groups, slots, k)
            sa = sa.view(groups, slots, k // BLOCKWISE_BLOCK)
            counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
            out = _poisoned(torch, (groups, slots, out_n), torch.bfloat16)
            run_grouped_gemm(bundle, a8, w8.transpose(1, 2), counts, sa, sb, out, None, kernel.id,
                             masked=True, activation=activation, scale_format="blockwise")
            yield what, _masked_rows(torch, out, rows), torch.cat([product(g, a64[g, :r]) for g, r in enumerate(rows)])
        else:
            ends = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
            out = _poisoned(torch, (sum(rows), out_n), torch.bfloat16)
            run_grouped_gemm(bundle, a8, w8.transpose(1, 2), ends, sa, sb, out, None, kernel.id,
                             activation=activation, scale_format="blockwise")
            starts = [0, *ends.tolist()[:-1]]
            yield what, out, torch.cat([product(g, a64[s:s + r]) for g, (s, r) in enumerate(zip(starts, rows))])


def verify_kernel(torch, bundle, kernel: KernelRecord, seed: int) -> KernelResult:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    worst, runs, failures = 0.0, 0, []
    for what, out, ref in _runs(torch, bundle, kernel, gen):
        err = _error(torch, out, ref)
        runs += 1
        if not err < TOLERANCE:  # NaN fails too
            failures.append(f"{what}: relative error {err:.3g}")
        else:
            worst = max(worst, err)
    return KernelResult(kernel.id, worst, runs, tuple(failures))


def verify(bundle, torch, seed: int | None = None, only: str | None = None,
           done: frozenset[tuple[str, str]] = frozenset()) -> tuple[dict, list[KernelResult]]:
    """Run every kernel of ``bundle`` (those whose id contains ``only``, less those whose (id, cubin
    sha256) is in ``done``: :func:`verified_cubins`); returns the record and the results."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    results = [verify_kernel(torch, bundle, k, seed + k.index) for k in bundle.kernels
               if (only is None or only in k.id) and (k.id, k.cubin.sha256) not in done]
    torch.cuda.synchronize()
    cubins = {k.id: k.cubin.sha256 for k in bundle.kernels}
    device = torch.cuda.get_device_name()
    record = {
        "sku": sku(device), "device": device,
        "compute_capability": list(torch.cuda.get_device_capability()),
        "driver": linux_driver(), "torch": torch.__version__,
        "date": datetime.date.today().isoformat(), "seed": seed, "bundle_version": bundle.version,
        "kernels": {r.kernel_id: {"cubin_sha256": cubins[r.kernel_id], "max_rel_error": float(f"{r.max_rel_error:.3g}"),
                                  "runs": r.runs}
                    for r in results if r.passed},
        "failed": sorted(r.kernel_id for r in results if not r.passed),
    }
    return record, results


def merge_record(existing: dict | None, bundle: str, record: dict) -> dict:
    """The verification file of ``bundle`` with ``record`` added: an earlier record of its SKU keeps
    only the kernels this run did not cover (a run of ``--only`` some kernels leaves the others'
    evidence, with its own date and driver), and goes where it keeps none."""
    ran = set(record["kernels"]) | set(record.get("failed", ()))
    records = []
    for r in (existing or {}).get("records", []):
        if r.get("sku") == record["sku"]:
            r = {**r, "kernels": {k: v for k, v in r.get("kernels", {}).items() if k not in ran},
                 "failed": [k for k in r.get("failed", []) if k not in ran]}
            if not r["kernels"] and not r["failed"]:
                continue
        records.append(r)
    return {"schema": RECORD_SCHEMA, "bundle": bundle,
            "records": sorted([*records, record], key=lambda r: (r["sku"], r.get("date", "")))}


def verified_cubins(existing: dict | None, sku_name: str) -> frozenset[tuple[str, str]]:
    """The (kernel id, cubin sha256) pairs that passed on ``sku_name`` in a verification file: what
    ``--unverified`` leaves out, since a rebuilt kernel with the same cubin is the same code."""
    return frozenset((kernel_id, entry["cubin_sha256"]) for r in (existing or {}).get("records", [])
                     if r.get("sku") == sku_name for kernel_id, entry in r.get("kernels", {}).items())


def _read_existing(path: Path, bundle: str) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--out: {path} is not a readable verification file ({exc}); move it away first")
    if not isinstance(data, dict) or data.get("bundle") != bundle:
        raise SystemExit(f"--out: {path} holds records of bundle {data.get('bundle') if isinstance(data, dict) else '?'!r}, "
                         f"not {bundle!r}; give another path")
    return data




def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m tilekiln.verify", description=__doc__.split("\n")[0])
    p.add_argument("bundle", help="bundle directory or installed bundle name")
    p.add_argument("--out", type=Path, default=None,
                   help="write (or merge into) this verification file, e.g. catalog/verification/sm90a.json")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: a fresh one from the OS)")
    p.add_argument("--only", default=None, metavar="TEXT", help="only the kernels whose id contains TEXT")
    p.add_argument("--unverified", action="store_true",
                   help="only the kernels whose cubin has no passing record for this card's SKU in --out "
                        "(the kernels a catalog change added or changed)")
    args = p.parse_args(argv)
    if args.unverified and args.out is None:
        p.error("--unverified reads the records of --out: give --out FILE")
    from tilekiln.tuning.timing import require_cuda_torch

    torch = require_cuda_torch("tilekiln verify")
    import tilekiln

    bundle = tilekiln.load(args.bundle)
    # Read (and checked) before the kernels run, so an --out of another bundle fails at once.
    existing = _read_existing(args.out, bundle.name) if args.out is not None else None
    done = verified_cubins(existing, sku(torch.cuda.get_device_name())) if args.unverified else frozenset()
    record, results = verify(bundle, torch, args.seed, args.only, done)
    for r in results:
        status = "ok  " if r.passed else "FAIL"
        print(f"{status} {r.kernel_id}: {r.runs} runs, max relative error {r.max_rel_error:.3g}")
        for failure in r.failures:
            print(f"       {failure}")
    failed = [r for r in results if not r.passed]
    print(f"{len(results) - len(failed)} of {len(results)} kernels verified on {record['sku']} "
          f"(driver {record['driver']}, seed {record['seed']})", file=sys.stderr)
    if args.out is not None and results:
        write_atomic(args.out, json.dumps(merge_record(existing, bundle.name, record), indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
