"""The catalogs the compile tests build once per session (deviceless compile on the CPU): a
two-kernel sm90 catalog, and the tcgen05 kernels of the census and launch tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.compile.parallel import LocalExecutor
from builder.pipeline.build import BuildRequest, build
from tests.fixture_catalogs import make_project as fixture_project

ROOT = Path(__file__).resolve().parents[2]



def sm90_catalog(kernels: str, **defaults: str) -> str:
    """The text of a catalog file for sm_90a: ``defaults`` (field: YAML value, in order) under
    ``defaults:``, then ``kernels``, the YAML list of items."""
    lines = ["pipeline: sm90", "targets: [sm_90a]", "defaults:", *(f"  {k}: {v}" for k, v in defaults.items())]
    return "\n".join([*lines, "kernels:", ""]) + kernels


SMALL_CATALOG = sm90_catalog("""\
  - tile: [128, 128, 64]
    cluster: [1, 1]
  - tile: [64, 128, 64]
    cluster: [1, 2]
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn")


def make_project(base: Path, catalog: str = SMALL_CATALOG) -> Path:
    """A scratch project whose only catalog file is ``catalog`` as catalog/gemm/sm90.yaml."""
    fixture_project(base, [])
    (base / "catalog" / "gemm" / "sm90.yaml").write_text(catalog)
    return base


def run_build(project: Path, out: Path, cache: Path, jobs: int = 1, **kwargs):
    return build(BuildRequest(root=project, out_dir=out, cache_dir=cache, executor=LocalExecutor(jobs),
                              progress="none", **kwargs))


def build_catalogs(base: Path, catalogs: dict[str, str]):
    """Build catalog files (name: YAML text) as one scratch project under ``base``, two compile
    workers; asserts every kernel compiled, naming the errors of those that did not."""
    files = []
    for name, text in catalogs.items():
        files.append(base / name)
        files[-1].write_text(text)
    result = run_build(fixture_project(base / "project", files), base / "artifacts", base / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    return result


def records_by_id(result) -> dict:
    """kernel id: (bundle, record) over every bundle of a build."""
    return {r.kernel_id: (b, r) for b in result.bundles for r in b.records}


# The tcgen05 kernels the census and launch tests build: (target, catalog item), each kernel
# for one target only, covering every form of the default bundles (bf16/f16 and fp8, each
# layout letter, 1-CTA and 2-CTA, swap_ab, an activation, the sm107 pipeline's 64-byte K, the
# cluster-launch-control scheduler on a CTA pair and on one CTA, and on a block-scaled CTA pair,
# the oversized shared-memory carveout).
TCGEN05_KERNELS = {
    "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1": (
        "sm_100a", "tile: [128, 256, 64]\n    cluster: [1, 1]"),
    "gemm_sm100_bf16_bf16_f32_bf16_nt_128x256x64_c2x1_2cta_silu": (
        "sm_100f", "layout: nt\n    tile: [128, 256, 64]\n    cluster: [2, 1]\n    cta_group: 2\n"
                   "    activation: silu"),
    "gemm_sm100_e4m3_e5m2_f32_bf16_tn_128x256x128_c2x1_2cta": (
        "sm_103a", "dtypes: {a: e4m3, b: e5m2, acc: f32, c: bf16}\n    tile: [128, 256, 128]\n"
                   "    cluster: [2, 1]\n    cta_group: 2"),
    "gemm_sm100_f16_f16_f32_f16_tt_64x128x64_c1x1": (
        "sm_107a", "dtypes: {a: f16, b: f16, acc: f32, c: f16}\n    layout: tt\n    tile: [64, 128, 64]\n"
                   "    cluster: [1, 1]"),
    "gemm_sm100_e4m3_e4m3_f32_bf16_nn_128x32x128_c2x1_swapab": (
        "sm_100a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    layout: nn\n    tile: [128, 32, 128]\n"
                   "    cluster: [2, 1]\n    swap_ab: true"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    tile: [128, 256, 128]\n    cluster: [1, 1]"),
    "gemm_sm107_e4m3_e5m2_f32_bf16_nt_128x256x128_c2x1_2cta": (
        "sm_107a", "dtypes: {a: e4m3, b: e5m2, acc: f32, c: bf16}\n    layout: nt\n    tile: [128, 256, 128]\n"
                   "    cluster: [2, 1]\n    cta_group: 2"),
    # catalog/gemm/sm107.yaml's kernels whose stages need the oversized carveout.
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x192x128_c1x1_s6": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    tile: [128, 192, 128]\n    cluster: [1, 1]\n"
                   "    stages: 6"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x2_s5": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    tile: [128, 256, 128]\n    cluster: [1, 2]\n"
                   "    stages: 5"),
    "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta_clc": (
        "sm_100a", "tile: [128, 256, 64]\n    cluster: [2, 1]\n    cta_group: 2\n    scheduler: clc"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_clc": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    tile: [128, 256, 128]\n    cluster: [1, 1]\n"
                   "    scheduler: clc"),
    # mxfp8 (templates/sm100_blockscaled.py.j2), which the runtime also launches.
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [1, 1]"),
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_sfe8m0x32": (
        "sm_103a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2"),
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_sfe8m0x32_clc": (
        "sm_103a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2\n    scheduler: clc"),
}
# The block-scaled fp4 kernels (nvfp4, mxfp4), the catalog's, and nvfp4's clc twin: their census
# and their launch records, in bundles of their own.
FP4_KERNELS = {
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16": (
        "sm_100a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 256, 256]\n    cluster: [1, 1]"),
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe8m0x32": (
        "sm_103a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 256]\n    cluster: [1, 1]"),
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c2x1_2cta_sfe4m3x16": (
        "sm_107a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 256, 256]\n    cluster: [2, 1]\n    cta_group: 2"),
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16_clc": (
        "sm_100a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 256, 256]\n    cluster: [1, 1]\n    scheduler: clc"),
}

