"""tilekiln.grouped_gemm on the GPU: every grouped kernel of the bundle against a per-group float64
reference, over random, skewed and degenerate routings, with NaN-poisoned outputs; CUDA graph
capture and replay with new offsets; the clamp of offsets that break the contract."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (G, N, K, rows per group): empty groups, one-row groups, groups smaller than, equal to and
# just past a tile, all rows in one group, every group empty, N and K that are no tile multiple.
ROUTINGS = (
    (4, 256, 128, [100, 0, 1, 300]),
    (8, 384, 208, [128] * 8),
    (3, 136, 64, [0, 0, 0]),
    (1, 512, 512, [1000]),
    (5, 264, 256, [0, 0, 777, 0, 0]),
    (16, 1024, 256, [0, 5, 64, 65, 127, 128, 129, 255, 256, 257, 1, 0, 33, 500, 2, 7]),
    (64, 512, 384, [1] * 64),
)


def plain(kernel) -> bool:
    """A grouped kernel without the expert-MLP epilogues (tests/gpu/test_grouped_epilogues.py has those)
    or block scales (tests/gpu/test_blockscaled_grouped.py)."""
    return (not kernel.config.activation.gated and kernel.config.scaling.value == "tensor"
            and kernel.config.block_scale is None)


def grouped_kernels(bundle):
    return [k for k in bundle.kernels if k.config.family == "grouped" and plain(k)]


def make_offs(torch, sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()


def reference(torch, a, b, offs):
    """Per group, in float64: out[rows of g] = a[rows of g] @ b[g]; b is (G, K, N)."""
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].double() @ b[g].double()
        start = end
    return out


def inputs(torch, kernel, gen, groups, n, k, m):
    """a (m, K), b (G, K, N) in the kernel's layout (K-major: nn.Linear weights transposed), and
    the scales an fp8 kernel takes."""
    a = torch.randn(m, k, device="cuda", generator=gen)
    w = torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5
    fp8 = kernel.config.dtypes.a.value == "e4m3"
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    a = a.to(dtype)
    b = w.to(dtype).transpose(1, 2) if kernel.config.layout.b_k_major else w.transpose(1, 2).contiguous().to(dtype)
    scales = {}
    if fp8:
        scales = {"scale_a": torch.tensor([0.75], device="cuda"), "scale_b": torch.tensor([1.5], device="cuda")}
    return a, b, scales


def expected(torch, a, b, offs, scales):
    ref = reference(torch, a.float(), b.float(), offs)
    if scales:
        ref = ref * (scales["scale_a"].double() * scales["scale_b"].double())
    return ref


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_every_grouped_kernel_matches_float64(bundle, torch):
    kernels = grouped_kernels(bundle)
    assert kernels, "the bundle has no grouped kernels"
    gen = torch.Generator(device="cuda").manual_seed(41)
    failures = []
    for kernel in kernels:
        for groups, n, k, sizes in ROUTINGS:
            m = sum(sizes)
            a, b, scales = inputs(torch, kernel, gen, groups, n, k, m)
            offs = make_offs(torch, sizes)
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm(a, b, offs, out=out, kernel=kernel.id, **scales)
            ref = expected(torch, a, b, offs, scales)
            nans = out.isnan().sum().item()
            err = rel_err(out, ref) if m else 0.0
            if nans or not err < 1e-2:
                failures.append(f"{kernel.id} G={groups} N={n} K={k} rows {sizes[:8]}: error {err:.3g}, {nans} NaN")
    assert not failures, "\n".join(failures)


def test_random_and_skewed_routing_through_the_default_choice(bundle, torch):
    """Top-k routing of tokens to experts, uniform and Zipf-skewed, as an MoE layer sorts it."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(42)
    for groups, tokens, topk, skew in ((8, 1000, 2, 0.0), (32, 700, 4, 1.2), (128, 300, 8, 1.5)):
        weights = torch.arange(1, groups + 1, device="cuda", dtype=torch.float64) ** -skew
        picks = torch.multinomial(weights.expand(tokens, groups), topk, replacement=False, generator=gen)
        counts = torch.bincount(picks.flatten(), minlength=groups)
        m = int(counts.sum())
        offs = counts.cumsum(0).to(torch.int32)
        a = torch.randn(m, 512, device="cuda", generator=gen).to(torch.bfloat16)
        b = (torch.randn(groups, 768, 512, device="cuda", generator=gen) / 512**0.5).to(torch.bfloat16)
        out = torch.full((m, 768), float("nan"), dtype=torch.bfloat16, device="cuda")
        tilekiln.grouped_gemm(a, b.transpose(1, 2), offs, out=out, bundle=bundle)
        ref = reference(torch, a, b.transpose(1, 2), offs)
        assert out.isnan().sum().item() == 0
        assert rel_err(out, ref) < 1e-2
        # The allocating form computes the same.
        got = tilekiln.grouped_gemm(a, b.transpose(1, 2), offs, bundle=bundle)
        assert rel_err(got, ref) < 1e-2


