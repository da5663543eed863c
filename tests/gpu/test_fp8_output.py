"""fp8 e4m3 results with a per-tensor output scale on the GPU: every e4m3-result kernel, pinned,
against saturate(float64 reference * scale_result) rounded to e4m3, on fresh random inputs, NaN-poisoned
outputs and N not a multiple of the tile, with a scale_result that pushes the largest values past
448 (they must come out as +-448, never inf or NaN); the selection tilekiln.scaled_gemm makes;
agreement with torch._scaled_mm; torch.compile; and torch.library.opcheck of the operators."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (M, K, N): odd M on the ping-pong tiles, N not a multiple of 64, 128 or 256 (the last tile's
# stores stop at N; N stays a multiple of 16, an e4m3 row's 16 bytes), a large problem.
SHAPES = ((1, 512, 1008), (37, 768, 1040), (300, 2048, 1552), (2048, 4096, 1040))
E4M3_MAX = 448.0


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poisoned(torch, m, n):
    """An (m, n) NaN-filled e4m3 tensor whose rows are padded to 16 bytes, as TMA needs."""
    return torch.full((m, -(-n // 16) * 16), float("nan"), device="cuda", dtype=torch.float8_e4m3fn)[:, :n]


def operands(torch, gen, m, k, n, rowwise):
    fp8 = torch.float8_e4m3fn
    a = torch.randn(m, k, device="cuda", generator=gen).to(fp8)
    w = torch.randn(n, k, device="cuda", generator=gen).to(fp8)
    if rowwise:
        sa = torch.rand(m, 1, device="cuda", generator=gen) + 0.5
        sb = torch.rand(1, n, device="cuda", generator=gen) + 0.5
    else:
        sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
    return a, w, sa, sb


def scale_result_for(torch, k):
    """A scale_result that takes products past 2.5 spreads (about sqrt(K) * scales) beyond 448."""
    return torch.tensor([E4M3_MAX / (2.5 * 0.5 * 0.25 * k ** 0.5)], device="cuda")


def check(torch, out, exact, scale_result, what, failures):
    """``out`` against ``exact`` (the float64 value before the output scale)."""
    from tilekiln._torch.epilogue import saturate_result

    got = out.double()
    ref = saturate_result(exact, scale_result.item(), torch.float8_e4m3fn).double()
    beyond = (exact * scale_result.item()).abs() > E4M3_MAX
    if torch.isnan(got).any() or torch.isinf(got).any():
        failures.append(f"{what}: NaN or inf in the result")
    elif not (got[beyond].abs() == E4M3_MAX).all():
        failures.append(f"{what}: values past 448 did not saturate to +-448")
    elif not rel_err(got, ref) < 1e-2:
        failures.append(f"{what}: error {rel_err(got, ref):.3g}")
    return int(beyond.sum())


def fp8_result_kernels(bundle):
    kernels = [k for k in bundle.kernels if k.config.family == "gemm" and k.config.dtypes.c.value == "e4m3"]
    assert kernels and any(k.config.scaling.value == "rowwise" for k in kernels)
    return kernels


def test_every_e4m3_result_kernel_matches_the_saturated_float64_reference(bundle, torch):
    from tilekiln._torch.run import run_scaled_gemm

    gen = torch.Generator(device="cuda").manual_seed(43)
    failures, saturated = [], 0
    for kernel in fp8_result_kernels(bundle):
        rowwise = kernel.config.scaling.value == "rowwise"
        requested = (("scaling", "rowwise"),) if rowwise else ()
        for m, k, n in SHAPES:
            a, w, sa, sb = operands(torch, gen, m, k, n, rowwise)
            scale_result = scale_result_for(torch, k)
            out = poisoned(torch, m, n)
            run_scaled_gemm(bundle, a, w.t(), sa, sb, torch.float8_e4m3fn, out, None, kernel.id, requested,
                            None, scale_result)
            exact = (a.double() @ w.double().t()) * sa.double() * sb.double()
            saturated += check(torch, out, exact, scale_result, f"{kernel.id} {m}x{k}x{n}", failures)
    assert not failures, failures
    assert saturated > 0  # the saturation was exercised


def test_scaled_gemm_selects_an_e4m3_kernel_and_agrees_with_torch_scaled_mm(bundle, torch):
    import tilekiln
    from tilekiln._torch.epilogue import saturate_result

    gen = torch.Generator(device="cuda").manual_seed(44)
    for rowwise in (False, True):
        m, k, n = 512, 1024, 1536
        a, w, sa, sb = operands(torch, gen, m, k, n, rowwise)
        scale_result = scale_result_for(torch, k)
        choice = tilekiln.explain(a, w.t(), bundle=bundle, out_dtype=torch.float8_e4m3fn,
                                  scale_format="rowwise" if rowwise else "tensor")
        assert choice.kernel.config.dtypes.c.value == "e4m3", choice
        out = tilekiln.scaled_gemm(a, w.t(), sa, sb, out_dtype=torch.float8_e4m3fn, scale_result=scale_result,
                                   bundle=bundle)
        assert out.dtype == torch.float8_e4m3fn and out.shape == (m, n)
        failures = []
        exact = (a.double() @ w.double().t()) * sa.double() * sb.double()
        check(torch, out, exact, scale_result, f"rowwise={rowwise}", failures)
        assert not failures, failures
        # torch 2.11's _scaled_mm returned the unscaled product for an e4m3 result with scale_result on
        # an H100 (2026-12-07), so its fp32 result is scaled and saturated here, as cuBLASLt's D scale is.
        theirs = torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16 if rowwise else torch.float32)
        assert rel_err(out, saturate_result(theirs.double(), scale_result.item(), torch.float8_e4m3fn).double()) < 2e-2


def test_values_far_past_448_saturate_and_zero_stays_zero(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(45)
    _, w, sa, sb = operands(torch, gen, 256, 512, 512, False)
    x = torch.randn(256, 512, device="cuda", generator=gen)
    x[:8] = 0
    a = x.to(torch.float8_e4m3fn)
    huge = torch.tensor([1e6], device="cuda")
    out = tilekiln.scaled_gemm(a, w.t(), sa, sb, out_dtype=torch.float8_e4m3fn, scale_result=huge, bundle=bundle)
    exact = (a.double() @ w.double().t()) * 0.125
    got = out.double()
    assert not torch.isnan(got).any()
    # A sum whose exact value lies within the accumulation error of zero may come out with either
    # sign: Hopper's fp8 MMA keeps about 14 bits of its running sum (DeepSeek-V3's report, 3.3.2),
    # so near-zero sums of terms up to the row's largest are not resolved. Every other one is far
    # past 448 / 1e6 and saturates.
    clear = exact.abs() > 1e-2 * exact.abs().max()
    assert clear.sum() > 0.9 * exact.numel()
    assert (got[clear & (exact > 0)] == E4M3_MAX).all() and (got[clear & (exact < 0)] == -E4M3_MAX).all()
    assert (got[:8] == 0).all()  # x's zero rows


def test_the_compiled_call_is_the_eager_one(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(46)
    a, w, sa, sb = operands(torch, gen, 384, 1024, 1024, False)
    scale_result = scale_result_for(torch, 1024)

    def f(a, w, sa, sb, sr):
        return tilekiln.scaled_gemm(a, w.t(), sa, sb, out_dtype=torch.float8_e4m3fn, scale_result=sr, bundle=bundle)

    eager = f(a, w, sa, sb, scale_result)
    compiled = torch.compile(f, fullgraph=True)(a, w, sa, sb, scale_result)
    assert torch.equal(eager.view(torch.uint8), compiled.view(torch.uint8))


def test_operators_with_scale_result_pass_torch_library_opcheck(bundle, torch, opcheck):
    from tilekiln._torch.ops import scaled_gemm_op, scaled_gemm_out_op
    from tilekiln._torch.streams import bundle_ref

    fp8 = torch.float8_e4m3fn
    a8 = torch.randn(64, 128, device="cuda").to(fp8)
    w8 = torch.randn(112, 128, device="cuda").to(fp8).t()
    s = torch.tensor([1.0], device="cuda")
    sr = torch.tensor([4.0], device="cuda")
    ref = bundle_ref(bundle)
    for op, args in ((scaled_gemm_op, (a8, w8, s, s, fp8, ref, "", "tensor", None, sr)),
                     (scaled_gemm_out_op, (a8, w8, s, s, torch.empty(64, 112, device="cuda", dtype=fp8),
                                                  ref, "", "tensor", None, sr)),
                     (scaled_gemm_op, (a8, w8, torch.rand(64, 1, device="cuda"),
                                              torch.rand(1, 112, device="cuda"), fp8, ref, "", "rowwise", None, sr))):
        opcheck(op, args)
