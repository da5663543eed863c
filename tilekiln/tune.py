"""Measure which kernel is fastest per shape bucket and ship the table in the bundle.

    python3 -m tilekiln.tune BUNDLE_DIR [--shapes 4096x4096x4096,...] [--dtype bf16|f16|e4m3]
                             [--table-out catalog/tuning/<bundle>.json]

Runs on a GPU with torch. For every shape it times each kernel whose contract
accepts the problem, except those whose first launches are ``CUT`` times slower
than the fastest one's, in ``ROUNDS`` interleaved rounds (after warm-up, the
launches captured in CUDA graphs of ``GRAPH_LAUNCHES`` so host time drops out,
CUDA events around each of many replays queued back to back, the median, inputs
rotated so the L2 is cold for problems smaller than it), each block of a
candidate's launches followed by one of the baseline's (cuBLAS through torch,
``baseline_call``) and scored relative to it. That screen uses short blocks;
the kernels of the ``FINALISTS`` fastest walk groups it ranks within
``WINDOW`` of its fastest (``finalists``: a group is one kernel under all
its raster walks, which only steady state tells apart, and L2 hints) are then timed
the same way at steady state, each block as long as bench/gemm.py's
(``block_launches``) and run right after ``--settle-ms`` of untimed launches
of the same kernel (``steady_ms``), and the fastest of those is recorded
under the problem's shape bucket (``select.shape_bucket``: dtype, layout and
M, N, K and batch rounded up to the next 2^k or 3·2^k). The table is written
into ``manifest.json`` (``tuning.table``) and the manifest's digest is
recomputed, atomically; the runtime then prefers the tuned kernel for every
problem in that bucket whose contract it accepts. ``--table-out`` also writes
the table as a file: committed as ``catalog/tuning/<bundle>.json``, every
later build ships it (builder/manifest.py).

    python3 -m tilekiln.tune BUNDLE_DIR --merge RUN1.json RUN2.json ... [--table-out FILE]

needs no GPU: it picks each bucket's winner again from the measurements of
several earlier runs (their ``--table-out`` files), by ``combine``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from tilekiln._files import write_atomic
from tilekiln.manifest import MANIFEST_NAME, manifest_digest
from tilekiln.spec import KernelRecord
from tilekiln.splitk import parse_label

L2_BYTES = 60 * 2**20
# A candidate whose first launches take this many times the fastest
# candidate's is not measured further (nor recorded): run-to-run spread on the
# H200 is under 10%, so it cannot win. Without the cut, a bf16 tune of the
# 89-kernel bundle ran past 150 s where the 68-kernel one took about 60: the
# 64x16 swap_ab kernels, timed at every large shape, run there at a fifth of
# the best kernel's rate or less.
CUT = 2.0
# Candidates are timed in this many interleaved rounds (bench/gemm.py's four
# blocks). Timed one after another, the first ones ran on a cooler, faster
# card: at 2048x8192x8192 bf16 the model's first pick read 803 TFLOP/s in the
# tune and 680 in the bench, and at 8192^3 two kernels of the same tile
# differing only in raster swizzle read 1.53 and 1.91 ms
# (bench/results/h200-2026-12-03-tune192-bf16.json). Two interleaved bf16
# runs agreed on 51 of 82 buckets, run one's pick 0.55% slower on average in
# run two (h200-2026-12-03-tune-rounds-bf16-*.json).
ROUNDS = 4
# The screen's finalists (``finalists``: its FINALISTS fastest walk groups
# within WINDOW of its fastest) are timed again at steady state, in
# SUSTAINED_ROUNDS rounds. The H200 runs large GEMMs at its 700 W cap, where each kernel gets
# the SM clock its own power draw leaves: in 150 ms blocks at bf16 8192^3,
# 128x256 c2x1 sw8 held 1455 MHz and 128x128 c1x2 1260 (cuBLAS 1485). A
# short block instead runs at the clock the block before left, and a block of
# about 30 ms (bench/gemm.py's, before it settled) carries one kernel's power
# draw into the next one's: at 8192x28672x8192 128x128 c1x2 read 1.005 of
# cuBLAS in 1 ms blocks, 1.074 in 30 ms blocks and 0.852 in 150 ms blocks,
# 128x256 c2x1 rn sw8 0.991, 0.988 and 0.983
# (bench/results/block-length-h200-2026-12-03.json). The screen cannot rank
# kernels that differ only in their raster walk: at 16384x24576x8192 it timed
# 128x256 c2x1 at 9.56 ms and its bands-of-4 twin at 10.30, 13th of the
# screen, while at steady state the twin ran 10% faster (683 against 619
# TFLOP/s in 150 ms blocks); a tune that kept the screen's 8 fastest kernels
# picked the unswizzled one there, which read 0.872 of cuBLAS on the bench
# (bench/results/h200-2026-12-03-tune-steady-bf16.json, -steady-tuned-bf16.json).
# So the finalists are the screen's FINALISTS fastest walk groups
# (``walk_key``), each with all its walks: re-tuned so, that shape picked the
# bands-of-4 kernel and read 0.978 (h200-2026-12-03-steady-tuned2-bf16.json).
# Five groups are 13 kernels there (11 for fp8), and a steady fp8 tune of the
# 26 suite shapes of M >= 2048 took 181 s on the H200.
WINDOW = 1.15
FINALISTS = 5
# Three steady rounds, not two: a candidate's score is the median of its
# rounds' ratios to the baseline block right after it, and the median of two
# is their mean, so one slow baseline block moved a candidate half-way. The
# fp8 baseline has such blocks: at 256x14336x4096 torch._scaled_mm read 520.2
# and 947.3 TFLOP/s in the two repeats of one settled bench
# (h200-2026-12-03-settled-fp8.json), and a two-round tune scored 128x128
# c1x2 ping-pong there at 1133 TFLOP/s, 1.160x the baseline, where the bench
# then read it at 852.6 and 852.9, 0.89x (-final-steady-fp8.json). The third
# round adds half again to the steady pass's time (two took 181 s for the 26
# fp8 suite shapes of M >= 2048). Each round's pair of times is kept in the
# table under ``samples``, so a pick can be checked against them.
SUSTAINED_ROUNDS = 3
# Untimed launches of the same kernel before each steady-state block: a 150
# ms block's median launch already read steady-state clocks (above); the
# count is capped since the host enqueues about one launch per 7 us.
SETTLE_MS = 100.0
SETTLE_MAX_LAUNCHES = 2000
# Timed launches are replayed from CUDA graphs of this many launches
# (``graphed``, ``graph_ms``), so a side's host cost per call cannot pass for
# GPU time. Called one at a time, a GEMM shorter than its host path times the
# host: in one eager bench, torch._scaled_mm took 42 to 49 us per call at
# 16x8192x8192, 1024^3 and 256x4096x4096 alike, which replayed from graphs
# took 19.0, 4.5 and 9.9 us, and at 256x14336x4096 it took 57.7 us in that
# run, 31.1 in the next and 28.4 from graphs (bench/results/
# h200-2026-12-04-eager-e4m3.json, -eager-run2-e4m3.json,
# -graph-eager-tuned-e4m3.json). A tune timed that way ranked host noise:
# for bf16 1024^3 it shipped 128x192 c2x1, which the eager bench read at
# 1.41x cuBLAS and graphs at 0.54x (11.2 us to 6.0); tuned from graphs,
# 64x128 c1x2 reads 0.93x (-eager-bf16.json, -graph-eager-tuned-bf16.json,
# -graph-bf16.json).
GRAPH_LAUNCHES = 10
# Candidate times are kept in ms to 10 ns: at 0.1 us, every kernel of a 30 us
# bf16 2048^3 tune read 30.0 or 30.1, too coarse to rank them.
TIME_DECIMALS = 5

# LLM-style problems: token counts from decode to large prefill against the
# projection and MLP matrices of 4k- and 8k-hidden models, plus squares.
DEFAULT_SHAPES = sorted({
    (m, n, k)
    for m in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    for n, k in ((4096, 4096), (12288, 4096), (14336, 4096), (4096, 14336),
                 (8192, 8192), (24576, 8192), (28672, 8192), (8192, 28672))
} | {(s, s, s) for s in (1024, 2048, 4096, 8192)})


def require_cuda_torch(tool: str):
    """The torch module with a CUDA device to time on; SystemExit saying what ``tool`` lacks otherwise."""
    try:
        import torch
    except ModuleNotFoundError:
        raise SystemExit(f"{tool} times kernels on a CUDA GPU through torch, which is not installed here: "
                         "run it on the GPU machine (pip install torch)") from None
    if not torch.cuda.is_available():
        raise SystemExit(f"{tool} times kernels on a CUDA GPU, and torch sees none here")
    return torch


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in filter(None, text.split(",")):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--shapes: {item!r} is not MxNxK with positive integers")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def block_launches(flops: int) -> int:
    """Launches per timed block of a problem of ``flops``: about 2e13 flops (30 ms at 660
    TFLOP/s), 10 to 200 launches; bench/gemm.py's blocks."""
    return max(10, min(200, int(2e13 / flops)))


