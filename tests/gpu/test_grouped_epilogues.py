"""An expert MLP's grouped epilogues on the GPU (issue 32): every grouped SwiGLU and row-wise fp8
kernel of the bundle against a per-group float64 reference over random, skewed, empty-group and
one-row routings, in both layouts, with NaN-poisoned outputs whose unowned rows must stay NaN; the
default choice; the unfused fallback; CUDA graph capture and replay with new offsets and counts;
torch.compile, opcheck and torch._scaled_grouped_mm."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (G, N, K, rows per group) for the contiguous layout, N the GEMM's (2I for SwiGLU): empty groups,
# one-row groups, groups smaller than, equal to and just past a tile, all rows in one group; N a
# multiple of 128 but not of 256 (a 256-column tile's second gate/up pair past N), K no tile multiple.
ROUTINGS = (
    (4, 384, 128, [100, 0, 1, 300]),
    (8, 640, 208, [128] * 8),
    (3, 256, 64, [0, 0, 0]),
    (5, 384, 256, [0, 0, 777, 0, 0]),
    (16, 1024, 256, [0, 5, 64, 65, 127, 128, 129, 255, 256, 257, 1, 0, 33, 500, 2, 7]),
    (64, 256, 384, [1] * 64),
)
# Rows of a past the last offset, which no group owns: a kernel must not write them.
SPARE = 7
# (G, M_max, N, K, rows per group) for the masked layout; counts past M_max and below 0 are clamped.
MASKED = (
    (4, 64, 384, 128, [0, 1, 64, 17]),
    (8, 128, 640, 208, [128, 3, 0, 65, 200, -4, 64, 127]),
    (32, 16, 256, 256, [i % 17 for i in range(32)]),
)


def epilogue_kernels(bundle, family):
    # The blockwise SwiGLU ones take block scales: tests/gpu/test_grouped_blockwise.py runs them.
    return [k for k in bundle.kernels if k.config.family == family and k.config.scaling.value != "blockwise"
            and (k.config.activation.gated or k.config.scaling.value == "rowwise")]


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_offs(torch, sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()


def operands(torch, gen, rows, groups, n, k, fp8):
    """a (rows, K) and the (G, N, K) weights (nn.Linear's per expert; SwiGLU: gate and up interleaved,
    which random weights are as they come), in bf16 or e4m3."""
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    a = torch.randn(rows, k, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    return a, w


def scales(torch, gen, kernel, rows_shape, groups, n):
    """The scales a kernel takes: row-wise ones per row of a and per group and column of b (torch's
    shapes), one-element ones for a per-tensor fp8 kernel, none for bf16."""
    if kernel.config.scaling.value == "rowwise":
        return {"scale_a": torch.rand(rows_shape, device="cuda", generator=gen) + 0.5,
                "scale_b": torch.rand(groups, n, device="cuda", generator=gen) + 0.5}
    if kernel.config.dtypes.a.value == "e4m3":
        return {"scale_a": torch.tensor([0.75], device="cuda"), "scale_b": torch.tensor([1.5], device="cuda")}
    return {}


def group_result(torch, x, w_g, g, rows, scale, gated):
    """One group's float64 result: x @ w_g.T times its scales (``rows``: the slice of scale_a of x's
    rows), paired by torch's SwiGLU where ``gated``."""
    from tilekiln._torch.epilogue import swiglu_unfused

    y = x.double() @ w_g.double().t()
    if "scale_b" in scale:
        sa, sb = scale["scale_a"].double(), scale["scale_b"].double()
        if sb.numel() == 1:
            y = y * (sa * sb)
        else:
            y = y * sa.reshape(-1)[rows][:, None] * sb.reshape(sb.shape[0], -1)[g][None, :]
    return swiglu_unfused(y) if gated else y


def contiguous_reference(torch, a, w, sizes, scale, gated):
    out_n = w.shape[1] // 2 if gated else w.shape[1]
    ref = torch.full((a.shape[0], out_n), float("nan"), dtype=torch.float64, device="cuda")
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        ref[rows] = group_result(torch, a[rows], w[g], g, rows, scale, gated)
        start += size
    return ref


