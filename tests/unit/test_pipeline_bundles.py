"""Each Blackwell-family bundle of the default catalog holds what its pipeline adds.

The sm107a bundle's fp8 kernels, dense, grouped and block-scaled (mxfp8), and its mxfp4
kernels come from the sm107 pipeline and are rendered with SM 10.7's 64-byte
MMA K; no other bundle gets one, and no sm107a kernel uses the 32-byte MMA in
their place (its nvfp4 kernels keep it: BLOCK-SCALE-MMA-K). sm103 adds only
the block-scaled fp4 MMA (K 48): the sm103a bundle holds the sm100 pipeline's
kernels and the sm103 pipeline's fp4 ones, dense and grouped. Validation and
rendering only: no compile.
"""

from __future__ import annotations

from builder.check.validate import Project, validate_project
from builder.render import render_kernel
from tests.fixture_catalogs import ROOT

VALIDATION = validate_project(Project(ROOT))


def by_target() -> dict[str, list]:
    out: dict[str, list] = {}
    for ctx in VALIDATION.kernels:
        for target in ctx.entry.targets:
            out.setdefault(target, []).append(ctx)
    return out


def test_the_default_catalog_is_valid():
    assert VALIDATION.ok, [d.to_text() for d in VALIDATION.diagnostics]


def test_rubin_fp8_kernels_use_the_64_byte_mma_k_and_only_rubin_gets_them():
    targets = by_target()
    # Dense fp8 (block-scaled kernels are another MMA kind: tests/compile/test_blockscaled_kernels.py).
    fp8 = {t: [c for c in kernels if c.entry.config.dtypes.a.bits == 8 and c.entry.config.block_scale is None]
           for t, kernels in targets.items()}
    assert fp8["sm_107a"] and all(c.entry.config.pipeline == "sm107" for c in fp8["sm_107a"])
    for ctx in fp8["sm_107a"]:
        assert ctx.plan.mma_k_bytes == 64 and ctx.plan.k_blocks == ctx.plan.cta_k_bytes // 64
        assert "MMA_K_BYTES, MMA_K = 64, 64" in render_kernel(ctx).text
    for target in ("sm_100a", "sm_100f", "sm_103a"):
        assert fp8[target], target
        assert all(c.entry.config.pipeline == "sm100" and c.plan.mma_k_bytes == 32 for c in fp8[target]), target


def test_family_bundle_holds_only_sm100_pipeline_kernels_and_b300_adds_the_48_byte_k():
    """sm_100f cubins also run on SM 10.3 and 10.7, so they use no instruction of a later minor;
    sm_103a holds kernels sm_100a does not: the sm103 pipeline's fp4 kernels with the 48-byte K."""
    targets = by_target()
    assert {c.entry.config.pipeline for c in targets["sm_100f"]} == {"sm100"}
    assert {c.entry.config.pipeline for c in targets["sm_103a"]} == {"sm100", "sm103"}
    assert {c.entry.config.pipeline for c in targets["sm_107a"]} == {"sm100", "sm107"}
    sm103 = [c for c in targets["sm_103a"] if c.entry.config.pipeline == "sm103"]
    assert sm103 and all(c.entry.config.dtypes.a.value == "e2m1" and c.entry.config.block_scale is not None
                         and c.plan.mma_k_bytes == 48 and c.plan.cta_k_bytes == 384 and c.plan.k_blocks == 8
                         for c in sm103)
    ids = {t: {c.entry.kernel_id for c in kernels} for t, kernels in targets.items()}
    assert ids["sm_103a"] - ids["sm_100a"] == {c.entry.kernel_id for c in sm103}


def test_rubin_block_scaled_kernels_use_the_64_byte_mma_k_except_nvfp4():
    targets = by_target()
    scaled = {t: [c for c in kernels if c.entry.config.block_scale is not None] for t, kernels in targets.items()}
    formats = {t: {(c.entry.config.dtypes.a.value, c.entry.config.block_scale.scale.value,
                    c.entry.config.block_scale.block) for c in kernels} for t, kernels in scaled.items()}
    everything = {("e4m3", "e8m0", 32), ("e2m1", "e4m3", 16), ("e2m1", "e8m0", 32)}
    assert formats["sm_100a"] == formats["sm_103a"] == everything
    # e5m3 scale factors exist on SM 10.7 only (DTYPE-ARCH).
    assert formats["sm_107a"] == everything | {("e2m1", "e5m3", 32)}
    for ctx in scaled["sm_107a"]:
        nvfp4 = ctx.entry.config.block_scale.block == 16
        assert ctx.entry.config.pipeline == ("sm100" if nvfp4 else "sm107"), ctx.entry.config
        assert ctx.plan.mma_k_bytes == (32 if nvfp4 else 64) and ctx.plan.k_blocks == ctx.plan.cta_k_bytes // (
            ctx.plan.mma_k_bytes)
    assert all(c.entry.config.pipeline == "sm100" and c.plan.mma_k_bytes == 32 for c in scaled["sm_100a"])
    assert all((c.entry.config.pipeline, c.plan.mma_k_bytes) in {("sm100", 32), ("sm103", 48)}
               for c in scaled["sm_103a"])


