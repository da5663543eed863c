"""Blockwise fp8 grouped GEMM on the GPU (issue 34): every blockwise grouped kernel, contiguous and
masked, against a per-group float64 reference of its dequantized inputs over skewed routings with
empty, one-row and partial groups (outputs poisoned with NaN: rows no group owns, or past a masked
count, stay NaN); its accuracy next to per-tensor fp8 grouped on the same outlier-injected data;
the errors of wrong scales and K on the device.

    python -m pytest -q tests/gpu/test_grouped_blockwise.py   (TILEKILN_TEST_BUNDLE: default artifacts/sm90a)
"""

from __future__ import annotations

import pytest

from tests.gpu.test_blockwise import _outliers, _row_rel, _weights

pytestmark = pytest.mark.gpu

ROWS, BLOCKS = (1, 128), (128, 128)
# (N, K, rows per group): empty groups, one-row groups, groups just past a tile, one group with all
# rows, N no multiple of 128 (576: DeepSeek-V3's), K of one block and DeepSeek-V3's 7168.
ROUTINGS = (
    (256, 128, [100, 0, 1, 300]),
    (576, 512, [0, 0, 777, 0, 0]),
    (1024, 256, [0, 5, 64, 65, 127, 128, 129, 255, 256, 257, 1, 0, 33, 500, 2, 7]),
    (2048, 7168, [1] * 8 + [600] + [0] * 7),
    (4096, 7168, [37] * 32),
)


def _kernels(bundle, family, activation="none"):
    kernels = [k for k in bundle.kernels if k.config.scaling.value == "blockwise" and k.config.family == family
               and k.config.activation.value == activation]
    assert kernels, f"the bundle has no blockwise {family} kernel with activation {activation}"
    return kernels


def _quantized_weights(torch, groups, n, k, gen):
    """(G, N, K) e4m3 weights, their (G, N/128, K/128) scales and float64 dequantized values."""
    import tilekiln
    from tilekiln.blockwise import dequantize

    pairs = [tilekiln.quantize_fp8_blockwise(_weights(torch, n, k, gen), BLOCKS) for _ in range(groups)]
    w8, sb = torch.stack([w for w, _ in pairs]), torch.stack([s for _, s in pairs])
    return w8, sb, [dequantize(w, s, BLOCKS) for w, s in pairs]


