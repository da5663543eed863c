"""Our hardware-fact tables agree with what the installed DSL and toolchain expose.

A DSL upgrade that changes a fact (shared memory per arch, TMEM columns,
accepted arch strings, MMA shapes, accumulator layouts, the int8 arch gate)
fails here, naming the fact and the file to review. MMA shapes are probed by
constructing the DSL's tcgen05 ops while it traces for the pipeline's own
arch; the int8 gate by compiling the template.
"""

from __future__ import annotations

import itertools
import re

import pytest

from builder.check.derive import tmem_accumulator_columns
from builder.compile.toolchain import HOST_TARGET
from builder.load.facts import load_facts
from tests.fixture_catalogs import ROOT

pytestmark = pytest.mark.compile

FACTS = load_facts(ROOT / "catalog" / "hardware", ROOT)
TCGEN05 = [p for p in FACTS.pipelines if p.require("mma_instruction") == "tcgen05"]


def own_arch(pipeline) -> str:
    """The DSL's name for the pipeline's compute capability: sm100 -> sm_100."""
    return "sm_" + pipeline.pipeline.removeprefix("sm")


@pytest.fixture(scope="module")
def dsl():
    import cutlass
    import cutlass.cute as cute

    return cutlass, cute


@pytest.mark.parametrize("pipeline", FACTS.pipelines, ids=lambda p: p.pipeline)
def test_shared_memory_capacity(dsl, pipeline):
    from cutlass.memory import get_smem_capacity_in_bytes

    budget = max(pipeline.require("smem_per_block_optin"),
                 pipeline.require("smem_oversized_carveout") if pipeline.has("smem_oversized_carveout") else 0)
    assert get_smem_capacity_in_bytes(own_arch(pipeline)) == budget, pipeline.file


@pytest.mark.parametrize("pipeline", TCGEN05, ids=lambda p: p.pipeline)
def test_tensor_memory_columns(dsl, pipeline):
    from cutlass import base_dsl
    from cutlass.cute.arch.tmem import get_max_tmem_alloc_cols, get_min_tmem_alloc_cols, is_tmem_allocation_exclusive

    arch = own_arch(pipeline)
    total = pipeline.require("tmem_columns")
    assert get_max_tmem_alloc_cols(arch) == total, pipeline.file
    assert get_min_tmem_alloc_cols(arch) == pipeline.require("tmem_alloc_min_columns"), pipeline.file
    above = pipeline.require("tmem_exclusive_above") if pipeline.has("tmem_exclusive_above") else total
    enum = base_dsl.Arch.from_string(arch)
    assert not is_tmem_allocation_exclusive(above, enum)
    assert is_tmem_allocation_exclusive(above + 32, enum) == (above < total), pipeline.file


@pytest.mark.parametrize("pipeline", FACTS.pipelines, ids=lambda p: p.pipeline)
def test_targets_are_dsl_arches_and_run_where_the_dsl_says(dsl, pipeline):
    from cutlass import base_dsl

    hardware = [a for a in base_dsl.Arch if a.suffix == "a"]
    for target in pipeline.targets:
        arch = base_dsl.Arch.from_string(target.name)
        assert (arch.major, arch.minor, arch.suffix) == (*target.compute_capability, target.kind), target.name
        runs_on = sorted({(h.major, h.minor) for h in hardware if h.can_run_binary_built_for(arch)})
        assert runs_on == sorted(tuple(cc) for cc in target.runs_on), f"{target.name} in {pipeline.file}"


@pytest.mark.parametrize("pipeline", TCGEN05, ids=lambda p: p.pipeline)
def test_tma_alignment(dsl, pipeline):
    import cutlass.utils.blackwell_helpers as helpers

    assert helpers.TMA_ALIGNMENT_BYTES == pipeline.require("tma_alignment_bytes")


def _probe(cute, arch: str, fn) -> dict:
    """Run ``fn`` while the DSL traces a host function for ``arch``; return what it recorded."""
    out: dict = {}

    @cute.jit
    def traced():
        out.update(fn())

    cute.compile(traced, options=f"--gpu-arch {arch} --host-target '{HOST_TARGET}'")
    return out


def _accepts(make) -> bool:
    try:
        make()
    except Exception:  # noqa: BLE001 - the DSL rejects a shape with DSLUserCodeError or ValueError
        return False
    return True


