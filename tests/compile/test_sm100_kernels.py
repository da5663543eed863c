"""The tcgen05 template compiles for every Blackwell-family target and links into bundles.

One default-catalog kernel per target (1-CTA and 2-CTA, bf16 and f16), built
deviceless through the normal build: the cubin must hold tcgen05 MMAs
(UTCHMMA), spill nothing, be assembled for exactly the requested target (an
``f`` target included), and use the shared memory the validator modelled.
"""

from __future__ import annotations

import json

import pytest

from builder.compile.cubin import compiled_for
from builder.compile.parallel import LocalExecutor
from builder.pipeline.build import BuildRequest, build
from tests.fixture_catalogs import make_project

pytestmark = pytest.mark.compile

PER_TARGET = {
    "sm_100a": ("gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1", "tile: [128, 256, 64]\n    cluster: [1, 1]"),
    "sm_100f": ("gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta",
                "tile: [128, 256, 64]\n    cluster: [2, 1]\n    cta_group: 2"),
    "sm_103a": ("gemm_sm100_f16_f16_f32_f16_tn_128x256x64_c2x1_2cta",
                "dtypes: {a: f16, b: f16, acc: f32, c: f16}\n    tile: [128, 256, 64]\n    cluster: [2, 1]\n"
                "    cta_group: 2"),
    "sm_107a": ("gemm_sm100_bf16_bf16_f32_bf16_tn_64x128x64_c1x1", "tile: [64, 128, 64]\n    cluster: [1, 1]"),
}

CATALOG = """pipeline: sm100
targets: [sm_100a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
""" + "".join(f"  - {fields}\n    targets: [{arch}]\n" for arch, (_, fields) in PER_TARGET.items())


@pytest.fixture(scope="module")
def sm100_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("sm100")
    catalog = base / "sm100.yaml"
    catalog.write_text(CATALOG)
    project = make_project(base / "project", [catalog])
    result = build(BuildRequest(root=project, out_dir=base / "artifacts", cache_dir=base / "cache",
                                executor=LocalExecutor(2), progress="none"))
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    return {b.arch: b for b in result.bundles}


@pytest.mark.parametrize("arch", sorted(PER_TARGET))
def test_kernel_compiles_to_tcgen05_for_its_target(sm100_build, arch):
    kernel_id, _ = PER_TARGET[arch]
    bundle = sm100_build[arch]
    (record,) = bundle.records
    assert record.kernel_id == kernel_id and record.status == "compiled"
    assert record.info.count("UTCHMMA") > 0, dict(record.info.census)
    assert record.info.count("UTMALDG") > 0 and record.info.count("UTMASTG") > 0
    assert not record.info.spills and record.info.local_bytes == 0
    assert compiled_for(record.cubin) == arch
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    assert manifest["bundle"]["arch"] == arch
    (kernel,) = manifest["kernels"]
    assert kernel["resources"]["smem_bytes"] == record.ctx.plan.smem.total
    assert kernel["config"]["cta_group"] == record.ctx.entry.config.cta_group
