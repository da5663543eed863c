"""Blockwise fp8 on the GPU: every blockwise kernel against a float64 reference of its dequantized
inputs, its accuracy next to per-tensor fp8 on data with outliers, and the errors of wrong scales.

    python -m pytest -q tests/gpu/test_blockwise.py   (TILEKILN_TEST_BUNDLE: the bundle, default artifacts/sm90a)
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu

ROWS, BLOCKS = (1, 128), (128, 128)
# (M, N, K): odd M, N not a multiple of any tile N, one K block, DeepSeek-V3 projections, a large one.
SHAPES = ((257, 200, 384), (1, 576, 128), (1000, 1032, 1024), (64, 7168, 2048), (129, 1536, 7168),
          (4096, 4096, 4096))


def _outliers(torch, m, k, gen):
    """bf16 normals with the outliers of LLM activations: a few channels 20x larger in every
    token, and massive tokens (one in 64, at least one) 1000x larger in every channel."""
    a = torch.randn(m, k, device="cuda", generator=gen)
    a[:, torch.randint(0, k, (4,), device="cuda", generator=gen)] *= 20.0
    a[torch.randint(0, m, (max(1, m // 64),), device="cuda", generator=gen)] *= 1000.0
    return a.to(torch.bfloat16)


def _weights(torch, n, k, gen):
    """bf16 normals whose 128x128 blocks differ in magnitude by up to 2^12, so a kernel that read
    another block's scale would be far off."""
    blocks = 2.0 ** torch.randint(-6, 7, (-(-n // 128), k // 128), device="cuda", generator=gen)
    w = torch.randn(n, k, device="cuda", generator=gen)
    return (w * blocks.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)).to(torch.bfloat16)


def _rel(torch, out, ref):
    if torch.isnan(out).any():
        return float("nan")
    return ((out.double() - ref).norm() / ref.norm()).item()


def _row_rel(torch, out, ref, reduce="mean"):
    """Each row's (token's) relative error, reduced by ``reduce`` ("mean" or "max") over the rows:
    a massive token's output does not hide the others' errors, as it does in one norm over the
    whole result."""
    if torch.isnan(out).any():
        return float("nan")
    per_row = (out.double() - ref).norm(dim=1) / ref.norm(dim=1)
    return getattr(per_row, reduce)().item()


def _worst_rows(torch, label, outputs, ref):
    """A failure line for each of ``outputs`` (by name) whose worst row is 1e-2 or more off ``ref``."""
    failures = []
    for what, out in outputs.items():
        err = _row_rel(torch, out, ref, "max")
        if not err < 1e-2:  # NaN fails too
            failures.append(f"{label} {what}: relative error of the worst row {err:.3g}")
    return failures


def _quantize(x, block, power_of_two=False):
    import tilekiln

    return tilekiln.quantize_fp8_blockwise(x, block, power_of_two=power_of_two)


def _blockwise_kernels(bundle, c="bf16", activation="none"):
    # The dense ones: tests/gpu/test_grouped_blockwise.py runs the grouped ones.
    kernels = [k for k in bundle.kernels if k.config.scaling.value == "blockwise" and k.config.family == "gemm"
               and k.config.dtypes.c.value == c and k.config.activation.value == activation]
    assert kernels, f"the bundle has no blockwise kernel writing {c} with activation {activation}"
    return kernels


@pytest.mark.parametrize("power_of_two", [False, True])
def test_every_blockwise_kernel_matches_the_dequantized_float64_product(torch, bundle, power_of_two):
    from tilekiln.blockwise import dequantize

    failures = []
    for kernel in _blockwise_kernels(bundle):
        for i, (m, n, k) in enumerate(SHAPES):
            gen = torch.Generator(device="cuda").manual_seed(3400 + 10 * kernel.index + i)
            a8, sa = _quantize(_outliers(torch, m, k, gen), ROWS, power_of_two)
            w8, sb = _quantize(_weights(torch, n, k, gen), BLOCKS, power_of_two)
            ref = dequantize(a8, sa, ROWS) @ dequantize(w8, sb, BLOCKS).t()
            runs = []
            for _ in range(2):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.scaled_gemm(a8, w8.t(), sa, sb, out=out, kernel=kernel.id, scale_format="blockwise")
                runs.append(out)
            torch.cuda.synchronize()
            err = _row_rel(torch, runs[0], ref, "max")
            if not err < 1e-2:
                failures.append(f"{kernel.id} {(m, n, k)}: relative error of the worst row {err:.3g}")
            if not torch.equal(runs[0], runs[1]):
                failures.append(f"{kernel.id} {(m, n, k)}: two runs differ")
    assert not failures, "\n".join(failures)


def test_blockwise_swiglu_writes_the_paired_product(torch, bundle):
    """A dense MLP's gate_up with DeepSeek-V3 scales (scaled_gemm(..., activation="swiglu")): each
    blockwise SwiGLU kernel against silu(gate) * up of the float64 product of the dequantized inputs,
    the interleaved weight quantized as stored; and the same call on the bundle's choice, which must
    be a fused kernel."""
    from tilekiln.blockwise import dequantize
    from tilekiln._torch.epilogue import swiglu_unfused

    failures = []
    for kernel in _blockwise_kernels(bundle, activation="swiglu"):
        for i, (m, n, k) in enumerate(((257, 256, 384), (1000, 1280, 1024), (64, 2048, 7168))):
            gen = torch.Generator(device="cuda").manual_seed(3700 + 10 * kernel.index + i)
            a8, sa = _quantize(_outliers(torch, m, k, gen), ROWS)
            w8, sb = _quantize(_weights(torch, n, k, gen), BLOCKS)
            ref = swiglu_unfused(dequantize(a8, sa, ROWS) @ dequantize(w8, sb, BLOCKS).t())
            out = torch.full((m, n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
            bundle.scaled_gemm(a8, w8.t(), sa, sb, out=out, kernel=kernel.id, scale_format="blockwise",
                               activation="swiglu")
            chosen = bundle.scaled_gemm(a8, w8.t(), sa, sb, scale_format="blockwise", activation="swiglu")
            choice = bundle.explain(a8, w8.t(), out_dtype="bf16",
                                    requested=(("scaling", "blockwise"), ("activation", "swiglu")))
            if choice.notes:
                failures.append(f"{(m, n, k)}: the choice does not fuse the pairing: {choice.notes}")
            torch.cuda.synchronize()
            failures += _worst_rows(torch, f"{kernel.id} {(m, n, k)}", {"pinned": out, "chosen": chosen}, ref)
    assert not failures, "\n".join(failures)


# (M, N, K, slices): DeepSeek-V3's kv_a_proj at decode (slices of 512, four scale blocks each), an
# odd M against slices of 1024, a tail N.
SPLIT_SHAPES = ((23, 576, 7168, 14), (100, 1536, 7168, 7), (64, 200, 4096, 4))


def test_blockwise_split_k_promotes_each_slice_with_its_own_scale_blocks(torch, bundle):
    """Every blockwise fp32-partial kernel, pinned to a split (the K slices as batch entries, each
    reading its own columns of scale_a and scale_b), against the float64 product of the dequantized
    inputs; and straight into a float32 result. The weights' blocks differ in magnitude by up to
    2^12, so a slice that read another slice's scales would be far off."""
    from tilekiln.blockwise import dequantize

    failures = []
    for kernel in _blockwise_kernels(bundle, "f32"):
        for i, (m, n, k, split) in enumerate(SPLIT_SHAPES):
            gen = torch.Generator(device="cuda").manual_seed(3600 + 10 * kernel.index + i)
            a8, sa = _quantize(_outliers(torch, m, k, gen), ROWS)
            w8, sb = _quantize(_weights(torch, n, k, gen), BLOCKS)
            ref = dequantize(a8, sa, ROWS) @ dequantize(w8, sb, BLOCKS).t()
            split_out = bundle.scaled_gemm(a8, w8.t(), sa, sb, kernel=f"{kernel.id}/splitk{split}",
                                           scale_format="blockwise")
            fp32 = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
            bundle.scaled_gemm(a8, w8.t(), sa, sb, out=fp32, kernel=kernel.id, scale_format="blockwise")
            torch.cuda.synchronize()
            failures += _worst_rows(torch, f"{kernel.id} {(m, n, k, split)}", {"split": split_out, "f32": fp32}, ref)
    assert not failures, "\n".join(failures)


def test_blockwise_is_more_accurate_than_per_tensor_on_outliers(torch, bundle):
    """Same bf16 data with outliers, both against the float64 product of the bf16 inputs, per token.
    Per-tensor scaling sizes A's one scale for the massive tokens, which leaves the others in
    e4m3's subnormal range; blockwise scales each token's 128-channel blocks on their own."""
    lines, worse = [], []
    for i, (m, n, k) in enumerate(s for s in SHAPES if s[0] >= 64):
        gen = torch.Generator(device="cuda").manual_seed(3500 + i)
        a = _outliers(torch, m, k, gen)
        w = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = a.double() @ w.double().t()
        a8, sa = _quantize(a, ROWS)
        w8, sb = _quantize(w, BLOCKS)
        blockwise = bundle.scaled_gemm(a8, w8.t(), sa, sb, scale_format="blockwise")
        ta, tw = (x.float().abs().amax().reshape(1) / 448.0 for x in (a, w))
        at, wt = ((x.float() / s).to(torch.float8_e4m3fn) for x, s in ((a, ta), (w, tw)))
        tensor = bundle.scaled_gemm(at, wt.t(), ta, tw)
        torch.cuda.synchronize()
        e_bw, e_pt = _row_rel(torch, blockwise, ref), _row_rel(torch, tensor, ref)
        lines.append(f"{(m, n, k)}: mean row relative error blockwise {e_bw:.3g}, per-tensor {e_pt:.3g} "
                     f"(whole result: {_rel(torch, blockwise, ref):.3g}, {_rel(torch, tensor, ref):.3g})")
        if not e_bw < e_pt:
            worse.append(lines[-1])
    print("\n".join(lines))
    assert not worse, "blockwise not more accurate:\n" + "\n".join(worse)


def _operands(torch, m=300, n=200, k=384):
    a8, sa = _quantize(torch.randn(m, k, device="cuda").to(torch.bfloat16), ROWS)
    w8, sb = _quantize(torch.randn(n, k, device="cuda").to(torch.bfloat16), BLOCKS)
    return a8, w8.t(), sa, sb


@pytest.mark.parametrize("change, error, text", [
    (lambda t, a, b, sa, sb: (a, b, sa.contiguous(), sb), ValueError, "scale_a: expected a float32 tensor (M, K/128)"),
    (lambda t, a, b, sa, sb: (a, b, sa, sb[:1]), ValueError, "scale_b: expected a float32 tensor (ceil(N/128), K/128)"),
    (lambda t, a, b, sa, sb: (a, b, sa.cpu(), sb), ValueError, "got device cpu"),
    (lambda t, a, b, sa, sb: (a, b, sa, t.ones(1, device="cuda")), ValueError, "scale_b: expected"),
    (lambda t, a, b, sa, sb: (a[:, :320], b[:320], sa, sb), ValueError, "a: K = 320 is not a multiple of 128"),
])
def test_wrong_scales_raise_naming_the_argument_and_leave_the_device_usable(torch, bundle, change, error, text):
    a, b, sa, sb = _operands(torch)
    # A first, valid call caches a plan; the wrong one differs in its signature and is checked again.
    bundle.scaled_gemm(a, b, sa, sb, scale_format="blockwise")
    with pytest.raises(error, match=re.escape(text)):
        bundle.scaled_gemm(*change(torch, a, b, sa, sb), scale_format="blockwise")
    out = bundle.scaled_gemm(a, b, sa, sb, scale_format="blockwise")
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()


def test_per_tensor_scales_are_refused_for_blockwise_and_block_scales_are_read_from_their_shapes(torch, bundle):
    a, b, sa, sb = _operands(torch)
    one = torch.ones(1, device="cuda")
    with pytest.raises(ValueError, match=re.escape("scale_a: expected a float32 tensor (M, K/128)")):
        bundle.scaled_gemm(a, b, one, one, scale_format="blockwise")
    # Without scale_format, (M, K/128) and (ceil(N/128), K/128) scales are blockwise, as torch reads them.
    assert torch.equal(bundle.scaled_gemm(a, b, sa, sb), bundle.scaled_gemm(a, b, sa, sb, scale_format="blockwise"))
    with pytest.raises(ValueError, match=re.escape("scale_a: expected a float32 tensor (M, 1)")):
        bundle.scaled_gemm(a, b, sa[:, :2], sb)


def test_module_level_entry_point_and_torch_compile(torch, bundle):
    import tilekiln

    a, b, sa, sb = _operands(torch)
    eager = tilekiln.scaled_gemm(a, b, sa, sb, bundle=bundle, scale_format="blockwise")
    compiled = torch.compile(lambda *x: tilekiln.scaled_gemm(*x, bundle=bundle, scale_format="blockwise"),
                             fullgraph=True)(a, b, sa, sb)
    torch.cuda.synchronize()
    assert torch.equal(eager, compiled)
