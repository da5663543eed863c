"""Kernel ids round-trip, cover every field, and reject non-canonical spellings."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from tilekiln.spec import (FAMILY_NAMES, Activation, Bias, BlockScale, Cluster, DType, DTypes, KernelConfig,
                           KernelIdError, Layout, Operand, Raster, Residual, Scalars, Scaling, Schedule, Scheduler, Tile,
                           format_kernel_id, parse_kernel_id)

configs = st.builds(
    KernelConfig,
    family=st.sampled_from(FAMILY_NAMES),
    pipeline=st.sampled_from(["sm90", "sm100", "sm103", "sm107"]),
    dtypes=st.builds(DTypes, st.sampled_from(DType), st.sampled_from(DType), st.sampled_from(DType),
                     st.sampled_from(DType)),
    layout=st.builds(Layout, st.booleans(), st.booleans()),
    tile=st.builds(Tile, st.integers(1, 512), st.integers(1, 512), st.integers(1, 512)),
    cluster=st.builds(Cluster, st.integers(1, 16), st.integers(1, 16)),
    schedule=st.sampled_from(Schedule),
    scheduler=st.sampled_from(Scheduler),
    raster=st.sampled_from(Raster),
    swizzle=st.integers(1, 16),
    stages=st.one_of(st.none(), st.integers(1, 16)),
    cta_group=st.integers(1, 4),
    block_scale=st.one_of(st.none(), st.builds(BlockScale, st.sampled_from(DType), st.integers(1, 64))),
    swap_ab=st.booleans(),
    evict_first=st.frozensets(st.sampled_from(Operand)),
    bias=st.sampled_from(Bias),
    activation=st.sampled_from(Activation),
    residual=st.sampled_from(Residual),
    scaling=st.sampled_from(Scaling),
)


@given(configs)
def test_parse_inverts_format(config):
    assert parse_kernel_id(format_kernel_id(config)) == config


def test_swapped_kernels_are_named_after_the_mma_tile():
    config = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x128_c2x1_swapab")
    assert config.swap_ab and config.tile == Tile(64, 16, 128) and config.cluster == Cluster(2, 1)
    mixed = dataclasses.replace(config, dtypes=DTypes(DType.E4M3, DType.E5M2, DType.F32, DType.BF16),
                                layout=Layout(a_k_major=False, b_k_major=True))
    # The MMA's A is the problem's B: its type and majorness.
    assert mixed.mma_dtypes.a is DType.E5M2 and mixed.mma_dtypes.b is DType.E4M3
    assert mixed.mma_layout == Layout(a_k_major=True, b_k_major=False)
    assert dataclasses.replace(mixed, swap_ab=False).mma_layout == mixed.layout


def test_evict_first_names_the_problem_operands_and_maps_to_the_mma_under_swap_ab():
    config = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c2x1_swapab_sw8_efb_s12")
    assert config.evict_first == frozenset({Operand.B}) and config.stages == 12
    # Swapped, the problem's B is the MMA's A.
    assert config.mma_evict_first == (True, False)
    assert dataclasses.replace(config, swap_ab=False).mma_evict_first == (False, True)
    both = dataclasses.replace(config, evict_first=frozenset(Operand))
    assert format_kernel_id(both).endswith("_efab_s12")


def test_the_bias_precedes_the_activation_in_the_id():
    config = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c2x1_swapab_biasbf16_silu_efb")
    assert config.bias is Bias.BF16 and config.bias.dtype is DType.BF16 and config.activation is Activation.SILU
    assert Bias.NONE.dtype is None
    with pytest.raises(KernelIdError):
        parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c2x1_silu_biasbf16")


def test_rowwise_and_residual_spell_their_tokens_in_field_order():
    config = parse_kernel_id("gemm_sm90_e4m3_e4m3_f32_bf16_tn_64x128x128_c2x1_pingpong_rowwise_biasbf16")
    assert config.scaling is Scaling.ROWWISE and config.bias is Bias.BF16 and config.residual is Residual.NONE
    config = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c2x1_pingpong_biasbf16_silu_resadd")
    assert config.residual is Residual.ADD and config.activation is Activation.SILU
    # The residual comes after the activation, as the epilogue applies it.
    with pytest.raises(KernelIdError):
        parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c2x1_pingpong_resadd_silu")


def test_swiglu_is_a_gated_activation_in_the_id():
    config = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_swiglu_sw8")
    assert config.activation is Activation.SWIGLU and config.activation.gated and config.swizzle == 8
    assert not any(a.gated for a in Activation if a is not Activation.SWIGLU)


def test_tcgen05_options_parse():
    config = parse_kernel_id("gemm_sm103_e2m1_e2m1_f32_bf16_tn_128x256x768_c2x1_2cta_sfe4m3x16_s3")
    assert config.cta_group == 2 and config.block_scale == BlockScale(DType.E4M3, 16) and config.stages == 3


def test_example_id_from_the_issue():
    config = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1")
    assert config.tile == Tile(128, 256, 64) and config.cluster == Cluster(2, 1)
    assert config.layout.a_k_major and config.layout.b_k_major and config.stages is None


BASE = parse_kernel_id("gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1")
PERTURBATIONS = {
    "pipeline": "sm100",
    "dtypes": DTypes(DType.F16, DType.F16, DType.F32, DType.F16),
    "layout": Layout(False, True),
    "tile": Tile(128, 128, 64),
    "cluster": Cluster(1, 2),
    "schedule": Schedule.PINGPONG,
    "raster": Raster.N,
    "swizzle": 4,
    "stages": 3,
    "cta_group": 2,
    "block_scale": BlockScale(DType.E4M3, 16),
    "swap_ab": True,
    "evict_first": frozenset({Operand.B}),
    "bias": Bias.F32,
    "activation": Activation.GELU_TANH,
    "scaling": Scaling.BLOCKWISE,
    "residual": Residual.ADD,
    "scalars": Scalars.ALPHA_BETA,
    "scheduler": Scheduler.CLC,
}


def test_every_field_is_covered_by_a_perturbation():
    # family has one value until a second family exists; test_the_family_leads_the_id covers it
    assert set(PERTURBATIONS) == {f.name for f in dataclasses.fields(KernelConfig)} - {"family"}


def test_the_family_leads_the_id():
    for family in FAMILY_NAMES:
        assert format_kernel_id(dataclasses.replace(BASE, family=family)).startswith(f"{family}_sm90_")
    with pytest.raises(KernelIdError):
        parse_kernel_id("nope_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1")


@pytest.mark.parametrize("field", sorted(PERTURBATIONS))
def test_changing_any_field_changes_the_id(field):
    changed = dataclasses.replace(BASE, **{field: PERTURBATIONS[field]})
    assert format_kernel_id(changed) != format_kernel_id(BASE)


@pytest.mark.parametrize("bad", [
    "gemm_sm90_bf16_bf16_f32_bf16_tn_0128x256x64_c2x1",      # leading zero
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_s3_rn",  # options out of order
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_sw1",    # default spelled out
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_1cta",   # default CTA group spelled out
    "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_sfe4m3x16_2cta",  # options out of order
    "gemm_sm100_e2m1_e2m1_f32_bf16_tn_128x256x64_c2x1_sfe9m9x16",  # unknown scale type
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_efba",   # operands out of order
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_efbb",   # an operand twice
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_s3_efb",  # options out of order
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_efc",    # no operand c
    "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_turbo",  # unknown option
    "gemm_sm90_bf16_bf16_f32_bf16_xx_128x256x64_c2x1",        # bad layout
    "gemm_sm90_bf16_bf16_f32_128x256x64_c2x1",                # missing dtype
])
def test_non_canonical_ids_are_rejected(bad):
    with pytest.raises(KernelIdError):
        parse_kernel_id(bad)