def test_cuda_graph_replays_with_new_offsets(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(43)
    groups, n, k, m = 16, 640, 256, 2048
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16).transpose(1, 2)
    offs = make_offs(torch, [m // groups] * groups)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    tilekiln.grouped_gemm(a, b, offs, out=out, bundle=bundle)  # plan and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilekiln.grouped_gemm(a, b, offs, out=out, bundle=bundle)
    routings = ([m // groups] * groups, [m] + [0] * (groups - 1), [0] * (groups - 1) + [m],
                [1] * (groups - 1) + [m - groups + 1], [0, 3, 0, 200, 1, 0, 900, 0, 64, 65, 0, 127, 129, 0, 7, 552])
    for sizes in routings:
        assert sum(sizes) == m
        offs.copy_(make_offs(torch, sizes))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(torch, a, b, offs)
        assert out.isnan().sum().item() == 0, sizes
        assert rel_err(out, ref) < 1e-2, sizes


def test_offsets_that_break_the_contract_are_clamped(bundle, torch):
    """Decreasing, negative and too large ends are clamped into [previous end, total_M] on the
    device: nothing outside out is written, and rows past the last clamped end are untouched."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(44)
    groups, n, k, m = 6, 256, 128, 500
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16).transpose(1, 2)
    guard = torch.full((m + 2 * 128, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = guard[128:128 + m]
    for raw in ([100, 50, 300, -7, 450, 400], [-5, -5, 10, 10, 9999, 20], [600] * 6, [0] * 6):
        guard.fill_(float("nan"))
        offs = torch.tensor(raw, dtype=torch.int32, device="cuda")
        tilekiln.grouped_gemm(a, b, offs, out=out, bundle=bundle)
        torch.cuda.synchronize()
        ends, prev = [], 0
        for r in raw:
            prev = min(max(r, prev), m)
            ends.append(prev)
        clamped = torch.tensor(ends, dtype=torch.int32, device="cuda")
        ref = reference(torch, a, b, clamped)
        last = ends[-1]
        assert guard[:128].isnan().all() and guard[128 + m:].isnan().all(), raw
        assert out[last:].isnan().all(), raw
        assert out[:last].isnan().sum().item() == 0, raw
        if last:
            assert rel_err(out[:last], ref[:last]) < 1e-2, raw


def test_a_padded_out_keeps_its_row_padding(bundle, torch):
    """N = 100 into a (total_M, 104) buffer's first 100 columns: every kernel writes each group's
    rows and never the 4 padding columns, which belong to the caller (a full tile's TMA stores
    write whole 16-byte chunks, and a partial tile's 16-byte vector at column 96 would reach
    column 103: the runtime stages such an out, and the partial tiles' stores stop at N)."""
    gen = torch.Generator(device="cuda").manual_seed(46)
    groups, n, k, sizes = 5, 100, 128, [1, 0, 77, 300, 129]
    m = sum(sizes)
    offs = make_offs(torch, sizes)
    failures = []
    for kernel in grouped_kernels(bundle):
        if not kernel.config.layout.b_k_major:
            continue  # a (G, K, 100) N-major B has 200-byte rows, which TMA cannot load
        a, b, scales = inputs(torch, kernel, gen, groups, n, k, m)
        buffer = torch.full((m, 104), float("nan"), dtype=torch.bfloat16, device="cuda")
        buffer[:, n:] = 7.0
        bundle.grouped_gemm(a, b, offs, out=buffer[:, :n], kernel=kernel.id, **scales)
        torch.cuda.synchronize()
        err = rel_err(buffer[:, :n], expected(torch, a, b, offs, scales))
        if not (buffer[:, n:] == 7.0).all() or buffer[:, :n].isnan().any() or not err < 1e-2:
            failures.append(f"{kernel.id}: padding kept {bool((buffer[:, n:] == 7.0).all())}, error {err:.3g}")
    assert not failures, "\n".join(failures)


def test_matches_torch_grouped_mm(bundle, torch):
    import tilekiln

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    gen = torch.Generator(device="cuda").manual_seed(45)
    groups, n, k = 8, 1024, 512
    sizes = [0, 17, 128, 300, 1, 64, 0, 490]
    offs = make_offs(torch, sizes)
    a = torch.randn(sum(sizes), k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
    ours = tilekiln.grouped_gemm(a, w.transpose(1, 2), offs, bundle=bundle)
    theirs = torch._grouped_mm(a, w.transpose(1, 2), offs=offs)
    assert rel_err(ours, theirs.double()) < 1e-2


def test_torch_compile_traces_one_node(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(46)
    offs = make_offs(torch, [10, 0, 300, 90])
    a = torch.randn(400, 256, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(4, 384, 256, device="cuda", generator=gen) / 16).to(torch.bfloat16)

    @torch.compile(fullgraph=True)
    def layer(x, weights, ends):
        return tilekiln.grouped_gemm(x, weights.transpose(1, 2), ends, bundle=bundle) * 2

    got = layer(a, w, offs)
    assert rel_err(got, 2 * reference(torch, a, w.transpose(1, 2), offs)) < 1e-2


# Masked layout: (G, M_max, N, K, rows per group), counts past M_max and below 0 included (clamped).
MASKED = (
    (4, 64, 256, 128, [0, 1, 64, 17]),
    (8, 128, 384, 208, [128, 3, 0, 65, 200, -4, 64, 127]),
    (1, 32, 512, 512, [32]),
    (32, 16, 1024, 256, [i % 17 for i in range(32)]),
)


def masked_kernels(bundle):
    return [k for k in bundle.kernels if k.config.family == "grouped_masked" and plain(k)]


def check_masked(torch, out, a, b, counts, scales):
    """Rows below each clamped count against float64; every other row still NaN."""
    m_max = a.shape[1]
    scale = 1.0
    if scales:
        scale = (scales["scale_a"].double() * scales["scale_b"].double()).item()
    problems = []
    for g, count in enumerate(counts):
        rows = min(max(count, 0), m_max)
        ref = a[g, :rows].double() @ b[g].double() * scale
        got = out[g, :rows]
        if got.isnan().any() or (rows and rel_err(got, ref) >= 1e-2):
            problems.append(f"group {g} ({rows} rows) wrong")
        if not out[g, rows:].isnan().all():
            problems.append(f"group {g}: rows past {rows} written")
    return problems


def test_every_masked_kernel_matches_float64(bundle, torch):
    kernels = masked_kernels(bundle)
    assert kernels, "the bundle has no masked grouped kernels"
    gen = torch.Generator(device="cuda").manual_seed(47)
    failures = []
    for kernel in kernels:
        for groups, m_max, n, k, counts in MASKED:
            a, b, scales = inputs(torch, kernel, gen, groups, n, k, groups * m_max)
            a = a.reshape(groups, m_max, k)
            masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
            out = torch.full((groups, m_max, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm_masked(a, b, masked_m, out=out, kernel=kernel.id, **scales)
            torch.cuda.synchronize()
            failures += [f"{kernel.id} G={groups} M_max={m_max}: {p}"
                         for p in check_masked(torch, out, a.float(), b.float(), counts, scales)]
    assert not failures, "\n".join(failures)


def test_masked_cuda_graph_replays_with_new_counts(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(48)
    groups, m_max, n, k = 16, 64, 512, 256
    a = torch.randn(groups, m_max, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16).transpose(1, 2)
    masked_m = torch.full((groups,), m_max, dtype=torch.int32, device="cuda")
    out = torch.empty(groups, m_max, n, dtype=torch.bfloat16, device="cuda")
    tilekiln.grouped_gemm_masked(a, b, masked_m, out=out, bundle=bundle)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilekiln.grouped_gemm_masked(a, b, masked_m, out=out, bundle=bundle)
    for counts in ([m_max] * groups, [0] * groups, [1] * groups, [(7 * g) % (m_max + 1) for g in range(groups)]):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not check_masked(torch, out, a, b, counts, {}), counts
