"""Each bundle's host launch path, run against a recording stand-in for the driver, launches
exactly what the validator derived.

No GPU is needed and none of these kernels' launches can be observed otherwise: the
Blackwell and Rubin bundles have never run on hardware. For every bundle of the
session's builds (sm90a, and the tcgen05 kernels in sm100a, sm100f, sm103a and sm107a)
the test links the bundle's own kernel objects, its glue and the release shim with
``launch_recorder.c`` in place of the static CUDA runtime (the shipped library's
cudart cannot start without a real driver), opens the bundle through the runtime
(``tilekiln.bundle.Bundle``) with that library, and plans and launches every kernel
for a set of problem sizes through ``Bundle.plan`` and ``Bundle.launch``. The
stand-in records what the generated host code and the glue asked of the driver;
each kernel must have launched:

* through the driver's ``cuLaunchKernelEx`` that the shim resolves (never its
  runtime fallback);
* with grid (cluster_m, cluster_n, min(work items, resident clusters)), the work
  items counted in the MMA's terms (M and N swapped under ``swap_ab``) and the
  resident clusters the runtime took from the occupancy query (the SM count for
  one-CTA clusters); a ``scheduler: clc`` kernel with grid (cluster_m x work
  items, cluster_n, 1), one cluster per item whatever the device holds;
* with the plan's threads per CTA and dynamic shared memory, the cluster
  dimension attribute, and programmatic stream serialization exactly when the
  template's manifest declares ``programmatic_launch``;
* after its load set the non-portable cluster attribute and a dynamic
  shared-memory limit of the opt-in limit less the cubin's static shared
  memory, which the plan's dynamic bytes fit; a kernel the validator planned on
  the oversized carveout then also its shared-memory mode (driver attribute 17)
  to ALLOW_OVERSIZED (3), and that limit to exactly its dynamic bytes, after
  asking the device's oversized limit (attribute 150); no other kernel sets the
  mode.
"""

from __future__ import annotations

import ctypes
import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.check.context import KernelContext
from builder.check.derive import Tcgen05Plan
from builder.compile.toolchain import toolchain
from builder.package.link import CFLAGS, LINK_DIR, link_input, render_glue, zig_target
from builder.pipeline.build import BundleResult
from tilekiln._tensors import Operand
from tilekiln.bundle import Bundle, BundleError
from tilekiln.manifest import VerifiedBundle, read_manifest
from tilekiln.spec import Scheduler, format_kernel_id, requested_fields

pytestmark = pytest.mark.compile

RECORDER = Path(__file__).with_name("launch_recorder.c")
GLIBC = (2, 28)
# (M, N, K, batch): skinny, ragged, large and batched, every stride a multiple of 16 elements.
PROBLEMS = ((16, 4096, 4096, 1), (1008, 1040, 528, 1), (8192, 8192, 1024, 2), (128, 128, 128, 1))
# e2m1 operands: 2-D, K a multiple of 128 elements (whole scale-factor atoms, 16-byte rows).
FP4_PROBLEMS = ((16, 4096, 4096, 1), (1008, 1040, 512, 1), (8192, 8192, 1024, 1), (128, 128, 128, 1))
SM_COUNT = {9: 132, 10: 148}  # the stand-in device: an H100 SXM, a B200
# The stand-in's answer to every occupancy query: not SM count / cluster size, so a
# launch that ignored the runtime's query would show.
OCCUPANCY = 30
# cudaDeviceAttr, cudaFuncAttribute and CUlaunchAttributeID values (driver_types.h, cuda.h).
ATTR_SM_COUNT, ATTR_CC_MAJOR, ATTR_CC_MINOR, ATTR_SMEM_OPTIN = 16, 75, 76, 97
FUNC_MAX_DYNAMIC_SMEM, FUNC_NON_PORTABLE_CLUSTER = 8, 14
# Not in the pinned headers: cuda-bindings 13.4.4 / 13.5.0 (templates/link/glue.c.j2).
ATTR_MAX_OVERSIZED_SMEM, FUNC_SHARED_MEMORY_MODE, SHARED_MEMORY_MODE_ALLOW_OVERSIZED = 150, 17, 3
LAUNCH_CLUSTER_DIM, LAUNCH_PROGRAMMATIC = 4, 6


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int
    cluster: tuple[int, int, int]
    programmatic: int


