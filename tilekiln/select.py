"""Choose a kernel for a problem, and say why.

Cheapest checks first: dtype, operand majorness, then the kernel's contract
(stride divisibility for 16-byte TMA rows, index range). Among the kernels
that accept the problem, a measured choice from the tuning table of the
device's SKU (or the nearest SKU's: tilekiln/tuning/sku.py) wins if one exists
for the problem's shape bucket; otherwise the analytic model estimates the
time of each:

    time ~ turns x max(tile work / rate + tile traffic, K steps x step floor)

``turns`` counts how many output cluster tiles the busiest cluster of the persistent grid walks
(wave quantisation on this device's resident clusters), the tile work includes the padding a tile
wastes at the matrix edge (tile efficiency), and the efficiency term favours tiles with more
reuse per byte loaded and clusters that share loads through TMA multicast. The traffic term
counts the A rows and B columns one wave of the raster walk touches (the swizzle band decides how
many of each), each read from DRAM once per wave: a decode-sized GEMM is priced by the weight it
streams, and a large grid walked without a swizzle band by the A panels every wave reloads. The
rate is the SM's full MMA rate where two warpgroups issue (a 128-row cooperative tile, a ping-pong
CTA with two tiles) and ``lone_warpgroup`` of it where one does (a 64-row cooperative tile, a
ping-pong CTA's last odd tile); a K step never takes less than the pipeline's round trip.
The constants (:class:`ModelParams`) are fitted to measurements; the model only ranks
candidates, and ``tilekiln tune`` replaces it with measurements where it errs.

Where two accepted kernels differ only in their scheduler (``scheduler: clc`` beside the static
walk: tilekiln/spec.py, Scheduler), the model prices them the same and the cluster-launch-control
kernel wins the tie: its clusters take tiles as they finish, so SMs shared with other work or
tiles of uneven cost leave no cluster idle while another still has a queue. This preference is
untested on hardware (no SM 10.x part has run either kernel); ``tilekiln tune`` measures both and
overrides it per shape bucket.

Callers that can run a split-K plan (torch tensors; ``tilekiln/splitk.py``)
also get the fp32-partial kernels over K slices as candidates, named
``<kernel id>/splitk<S>``; the model prices them at their sliced estimate plus
the ordered sum's launch and the partials it reads (:func:`split_cost`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from tilekiln.model import DEFAULT_MODEL, ModelParams, model_of, on_device
from tilekiln.problem import GemmProblem, gated, ungated
from tilekiln.spec import DTYPES, FAMILIES, GLU_BLOCK, KernelRecord, Scheduler, requested_fields
from tilekiln.splitk import PARTIAL_DTYPE, label, sliced
from tilekiln.tuning.sku import TablePick


@dataclass(frozen=True)
class Candidate:
    kernel: KernelRecord
    accepted: bool
    reason: str
    estimate: float = math.inf  # model time (tilekiln/model.py's units); lower is better
    microseconds: float = math.inf  # the estimate on the device (ModelParams.sm_macs_per_us), for explain
    split: int = 1  # K slices (splitk.py); 1: the kernel runs the problem as it is
    run: GemmProblem | None = None  # what the kernel runs: the problem, or its K slices

    @property
    def label(self) -> str:
        return label(self.kernel.id, self.split)


@dataclass(frozen=True)
class Choice:
    kernel: KernelRecord | None
    how: str  # "tuned", "model" or "none"
    candidates: tuple[Candidate, ...]
    split: int = 1
    run: GemmProblem | None = None
    notes: tuple[str, ...] = ()  # further lines for explain, such as what the backward GEMMs run on
    decided: str = ""  # which SKU's table decided, or why the model did (tilekiln/tuning/sku.py)

    @property
    def label(self) -> str:
        return label(self.kernel.id, self.split) if self.kernel else "none"

    def __str__(self) -> str:
        how = f"{self.how}: {self.decided}" if self.decided else self.how
        lines = [f"chosen: {self.label} ({how}; {self.kernel.verification_label})" if self.kernel else
                 f"chosen: {self.label} ({how})"]
        for c in sorted(self.candidates, key=lambda c: (not c.accepted, *_model_rank(c))):
            mark = "accept" if c.accepted else "reject"
            est = f" estimate {c.microseconds:.3g} us;" if c.accepted else ""
            lines.append(f"  {mark} {c.label}:{est} {c.reason}")
        return "\n".join([*lines, *self.notes])


def bucket_ceiling(v: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^k) that is >= ``v``.

    Half-octave steps keep LLM widths that differ in wave count apart: with
    power-of-two buckets 24576 and 28672 share 32768, and on the H200 the
    winner for M=256 differs (128x192 tiles: 684 TFLOP/s at 256x24576x8192,
    where the 28672 winner, 128x256, gives 486).
    """
    p = 1 << max(0, (v - 1).bit_length())
    return 3 * p // 4 if p >= 4 and v <= 3 * p // 4 else p


