"""Runtime behaviour on the GPU: fuzzed calls, errors, threads, CUDA graphs, torch.compile."""

from __future__ import annotations

import random
import threading

import pytest

pytestmark = pytest.mark.gpu

FUZZ_CALLS = 1000


def _operand(torch, rows, cols, dtype, transposed, batch, gen, extra):
    """A (batch,) rows x cols operand; transposed views and padded leading dims (multiples of 8)."""
    inner, outer = (rows, cols) if transposed else (cols, rows)
    lead = (inner + 7) // 8 * 8 + 8 * extra
    shape = ((batch,) if batch else ()) + (outer, lead)
    t = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)[..., :inner]
    return t.transpose(-1, -2) if transposed else t


def random_call(torch, rng, gen):
    dtype = rng.choice([torch.bfloat16, torch.float16])
    m, n, k = rng.randint(1, 640), rng.randint(1, 640), rng.randint(1, 640)
    batch_kind = rng.choice(["none", "none", "both", "a", "b"])
    batch = rng.randint(2, 4)
    ba = batch if batch_kind in ("both", "a") else None
    bb = batch if batch_kind in ("both", "b") else None
    a = _operand(torch, m, k, dtype, rng.random() < 0.3, ba, gen, rng.randint(0, 2))
    b = _operand(torch, k, n, dtype, rng.random() < 0.3, bb, gen, rng.randint(0, 2))
    out = None
    if n % 8 or rng.random() < 0.3:
        batch_shape = (batch,) if batch_kind != "none" else ()
        full = torch.full(batch_shape + (m, (n + 7) // 8 * 8), float("nan"), device="cuda", dtype=dtype)
        out = full[..., :n]
    return a, b, out


def test_fuzz_against_float64_reference(bundle, torch):
    rng = random.Random(20261202)
    gen = torch.Generator(device="cuda").manual_seed(7)
    failures, calls = [], 0
    for i in range(FUZZ_CALLS):
        a, b, out = random_call(torch, rng, gen)
        result = bundle.gemm(a, b, out)
        ref = torch.matmul(a.double(), b.double())
        err = ((result.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        calls += 1
        if not err < 1e-2 or torch.isnan(result).any():
            failures.append(f"call {i}: a {tuple(a.shape)} {a.stride()} b {tuple(b.shape)} {b.stride()} "
                            f"{a.dtype}: relative error {err:.3g}")
    torch.cuda.synchronize()
    print(f"fuzz: {calls} calls, {len(failures)} failures")
    assert calls == FUZZ_CALLS and not failures, "\n".join(failures[:20])


def test_documented_errors_leave_the_device_usable(bundle, torch):
    import tilekiln

    bf = torch.bfloat16
    a = torch.randn(64, 64, device="cuda", dtype=bf)
    bad = [
        (lambda: bundle.gemm(torch.randn(64, 12, device="cuda", dtype=bf), torch.randn(12, 64, device="cuda", dtype=bf)),
         ValueError, "multiple of 8"),
        (lambda: bundle.gemm(a.float(), a.float()), tilekiln.NoKernelError, "dtype"),
        (lambda: bundle.gemm(a, a.half()), TypeError, "same dtype"),
        (lambda: bundle.gemm(a, torch.randn(32, 64, device="cuda", dtype=bf)), ValueError, "cannot be multiplied"),
        (lambda: bundle.gemm(a.cpu(), a.cpu()), ValueError, "host memory"),
        (lambda: bundle.gemm(a[:, ::2], a[:32]), ValueError, "strides"),
        (lambda: bundle.gemm(a, a, torch.empty(64, 32, device="cuda", dtype=bf)), ValueError, "out: shape"),
        (lambda: bundle.gemm(torch.randn(2, 2, 64, 64, device="cuda", dtype=bf), a), ValueError, "2-D or 3-D"),
        (lambda: bundle.gemm(torch.randn(3, 64, 64, device="cuda", dtype=bf), torch.randn(2, 64, 64, device="cuda", dtype=bf)),
         ValueError, "broadcast"),
        (lambda: bundle.gemm(torch.randn(64 * 64 + 4, device="cuda", dtype=bf)[4:].view(64, 64), a), ValueError, "16-byte"),
        (lambda: bundle.gemm(a, a, kernel="gemm_sm90_nope"), tilekiln.NoKernelError, "no such kernel"),
    ]
    for call, exc, text in bad:
        with pytest.raises(exc, match=text):
            call()
    out = bundle.gemm(a, a)
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), (a.float() @ a.float()), rtol=2e-2, atol=2e-1)


def test_an_out_no_kernel_stores_is_written_as_torch_matmul_writes_it(bundle, torch):
    """A column-major out= and one of 100 bf16 columns back to back: no kernel stores their rows, so
    the product goes through a result of tilekiln's and a copy (docs/runtime.md, Result layout)."""
    gen = torch.Generator(device="cuda").manual_seed(61)
    a = torch.randn(96, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(100, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    for out in (torch.full((100, 96), float("nan"), device="cuda", dtype=torch.bfloat16).t(),
                torch.full((96, 100), float("nan"), device="cuda", dtype=torch.bfloat16)):
        assert bundle.gemm(a, w.t(), out) is out
        torch.cuda.synchronize()
        assert torch.allclose(out.float(), a.float() @ w.float().t(), rtol=2e-2, atol=2e-1)


def test_extents_past_int32_are_refused_before_launch(bundle, torch):
    """The plan block holds M, N, K and L as int32: a larger extent is refused on the host, and the
    next call runs. Zero-stride views stand in for operands too large to allocate."""
    bf = torch.bfloat16
    a = torch.randn(64, 64, device="cuda", dtype=bf)
    wide = torch.zeros(64, 1, device="cuda", dtype=bf).expand(64, 2**31)
    with pytest.raises(ValueError):
        bundle.gemm(wide, torch.zeros(1, 64, device="cuda", dtype=bf).expand(2**31, 64))
    out = bundle.gemm(a, a)
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), a.float() @ a.float(), rtol=2e-2, atol=2e-1)


def test_operands_freed_right_after_the_call_are_read_before_reuse(bundle, torch):
    """Inputs whose last reference dies as the call returns, while the stream is still busy with
    earlier work, are read by the kernel before the caching allocator hands their memory to the
    NaN-filled tensors allocated next: the launch is enqueued on the allocating stream."""
    bf = torch.bfloat16
    results = []
    torch.cuda._sleep(100_000_000)  # about 50 ms of queued work ahead of every launch below
    for _ in range(8):
        a = torch.randn(256, 256, device="cuda", dtype=bf)
        b = torch.randn(256, 256, device="cuda", dtype=bf)
        reference = a.double() @ b.double()
        results.append((bundle.gemm(a, b), reference))
        del a, b
        torch.full((256, 256), float("nan"), device="cuda", dtype=bf)
        torch.full((256, 256), float("nan"), device="cuda", dtype=bf)
    torch.cuda.synchronize()
    for out, reference in results:
        assert ((out.double() - reference).norm() / reference.norm()).item() < 1e-2


def test_eight_threads_launch_concurrently(bundle, torch):
    errors = []

    def worker(seed):
        try:
            gen = torch.Generator(device="cuda").manual_seed(seed)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i in range(40):
                    m, n, k = 128 + 8 * (seed + i % 5), 256, 192 + 8 * i
                    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
                    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
                    out = bundle.gemm(a, b)
                    ref = a.double() @ b.double()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        errors.append((seed, i, err))
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append((seed, repr(exc)))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_launches_go_straight_to_the_driver(bundle, torch):
    """templates/link/shim.c launches through cuLaunchKernelEx and retries through the CUDA
    runtime only what the driver refuses: a thread with no current context, once."""
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    bundle.gemm(a, b)
    lib = bundle._lib
    before = lib.fallback_launches()
    for _ in range(20):
        out = bundle.gemm(a, b)
    assert lib.fallback_launches() == before
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2

    results = []
    thread = threading.Thread(target=lambda: results.extend(bundle.gemm(a, b) for _ in range(5)))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert len(results) == 5
    assert all(((r.double() - ref).norm() / ref.norm()).item() < 1e-2 for r in results)
    assert lib.fallback_launches() - before <= 1


def test_persistent_launches_start_the_clusters_the_device_holds(bundle, torch):
    """Every kernel's cluster count comes from the driver, and one query per cluster shape
    stands for every kernel of that shape (each runs one CTA per SM)."""
    from tilekiln.select import nominal_clusters

    sm_count = bundle.device(0).sm_count
    lib = bundle._library()
    for k in bundle.kernels:
        resident = bundle.resident_clusters(k, 0)
        assert 1 <= resident <= nominal_clusters(k, sm_count), (k.id, resident)
        if k.cluster_size > 1:
            cluster = (k.config.cluster.m, k.config.cluster.n)
            bundle._ensure_ready(k.index, 0)
            status, exact = lib.max_active_clusters(k.index, 0, k.threads, k.dynamic_smem_bytes, cluster)
            assert status == 0 and exact == resident, (k.id, status, exact, resident)
    print({f"{c.m}x{c.n}": count for (_, c), count in bundle._clusters.items()})


def test_cuda_graph_capture_and_replay(bundle, torch):
    a = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(512, 256, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        bundle.gemm(a, b, out)  # warm-up: plan, load the kernel outside capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bundle.gemm(a, b, out)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_torch_compile_of_a_function_calling_gemm(bundle, torch):
    import tilekiln

    def mlp(x, w1, w2):
        h = torch.relu(tilekiln.gemm(x, w1, bundle=bundle))
        return tilekiln.gemm(h, w2, bundle=bundle) * 0.5

    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16) / 16
    w2 = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16) / 16
    compiled = torch.compile(mlp, fullgraph=True)
    got = compiled(x, w1, w2)
    ref = (torch.relu(x.double() @ w1.double()) @ w2.double()) * 0.5
    assert ((got.double() - ref).norm() / ref.norm()).item() < 2e-2


def test_explain_names_the_choice_and_the_rejections(bundle, torch):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    choice = bundle.explain(a, w.t())
    text = str(choice)
    print(text)
    assert choice.kernel is not None and choice.kernel.id in text
    assert "reject" in text and "layout" in text


CHAIN_STEPS = 6


def _chain_reference(torch, x, w, steps):
    """x, x @ w, ... in float64, each step rounded to the operands' dtype as the kernels store it."""
    ref = [x.double()]
    for _ in range(steps):
        ref.append((ref[-1] @ w.double()).to(x.dtype).double())
    return ref[-1]


def test_dependent_launches_read_their_predecessors_output(bundle, torch):
    """Kernels launch with programmatic stream serialization: each may start while its
    predecessor runs. A chain X <- X @ W through two buffers makes every launch read
    what the one before wrote (read after write) and overwrite what it read (write
    after read); any access before griddepcontrol.wait shows up as a stale operand.
    Run eagerly and as a replayed CUDA graph, for every 16-bit kernel that takes
    row-major A."""
    from tilekiln.spec import requested_fields

    failures = []
    checked = 0
    for kernel in bundle.kernels:
        cfg = kernel.config
        # A kernel with an epilogue (bias, activation, residual) runs only calls that ask for it;
        # a grouped kernel's call takes offsets, not this chain's plain GEMM.
        if (cfg.family != "gemm" or cfg.dtypes.a.value not in ("bf16", "f16") or cfg.dtypes.c.value == "f32"
                or not cfg.layout.a_k_major or any(getattr(cfg, f.name) != f.default for f, _ in requested_fields())):
            continue
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[cfg.dtypes.a.value]
        g = torch.Generator(device="cuda").manual_seed(31 + kernel.index)
        x0 = torch.randn(1024, 1024, device="cuda", dtype=dtype, generator=g)
        w = (torch.randn(1024, 1024, device="cuda", generator=g) / 32).to(dtype)
        if cfg.layout.b_k_major:
            w = w.t().contiguous().t()
        ref = _chain_reference(torch, x0, w, CHAIN_STEPS)
        bufs = [torch.empty_like(x0), torch.empty_like(x0)]

        def chain():
            bufs[0].copy_(x0)
            for i in range(CHAIN_STEPS):
                bundle.gemm(bufs[i % 2], w, bufs[(i + 1) % 2], kernel=kernel.id)

        chain()
        torch.cuda.synchronize()
        results = {"eager": bufs[CHAIN_STEPS % 2].clone()}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
        bufs[0].fill_(float("nan"))
        bufs[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        results["graphed"] = bufs[CHAIN_STEPS % 2].clone()
        for mode, out in results.items():
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if not err < 2e-2:
                failures.append(f"{kernel.id} {mode}: relative error {err:.3g} after {CHAIN_STEPS} steps")
        checked += 1
    print(f"dependent launches: {checked} kernels, {len(failures)} failures")
    assert checked and not failures, "\n".join(failures)