def settle_launches(launch_ms: float, settle_ms: float) -> int:
    """Untimed launches that keep the GPU busy for ``settle_ms`` at ``launch_ms`` each."""
    if settle_ms <= 0:
        return 0
    return min(SETTLE_MAX_LAUNCHES, math.ceil(settle_ms / launch_ms))


def warm_ms(fn) -> float:
    """``median_event_ms(fn, 3)`` after three warm-up calls: a first, rough time of ``fn``."""
    for i in range(3):
        fn(i)
    return median_event_ms(fn, 3)


class CaptureError(RuntimeError):
    """A side's launches could not be captured in a CUDA graph; the message names the side."""


def graphed(fn, side: str):
    """``fn(0) .. fn(GRAPH_LAUNCHES - 1)`` captured as one CUDA graph, and a function of ``i``
    that replays it. ``fn`` must have run outside capture first (warm-up: plans, module loads,
    cuBLAS's algorithm choice). A failed capture raises :class:`CaptureError` naming ``side``."""
    import torch

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(GRAPH_LAUNCHES):
                fn(i)
    except RuntimeError as exc:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise CaptureError(f"{side}: its launches could not be captured in a CUDA graph ({first})") from exc
    return lambda i: graph.replay()


def graph_replays(iters: int, settle: int) -> tuple[int, int]:
    """(timed, untimed) replays of a ``graphed`` function for about ``iters`` timed and
    ``settle`` untimed launches: at least two timed, since ``median_event_ms`` drops its first."""
    return max(2, -(-iters // GRAPH_LAUNCHES)), -(-settle // GRAPH_LAUNCHES)


def graph_ms(replay, iters: int, settle: int) -> float:
    """``steady_ms`` of a ``graphed`` function in ms per launch, for about ``iters`` timed
    launches after ``settle`` untimed ones (``graph_replays``)."""
    timed, untimed = graph_replays(iters, settle)
    return steady_ms(replay, timed, untimed) / GRAPH_LAUNCHES


def steady_ms(fn, iters: int, settle: int) -> float:
    """``median_event_ms(fn, iters)`` right after ``settle`` untimed calls of ``fn`` queued
    ahead of it, so the timed calls run at the clock ``fn``'s own power draw leaves."""
    for i in range(settle):
        fn(i)
    return median_event_ms(fn, iters)


def finalists(times: dict[str, float], group: Callable[[str], object] = lambda label: label,
              window: float = WINDOW, most: int = FINALISTS) -> list[str]:
    """The labels of ``times`` in the ``most`` groups (``group(label)``) whose fastest label is
    within ``window`` times the fastest of all, fastest first (ties in label order)."""
    best = min(times.values())
    order = sorted(times, key=lambda label: (times[label], label))
    kept: list[object] = []
    for label in order:
        if times[label] <= window * best and group(label) not in kept:
            kept.append(group(label))
    kept = kept[:most]
    return [label for label in order if group(label) in kept]


def walk_key(kernels: Mapping[str, KernelRecord], label: str) -> tuple:
    """What the choice ``label`` (a kernel id of ``kernels``, or a split-K label) is apart from
    the order its CTAs walk the output tiles (raster, swizzle) and its L2 hints (evict_first)."""
    kid, split = parse_label(label)
    k = kernels[kid]
    c = k.config
    return (c.dtypes, c.layout, c.tile, c.cluster, c.schedule, c.swap_ab, k.stages, split)


def median_event_ms(fn, iters: int, while_queued: Callable[[], None] | None = None) -> float:
    """Median GPU time of ``fn(i)`` for i in range(iters): each call between its own pair of
    CUDA events, the calls queued back to back; ``while_queued`` runs on the host once they are
    queued, while the GPU works through them (bench/block_length.py samples the clock there).

    The host does not wait between calls, so while the GPU has work queued a
    call's events bracket only its kernels, not the host's time to enqueue
    them (``bench/overhead.py`` measures that). Waiting after every call, as
    this function first did, put the enqueue latency into every sample: about
    7 us for tilekiln and 11 us for torch.matmul on the H200 host, a large
    share of a 1024^3 GEMM's 15 us. The first call, which starts on an idle
    GPU, is left out.
    """
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters + 1)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(i)
        end.record()
    if while_queued is not None:
        while_queued()
    events[-1][1].synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events[1:])