def _shapes(make, ms=(32, 64, 96, 128, 192, 256), ns=range(8, 272, 8)) -> dict:
    """{group: (Ms accepted with some N, Ns accepted with the smallest accepted M)}."""
    out = {}
    for group in (1, 2):
        ok = {(m, n) for m, n in itertools.product(ms, ns) if _accepts(lambda: make(m, n, group))}
        m_set = sorted({m for m, _ in ok})
        out[group] = (m_set, sorted(n for m, n in ok if m_set and m == m_set[0]))
    return out


def _range(fact) -> list[int]:
    return list(range(fact.min, fact.max + 1, fact.step))


def test_sm100_mma_shapes_k_and_accumulator_layouts(dsl):
    cutlass, cute = dsl
    import cutlass.utils.blackwell_helpers as helpers
    from cutlass.cute.nvgpu import OperandMajorMode as Major
    from cutlass.cute.nvgpu import tcgen05
    from cutlass.cute.nvgpu.tcgen05 import find_tmem_tensor_col_offset
    from cutlass.utils.blockscaled_layout import BlockScaledBasicChunk

    facts = FACTS.pipeline("sm100")
    smem = tcgen05.OperandSource.SMEM
    group_of = {1: tcgen05.CtaGroup.ONE, 2: tcgen05.CtaGroup.TWO}
    layouts = [(64, 128, 1, 1), (64, 128, 1, 2), (128, 256, 1, 2), (128, 128, 2, 1), (128, 128, 2, 2),
               (64, 256, 2, 2), (128, 64, 2, 2), (64, 8, 1, 2)]

    def record():
        dense = _shapes(lambda m, n, g: tcgen05.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (m, n), group_of[g],
                                                             smem, Major.K, Major.K))
        n_major_8bit = _shapes(lambda m, n, g: tcgen05.MmaF8F6F4Op(
            cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, cutlass.Float32, (m, n), group_of[g], smem, Major.K,
            Major.MN), ms=(128, 256))
        scaled = _shapes(lambda m, n, g: tcgen05.MmaMXF4NVF4Op(cutlass.Float8E4M3FN, (m, n), group_of[g], smem))
        k = tcgen05.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (128, 128), group_of[1], smem, Major.K,
                                 Major.K).shape_mnk[2]
        columns = {}
        for cta_m, n, g, stages in layouts:
            mma = helpers.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, Major.K, Major.K,
                                                 cutlass.Float32, group_of[g], (cta_m * g, n))
            frag = mma.make_fragment_C(cute.append(mma.partition_shape_C((cta_m * g, n)), stages))
            columns[(cta_m, n, g, stages)] = find_tmem_tensor_col_offset(frag)
        atom = BlockScaledBasicChunk(16).layout.shape
        return {"dense": dense, "n_major_8bit": n_major_8bit, "scaled": scaled, "k": k, "columns": columns,
                "atom": atom}

    seen = _probe(cute, "sm_100a", record)
    assert seen["dense"][1] == (facts.require("mma_m_1cta"), _range(facts.require("mma_n")))
    assert seen["dense"][2] == ([m for m in facts.require("mma_m_2cta")], _range(facts.require("mma_n_2cta")))
    steps = facts.require("mma_n_step_mn_major_8bit")
    for group in (1, 2):
        assert seen["n_major_8bit"][group][1] == list(range(steps[group], 257, steps[group])), group
    assert seen["scaled"][1][0] == facts.require("mma_m_block_scaled_1cta")
    assert seen["scaled"][2][0] == facts.require("mma_m_block_scaled_2cta")
    assert seen["k"] * 16 // 8 == facts.require("mma_k_bytes"), "bf16 MMA K in bytes"
    lanes = facts.require("tmem_lanes")
    for (cta_m, n, g, stages), cols in seen["columns"].items():
        assert tmem_accumulator_columns(cta_m, n, g, stages, lanes) == cols, (cta_m, n, g, stages)
    (rows, row_blocks), (_, k_blocks) = seen["atom"]
    assert rows * row_blocks == facts.require("block_scale_atom_rows")
    assert k_blocks == facts.require("block_scale_atom_k_blocks")


