"""Choose a kernel for a problem, and say why.

Cheapest checks first: dtype, operand majorness, then the kernel's contract
(stride divisibility for 16-byte TMA rows, index range). Among the kernels
that accept the problem, a measured choice from the tuning table of the
device's SKU (or the nearest SKU's: tilekiln/tuning/sku.py) wins if one exists
for the problem's shape bucket; otherwise the analytic model estimates the
time of each:

    time ~ waves x (CTA tile work / per-CTA efficiency + a wave's DRAM bytes x cost per byte)

``waves`` counts how many rounds of the persistent grid the output cluster
tiles need on this device's SM count (wave quantisation), the CTA tile work
includes the padding a tile wastes at the matrix edge (tile efficiency), and
the efficiency term favours tiles with more reuse per byte loaded and
clusters that share loads through TMA multicast. The traffic term counts the
A rows and B columns one wave of the raster walk touches (the swizzle band
decides how many of each), each read from DRAM once per wave: a decode-sized
GEMM is priced by the weight it streams, and a large grid walked without a
swizzle band by the A panels every wave reloads. The model only ranks
candidates; ``tilekiln tune`` replaces it with measurements where it errs.

Where two accepted kernels differ only in their scheduler (``scheduler: clc`` beside the static
walk: tilekiln/spec.py, Scheduler), the model prices them the same and the cluster-launch-control
kernel wins the tie: its clusters take tiles as they finish, so SMs shared with other work or
tiles of uneven cost leave no cluster idle while another still has a queue. This preference is
untested on hardware (no SM 10.x part has run either kernel); ``tilekiln tune`` measures both and
overrides it per shape bucket.

Callers that can run a split-K plan (torch tensors; ``tilekiln/splitk.py``)
also get the fp32-partial kernels over K slices as candidates, named
``<kernel id>/splitk<S>``; the model prices them at ``SPLIT_OVERHEAD`` times
their sliced estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from tilekiln.problem import GemmProblem, gated, ungated
from tilekiln.spec import FAMILIES, GLU_BLOCK, KernelRecord, Scheduler, requested_fields
from tilekiln.splitk import PARTIAL_DTYPE, SPLIT_OVERHEAD, label, sliced
from tilekiln.tuning.sku import TablePick

# The model's reuse term: tile intensity m*n/(m+n) over itself plus this
# constant (elements). With 20, 128x256 tiles rank above 128x128 above 64x128,
# as the H200 measurements of the default catalog did (651, 598, 398 TFLOP/s
# at 8192^3; bench/results).
_REUSE_KNEE = 20.0
# Each doubling of the cluster size, which halves one operand's L2 traffic
# through multicast, measured 5-13% faster at 8192^3 on the H200.
_MULTICAST_GAIN = 1.06
# The same for a grouped kernel's cluster along M, whose CTAs share one group's B tile. Each
# group's B is read only by that group's tiles, so the L2 holds less of it for a neighbour than a
# dense B. With the expected padding of GroupedProblem.row_tiles, 1.2 ranks the H100's
# grouped kernels as measured at 4096 tokens (bench/results/h100-2026-12-07-grouped-variants.json:
# the fastest of 128x128/128x256 c1x1/c2x1 on all eight layer and routing rows, where 1.06 picked
# c2x1 for Qwen3-30B-A3B's 256-row groups at 0.89 and 0.95 of the fastest). Its pick moves from
# c1x1 to c2x1 at about 400 rows per group.
_GROUPED_MULTICAST_GAIN = 1.2
# The traffic term's price of one operand element read from DRAM, in MMA multiply-adds: about
# 150 flop/byte (the H200's achieved bf16 rate over its DRAM bandwidth) is 150 MACs per 2-byte
# element, and an 8-bit MMA runs twice the MACs on half the bytes, so the price per element holds
# for fp8. Ranking the candidates of the H200 tuning measurements (bench/model_regret.py), the
# term took the model's pick from 1.031 to 1.021 of the fastest (geomean; worst 1.19 to 1.08) in
# bf16 and from 1.044 to 1.022 (worst 1.20 to 1.12) in fp8, and prices from 50 to 300 give the
# same picks within 0.002.
_MACS_PER_ELEMENT = 150.0


@dataclass(frozen=True)
class Candidate:
    kernel: KernelRecord
    accepted: bool
    reason: str
    estimate: float = math.inf  # model time, arbitrary units; lower is better
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
            est = f" estimate {c.estimate:.3g}" if c.accepted else ""
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
                return (f"alignment: {name} {what} stride {stride} is not a multiple of {div} elements "
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


def estimate(kernel: KernelRecord, problem: GemmProblem, resident: int) -> float:
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
    waves = math.ceil(items / resident)
    intensity = tm * tn / (tm + tn)
    gain_m = _GROUPED_MULTICAST_GAIN if FAMILIES[problem.family].indices else _MULTICAST_GAIN
    efficiency = (intensity / (intensity + _REUSE_KNEE) * gain_m ** math.log2(cm)
                  * _MULTICAST_GAIN ** math.log2(kernel.cluster_size / cm))
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
    traffic = elements * k * _MACS_PER_ELEMENT / (clusters * kernel.cluster_size)
    return waves * (tm * tn * k / efficiency + traffic)


def choose(kernels: tuple[KernelRecord, ...], problem: GemmProblem, sm_count: int,
           tuning: TablePick, splits: tuple[int, ...] = (1,),
           resident: Callable[[KernelRecord], int] | None = None) -> Choice:
    """The kernel (and K split, among ``splits``) for ``problem``: tuned if the device's table
    (``tuning``: tilekiln/tuning/sku.py) names an accepted candidate for its bucket, else the
    model's best. ``resident``: how many clusters of a kernel the device holds at once (default
    :func:`nominal_clusters`)."""
    if resident is None:
        def resident(k: KernelRecord) -> int:
            return nominal_clusters(k, sm_count)
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
            cost = estimate(k, run, resident(k)) * (SPLIT_OVERHEAD if split > 1 else 1.0)
            reason = "contract fits" if split == 1 else f"contract fits {split} slices of K = {run.k}"
            candidates.append(Candidate(k, True, reason, cost, split, run))
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