def operand_sets(m: int, n: int, k: int, dtype, out_dtype) -> list[tuple]:
    """Independent (a, b = w.t(), out) sets, enough that together they exceed the L2 twice
    (at most 8), so consecutive launches read their inputs from memory, not the L2."""
    import torch

    one = (m * k + n * k) * torch.finfo(dtype).bits // 8 + m * n * torch.finfo(out_dtype).bits // 8
    sets = []
    for _ in range(max(1, min(8, math.ceil(2 * L2_BYTES / one)))):
        a = torch.randn(m, k, device="cuda").to(dtype)
        w = torch.randn(n, k, device="cuda").to(dtype)  # nn.Linear weight: b = w.t() is K-major
        sets.append((a, w.t(), torch.empty(m, n, device="cuda", dtype=out_dtype)))
    return sets


@dataclass(frozen=True)
class Timings:
    """Candidate times in ms, each relative to the reference timed right after it and scaled by
    the reference's median time (``reference_ms``); ``samples``: each candidate's (time,
    reference time) pairs, one a round, in ms."""

    candidates: dict[str, float]
    reference_ms: float
    samples: dict[str, list[tuple[float, float]]]


def interleaved(labels: list[str], measure: Callable[[str], float], reference: Callable[[], float],
                rounds: int) -> Timings:
    """Each label's median, over ``rounds`` round-robin rounds, of ``measure(label)`` divided by
    the ``reference()`` measured right after it.

    Each round starts one label later than the one before, so the card's clock,
    which falls as it heats against its power cap, weighs on every label
    alike, and the reference that follows each measurement cancels what drift
    is left. It also puts every candidate where bench/gemm.py puts it: after
    another kernel, not after itself. Timed only against one another, bf16
    128x16x64 c4x1 swap_ab won 16x8192x8192 in three tunes by 0.6 to 1.7%
    and then read 0.81 to 0.95 of cuBLAS in all eight bench repeats that ran
    it, where the runner-up read 0.94 to 1.18 (catalog/gemm/sm90.yaml).
    """
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    for r in range(rounds):
        shift = r % len(labels) if labels else 0
        for label in labels[shift:] + labels[:shift]:
            measured = measure(label)
            samples[label].append((measured, reference()))
    references = [ref for pairs in samples.values() for _, ref in pairs]
    reference_ms = statistics.median(references) if references else math.nan
    return Timings({label: statistics.median(t / ref for t, ref in pairs) * reference_ms
                    for label, pairs in samples.items()}, reference_ms, samples)


