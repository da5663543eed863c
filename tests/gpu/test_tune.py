"""`tilekiln.tune` on the GPU: it measures, writes the bundle's tuning file (the manifest stays as
built), the Bundle this process has open then runs the tuned kernels, and every candidate is scored
against the baseline timed right after it."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

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
    # the table of the card it ran on, stated as the driver describes it, and no other card's
    sku = bundle.device(torch.cuda.current_device()).sku
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert (written["device"], written["compute_capability"], written["sm_count"], written["memory_mib"]) == (
        props.name, [props.major, props.minor], props.multi_processor_count, props.total_memory // 2**20)
    (file_table,) = tuning_file["tables"]
    assert file_table["device"] == sku.name
    assert tilekiln.load(bundle_dir) is bundle and bundle.table_for(torch.cuda.current_device()).exact
    assert dict(bundle.table_for(torch.cuda.current_device()).table.table) == written["table"]
    for shape in SHAPES:
        bucket, entry = next((b, e) for b, e in written["measurements"].items() if e["shape"] == list(shape))
        times = entry["candidates"]
        assert len(times) > 1 and written["table"][bucket] == min(times, key=times.get)
        assert file_table["table"][bucket] == written["table"][bucket]
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


def test_a_committed_table_states_its_card_as_this_driver_reads_it(gpu_bundle_dir):
    """The committed tables of catalog/tuning/ state the card they were measured on (what finds the
    nearest SKU's table); on a card of one of their names, the runtime reads the same SM count and
    compute capability, and the memory within 1% (drivers reserve a few MiB more or less)."""
    import torch

    import tilekiln

    root = Path(__file__).resolve().parents[2] / "catalog" / "tuning"
    bundle = tilekiln.load(gpu_bundle_dir)
    device = bundle.device(torch.cuda.current_device())
    tables = [json.loads(p.read_text()) for p in sorted((root / bundle.name).glob("*.json"))]
    mine = [t for t in tables if t["device"] == device.name]
    if not mine:
        pytest.skip(f"no committed table of {device.name} (tables of {[t['device'] for t in tables]})")
    (table,) = mine
    assert (table["compute_capability"], table["sm_count"]) == (list(device.compute_capability), device.sm_count)
    assert abs(table["memory_mib"] - device.memory_mib) <= device.memory_mib / 100, (table, device)
    assert bundle.table_for(torch.cuda.current_device()).exact