# Block-scaled SwiGLU (templates/sm100_blockscaled.py.j2 with the gated epilogue of
# common/persistent.j2), the catalog's: mxfp8 and nvfp4 on the 32-byte MMA, mxfp8 on the sm107
# pipeline's 64-byte one, each with one CTA and on a CTA pair, in bundles of their own.
BLOCKSCALED_SWIGLU_KERNELS = {
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_sfe8m0x32_swiglu": (
        "sm_103a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2\n    activation: swiglu"),
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c2x1_2cta_sfe4m3x16_swiglu": (
        "sm_100a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 256, 256]\n    cluster: [2, 1]\n    cta_group: 2\n    activation: swiglu"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_sfe8m0x32_swiglu": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2\n    activation: swiglu"),
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32_swiglu": (
        "sm_100a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [1, 1]\n    activation: swiglu"),
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe4m3x16_swiglu": (
        "sm_103a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 256, 256]\n    cluster: [1, 1]\n    activation: swiglu"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32_swiglu": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [1, 1]\n    activation: swiglu"),
}

# Block-scaled kernels with fp16 output (scaled_gemm(..., out_dtype=torch.float16)), the catalog's:
# mxfp8 with one CTA on the 32-byte MMA and on the sm107 pipeline's 64-byte one, nvfp4 on a CTA pair,
# in bundles of their own.
BLOCKSCALED_F16_KERNELS = {
    "gemm_sm100_e4m3_e4m3_f32_f16_tn_128x256x128_c1x1_sfe8m0x32": (
        "sm_100a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: f16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [1, 1]"),
    "gemm_sm100_e2m1_e2m1_f32_f16_tn_128x256x256_c2x1_2cta_sfe4m3x16": (
        "sm_107a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: f16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 256, 256]\n    cluster: [2, 1]\n    cta_group: 2"),
    "gemm_sm107_e4m3_e4m3_f32_f16_tn_128x256x128_c1x1_sfe8m0x32": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: f16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [1, 1]"),
}