def measure_candidates(labels: list[str], probe: Callable[[str], float], measure: Callable[[str], float],
                       reference: Callable[[], float], rounds: int = ROUNDS) -> Timings:
    """``interleaved`` times of the labels whose ``probe`` (a warm-up and a few launches) is
    within ``CUT`` times the fastest probe; the others are left out of the result."""
    probes = {label: probe(label) for label in labels}
    fastest = min(probes.values(), default=math.inf)
    return interleaved([label for label in labels if probes[label] <= CUT * fastest], measure, reference, rounds)


def baseline_call(a, b, c, scales):
    """The baseline tilekiln is measured against: cuBLAS through torch.matmul, or
    torch._scaled_mm with per-tensor ``scales`` and bf16 output for 8-bit floats."""
    import torch

    if scales is None:
        return torch.matmul(a, b, out=c)
    # fast accumulation on both sides: tilekiln's fp8 kernels accumulate in the
    # WGMMA's fp32 accumulators without periodic promotion.
    return torch._scaled_mm(a, b, scale_a=scales[0], scale_b=scales[1], out_dtype=torch.bfloat16,
                            use_fast_accum=True)


def tilekiln_call(bundle, a, b, c, scales, kernel: str | None = None):
    """``bundle``'s counterpart of ``baseline_call``: ``gemm``, or ``scaled_gemm`` with the
    per-tensor ``scales`` of 8-bit floats, into ``c`` (None: a new tensor); ``kernel`` pins a
    choice by its label. Returns the output."""
    if scales is None:
        return bundle.gemm(a, b, c, kernel=kernel)
    return bundle.scaled_gemm(a, b, *scales, out=c, kernel=kernel)