def run(bundle, kernel, a, w, rows, out, scale, masked=False):
    """The kernel pinned, through the API a call of its epilogue takes."""
    kwargs = dict(out=out, kernel=kernel.id, **scale)
    if kernel.config.activation.gated:
        call = bundle.grouped_swiglu_masked if masked else bundle.grouped_swiglu
        return call(a, w, rows, **kwargs)
    call = bundle.grouped_gemm_masked if masked else bundle.grouped_gemm
    return call(a, w.transpose(1, 2), rows, **kwargs)


def check_contiguous(torch, out, ref, owned) -> str | None:
    """Rows below ``owned`` against float64; the rest still NaN."""
    if out[:owned].isnan().any():
        return f"{out[:owned].isnan().sum().item()} NaN in owned rows"
    if not out[owned:].isnan().all():
        return "rows no group owns were written"
    err = rel_err(out[:owned], ref[:owned]) if owned else 0.0
    return None if err < 1e-2 else f"error {err:.3g}"


def test_every_grouped_epilogue_kernel_matches_float64(bundle, torch):
    kernels = epilogue_kernels(bundle, "grouped")
    assert kernels, "the bundle has no grouped swiglu or row-wise kernels"
    gen = torch.Generator(device="cuda").manual_seed(61)
    failures = []
    for kernel in kernels:
        gated, fp8 = kernel.config.activation.gated, kernel.config.dtypes.a.value == "e4m3"
        for groups, n, k, sizes in ROUTINGS:
            owned = sum(sizes)
            a, w = operands(torch, gen, owned + SPARE, groups, n, k, fp8)
            scale = scales(torch, gen, kernel, (owned + SPARE,), groups, n)
            out = torch.full((owned + SPARE, n // 2 if gated else n), float("nan"), dtype=torch.bfloat16, device="cuda")
            run(bundle, kernel, a, w, make_offs(torch, sizes), out, scale)
            problem = check_contiguous(torch, out, contiguous_reference(torch, a, w, sizes, scale, gated), owned)
            if problem:
                failures.append(f"{kernel.id} G={groups} N={n} K={k} rows {sizes[:8]}: {problem}")
    assert not failures, "\n".join(failures)


def test_every_masked_epilogue_kernel_matches_float64(bundle, torch):
    kernels = epilogue_kernels(bundle, "grouped_masked")
    assert kernels, "the bundle has no masked swiglu or row-wise kernels"
    gen = torch.Generator(device="cuda").manual_seed(62)
    failures = []
    for kernel in kernels:
        gated, fp8 = kernel.config.activation.gated, kernel.config.dtypes.a.value == "e4m3"
        for groups, m_max, n, k, counts in MASKED:
            a, w = operands(torch, gen, groups * m_max, groups, n, k, fp8)
            a = a.reshape(groups, m_max, k)
            # Row-wise scale_a of the masked layout: (G, M_max), as torch's 3-D operands take it.
            scale = scales(torch, gen, kernel, (groups, m_max), groups, n)
            out = torch.full((groups, m_max, n // 2 if gated else n), float("nan"), dtype=torch.bfloat16,
                             device="cuda")
            run(bundle, kernel, a, w, torch.tensor(counts, dtype=torch.int32, device="cuda"), out, scale, masked=True)
            for g, count in enumerate(counts):
                rows = min(max(count, 0), m_max)
                flat = slice(g * m_max, g * m_max + rows)
                ref = group_result(torch, a[g, :rows], w[g], g, flat, scale, gated)
                got = out[g, :rows]
                if got.isnan().any() or (rows and rel_err(got, ref) >= 1e-2):
                    failures.append(f"{kernel.id} G={groups} M_max={m_max} N={n}: group {g} ({rows} rows) wrong")
                if not out[g, rows:].isnan().all():
                    failures.append(f"{kernel.id} G={groups} M_max={m_max} N={n}: group {g} rows past {rows} written")
    assert not failures, "\n".join(failures)


def routed_sizes(torch, gen, groups, tokens, topk, skew):
    """Rows per expert of top-k routing, Zipf-skewed by ``skew`` (0: uniform)."""
    weights = torch.arange(1, groups + 1, device="cuda", dtype=torch.float64) ** -skew
    picks = torch.multinomial(weights.expand(tokens, groups), topk, replacement=False, generator=gen)
    return torch.bincount(picks.flatten(), minlength=groups).tolist()


@pytest.mark.parametrize("fp8", [False, True])
def test_random_and_skewed_routing_through_the_default_choice(bundle, torch, fp8):
    """The gate_up projection of an MoE layer as a model calls it: the bundle picks a fused kernel."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(63)
    for groups, tokens, topk, skew in ((8, 1000, 2, 0.0), (32, 700, 4, 1.2), (128, 300, 8, 1.5)):
        sizes = routed_sizes(torch, gen, groups, tokens, topk, skew)
        m, n, k = sum(sizes), 768, 512
        a, w = operands(torch, gen, m, groups, n, k, fp8)
        scale = {}
        if fp8:
            scale = {"scale_a": torch.rand(m, 1, device="cuda", generator=gen) + 0.5,
                     "scale_b": torch.rand(groups, 1, n, device="cuda", generator=gen) + 0.5}
        offs = make_offs(torch, sizes)
        choice = tilekiln.explain(a, w.transpose(1, 2), offs=offs, activation="swiglu",
                                  scale_format="rowwise" if fp8 else None, bundle=bundle)
        assert choice.kernel.config.activation.gated and not choice.notes, str(choice)
        got = tilekiln.grouped_swiglu(a, w, offs, bundle=bundle, **scale)
        ref = contiguous_reference(torch, a, w, sizes, scale, True)
        assert got.shape == (m, n // 2) and got.isnan().sum().item() == 0
        assert rel_err(got, ref) < 1e-2
        if fp8:
            # Row-wise without SwiGLU, the down projection's scales.
            got = tilekiln.grouped_gemm(a, w.transpose(1, 2), offs, bundle=bundle, **scale)
            assert rel_err(got, contiguous_reference(torch, a, w, sizes, scale, False)) < 1e-2


def test_a_swiglu_no_kernel_fuses_runs_the_gemm_then_torchs_pairing(bundle, torch):
    """I = 96 is not a whole number of 64-row blocks per tile: the plain grouped kernel runs and torch
    pairs its columns, writing the rows no group owns as zeros."""
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(64)
    sizes, n, k = [0, 37, 1, 200], 192, 256
    owned = sum(sizes)
    a, w = operands(torch, gen, owned + SPARE, len(sizes), n, k, False)
    offs = make_offs(torch, sizes)
    choice = tilekiln.explain(a, w.transpose(1, 2), offs=offs, activation="swiglu", bundle=bundle)
    assert choice.notes and choice.notes[0].startswith("unfused: no kernel computes activation swiglu"), str(choice)
    out = torch.full((owned + SPARE, n // 2), float("nan"), dtype=torch.bfloat16, device="cuda")
    tilekiln.grouped_swiglu(a, w, offs, out=out, bundle=bundle)
    ref = contiguous_reference(torch, a, w, sizes, {}, True)
    assert rel_err(out[:owned], ref[:owned]) < 1e-2
    assert (out[owned:] == 0).all()


@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_graph_replays_with_new_offsets(bundle, torch, fp8):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(65)
    groups, n, k, m = 16, 640, 256, 2048
    a, w = operands(torch, gen, m, groups, n, k, fp8)
    scale = {}
    if fp8:
        scale = {"scale_a": torch.rand(m, device="cuda", generator=gen) + 0.5,
                 "scale_b": torch.rand(groups, n, device="cuda", generator=gen) + 0.5}
    offs = make_offs(torch, [m // groups] * groups)
    out = torch.empty(m, n // 2, dtype=torch.bfloat16, device="cuda")
    tilekiln.grouped_swiglu(a, w, offs, out=out, bundle=bundle, **scale)  # plan and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilekiln.grouped_swiglu(a, w, offs, out=out, bundle=bundle, **scale)
    routings = ([m // groups] * groups, [m] + [0] * (groups - 1), [0] * (groups - 1) + [m],
                [1] * (groups - 1) + [m - groups + 1], [0, 3, 0, 200, 1, 0, 900, 0, 64, 65, 0, 127, 129, 0, 7, 552])
    for sizes in routings:
        assert sum(sizes) == m
        offs.copy_(make_offs(torch, sizes))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = contiguous_reference(torch, a, w, sizes, scale, True)
        assert out.isnan().sum().item() == 0, sizes
        assert rel_err(out, ref) < 1e-2, sizes


def test_masked_cuda_graph_replays_with_new_counts(bundle, torch):
    import tilekiln

    gen = torch.Generator(device="cuda").manual_seed(66)
    groups, m_max, n, k = 16, 64, 512, 256
    a, w = operands(torch, gen, groups * m_max, groups, n, k, False)
    a = a.reshape(groups, m_max, k)
    masked_m = torch.full((groups,), m_max, dtype=torch.int32, device="cuda")
    out = torch.empty(groups, m_max, n // 2, dtype=torch.bfloat16, device="cuda")
    tilekiln.grouped_swiglu_masked(a, w, masked_m, out=out, bundle=bundle)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilekiln.grouped_swiglu_masked(a, w, masked_m, out=out, bundle=bundle)
    for counts in ([m_max] * groups, [0] * groups, [1] * groups, [(7 * g) % (m_max + 1) for g in range(groups)]):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for g, count in enumerate(counts):
            ref = group_result(torch, a[g, :count], w[g], g, None, {}, True)
            assert not out[g, :count].isnan().any() and out[g, count:].isnan().all(), counts
            if count:
                assert rel_err(out[g, :count], ref) < 1e-2, counts


def test_torch_compile_and_opcheck(bundle, torch, opcheck):
    import tilekiln
    from tilekiln._torch.ops import grouped_gemm_op
    from tilekiln._torch.streams import bundle_ref

    gen = torch.Generator(device="cuda").manual_seed(67)
    sizes = [10, 0, 300, 90]
    offs = make_offs(torch, sizes)
    a, w = operands(torch, gen, sum(sizes), 4, 384, 256, False)

    @torch.compile(fullgraph=True)
    def layer(x, weights, ends):
        return tilekiln.grouped_swiglu(x, weights, ends, bundle=bundle) * 2

    got = layer(a, w, offs)
    assert rel_err(got, 2 * contiguous_reference(torch, a, w, sizes, {}, True)) < 1e-2
    opcheck(grouped_gemm_op, (a, w.transpose(1, 2), offs, None, None, bundle_ref(bundle), "", "swiglu"))


def test_row_wise_scales_match_torch_scaled_grouped_mm(bundle, torch):
    import tilekiln

    if not hasattr(torch, "_scaled_grouped_mm"):
        pytest.skip("this torch has no torch._scaled_grouped_mm")
    gen = torch.Generator(device="cuda").manual_seed(68)
    # torch's kernel wants each group's rows a multiple of 16 and N, K multiples of 16.
    sizes, n, k = [0, 32, 16, 256], 512, 256
    offs = make_offs(torch, sizes)
    a, w = operands(torch, gen, sum(sizes), len(sizes), n, k, True)
    scale_a = torch.rand(sum(sizes), device="cuda", generator=gen) + 0.5
    scale_b = torch.rand(len(sizes), n, device="cuda", generator=gen) + 0.5
    try:
        theirs = torch._scaled_grouped_mm(a, w.transpose(1, 2), scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16)
    except RuntimeError as exc:
        pytest.skip(f"torch._scaled_grouped_mm does not run here: {exc}")
    ours = tilekiln.grouped_gemm(a, w.transpose(1, 2), offs, scale_a=scale_a, scale_b=scale_b, bundle=bundle)
    assert rel_err(ours, theirs.double()) < 1e-2