# The tcgen05 dense template's fused epilogues (bias, row-wise fp8 scales), in bundles of their own:
# a bf16 and an f32 bias on a CTA pair, a 64-row tile (the 16-lane TMEM layout) and a swapped decode
# tile (the bias along the MMA's rows), row-wise scales on a pair, swapped with a bias, and with the
# sm107 pipeline's 64-byte K; SwiGLU on a pair.
TCGEN05_EPILOGUE_KERNELS = {
    "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta_biasbf16": (
        "sm_100a", "tile: [128, 256, 64]\n    cluster: [2, 1]\n    cta_group: 2\n    bias: bf16"),
    "gemm_sm100_bf16_bf16_f32_bf16_tn_64x128x64_c1x1_biasf32_gelutanh": (
        "sm_100f", "tile: [64, 128, 64]\n    cluster: [1, 1]\n    bias: f32\n    activation: gelutanh"),
    "gemm_sm100_bf16_bf16_f32_bf16_tn_128x32x64_c2x1_swapab_biasbf16": (
        "sm_103a", "tile: [128, 32, 64]\n    cluster: [2, 1]\n    swap_ab: true\n    bias: bf16"),
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_rowwise": (
        "sm_100a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    scaling: rowwise\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2"),
    "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x32x128_c2x1_swapab_rowwise_biasbf16": (
        "sm_100a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    scaling: rowwise\n"
                   "    tile: [128, 32, 128]\n    cluster: [2, 1]\n    swap_ab: true\n    bias: bf16"),
    "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta_swiglu": (
        "sm_103a", "tile: [128, 256, 64]\n    cluster: [2, 1]\n    cta_group: 2\n    activation: swiglu"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_rowwise": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    scaling: rowwise\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2"),
}

# The sm107 pipeline's block-scaled kernels (the 64-byte-K MMA): catalog/gemm/sm107_blockscaled.yaml's
# mxfp8 128x256 (1-CTA and a CTA pair) and mxfp4, and the fp4 kernel with e5m3 scales, which only SM
# 10.7 has (scale_format "fp4-e5m3-b32").
SM107_BLOCKSCALED_KERNELS = {
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [1, 1]"),
    "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_sfe8m0x32": (
        "sm_107a", "dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 128]\n    cluster: [2, 1]\n    cta_group: 2"),
    "gemm_sm107_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe8m0x32": (
        "sm_107a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 256, 256]\n    cluster: [1, 1]"),
    "gemm_sm107_e2m1_e2m1_f32_bf16_tn_128x256x256_c1x1_sfe5m3x32": (
        "sm_107a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e5m3, block: 32}\n"
                   "    tile: [128, 256, 256]\n    cluster: [1, 1]"),
}

# The sm103 pipeline's block-scaled fp4 kernels (the 48-byte-K MMA, CTA K fixed at 384 bytes):
# catalog/gemm/sm103_blockscaled.yaml's nvfp4 (bf16 and fp16 output) and mxfp4 kernels and nvfp4's clc twin.
SM103_BLOCKSCALED_KERNELS = {
    "gemm_sm103_e2m1_e2m1_f32_f16_tn_128x128x768_c1x1_sfe4m3x16": (
        "sm_103a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: f16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 128, 768]\n    cluster: [1, 1]"),
    "gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16": (
        "sm_103a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 128, 768]\n    cluster: [1, 1]"),
    "gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe8m0x32": (
        "sm_103a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e8m0, block: 32}\n"
                   "    tile: [128, 128, 768]\n    cluster: [1, 1]"),
    "gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe4m3x16_clc": (
        "sm_103a", "dtypes: {a: e2m1, b: e2m1, acc: f32, c: bf16}\n    block_scale: {scale: e4m3, block: 16}\n"
                   "    tile: [128, 128, 768]\n    cluster: [1, 1]\n    scheduler: clc"),
}


def tcgen05_catalog(pipeline: str, kernels: dict[str, tuple[str, str]] = TCGEN05_KERNELS) -> str:
    # The catalog's default target, one its pipeline has; each kernel names its own.
    target = "sm_103a" if pipeline == "sm103" else "sm_107a"
    return f"""pipeline: {pipeline}
targets: [{target}]
defaults:
  dtypes: {{a: bf16, b: bf16, acc: f32, c: bf16}}
  layout: tn
kernels:
""" + "".join(f"  - {fields}\n    targets: [{arch}]\n" for kid, (arch, fields) in kernels.items()
              if kid.split("_")[1] == pipeline)


@pytest.fixture(scope="session")
def small_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("small")
    project = make_project(base / "project")
    result = run_build(project, base / "artifacts", base / "cache")
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    return result.bundles[0]