def expected_launch(ctx: KernelContext, m: int, n: int, batch: int, resident: int) -> Launch:
    """The launch the validator's plan and the templates' work distribution call for."""
    cfg, plan = ctx.entry.config, ctx.plan
    rows, cols = (n, m) if cfg.swap_ab else (m, n)
    items = (math.ceil(math.ceil(rows / cfg.tile.m) / cfg.cluster.m)
             * math.ceil(math.ceil(cols / cfg.tile.n) / cfg.cluster.n) * batch)
    grid = ((cfg.cluster.m * items, cfg.cluster.n, 1) if cfg.scheduler is Scheduler.CLC
            else (cfg.cluster.m, cfg.cluster.n, max(1, min(items, resident))))
    return Launch(grid, (plan.threads, 1, 1),
                  plan.smem.dynamic_bytes, (cfg.cluster.m, cfg.cluster.n, 1),
                  int(ctx.template.manifest.parameters.programmatic_launch))


def recorded_launch(event: dict) -> Launch:
    attrs = {a["id"]: a for a in event["attributes"]}
    cluster = tuple(attrs[LAUNCH_CLUSTER_DIM]["cluster"]) if LAUNCH_CLUSTER_DIM in attrs else (1, 1, 1)
    return Launch(tuple(event["grid"]), tuple(event["block"]), event["dynamic_smem"], cluster,
                  attrs.get(LAUNCH_PROGRAMMATIC, {"value": 0})["value"])


def link_recording_library(bundle: BundleResult, out: Path) -> Path:
    """The bundle's objects, glue and shim, linked with the recorder instead of cudart."""
    tools = toolchain()
    work = out / bundle.bundle
    work.mkdir(parents=True)
    kernels = [link_input(r) for r in bundle.records]
    (work / "glue.c").write_text(render_glue(bundle.bundle, kernels))
    objects = []
    for i, k in enumerate(kernels):
        objects.append(work / f"k{i:04d}.o")
        objects[-1].write_bytes(k.object_bytes)
    library = work / "librecord.so"
    cmd = [*tools.cc, "-target", zig_target(GLIBC), *CFLAGS, f"-I{tools.cuda_include}", "-shared", "-Wl,-z,defs",
           "-o", str(library), str(work / "glue.c"), str(LINK_DIR / "shim.c"), str(RECORDER), *map(str, objects)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return library


class Recorded:
    """A bundle opened by the runtime over its recording library, and the recorder's controls."""

    def __init__(self, result: BundleResult, library: Path, scratch: Path):
        directory = scratch / result.path.name
        shutil.copytree(result.path, directory)
        manifest = read_manifest(directory, verify=False)
        # The runtime opens a library only from bytes it verified (tilekiln/manifest.py,
        # read_bundle); the recording library stands in for the verified one here, and its
        # controls are reached through the very instance the runtime opened.
        self.bundle = Bundle(directory, manifest, verified=VerifiedBundle(manifest, library.read_bytes(), None, None))
        self.recorder = self.bundle._library()._lib
        self.recorder.tkrec_log.restype = ctypes.c_char_p
        self.cc = manifest.compute_capability
        self.records = {r.kernel_id: r for r in result.records}

    def configure(self, static_smem: int, smem_optin: int, smem_oversized: int = 0) -> None:
        values = (ctypes.c_int * 256)()
        values[ATTR_CC_MAJOR], values[ATTR_CC_MINOR] = self.cc
        values[ATTR_SM_COUNT], values[ATTR_SMEM_OPTIN] = SM_COUNT[self.cc[0]], smem_optin
        values[ATTR_MAX_OVERSIZED_SMEM] = smem_oversized
        self.recorder.tkrec_configure(values, 256, OCCUPANCY, static_smem)
        self.recorder.tkrec_clear()

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.recorder.tkrec_log().decode().splitlines()]


def operand(name: str, rows: int, cols: int, batch: int, dtype: str, ptr: int, row_major: bool) -> Operand:
    """A (batch x) rows x cols operand at a fake device address, row- or column-major."""
    strides = (cols, 1) if row_major else (1, rows)
    shape = (rows, cols)
    if batch > 1:
        shape, strides = (batch, *shape), (rows * cols, *strides)
    return Operand(name, shape, strides, dtype, ptr, 0, None)