def test_sm103_mma_k_and_shapes(dsl):
    cutlass, cute = dsl
    from cutlass.cute.nvgpu import tcgen05

    facts = FACTS.pipeline("sm103")
    smem = tcgen05.OperandSource.SMEM
    group_of = {1: tcgen05.CtaGroup.ONE, 2: tcgen05.CtaGroup.TWO}

    def record():
        make = lambda m, n, g: tcgen05.SM103MmaMXF4NVF4Op(cutlass.Float8E4M3FN, (m, n), group_of[g], smem)  # noqa: E731
        return {"shapes": _shapes(make), "k": make(128, 128, 1).shape_mnk[2]}

    seen = _probe(cute, "sm_103a", record)
    assert seen["k"] * 4 // 8 == facts.require("mma_k_bytes"), "fp4 MMA K in bytes"
    assert facts.require("cta_k_bytes_fixed") % facts.require("mma_k_bytes") == 0
    assert seen["shapes"][1] == (facts.require("mma_m_block_scaled_1cta"), _range(facts.require("mma_n")))
    assert seen["shapes"][2] == (facts.require("mma_m_block_scaled_2cta"), _range(facts.require("mma_n_2cta")))


def test_sm103_mma_builds_for_the_target_kinds_the_facts_name(dsl):
    """mma_target_kinds: the DSL builds SM 10.3's 48-byte-K MMA for sm_103a and refuses sm_103f."""
    cutlass, cute = dsl
    from cutlass.cute.nvgpu import tcgen05

    facts = FACTS.pipeline("sm103")
    kinds = facts.require("mma_target_kinds")

    def record():
        op = tcgen05.SM103MmaMXF4Op((128, 128), tcgen05.CtaGroup.ONE, tcgen05.OperandSource.SMEM)
        cute.make_tiled_mma(cute.make_mma_atom(op))
        return {}

    for target in facts.targets:
        assert _accepts(lambda: _probe(cute, target.name, record)) == (target.kind in kinds), target.name


def test_the_glue_requests_the_oversized_carveout_by_number():
    """The pinned CUDA 13.0 headers name none of what the oversized carveout takes, so the glue
    (templates/link/glue.c.j2) sets it by number, as cuda-bindings 13.4.4 and 13.5.0 document it.

    The DSL's generated load sets cudaFuncAttributeMaxDynamicSharedMemorySize to the device's
    cudaDevAttrMaxSharedMemoryPerBlockOptin less the kernel's static shared memory, which the
    pinned runtime documents as the bound of that attribute; past it a function must first be
    given the shared-memory mode ALLOW_OVERSIZED (function attribute 17 = 3), and the device's
    oversized limit is attribute 150. The pinned headers end their function attributes at 15 and
    their device attributes at 147. Once the toolchain names them this test fails: then the glue
    should use the names."""
    from builder.compile.toolchain import toolchain

    include = toolchain().cuda_include
    runtime_api = (include / "cuda_runtime_api.h").read_text()
    headers = "".join((include / name).read_text() for name in ("cuda.h", "driver_types.h", "cuda_runtime_api.h"))
    assert ("The sum of this value and the function attribute ::sharedSizeBytes\n *   cannot exceed the device "
            "attribute ::cudaDevAttrMaxSharedMemoryPerBlockOptin") in runtime_api
    assert "OVERSIZED_SHARED" not in headers and "OversizedShared" not in headers
    assert "SHARED_MEMORY_MODE" not in headers
    assert re.search(r"cudaDevAttrOnlyPartialHostNativeAtomicSupported\s*=\s*147,[^\n]*\n\s*cudaDevAttrMax\b", headers)
    assert re.search(r"CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 15,[^}]*CU_FUNC_ATTRIBUTE_MAX\b",
                     headers)
    glue = (ROOT / "templates" / "link" / "glue.c.j2").read_text()
    for define in ("TK_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE 17", "TK_SHARED_MEMORY_MODE_ALLOW_OVERSIZED 3",
                   "TK_DEVICE_ATTRIBUTE_MAX_OVERSIZED_SHARED_MEMORY_PER_BLOCK 150"):
        assert f"#define {define}\n" in glue
    assert "cuda-bindings 13.4.4 and 13.5.0" in glue


