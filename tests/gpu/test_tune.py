"""`tilekiln.tune` on the GPU: it measures, writes a table the runtime then follows, and
scores every candidate against the baseline timed right after it."""

from __future__ import annotations

import functools
import json
import shutil

import pytest

pytestmark = pytest.mark.gpu


def test_tune_writes_a_table_the_runtime_follows(gpu_bundle_dir, tmp_path):
    import torch

    import tilekiln
    from tilekiln import tune

    bundle_dir = tmp_path / "bundle"
    shutil.copytree(gpu_bundle_dir, bundle_dir)
    table_out = tmp_path / "table.json"
    tune.main([str(bundle_dir), "--shapes", "256x4096x4096,16x8192x8192", "--iters", "8",
               "--table-out", str(table_out)])

    written = json.loads(table_out.read_text())
    bundle = tilekiln.load(bundle_dir)  # opened anew: tune rewrote the manifest
    for shape in ([256, 4096, 4096], [16, 8192, 8192]):
        bucket, entry = next((b, e) for b, e in written["measurements"].items() if e["shape"] == shape)
        times = entry["candidates"]
        assert len(times) > 1 and written["table"][bucket] == min(times, key=times.get)
        assert entry["baseline_ms"] > 0 and all(t > 0 for t in times.values())
        # the finalists, timed again in bench-length blocks, are the screen's fastest walk groups
        group = functools.partial(tune.walk_key, {k.id: k for k in bundle.kernels})
        assert list(times) == sorted(tune.finalists(entry["screen"], group))
        assert list(entry["samples"]) == list(times)
        assert all(len(pairs) == tune.SUSTAINED_ROUNDS for pairs in entry["samples"].values())
        m, n, k = shape
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, k, device="cuda").to(torch.bfloat16).t()
        choice = bundle.explain(a, b)
        assert choice.how == "tuned" and choice.label == written["table"][bucket]