def test_every_contiguous_blockwise_kernel_matches_the_dequantized_float64_product(torch, bundle):
    import tilekiln
    from tilekiln.blockwise import dequantize

    failures = []
    for kernel in _kernels(bundle, "grouped"):
        for i, (n, k, rows) in enumerate(ROUTINGS):
            gen = torch.Generator(device="cuda").manual_seed(3400 + 10 * kernel.index + i)
            total = sum(rows)
            a8, sa = tilekiln.quantize_fp8_blockwise(_outliers(torch, total, k, gen), ROWS)
            w8, sb, w64 = _quantized_weights(torch, len(rows), n, k, gen)
            a64 = dequantize(a8, sa, ROWS)
            ends = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
            out = torch.full((total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            bundle.grouped_gemm(a8, w8.transpose(1, 2), ends, scale_a=sa, scale_b=sb, out=out, kernel=kernel.id,
                                scale_format="blockwise")
            torch.cuda.synchronize()
            start = 0
            for g, r in enumerate(rows):
                if r:
                    err = _row_rel(torch, out[start:start + r], a64[start:start + r] @ w64[g].t(), "max")
                    if not err < 1e-2:
                        failures.append(f"{kernel.id} N {n} K {k} group {g} ({r} rows): worst row {err:.3g}")
                start += r
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("family", ["grouped", "grouped_masked"])
def test_every_blockwise_swiglu_kernel_writes_the_paired_product(torch, bundle, family):
    """The expert MLP's gate_up with DeepSeek-V3 scales: each blockwise SwiGLU kernel, through
    grouped_swiglu(_masked) with scale_format="blockwise", against silu(gate) * up of the float64
    product of the dequantized inputs (the interleaved weight quantized as it is stored, so a 128-row
    scale block holds one 64-row gate block and its up block); rows past a masked count stay NaN."""
    import tilekiln
    from tilekiln.blockwise import dequantize
    from tilekiln._torch.epilogue import swiglu_unfused

    masked = family == "grouped_masked"
    failures = []
    for kernel in _kernels(bundle, family, "swiglu"):
        for i, (n, k, rows) in enumerate(ROUTINGS):
            gen = torch.Generator(device="cuda").manual_seed(3800 + 10 * kernel.index + i)
            groups, slots, inter = len(rows), max(rows) + 3, -(-n // 256) * 128
            w8, sb, w64 = _quantized_weights(torch, groups, 2 * inter, k, gen)
            total = groups * slots if masked else sum(rows)
            a8, sa = tilekiln.quantize_fp8_blockwise(_outliers(torch, total, k, gen), ROWS)
            a64 = dequantize(a8, sa, ROWS)
            if masked:
                counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
                out = torch.full((groups, slots, inter), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.grouped_swiglu_masked(a8.view(groups, slots, k), w8, counts,
                                             scale_a=sa.view(groups, slots, k // 128), scale_b=sb, out=out,
                                             kernel=kernel.id, scale_format="blockwise")
                got = [out[g, :r] for g, r in enumerate(rows)]
                firsts = [g * slots for g in range(groups)]
            else:
                ends = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
                out = torch.full((total, inter), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.grouped_swiglu(a8, w8, ends, scale_a=sa, scale_b=sb, out=out, kernel=kernel.id,
                                      scale_format="blockwise")
                firsts = [0, *ends.tolist()[:-1]]
                got = [out[f:f + r] for f, r in zip(firsts, rows)]
            torch.cuda.synchronize()
            for g, r in enumerate(rows):
                if r:
                    ref = swiglu_unfused(a64[firsts[g]:firsts[g] + r] @ w64[g].t())
                    err = _row_rel(torch, got[g], ref, "max")
                    if not err < 1e-2:
                        failures.append(f"{kernel.id} I {inter} K {k} group {g} ({r} rows): worst row {err:.3g}")
                if masked and not out[g, r:].isnan().all():
                    failures.append(f"{kernel.id} I {inter} K {k} group {g}: rows past {r} written")
    assert not failures, "\n".join(failures)


def test_every_masked_blockwise_kernel_matches_and_leaves_rows_past_the_counts(torch, bundle):
    import tilekiln
    from tilekiln.blockwise import dequantize

    failures = []
    for kernel in _kernels(bundle, "grouped_masked"):
        for i, (n, k, rows) in enumerate(ROUTINGS):
            gen = torch.Generator(device="cuda").manual_seed(3600 + 10 * kernel.index + i)
            groups, slots = len(rows), max(rows) + 3
            a8, sa = tilekiln.quantize_fp8_blockwise(_outliers(torch, groups * slots, k, gen), ROWS)
            a64 = dequantize(a8, sa, ROWS).view(groups, slots, k)
            w8, sb, w64 = _quantized_weights(torch, groups, n, k, gen)
            counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
            out = torch.full((groups, slots, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            bundle.grouped_gemm_masked(a8.view(groups, slots, k), w8.transpose(1, 2), counts,
                                       scale_a=sa.view(groups, slots, k // 128), scale_b=sb, out=out,
                                       kernel=kernel.id, scale_format="blockwise")
            torch.cuda.synchronize()
            for g, r in enumerate(rows):
                if r:
                    err = _row_rel(torch, out[g, :r], a64[g, :r] @ w64[g].t(), "max")
                    if not err < 1e-2:
                        failures.append(f"{kernel.id} N {n} K {k} group {g} ({r} rows): worst row {err:.3g}")
                if not out[g, r:].isnan().all():
                    failures.append(f"{kernel.id} N {n} K {k} group {g}: rows past {r} written")
    assert not failures, "\n".join(failures)


def test_blockwise_grouped_is_more_accurate_than_per_tensor_on_outliers(torch, bundle):
    """The same bf16 experts and tokens with outliers, both against the float64 product of the bf16
    inputs, per token: blockwise (the default choice for blockwise scales) and per-tensor fp8 grouped
    (one scale for all of a, one for all of b)."""
    import tilekiln

    lines, worse = [], []
    for i, (n, k, rows) in enumerate(r for r in ROUTINGS if sum(r[2]) >= 64):
        gen = torch.Generator(device="cuda").manual_seed(3700 + i)
        total, groups = sum(rows), len(rows)
        a = _outliers(torch, total, k, gen)
        w = torch.randn(groups, n, k, device="cuda", generator=gen).to(torch.bfloat16)
        ends = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
        ref = torch.cat([a[s:e].double() @ w[g].double().t()
                         for g, (s, e) in enumerate(zip([0, *ends.tolist()[:-1]], ends.tolist()))])
        a8, sa = tilekiln.quantize_fp8_blockwise(a, ROWS)
        pairs = [tilekiln.quantize_fp8_blockwise(w[g], BLOCKS) for g in range(groups)]
        w8, sb = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        blockwise = bundle.grouped_gemm(a8, w8.transpose(1, 2), ends, scale_a=sa, scale_b=sb,
                                        scale_format="blockwise")
        ta, tw = (x.float().abs().amax().reshape(1) / 448.0 for x in (a, w))
        at, wt = ((x.float() / s).to(torch.float8_e4m3fn) for x, s in ((a, ta), (w, tw)))
        tensor = bundle.grouped_gemm(at, wt.transpose(1, 2), ends, scale_a=ta, scale_b=tw)
        torch.cuda.synchronize()
        e_bw, e_pt = _row_rel(torch, blockwise, ref), _row_rel(torch, tensor, ref)
        lines.append(f"N {n} K {k} rows {total}: mean row relative error blockwise {e_bw:.3g}, per-tensor {e_pt:.3g}")
        if not e_bw < e_pt:
            worse.append(lines[-1])
    print("\n".join(lines))
    assert not worse, "blockwise not more accurate:\n" + "\n".join(worse)


def test_wrong_scales_raise_naming_the_argument(torch, bundle):
    import tilekiln

    a8, sa = tilekiln.quantize_fp8_blockwise(torch.randn(300, 256, device="cuda").to(torch.bfloat16), ROWS)
    gen = torch.Generator(device="cuda").manual_seed(3800)
    w8, sb, _ = _quantized_weights(torch, 3, 200, 256, gen)
    ends = torch.tensor([100, 100, 300], dtype=torch.int32, device="cuda")
    b = w8.transpose(1, 2)
    with pytest.raises(ValueError, match="scale_a: expected a float32 tensor"):
        bundle.grouped_gemm(a8, b, ends, scale_a=sa.contiguous(), scale_b=sb, scale_format="blockwise")
    with pytest.raises(ValueError, match="scale_b: expected a float32 tensor"):
        bundle.grouped_gemm(a8, b, ends, scale_a=sa, scale_b=sb.cpu(), scale_format="blockwise")
    with pytest.raises(ValueError, match="a: K = 200 is not a multiple of 128"):
        bundle.grouped_gemm(a8[:, :200], b[:, :200], ends, scale_a=sa, scale_b=sb, scale_format="blockwise")
    out = bundle.grouped_gemm(a8, b, ends, scale_a=sa, scale_b=sb, scale_format="blockwise")
    assert out.dtype == torch.bfloat16 and out.shape == (300, 200) and not out.isnan().any()
