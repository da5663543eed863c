"""An ``out=`` view whose rows end short of a 16-byte boundary: the columns past N in its rows are
the caller's (a column slice of a wider buffer), and TMA stores, which write a row in whole
16-byte chunks, would overwrite them. Every entry point leaves them as they were and writes every
element of out; the rows a grouped call does not own stay untouched too."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

N, WIDTH = 100, 136  # 200-byte rows inside 272-byte ones: the chunk of column 99 reaches column 103
SENTINEL = 7.0


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def view(torch, *lead):
    """A (*lead, N) NaN-filled column slice of a (*lead, WIDTH) bf16 buffer whose other columns hold
    SENTINEL; returns (buffer, view)."""
    buffer = torch.full((*lead, WIDTH), float("nan"), device="cuda", dtype=torch.bfloat16)
    buffer[..., N:] = SENTINEL
    return buffer, buffer[..., :N]


def untouched(buffer) -> bool:
    return bool((buffer[..., N:] == SENTINEL).all())


def dense_kernels(bundle):
    """The plain bf16 tn GEMM kernels (no epilogue, swap-AB or split), one per tile shape."""
    seen, kernels = set(), []
    for k in bundle.kernels:
        cfg = k.config
        if (cfg.family != "gemm" or k.id.count("_") != 8 or not k.id.startswith("gemm_sm90_bf16_bf16_f32_bf16_tn_")):
            continue
        tile = k.id.split("_")[-2]
        if tile not in seen:
            seen.add(tile)
            kernels.append(k)
    return kernels


def test_every_dense_tile_leaves_the_columns_past_n_alone(bundle, torch):
    gen = torch.Generator(device="cuda").manual_seed(51)
    a = torch.randn(300, 256, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(N, 256, device="cuda", generator=gen) / 16).to(torch.bfloat16)
    ref = a.double() @ w.double().t()
    kernels = dense_kernels(bundle)
    assert kernels, "the bundle has no plain bf16 tn kernels"
    failures = []
    for kernel in kernels:
        buffer, out = view(torch, 300)
        assert bundle.gemm(a, w.t(), out=out, kernel=kernel.id) is out
        torch.cuda.synchronize()
        if not untouched(buffer) or out.isnan().any() or not rel_err(out, ref) < 1e-2:
            failures.append(f"{kernel.id}: padding kept {untouched(buffer)}, error {rel_err(out, ref):.3g}")
    assert not failures, "\n".join(failures)


def test_scaled_addmm_and_linear_leave_the_columns_past_n_alone(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(52)
    a = torch.randn(77, 512, device="cuda", generator=gen)
    w = torch.randn(N, 512, device="cuda", generator=gen) / 23
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.tensor([1.0], device="cuda")
    buffer, out = view(torch, 77)
    tilekiln.scaled_gemm(a8, w8.t(), one, one, out=out, bundle=bundle)
    torch.cuda.synchronize()
    assert untouched(buffer)
    assert rel_err(out, a8.double() @ w8.double().t()) < 1e-2

    x, wb = a.to(torch.bfloat16), w.to(torch.bfloat16)
    product = x.double() @ wb.double().t()
    # addmm in place: out is also the input, read at its own strides.
    buffer, out = view(torch, 77)
    residual = torch.randn(77, N, device="cuda", generator=gen).to(torch.bfloat16)
    out.copy_(residual)
    tilekiln.addmm(out, x, wb.t(), beta=0.5, alpha=2.0, out=out, bundle=bundle)
    torch.cuda.synchronize()
    assert untouched(buffer)
    assert rel_err(out, 2.0 * product + 0.5 * residual.double()) < 1e-2
    # linear with a residual at out's strides (the fused form).
    buffer, out = view(torch, 77)
    res_buffer = torch.randn(77, WIDTH, device="cuda", generator=gen).to(torch.bfloat16)
    tilekiln.linear(x, wb, residual=res_buffer[:, :N], out=out, bundle=bundle)
    torch.cuda.synchronize()
    assert untouched(buffer)
    assert rel_err(out, product + res_buffer[:, :N].double()) < 1e-2


def test_masked_grouped_leaves_the_columns_past_n_and_the_unowned_rows_alone(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(53)
    groups, m_max, k = 4, 96, 256
    counts = [96, 0, 33, 70]
    a = torch.randn(groups, m_max, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(groups, N, k, device="cuda", generator=gen) / 16).to(torch.bfloat16)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    buffer, out = view(torch, groups, m_max)
    tilekiln.grouped_gemm_masked(a, w.transpose(1, 2), masked_m, out=out, bundle=bundle)
    torch.cuda.synchronize()
    assert untouched(buffer)
    for g, rows in enumerate(counts):
        assert out[g, rows:].isnan().all(), g
        if rows:
            assert rel_err(out[g, :rows], a[g, :rows].double() @ w[g].double().t()) < 1e-2, g