def shape_bucket(problem: GemmProblem, kernel_layout: str) -> str:
    """Tuning-table key: dtype, layout and the bucket ceilings of M, N, K and L."""
    c = bucket_ceiling
    return f"{problem.dtype}:{kernel_layout}:{c(problem.m)}x{c(problem.n)}x{c(problem.k)}:{c(problem.batch)}"


def layout_code(problem: GemmProblem) -> str:
    return ("t" if problem.a.major == "k" else "n") + ("n" if problem.b.major == "k" else "t")


# How check_kernel begins its refusal of an operand's stride, which refuses_out_rows recognises.
_ALIGNMENT = "alignment: {}"


def refuses_out_rows(candidate: Candidate) -> bool:
    """Whether :func:`check_kernel` refused ``candidate`` for out's stride (rows or batch entries not
    a whole number of TMA's 16-byte units apart), a fix in the caller's hands."""
    return not candidate.accepted and candidate.reason.startswith(_ALIGNMENT.format("out"))


def check_kernel(kernel: KernelRecord, problem: GemmProblem) -> str | None:
    """Why ``kernel`` cannot run ``problem``, or None if it can."""
    cfg = kernel.config
    if cfg.family != problem.family:
        return f"family: kernel computes {cfg.family}, the call is {problem.family}"
    want = (problem.a_dtype, problem.b_dtype, problem.out_dtype)
    have = (cfg.dtypes.a.value, cfg.dtypes.b.value, cfg.dtypes.c.value)
    if want != have:
        return f"dtype: kernel computes {have[0]}/{have[1]}->{have[2]}, the call needs {problem.dtype}"
    asked = dict(problem.requested)
    for f, spec in requested_fields():
        want, have = asked.get(f.name, spec.codec.request(f.default)), spec.codec.request(getattr(cfg, f.name))
        if want != have:
            return f"{f.name}: kernel computes {have}, the call asks for {want}"
    if cfg.activation.gated and problem.n % (2 * GLU_BLOCK):
        return (f"swiglu: I = N/2 = {problem.n // 2} is not a multiple of the kernel's {GLU_BLOCK}-row gate and up "
                "blocks (its tiles pair whole blocks)")
    a_major, b_major, _ = cfg.layout.majors
    if a_major != problem.a.major:
        return f"layout: kernel wants A {a_major}-major, a is {problem.a.major}-major"
    if b_major != problem.b.major:
        return f"layout: kernel wants B {b_major}-major, b is {problem.b.major}-major"
    limit = kernel.contract.max_extent
    for name, extent in (("M", problem.m), ("N", problem.n), ("K", problem.k), ("batch", problem.batch)):
        if extent > limit:
            return f"extent: {name} = {extent} exceeds the kernel's index range ({limit})"
    why = problem.exceeds(cfg.tile.m, cfg.tile.n)
    if why is not None:
        return why
    div_a, div_b, div_c = kernel.contract.stride_divisibility
    for name, layout, div in (("a", problem.a, div_a), ("b", problem.b, div_b), ("out", problem.c, div_c)):
        for what, stride in (("leading", layout.lead), ("batch", layout.batch)):
            if stride % div:
                return (f"{_ALIGNMENT.format(name)} {what} stride {stride} is not a multiple of {div} elements "
                        f"({kernel.contract.base_alignment} bytes, needed by TMA)")
    return None