def run_kernel(recorded: Recorded, kernel_id: str, problems=PROBLEMS) -> tuple[list[dict], list[tuple[Launch, Launch]]]:
    """Plan and launch ``kernel_id`` on every problem: (every event, (expected, recorded) launches)."""
    ctx = recorded.records[kernel_id].ctx
    cfg = ctx.entry.config
    recorded.configure(recorded.records[kernel_id].info.static_smem_bytes,
                       ctx.facts.require("smem_per_block_optin"), oversized_limit(ctx))
    requested = tuple((f.name, spec.codec.request(getattr(cfg, f.name))) for f, spec in requested_fields()
                      if getattr(cfg, f.name) != f.default)
    pairs = []
    for m, n, k, batch in problems:
        d = cfg.dtypes
        a = operand("a", m, k, batch, d.a.value, 0x7F0000000000, cfg.layout.a_k_major)
        b = operand("b", k, n, batch, d.b.value, 0x7F1000000000, not cfg.layout.b_k_major)
        # A gated (swiglu) kernel's result pairs B's N columns into N/2.
        c = operand("out", m, n // 2 if cfg.activation.gated else n, batch, d.c.value, 0x7F2000000000, True)
        plan = recorded.bundle.plan(a, b, c, kernel=kernel_id,
                                    out_dtype=d.c.value if d.scaled or cfg.block_scale else None,
                                    requested=requested)
        resident = recorded.bundle.resident_clusters(recorded.bundle.kernels[plan_index(recorded, kernel_id)], 0)
        before = len(recorded.events())
        recorded.bundle.launch(plan, a.ptr, b.ptr, c.ptr, 0, 0x7F3000000000, 0x7F3000000010, 0x7F3000000020,
                               0x7F4000000000, 0x7F5000000000)
        (launch,) = [e for e in recorded.events()[before:] if e["event"] == "launch"]
        assert launch["path"] == "driver", launch
        pairs.append((expected_launch(ctx, m, n, batch, resident), recorded_launch(launch)))
    return recorded.events(), pairs


def oversized(ctx: KernelContext) -> bool:
    return isinstance(ctx.plan, Tcgen05Plan) and ctx.plan.oversized_launch


def oversized_limit(ctx: KernelContext) -> int:
    """The stand-in device's attribute 150: the pipeline's carveout (0 where it has none)."""
    return ctx.facts.require("smem_oversized_carveout") if ctx.facts.has("smem_oversized_carveout") else 0


def plan_index(recorded: Recorded, kernel_id: str) -> int:
    return [k.id for k in recorded.bundle.kernels].index(kernel_id)


@pytest.fixture(scope="module")
def recorded_bundles(small_build, tcgen05_build, tmp_path_factory) -> dict[str, Recorded]:
    scratch = tmp_path_factory.mktemp("recorded")
    return {b.bundle: Recorded(b, link_recording_library(b, scratch / "lib"), scratch)
            for b in (small_build, *tcgen05_build.bundles)}


@pytest.mark.parametrize("bundle", ["sm90a", "sm100a", "sm100f", "sm103a", "sm107a"])
def test_every_kernel_launches_as_its_plan_says(recorded_bundles, bundle):
    _check_launches(recorded_bundles[bundle])


def _check_launches(recorded: Recorded, problems=PROBLEMS) -> None:
    assert recorded.records
    for kernel_id, record in recorded.records.items():
        ctx = record.ctx
        events, pairs = run_kernel(recorded, kernel_id, problems)
        for expected, launched in pairs:
            assert launched == expected, kernel_id
        check_smem_attributes(ctx, events, record.info.static_smem_bytes)
        attributes = {e["attribute"]: e["value"] for e in events if e["event"] == "kernel_attribute"}
        assert attributes[FUNC_NON_PORTABLE_CLUSTER] == 1, kernel_id
        cluster = (ctx.entry.config.cluster.m, ctx.entry.config.cluster.n, 1)
        for query in (e for e in events if e["event"] == "occupancy"):
            assert (tuple(query["block"]), query["dynamic_smem"], tuple(query["cluster"])) == (
                (ctx.plan.threads, 1, 1), ctx.plan.smem.dynamic_bytes, cluster), kernel_id


def check_smem_attributes(ctx: KernelContext, events: list[dict], static_smem: int) -> None:
    """The dynamic shared-memory limit the loads set, in order, and the shared-memory mode."""
    plan = ctx.plan
    limits = [e["value"] for e in events if e["event"] == "kernel_attribute" and e["attribute"] == FUNC_MAX_DYNAMIC_SMEM]
    modes = [e["value"] for e in events if e["event"] == "kernel_attribute" and e["attribute"] == FUNC_SHARED_MEMORY_MODE]
    optin = ctx.facts.require("smem_per_block_optin") - ctx.template.manifest.parameters.static_smem_bytes
    if not oversized(ctx):
        # The generated load's limit alone, as before the carveout existed.
        assert limits == [optin] and optin >= plan.smem.dynamic_bytes and not modes, format_kernel_id(ctx.entry.config)
        return
    # The generated load's limit, then the glue's: the mode first, the device's oversized limit
    # asked, then exactly the Storage struct, which with the static reservation fits that limit.
    assert limits == [optin, plan.smem.dynamic_bytes] and modes == [SHARED_MEMORY_MODE_ALLOW_OVERSIZED]
    assert plan.smem.dynamic_bytes > optin and plan.smem.dynamic_bytes + static_smem <= oversized_limit(ctx)
    order = [(e["event"], e.get("attribute")) for e in events
             if e["event"] in ("kernel_attribute", "device_attribute")]
    mode = order.index(("kernel_attribute", FUNC_SHARED_MEMORY_MODE))
    assert order[mode + 1:mode + 3] == [("device_attribute", ATTR_MAX_OVERSIZED_SMEM),
                                        ("kernel_attribute", FUNC_MAX_DYNAMIC_SMEM)], order
    (driver,) = [e for e in events if e["event"] == "kernel_attribute" and e.get("driver")]
    assert driver["attribute"] == FUNC_SHARED_MEMORY_MODE


def test_the_sm107_bundle_loads_its_oversized_kernels_on_the_carveout(recorded_bundles):
    """The catalog's sm107 kernels whose stages pass the opt-in limit: the plan and the manifest say
    so, and the recorded load (checked in _check_launches) requests the carveout."""
    recorded = recorded_bundles["sm107a"]
    oversized = {k for k, r in recorded.records.items() if r.ctx.plan.oversized_launch}  # all tcgen05 plans
    assert oversized == {"gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x192x128_c1x1_s6",
                         "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x2_s5"}
    for kernel in recorded.bundle.kernels:
        assert kernel.resources.oversized_smem == (kernel.id in oversized), kernel.id
        if kernel.id in oversized:
            assert kernel.resources.smem_bytes == recorded.records[kernel.id].ctx.plan.smem.total == 264192


def test_a_device_without_room_for_the_carveout_refuses_the_load_and_says_why(small_build, tcgen05_build,
                                                                               tmp_path_factory):
    """A device whose oversized limit (attribute 150) is the opt-in limit, as a driver or part without
    the carveout answers: the glue refuses the kernel and the runtime names the driver requirement."""
    (result,) = [b for b in tcgen05_build.bundles if b.bundle == "sm107a"]
    scratch = tmp_path_factory.mktemp("recorded-no-carveout")
    recorded = Recorded(result, link_recording_library(result, scratch / "lib"), scratch)
    kernel_id = "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x192x128_c1x1_s6"
    ctx = recorded.records[kernel_id].ctx
    optin = ctx.facts.require("smem_per_block_optin")
    recorded.configure(recorded.records[kernel_id].info.static_smem_bytes, optin, optin)
    m, n, k = 1008, 1040, 528
    a = operand("a", m, k, 1, "e4m3", 0x7F0000000000, True)
    b = operand("b", k, n, 1, "e4m3", 0x7F1000000000, False)
    c = operand("out", m, n, 1, "bf16", 0x7F2000000000, True)
    with pytest.raises(BundleError, match=r"oversized carveout.*CU_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE \(17"):
        recorded.bundle.launch(recorded.bundle.plan(a, b, c, kernel=kernel_id, out_dtype="bf16"),
                               a.ptr, b.ptr, c.ptr, 0, 0, 0, 0, 0, 0)
    assert not [e for e in recorded.events() if e["event"] == "launch"]


@pytest.mark.parametrize("bundle", ["sm100a", "sm103a", "sm107a"])
def test_every_fp4_kernel_launches_as_its_plan_says(fp4_build, tmp_path_factory, bundle):
    """nvfp4 and mxfp4 kernels, planned over e2m1 operands in elements (K twice the bytes of a
    row): what ``scaled_gemm`` describes a float4_e2m1fn_x2 tensor as (tilekiln/_tensors.py)."""
    scratch = tmp_path_factory.mktemp(f"recorded-fp4-{bundle}")
    (result,) = [b for b in fp4_build.bundles if b.bundle == bundle]
    _check_launches(Recorded(result, link_recording_library(result, scratch / "lib"), scratch), FP4_PROBLEMS)


def test_every_block_scaled_swiglu_kernel_launches_as_its_plan_says(blockscaled_swiglu_build, tmp_path_factory):
    """Block-scaled SwiGLU kernels, planned asking for their block scale and swiglu: FP4_PROBLEMS with
    N 1024 for 1040 (I = N/2 a multiple of the 64-row gate and up blocks, which the kernels pair)."""
    problems = tuple((m, 1024 if n == 1040 else n, k, batch) for m, n, k, batch in FP4_PROBLEMS)
    for result in blockscaled_swiglu_build.bundles:
        scratch = tmp_path_factory.mktemp(f"recorded-blockscaled-swiglu-{result.bundle}")
        _check_launches(Recorded(result, link_recording_library(result, scratch / "lib"), scratch), problems)


def test_every_block_scaled_f16_kernel_launches_as_its_plan_says(blockscaled_f16_build, tmp_path_factory):
    """Block-scaled kernels with fp16 output, planned for an fp16 result (out_dtype "f16") and their
    block scale: FP4_PROBLEMS (2-D, K whole scale-factor atoms)."""
    for result in blockscaled_f16_build.bundles:
        scratch = tmp_path_factory.mktemp(f"recorded-blockscaled-f16-{result.bundle}")
        _check_launches(Recorded(result, link_recording_library(result, scratch / "lib"), scratch), FP4_PROBLEMS)


def test_every_sm107_block_scaled_kernel_launches_as_its_plan_says(sm107_blockscaled_build, tmp_path_factory):
    """The sm107 pipeline's 64-byte-K block-scaled kernels (mxfp8 and fp4 operands in elements)."""
    scratch = tmp_path_factory.mktemp("recorded-sm107-blockscaled")
    (result,) = sm107_blockscaled_build.bundles
    _check_launches(Recorded(result, link_recording_library(result, scratch / "lib"), scratch), FP4_PROBLEMS)


def test_every_sm103_block_scaled_kernel_launches_as_its_plan_says(sm103_blockscaled_build, tmp_path_factory):
    """The sm103 pipeline's 48-byte-K fp4 kernels (operands in elements, K of any multiple of 128:
    a K-slice is 768 elements, and TMA zero-fills a slice past K)."""
    scratch = tmp_path_factory.mktemp("recorded-sm103-blockscaled")
    (result,) = sm103_blockscaled_build.bundles
    _check_launches(Recorded(result, link_recording_library(result, scratch / "lib"), scratch), FP4_PROBLEMS)


def test_a_clc_kernel_launches_every_cluster_tile_and_a_static_one_the_resident_clusters(recorded_bundles):
    """The large problem has more cluster tiles than the stand-in device holds (OCCUPANCY): the
    static twin's grid stops at the resident clusters, the clc kernel's covers every tile."""
    recorded = recorded_bundles["sm100a"]
    (clc,) = [k for k, r in recorded.records.items() if r.ctx.entry.config.scheduler is Scheduler.CLC]
    _, pairs = run_kernel(recorded, clc)
    m, n, _, batch = PROBLEMS[2]
    items = math.ceil(m / 256) * math.ceil(n / 256) * batch  # 256x256 cluster tiles of the 2x1 CTA pair
    assert items > OCCUPANCY and pairs[2][1].grid == (2 * items, 1, 1) == pairs[2][0].grid
    assert pairs[2][1].block == (recorded.records[clc].ctx.plan.threads, 1, 1) == (224, 1, 1)


def test_a_launch_that_disagrees_with_its_plan_is_caught(recorded_bundles):
    """The comparison sees every field: another kernel's plan does not match this launch."""
    recorded = recorded_bundles["sm100a"]
    one, other = sorted(recorded.records)[:2]
    _, pairs = run_kernel(recorded, one)
    launched = pairs[0][1]
    m, n, _, batch = PROBLEMS[0]
    assert launched != expected_launch(recorded.records[other].ctx, m, n, batch, OCCUPANCY)
    assert launched == pairs[0][0]


def check_grouped_launches(recorded: Recorded, problems, requested=lambda cfg: ()) -> set[str]:
    """Plan and launch every grouped kernel of ``recorded`` through tilekiln.grouped (the path of
    ``grouped_gemm``) on each (total_M or M_max, N, K, G) of ``problems``, and assert it goes to the
    driver with grid (cluster_m, cluster_n, min(work-item bound, resident clusters)), the bound being
    what the host counts without reading the row table: (ceil(total_M / cluster rows) + G) cluster
    tiles along M (masked: every group full) times the cluster tiles along N (a ``scheduler: clc``
    kernel: grid (cluster_m x bound, cluster_n, 1), a cluster per item of the bound); the plan's threads,
    dynamic shared memory and cluster; and the dynamic shared memory the plan's budget allows.
    ``requested``: a kernel config's requested epilogue (a block scale). Returns the ids launched."""
    from tilekiln.grouped import launch_grouped, make_grouped_problem, make_masked_problem, plan_grouped

    launched = set()
    for kernel_id, record in recorded.records.items():
        ctx = record.ctx
        cfg, plan = ctx.entry.config, ctx.plan
        recorded.configure(record.info.static_smem_bytes, ctx.facts.require("smem_per_block_optin"),
                           oversized_limit(ctx))
        dtype = cfg.dtypes.a.value
        scaled = dtype != cfg.dtypes.c.value
        masked = cfg.family == "grouped_masked"
        cm, cn = cfg.cluster.m, cfg.cluster.n
        cluster_tiles_n = lambda n: math.ceil(math.ceil(n / cfg.tile.n) / cn)  # noqa: E731
        events_before = len(recorded.events())
        for m, n, k, groups in problems:
            # K-major B is nn.Linear's (G, N, K) weights transposed; N-major B a contiguous (G, K, N).
            b_strides = (n * k, 1, k) if cfg.layout.b_k_major else (n * k, n, 1)
            b = Operand("b", (groups, k, n), b_strides, dtype, 0x7F1000000000, 0, None)
            rows = Operand("rows", (groups,), (1,), "i32", 0x7F3000000000, 0, None)
            if masked:
                a = Operand("a", (groups, m, k), (m * k, k, 1), dtype, 0x7F0000000000, 0, None)
                out = Operand("out", (groups, m, n), (m * n, n, 1), "bf16", 0x7F2000000000, 0, None)
                problem = make_masked_problem(a, b, rows, out, scaled, requested(cfg))
                bound = math.ceil(m / (cfg.tile.m * cm)) * groups * cluster_tiles_n(n)
            else:
                a = Operand("a", (m, k), (k, 1), dtype, 0x7F0000000000, 0, None)
                out = Operand("out", (m, n), (n, 1), "bf16", 0x7F2000000000, 0, None)
                problem = make_grouped_problem(a, b, rows, out, scaled, requested(cfg))
                bound = (math.ceil(m / (cfg.tile.m * cm)) + groups) * cluster_tiles_n(n)
            grouped = plan_grouped(recorded.bundle, problem, kernel_id)
            kernel = next(kr for kr in recorded.bundle.kernels if kr.id == kernel_id)
            resident = recorded.bundle.resident_clusters(kernel, 0)
            before = len(recorded.events())
            launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, out.ptr, rows.ptr, 0,
                           0x7F4000000000 if scaled else 0, 0x7F5000000000 if scaled else 0)
            (launch,) = [e for e in recorded.events()[before:] if e["event"] == "launch"]
            assert launch["path"] == "driver", launch
            grid = ((cm * bound, cn, 1) if cfg.scheduler is Scheduler.CLC
                    else (cm, cn, max(1, min(bound, resident))))
            expected = Launch(grid, (plan.threads, 1, 1),
                              plan.smem.dynamic_bytes, (cm, cn, 1), 1)
            assert recorded_launch(launch) == expected, (kernel_id, m, n, k, groups)
            assert LAUNCH_CLUSTER_DIM in {attr["id"] for attr in launch["attributes"]}
        check_smem_attributes(ctx, recorded.events()[events_before:], record.info.static_smem_bytes)
        launched.add(kernel_id)
    return launched