def tune(bundle_dir: Path, shapes: list[tuple[int, int, int]], dtype_name: str, iters: int,
         settle_ms: float = SETTLE_MS, record: Callable[[dict[str, dict]], None] | None = None) -> dict[str, dict]:
    """The table of ``shapes``; ``record`` gets the table so far after every shape, so a run cut
    short (a tune of 33 large bf16 shapes takes about 5 minutes) keeps what it measured."""
    import torch

    import tilekiln
    from tilekiln._tensors import describe
    from tilekiln.problem import make_problem
    from tilekiln.select import layout_code, shape_bucket

    bundle = tilekiln.load(bundle_dir)
    group = functools.partial(walk_key, {kernel.id: kernel for kernel in bundle.kernels})
    fp8 = dtype_name == "e4m3"
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn}[dtype_name]
    out_dtype = torch.bfloat16 if fp8 else dtype
    scales = (torch.ones(1, device="cuda"), torch.ones(1, device="cuda")) if fp8 else None
    table: dict[str, dict] = {}
    for (m, n, k) in shapes:
        sets = operand_sets(m, n, k, dtype, out_dtype)
        problem = make_problem(describe(sets[0][0], "a"), describe(sets[0][1], "b"), None,
                               "bf16" if fp8 else None)
        bucket = shape_bucket(problem, layout_code(problem))
        # Every accepted choice, split-K ones included, by the label a pin and the table use.
        labels = [c.label for c in bundle.choose(problem, allow_split=True).candidates if c.accepted]

        def runner(kid):
            return lambda i: tilekiln_call(bundle, *sets[i % len(sets)], scales, kid)

        def baseline(i):
            baseline_call(*sets[i % len(sets)], scales)

        # a candidate's graph is captured on first use: after the probe warmed
        # the kernel up, and only for the candidates the probe kept
        replay = functools.cache(lambda kid: graphed(runner(kid), f"{m}x{n}x{k} {kid}"))

        for i in range(3):  # warm-up; cuBLAS picks and caches its algorithm here
            baseline(i)
        base = graphed(baseline, f"{m}x{n}x{k} baseline")
        per_round = max(1, iters // ROUNDS)
        screen = measure_candidates(labels, lambda kid: warm_ms(runner(kid)),
                                    lambda kid: graph_ms(replay(kid), per_round, 0),
                                    lambda: graph_ms(base, per_round, 0))
        if not screen.candidates:
            continue
        flops = 2 * m * n * k
        launches = block_launches(flops)
        base_settle = settle_launches(screen.reference_ms, settle_ms)
        timings = interleaved(
            finalists(screen.candidates, group),
            lambda kid: graph_ms(replay(kid), launches, settle_launches(screen.candidates[kid], settle_ms)),
            lambda: graph_ms(base, launches, base_settle), SUSTAINED_ROUNDS)
        times = timings.candidates
        best = min(times, key=times.get)
        entry = table.get(bucket)
        # Several shapes may share a bucket; keep the kernel that wins the
        # largest problem there, since it dominates the bucket's run time.
        if entry is None or flops >= entry["flops"]:
            table[bucket] = {"kernel": best, "flops": flops, "shape": [m, n, k],
                             "tflops": round(flops / times[best] / 1e9, 1),
                             "baseline_ms": round(timings.reference_ms, TIME_DECIMALS),
                             "candidates": {kid: round(t, TIME_DECIMALS) for kid, t in sorted(times.items())},
                             "screen": {kid: round(t, TIME_DECIMALS) for kid, t in sorted(screen.candidates.items())},
                             "samples": {kid: [[round(t, TIME_DECIMALS), round(ref, TIME_DECIMALS)] for t, ref in pairs]
                                         for kid, pairs in sorted(timings.samples.items())}}
        print(f"{m:6d}x{n:6d}x{k:6d} {bucket:32s} {best} {flops / times[best] / 1e9:7.1f} TFLOP/s "
              f"{timings.reference_ms / times[best]:.3f}x baseline", flush=True)
        sets = replay = base = None  # free the operands and graphs before the next shape
        if record is not None:
            record(table)
    return table


def combine(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """One table from the ``measurements`` of several tune runs.

    Per bucket, each candidate that every run measured there is scored by the
    geometric mean, over the runs, of its time relative to that run's fastest;
    the lowest score wins, and the entry records the geometric-mean time of
    each such candidate. A single run is a snapshot of a card whose clock
    moves with its power cap: on the H200 two runs of the same bundle half an
    hour apart picked different kernels for 107 of 164 buckets, and at
    2048x8192x28672 bf16 one table's pick ran at 0.91 of cuBLAS where the
    other's ran at 1.02 (bench/README.md), so the shipped table combines runs.
    """
    table: dict[str, dict] = {}
    for bucket in sorted({b for run in runs for b in run}):
        entries = [run[bucket] for run in runs if bucket in run]
        common = set.intersection(*(set(e["candidates"]) for e in entries))
        if not common:
            continue
        fastest = [min(e["candidates"][c] for c in common) for e in entries]
        score = {c: _geomean([e["candidates"][c] / f for e, f in zip(entries, fastest)]) for c in common}
        times = {c: round(_geomean([e["candidates"][c] for e in entries]), TIME_DECIMALS) for c in sorted(common)}
        best = min(sorted(common), key=score.get)
        first = entries[0]
        table[bucket] = {"kernel": best, "flops": first["flops"], "shape": first["shape"],
                         "tflops": round(first["flops"] / times[best] / 1e9, 1), "candidates": times,
                         "runs": len(entries)}
        if all("baseline_ms" in e for e in entries):
            table[bucket]["baseline_ms"] = round(_geomean([e["baseline_ms"] for e in entries]), TIME_DECIMALS)
    return table


def mergeable(runs: list[dict[str, dict]], kernel_ids: set[str]) -> tuple[list[dict[str, dict]], int]:
    """The runs' own measurements of the kernels in ``kernel_ids``, and how many entries were
    left out as copies.

    A ``--table-out`` file holds the bundle's whole tuning field, so besides
    the buckets its run measured it carries copies: of an earlier run's
    entries (equal to that run's), or of a merged table's (which have
    ``runs``). Counted again, a copy weighs one run twice or mixes in
    measurements of another bundle; each is kept once, merged ones never.
    A kernel dropped from the catalog since a run measured it cannot be the
    table's pick; a bucket left without candidates is left out.
    """
    seen: set[tuple[str, str]] = set()
    kept, copies = [], 0
    for run in runs:
        out = {}
        for bucket, entry in run.items():
            key = (bucket, json.dumps(entry["candidates"], sort_keys=True))
            if "runs" in entry or key in seen:
                copies += 1
                continue
            seen.add(key)
            candidates = {label: t for label, t in entry["candidates"].items() if parse_label(label)[0] in kernel_ids}
            if candidates:
                out[bucket] = dict(entry, candidates=candidates)
        kept.append(out)
    return kept, copies


def _kernel_ids(bundle_dir: Path) -> set[str]:
    path = bundle_dir / MANIFEST_NAME
    try:
        return {kernel["id"] for kernel in json.loads(path.read_text())["kernels"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--merge: {path} is not a bundle manifest ({exc})")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _read_run(path: Path) -> tuple[dict[str, dict], str]:
    """(measurements, device) of a ``--table-out`` file; SystemExit naming the file if it is not one."""
    try:
        data = json.loads(path.read_text())
        measurements, device = data["measurements"], data["device"]
        for bucket, entry in measurements.items():
            if not (entry["candidates"] and all(t > 0 for t in entry["candidates"].values())
                    and entry["flops"] > 0 and len(entry["shape"]) == 3):
                raise ValueError(f"bucket {bucket}: no positive candidate times, flops and shape")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"--merge {path}: not a tuning file written by --table-out ({exc})")
    return measurements, device


def write_table(bundle_dir: Path, table: dict[str, dict], device: str) -> dict:
    """Merge ``table`` into the bundle's manifest; returns the manifest's new ``tuning`` field."""
    path = bundle_dir / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    existing = manifest.get("tuning", {}).get("table", {})
    merged = dict(existing, **{bucket: entry["kernel"] for bucket, entry in table.items()})
    details = dict(manifest.get("tuning", {}).get("measurements", {}),
                   **{bucket: {k: v for k, v in entry.items() if k != "kernel"} for bucket, entry in table.items()})
    manifest["tuning"] = {"device": device, "table": dict(sorted(merged.items())),
                          "measurements": dict(sorted(details.items()))}
    manifest["integrity"] = {"manifest_sha256": manifest_digest(manifest)}
    write_atomic(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest["tuning"]




def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m tilekiln.tune", description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--shapes", default=None, help="comma-separated MxNxK list (default: an LLM shape grid)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "e4m3"])
    p.add_argument("--iters", type=int, default=20, help="launches per candidate in the screen")
    p.add_argument("--settle-ms", type=float, default=SETTLE_MS,
                   help="untimed launches of the same kernel before each steady-state block (0: none)")
    p.add_argument("--table-out", type=Path, default=None, help="also write the tuning table to this file")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="RUN.json",
                   help="no measuring: choose from these earlier runs' --table-out files")
    args = p.parse_args(argv)
    if args.merge:
        read = [_read_run(path) for path in args.merge]
        runs, devices = [m for m, _ in read], {d for _, d in read}
        if len(devices) != 1:
            raise SystemExit(f"--merge: the runs come from different devices ({', '.join(sorted(devices))})")
        runs, copies = mergeable(runs, _kernel_ids(args.bundle))
        if copies:
            print(f"--merge: left out {copies} copied or merged entries (each run's own measurements count once)",
                  file=sys.stderr)
        _finish(args, combine(runs), devices.pop())
        return
    torch = require_cuda_torch("tilekiln tune")
    shapes = parse_shapes(args.shapes) if args.shapes else DEFAULT_SHAPES
    device = torch.cuda.get_device_name()
    try:
        table = tune(args.bundle, shapes, args.dtype, args.iters, args.settle_ms,
                     record=lambda so_far: _write(args, so_far, device))
    except CaptureError as exc:
        # The shapes before this one are in the table already (``record``).
        raise SystemExit(f"tilekiln tune: {exc}; the buckets measured before it are written, "
                         "re-run with --shapes leaving that shape out")
    print(f"wrote {len(table)} buckets to {args.bundle / MANIFEST_NAME}", file=sys.stderr)


def _finish(args, table: dict[str, dict], device: str) -> None:
    _write(args, table, device)
    print(f"wrote {len(table)} buckets to {args.bundle / MANIFEST_NAME}", file=sys.stderr)


def _write(args, table: dict[str, dict], device: str) -> None:
    tuning = write_table(args.bundle, table, device)
    if args.table_out is not None:
        write_atomic(args.table_out, json.dumps(tuning, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
