"""Two or more GPUs in one process (issue: several GPUs): each device gets its own prepared
kernels, launches stay on their device, threads and streams per device are honoured. Skips on a
machine with one GPU."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def devices(torch):
    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip(f"needs two or more GPUs, this machine has {count}")
    return list(range(count))


def rel_err(got, ref) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_each_device_runs_every_entry_point_from_its_own_thread(bundle, torch, devices, gpu_bundle_dir,
                                                                 monkeypatch):
    import tilekiln

    monkeypatch.setenv("TILEKILN_BUNDLE_PATH", str(gpu_bundle_dir))  # the default bundle of every device
    errors = []

    def worker(device):
        try:
            gen = torch.Generator(device=f"cuda:{device}").manual_seed(40 + device)
            stream = torch.cuda.Stream(device=device)
            with torch.cuda.device(device), torch.cuda.stream(stream):
                for i in range(30):
                    m = 64 + 32 * (i % 7)
                    x = torch.randn(m, 1024, device=f"cuda:{device}", dtype=torch.bfloat16, generator=gen)
                    w = torch.randn(768, 1024, device=f"cuda:{device}", dtype=torch.bfloat16, generator=gen) / 32
                    ref = x.double() @ w.double().t()
                    one = torch.ones(1, device=f"cuda:{device}")
                    results = {
                        "gemm": (tilekiln.gemm(x, w.t()), ref),
                        "linear": (tilekiln.linear(x, w, activation="silu", bundle=bundle),
                                   torch.nn.functional.silu(ref)),
                        "scaled_gemm": (tilekiln.scaled_gemm(x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t(),
                                                             one, one, bundle=bundle),
                                        x.to(torch.float8_e4m3fn).double() @ w.to(torch.float8_e4m3fn).double().t()),
                    }
                    stream.synchronize()
                    for name, (got, want) in results.items():
                        if got.device.index != device or not rel_err(got, want) < 1e-2:
                            errors.append((device, i, name, got.device, rel_err(got, want)))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append((device, repr(exc)))

    threads = [threading.Thread(target=worker, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:10]
    prepared = bundle.prepared
    for kernel_id in {k for k, _ in prepared}:
        assert {d for k, d in prepared if k == kernel_id} <= set(devices)
    assert {d for _, d in prepared} == set(devices), "every device prepared its own kernels"
    assert tilekiln._default_bundle(devices[0]) is tilekiln._default_bundle(devices[1])


def test_operands_on_two_devices_are_refused(bundle, torch, devices):
    a = torch.randn(64, 64, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda:1", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a is on cuda:0 but b is on cuda:1"):
        bundle.gemm(a, b)
    assert rel_err(bundle.gemm(b, b), b.double() @ b.double()) < 1e-2  # the device stays usable