def nominal_clusters(kernel: KernelRecord, sm_count: int) -> int:
    """Clusters of ``kernel`` that ``sm_count`` SMs would hold if every SM could join any cluster;
    the driver's count (Bundle.resident_clusters) is lower where GPCs leave SMs over."""
    return max(1, sm_count // kernel.cluster_size)


def wave_window(rows: int, cols: int, clusters: int, band: int) -> tuple[int, int]:
    """The (rows, columns) of a rows x cols grid of cluster tiles that ``clusters`` consecutive work
    items cover, walked as the templates' work_tile walks it: bands of ``band`` columns, each walked
    down its rows (raster along rows)."""
    band = min(band, cols)
    if clusters <= band * rows:
        return min(rows, math.ceil(clusters / band)), min(band, clusters)
    return rows, min(cols, math.ceil(clusters / rows))


def warpgroup_mma(kernel: KernelRecord) -> bool:
    """Whether ``kernel``'s MMAs are warpgroup MMAs (sm90's wgmma, by its SASS census), whose
    rate depends on how many warpgroups issue them at once."""
    sass = kernel.resources.sass
    return any(sass.get(op, 0) for op in ("HGMMA", "QGMMA", "IGMMA"))


def estimate(kernel: KernelRecord, problem: GemmProblem, resident: int, model: ModelParams = DEFAULT_MODEL) -> float:
    """Relative run time of ``kernel`` on ``problem`` when ``resident`` of its clusters run at once."""
    cfg = kernel.config
    tm, tn = cfg.tile.m, cfg.tile.n
    cm, cn = cfg.cluster.m, cfg.cluster.n
    k = max(problem.k, 1)
    # A swapped kernel's tile M runs along the problem's N.
    m, n = (problem.n, problem.m) if cfg.swap_ab else (problem.m, problem.n)
    # Cluster tiles along M: a grouped problem pads each group to whole cluster tiles.
    tiles_m = math.ceil(m / (tm * cm)) if cfg.swap_ab else problem.row_tiles(tm * cm)
    tiles_n = math.ceil(math.ceil(n / tn) / cn)
    items = tiles_m * tiles_n * problem.batch
    intensity = tm * tn / (tm + tn)
    gain_m = model.grouped_multicast_gain if FAMILIES[problem.family].indices else model.multicast_gain
    efficiency = (intensity / (intensity + model.reuse_knee) * gain_m ** math.log2(cm)
                  * model.multicast_gain ** math.log2(kernel.cluster_size / cm))
    clusters = min(resident, items)
    # A wave wider than one batch entry's grid spans several entries, each with its own operands.
    per_entry = tiles_m * tiles_n
    within = min(clusters, per_entry)
    if cfg.raster.value == "m":
        rows, cols = wave_window(tiles_m, tiles_n, within, cfg.swizzle)
    else:
        cols, rows = wave_window(tiles_n, tiles_m, within, cfg.swizzle)
    # Rows past M and columns past N are TMA zero-fill, never read.
    elements = (min(rows * cm * tm, m) + min(cols * cn * tn, n)) * math.ceil(clusters / per_entry)
    mma = tm * tn * k / efficiency
    traffic = elements * k * model.macs_per_element / (clusters * kernel.cluster_size)
    # A K step costs at least a round trip of the pipeline, however little it computes: a 64x16
    # tile's 64-deep steps (4 MMAs) took 0.21 us each on the H100 (DeepSeek-V3's kv_a_proj, 112
    # steps in 24 us at every M from 1 to 205; h100-2026-12-07-sweep-bf16-shard1of4-partial.json).
    floor = math.ceil(k / cfg.tile.k) * model.step_us * model.sm_macs_per_us * mma_rate(problem)
    # The busiest cluster's share of the tiles: each cluster walks its own in turn.
    turns = math.ceil(items / resident)

    def tile(rate: float) -> float:
        return max(mma / rate + traffic, floor)

    # Warpgroup MMAs run at the SM's full rate where full_rate_rows are in flight at once: two
    # 64-row warpgroups of a cooperative tile, or the one warpgroup of a 128-row ping-pong tile. A
    # 64-row tile issues from one warpgroup at a time (ping-pong's two take turns at the mainloop,
    # the point being that one's epilogue overlaps the other's MMAs), at lone_warpgroup the rate.
    lone = warpgroup_mma(kernel) and tm < model.full_rate_rows
    return turns * tile(model.lone_warpgroup if lone else 1.0)


def split_cost(problem: GemmProblem, split: int, model: ModelParams = DEFAULT_MODEL) -> float:
    """What running ``problem`` as ``split`` K slices adds to the slices' own estimate: the
    launch of the ordered sum and the fp32 partials it reads (tilekiln/splitk.py), spread over
    the device like the sum itself."""
    return (model.launch_us * model.sm_macs_per_us * mma_rate(problem)
            + split * problem.m * problem.n * model.partial_element)


def mma_rate(problem: GemmProblem) -> float:
    """Multiply-adds the tensor cores run per 16-bit one at the problem's operand width (8-bit: two)."""
    return 16 / DTYPES[problem.a_dtype].bits


def choose(kernels: tuple[KernelRecord, ...], problem: GemmProblem, sm_count: int,
           tuning: TablePick, splits: tuple[int, ...] = (1,),
           resident: Callable[[KernelRecord], int] | None = None, model: ModelParams | None = None) -> Choice:
    """The kernel (and K split, among ``splits``) for ``problem``: tuned if the device's table
    (``tuning``: tilekiln/tuning/sku.py) names an accepted candidate for its bucket, else the
    model's best. ``resident``: how many clusters of a kernel the device holds at once (default
    :func:`nominal_clusters`); ``model``: the model's constants (default: the table's fitted ones
    over :data:`tilekiln.model.DEFAULT_MODEL`, moved to the device's DRAM bandwidth)."""
    if model is None:
        model = on_device(model_of(tuning.model), tuning.device.dram_gbps)
    if resident is None:
        def resident(k: KernelRecord) -> int:
            return nominal_clusters(k, sm_count)
    per_us = model.sm_macs_per_us * mma_rate(problem)
    candidates = []
    for split in splits:
        run = problem if split == 1 else sliced(problem, split)
        if run is None:
            continue
        for k in kernels:
            if split > 1 and k.config.dtypes.c.value != PARTIAL_DTYPE:
                continue
            why = check_kernel(k, run)
            if why is not None:
                candidates.append(Candidate(k, False, why, split=split))
                continue
            cost = estimate(k, run, resident(k), model) + (split_cost(problem, split, model) if split > 1 else 0.0)
            reason = "contract fits" if split == 1 else f"contract fits {split} slices of K = {run.k}"
            candidates.append(Candidate(k, True, reason, cost, cost / per_us, split, run))
    accepted = [c for c in candidates if c.accepted]
    if not accepted:
        return Choice(None, "none", tuple(candidates))
    bucket = shape_bucket(problem, layout_code(problem))
    tuned_label = tuning.buckets.get(bucket)
    tuned = [c for c in accepted if c.label == tuned_label]
    best, how = (tuned[0], "tuned") if tuned else (min(accepted, key=_model_rank), "model")
    return Choice(best.kernel, how, tuple(candidates), best.split, best.run, decided=tuning.decided(bool(tuned), bucket))


def _model_rank(c: Candidate) -> tuple:
    """Lowest estimate first; on a tie a clc kernel before its static twin (module doc), then the id."""
    return c.estimate, c.kernel.config.scheduler is not Scheduler.CLC, c.label


def choose_fused(choose_for: Callable[[GemmProblem], Choice], problem: GemmProblem
                 ) -> tuple[Choice, tuple[tuple[str, object], ...]]:
    """The choice for ``problem`` and what of its requested epilogue no kernel computes. What only a
    kernel computes (FieldSpec.applied_after False, e.g. blockwise scaling) stays asked. The rest the
    epilogue applies in the spec's order (bias, then activation), so a kernel that computes the
    leading ones leaves a correct intermediate for torch to finish: the choice is for the longest
    leading part some kernel accepts (down to none), and the rest is left to the caller (applied by
    torch after the kernel) rather than dropped. Where what is left is gated (swiglu), the kernel
    runs the ungated GEMM, whose N columns torch then pairs."""
    after = {f.name for f, s in requested_fields() if s.applied_after}
    kept = tuple((name, value) for name, value in problem.requested if name not in after)
    epilogue = tuple((name, value) for name, value in problem.requested if name in after)
    def part(keep: int) -> GemmProblem:
        fused = replace(problem, requested=kept + epilogue[:keep])
        return ungated(fused) if gated(epilogue[keep:]) else fused

    for keep in range(len(epilogue), 0, -1):
        choice = choose_for(part(keep))
        if choice.kernel is not None:
            return choice, epilogue[keep:]
    return choose_for(part(0)), epilogue