def test_every_blackwell_family_bundle_holds_grouped_kernels_of_both_layouts():
    """bf16 and fp8 grouped (mixture-of-experts) kernels, contiguous and masked, from the tcgen05 grouped
    template; sm107a's fp8 ones from the sm107 pipeline (64-byte MMA K), as its dense fp8 kernels."""
    targets = by_target()
    for target in ("sm_100a", "sm_100f", "sm_103a", "sm_107a"):
        grouped = [c for c in targets[target] if c.entry.config.family != "gemm" and c.entry.config.block_scale is None]
        assert {c.template.name for c in grouped} == {"sm100_grouped"}, target
        assert {(c.entry.config.family, c.entry.config.dtypes.a.value) for c in grouped} == {
            (f, d) for f in ("grouped", "grouped_masked") for d in ("bf16", "e4m3")}, target
        for ctx in grouped:
            fp8_rubin = target == "sm_107a" and ctx.entry.config.dtypes.a.bits == 8
            assert ctx.entry.config.pipeline == ("sm107" if fp8_rubin else "sm100"), (target, ctx.entry.kernel_id)
            assert ctx.plan.mma_k_bytes == (64 if fp8_rubin else 32)


def test_the_arch_specific_blackwell_bundles_hold_block_scaled_grouped_kernels():
    """mxfp8, mxfp4 and nvfp4 grouped kernels of both layouts in sm100a, sm103a and sm107a, from the
    sm100 and sm107 pipelines' block-scaled grouped template; sm107a's mxfp8 and mxfp4 ones and its
    fp4-e5m3 one from the sm107 pipeline (64-byte MMA K), its nvfp4 ones on the 32-byte MMA
    (BLOCK-SCALE-MMA-K). sm103a adds the sm103 pipeline's (48-byte MMA K, 384-byte CTA K): nvfp4 and
    mxfp4 contiguous, mxfp4 masked. sm100f has none: the block-scaled MMA is arch-specific."""
    targets = by_target()
    shared = {(f, a, scale) for f in ("grouped", "grouped_masked")
              for a, scale in (("e4m3", "e8m0"), ("e2m1", "e8m0"), ("e2m1", "e4m3"))}
    for target in ("sm_100a", "sm_103a", "sm_107a"):
        grouped = [c for c in targets[target] if c.entry.config.family != "gemm" and c.entry.config.block_scale]
        k48 = [c for c in grouped if c.entry.config.pipeline == "sm103"]
        rest = [c for c in grouped if c.entry.config.pipeline != "sm103"]
        assert {c.template.name for c in rest} == {"sm100_blockscaled_grouped"}, target
        # sm107a adds fp4 with e5m3 scales, which only SM 10.7 has (DTYPE-ARCH)
        own = {("grouped", "e2m1", "e5m3")} if target == "sm_107a" else set()
        assert {(c.entry.config.family, c.entry.config.dtypes.a.value, c.entry.config.block_scale.scale.value)
                for c in rest} == shared | own, target
        for ctx in rest:
            k64 = target == "sm_107a" and ctx.entry.config.block_scale.block == 32
            assert (ctx.entry.config.pipeline, ctx.plan.mma_k_bytes) == (("sm107", 64) if k64 else ("sm100", 32))
        if target != "sm_103a":
            assert not k48, target
            continue
        assert {c.template.name for c in k48} == {"sm103_blockscaled_grouped"}
        assert {(c.entry.config.family, c.entry.config.block_scale.scale.value) for c in k48} == {
            ("grouped", "e4m3"), ("grouped", "e8m0"), ("grouped_masked", "e8m0")}
        assert all((c.plan.mma_k_bytes, c.plan.cta_k_bytes, c.plan.k_blocks) == (48, 384, 8) for c in k48)
    assert not [c for c in targets["sm_100f"] if c.entry.config.block_scale]


def test_the_arch_specific_blackwell_bundles_hold_fp16_and_pair_swiglu_block_scaled_kernels():
    """sm100a, sm103a and sm107a each hold an fp16-output kernel (scaled_gemm's out_dtype=torch.float16)
    and a CTA-pair SwiGLU kernel of mxfp8 and of nvfp4, dense; sm100f none (no block-scaled kernel)."""
    targets = by_target()
    mxfp8, nvfp4 = ("e4m3", "e8m0", 32), ("e2m1", "e4m3", 16)
    for target in ("sm_100a", "sm_103a", "sm_107a"):
        dense = [c.entry.config for c in targets[target]
                 if c.entry.config.block_scale is not None and c.entry.config.family == "gemm"]

        def formats(kernels):
            return {(k.dtypes.a.value, k.block_scale.scale.value, k.block_scale.block) for k in kernels}

        assert formats(k for k in dense if k.dtypes.c.value == "f16") == {mxfp8, nvfp4}, target
        assert formats(k for k in dense if k.activation.gated and k.cta_group == 2) == {mxfp8, nvfp4}, target
    assert not [c for c in targets["sm_100f"] if c.entry.config.block_scale is not None]