def _build_catalogs(tmp_path_factory, name: str, catalogs: dict[str, str]):
    """The fixture catalogs (file name -> YAML text) built into their bundles, all of them compiled."""
    base = tmp_path_factory.mktemp(name)
    files = []
    for file_name, text in catalogs.items():
        files.append(base / file_name)
        files[-1].write_text(text)
    project = fixture_project(base / "project", files)
    result = run_build(project, base / "artifacts", base / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    return result


@pytest.fixture(scope="session")
def tcgen05_build(tmp_path_factory):
    """TCGEN05_KERNELS built into the sm100a, sm100f, sm103a and sm107a bundles."""
    return _build_catalogs(tmp_path_factory, "tcgen05", {f"{p}.yaml": tcgen05_catalog(p) for p in ("sm100", "sm107")})


@pytest.fixture(scope="session")
def tcgen05_epilogue_build(tmp_path_factory):
    """TCGEN05_EPILOGUE_KERNELS built into the sm100a, sm100f, sm103a and sm107a bundles."""
    return _build_catalogs(tmp_path_factory, "tcgen05-epilogue",
                           {f"{p}.yaml": tcgen05_catalog(p, TCGEN05_EPILOGUE_KERNELS) for p in ("sm100", "sm107")})


@pytest.fixture(scope="session")
def fp4_build(tmp_path_factory):
    """FP4_KERNELS built into the sm100a, sm103a and sm107a bundles."""
    return _build_catalogs(tmp_path_factory, "fp4", {"sm100.yaml": tcgen05_catalog("sm100", FP4_KERNELS)})


@pytest.fixture(scope="session")
def blockscaled_swiglu_build(tmp_path_factory):
    """BLOCKSCALED_SWIGLU_KERNELS built into the sm100a, sm103a and sm107a bundles."""
    return _build_catalogs(tmp_path_factory, "blockscaled-swiglu",
                           {f"{p}.yaml": tcgen05_catalog(p, BLOCKSCALED_SWIGLU_KERNELS) for p in ("sm100", "sm107")})


@pytest.fixture(scope="session")
def blockscaled_f16_build(tmp_path_factory):
    """BLOCKSCALED_F16_KERNELS built into the sm100a and sm107a bundles."""
    return _build_catalogs(tmp_path_factory, "blockscaled-f16",
                           {f"{p}.yaml": tcgen05_catalog(p, BLOCKSCALED_F16_KERNELS) for p in ("sm100", "sm107")})


@pytest.fixture(scope="session")
def sm107_blockscaled_build(tmp_path_factory):
    """SM107_BLOCKSCALED_KERNELS built into the sm107a bundle."""
    return _build_catalogs(tmp_path_factory, "sm107-blockscaled",
                           {"sm107.yaml": tcgen05_catalog("sm107", SM107_BLOCKSCALED_KERNELS)})


@pytest.fixture(scope="session")
def sm103_blockscaled_build(tmp_path_factory):
    """SM103_BLOCKSCALED_KERNELS built into the sm103a bundle."""
    return _build_catalogs(tmp_path_factory, "sm103-blockscaled",
                           {"sm103.yaml": tcgen05_catalog("sm103", SM103_BLOCKSCALED_KERNELS)})


@dataclass(frozen=True)
class ProjectWheels:
    runtime: Path  # tilekiln_runtime-<version>-py3-none-any.whl (runtime/pyproject.toml)
    build: Path  # tilekiln_build-<version>-py3-none-any.whl (pyproject.toml)


@pytest.fixture(scope="session")
def project_wheels(tmp_path_factory) -> ProjectWheels:
    """The runtime and build tool wheels as `make wheel` builds them, offline and from a copy
    of the checkout (setuptools writes build/ and egg-info trees where it builds)."""
    src = tmp_path_factory.mktemp("project-src")
    for name in ("pyproject.toml", "README.md", "runtime/pyproject.toml"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for name in ("tilekiln", "builder"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("project-dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "--wheel-dir", str(out), str(src / "runtime"), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (runtime,) = out.glob("tilekiln_runtime-*.whl")
    (build_tool,) = out.glob("tilekiln_build-*.whl")
    return ProjectWheels(runtime, build_tool)