def test_sm107_mma_k_and_shapes(dsl):
    cutlass, cute = dsl
    from cutlass.cute.nvgpu import OperandMajorMode as Major
    from cutlass.cute.nvgpu import tcgen05

    facts = FACTS.pipeline("sm107")
    smem = tcgen05.OperandSource.SMEM
    group_of = {1: tcgen05.CtaGroup.ONE, 2: tcgen05.CtaGroup.TWO}
    k_fp8 = facts.require("mma_k_bytes")  # one byte per fp8 element

    def record():
        dense = _shapes(lambda m, n, g: tcgen05.SM107MmaFP8Op(
            cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, cutlass.Float32, (m, n, k_fp8), group_of[g], smem,
            Major.K, Major.K))
        wider = _accepts(lambda: tcgen05.SM107MmaFP8Op(
            cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, cutlass.Float32, (128, 128, k_fp8 + 32), group_of[1],
            smem, Major.K, Major.K))
        scaled = _shapes(lambda m, n, g: tcgen05.SM107MmaMXF4NVF4Op(cutlass.Float8E4M3FN, 16, (m, n), group_of[g],
                                                                    smem))
        k_fp4 = tcgen05.SM107MmaMXF4NVF4Op(cutlass.Float8E4M3FN, 16, (128, 128), group_of[1], smem).shape_mnk[2]
        return {"dense": dense, "wider": wider, "scaled": scaled, "k_fp4": k_fp4}

    seen = _probe(cute, "sm_107a", record)
    assert seen["dense"][1] == (facts.require("mma_m_1cta"), _range(facts.require("mma_n")))
    assert seen["dense"][2] == (facts.require("mma_m_2cta"), _range(facts.require("mma_n_2cta")))
    assert not seen["wider"], "the fp8 MMA K is at most mma_k_bytes"
    assert seen["k_fp4"] * 4 // 8 == k_fp8
    assert seen["scaled"][1][0] == facts.require("mma_m_block_scaled_1cta")
    # Stricter than the DSL's shape check on purpose (see the fact's source),
    # but never looser.
    assert set(facts.require("mma_m_block_scaled_2cta")) <= set(seen["scaled"][2][0])


def test_int8_mma_exists_only_where_the_facts_say(tmp_path):
    """Compile the tcgen05 template with int8 operands for an allowed and a
    gated arch: the toolchain must agree with ``only_on`` of the i8 combo."""
    from builder.check.validate import Project, validate_project
    from builder.compile.job import CompileFailure, CompileJob, CompileOutput
    from builder.compile.parallel import LocalExecutor
    from builder.render import render_kernel
    from tests.fixture_catalogs import make_project

    facts = FACTS.pipeline("sm100")
    (combo,) = [c for c in facts.require("dtype_combos") if c.a.value == "i8"]
    allowed = [t.name for t in facts.targets if all(tuple(cc) in map(tuple, combo.only_on) for cc in t.runs_on)]
    gated = [t.name for t in facts.targets if t.kind == "a" and t.name not in allowed]
    assert allowed and gated
    catalog = tmp_path / "int8.yaml"
    catalog.write_text("pipeline: sm100\ntargets: [sm_100a]\nkernels:\n  - dtypes: {a: i8, b: i8, acc: i32, c: i32}\n"
                       "    layout: tn\n    tile: [128, 128, 128]\n    cluster: [1, 1]\n")
    project = make_project(tmp_path / "project", [catalog])
    manifest = project / "templates" / "sm100_gemm.yaml"
    manifest.write_text(manifest.read_text().replace("    - {a: f16, b: f16, acc: f32, c: f16}\n",
                                                     "    - {a: f16, b: f16, acc: f32, c: f16}\n"
                                                     "    - {a: i8, b: i8, acc: i32, c: i32}\n"))
    (ctx,) = validate_project(Project(project)).planned
    source = render_kernel(ctx).text
    results = {r.arch: r for r in LocalExecutor(2).run([CompileJob(ctx.entry.kernel_id, a, source)
                                                       for a in (allowed[0], gated[0])])}
    assert isinstance(results[allowed[0]], CompileOutput), results[allowed[0]]
    assert isinstance(results[gated[0]], CompileFailure), f"int8 compiled for {gated[0]}: fix only_on in {facts.file}"


@pytest.mark.parametrize("pipeline", FACTS.pipelines, ids=lambda p: p.pipeline)
def test_cluster_launch_control(dsl, pipeline):
    """Cluster launch control is a tcgen05-generation feature (sm_100 and later), and its response
    is the 128-bit value the DSL's clc_response loads before query_cancel decodes it."""
    import inspect

    cutlass, cute = dsl
    has = pipeline.require("cluster_launch_control")
    assert has == (pipeline.require("mma_instruction") == "tcgen05"), pipeline.file
    if has:
        assert "Int128" in inspect.getsource(cute.arch.clc_response), "the DSL reads another response width"
        assert pipeline.require("clc_response_bytes") * 8 == cutlass.Int128.width, pipeline.file
