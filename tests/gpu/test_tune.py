"""`tilekiln.tune` on the GPU: it measures, writes the bundle's tuning file (the manifest stays as
built), the Bundle this process has open then runs the tuned kernels, and every candidate is scored
against the baseline timed right after it."""

from __future__ import annotations

import functools
import json
import shutil

import pytest

pytestmark = pytest.mark.gpu

SHAPES = ((256, 4096, 4096), (16, 8192, 8192))


def test_tune_writes_a_table_the_runtime_follows(gpu_bundle_dir, tmp_path):
    import torch

    import tilekiln
    from tilekiln import tune
    from tilekiln.manifest import MANIFEST_NAME
    from tilekiln.tuning import policy
    from tilekiln.tuning.table import TUNING_NAME

    bundle_dir = tmp_path / "bundle"
    shutil.copytree(gpu_bundle_dir, bundle_dir)
    built = (bundle_dir / MANIFEST_NAME).read_bytes()
    operands = {}
    for m, n, k in SHAPES:
        operands[m, n, k] = (torch.randn(m, k, device="cuda").to(torch.bfloat16),
                             torch.randn(n, k, device="cuda").to(torch.bfloat16).t())
    bundle = tilekiln.load(bundle_dir)  # open and planned before the tune, as a serving process would be
    for a, b in operands.values():
        bundle.gemm(a, b)
    table_out = tmp_path / "table.json"
    tune.main([str(bundle_dir), "--shapes", ",".join("x".join(map(str, s)) for s in SHAPES), "--iters", "8",
               "--table-out", str(table_out)])

    written = json.loads(table_out.read_text())
    tuning_file = json.loads((bundle_dir / TUNING_NAME).read_text())
    assert (bundle_dir / MANIFEST_NAME).read_bytes() == built
    assert tuning_file["manifest_sha256"] == bundle.manifest.sha256
    assert tilekiln.load(bundle_dir) is bundle and dict(bundle.tuning.table) == written["table"]
    for shape in SHAPES:
        bucket, entry = next((b, e) for b, e in written["measurements"].items() if e["shape"] == list(shape))
        times = entry["candidates"]
        assert len(times) > 1 and written["table"][bucket] == min(times, key=times.get)
        assert tuning_file["table"][bucket] == written["table"][bucket]
        assert entry["baseline_ms"] > 0 and all(t > 0 for t in times.values())
        # the finalists, timed again in bench-length blocks, are the screen's fastest walk groups
        group = functools.partial(policy.walk_key, {k.id: k for k in bundle.kernels})
        assert list(times) == sorted(policy.finalists(entry["screen"], group))
        assert list(entry["samples"]) == list(times)
        assert all(len(pairs) == policy.SUSTAINED_ROUNDS for pairs in entry["samples"].values())
        a, b = operands[shape]
        choice = bundle.explain(a, b)
        assert choice.how == "tuned" and choice.label == written["table"][bucket]
        # the plan cached before the tune was dropped: the call runs the tuned kernel
        c = bundle.gemm(a, b)
        (plan,) = [p for p in bundle._plans.values() if (p.problem.m, p.problem.n, p.problem.k) == shape]
        assert plan.kernel_id == written["table"][bucket]
        ref = a.double() @ b.double()
        assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
