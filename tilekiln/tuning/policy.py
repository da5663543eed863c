"""What a tune measures and what wins: candidates, the probe-and-cut screen, the finalists'
steady-state rounds, and :func:`tune`, the table of a list of shapes.

For every shape, each choice whose contract accepts the problem is probed;
those within ``CUT`` of the fastest probe are timed in ``ROUNDS`` interleaved
rounds, each block followed by one of the baseline's and scored relative to
it (:func:`measure_candidates`). The kernels of the screen's ``FINALISTS``
fastest walk groups within ``WINDOW`` of its fastest (:func:`finalists`) are
then timed again at steady state in ``SUSTAINED_ROUNDS`` rounds, and the
fastest of those is the entry of the problem's shape bucket
(``tilekiln.select.shape_bucket``: dtype, layout and M, N, K and batch rounded
up to the next 2^k or 3·2^k). The measuring itself is
``tilekiln/tuning/timing.py``'s. Standard library at import; :func:`tune`
imports torch.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Mapping

from tilekiln.spec import KernelRecord
from tilekiln.splitk import parse_label
from tilekiln.tuning.table import TIME_DECIMALS
from tilekiln.tuning.timing import (SETTLE_MS, Timings, baseline_call, block_launches, graph_ms, graphed,
                                    interleaved, operand_sets, settle_launches, tilekiln_call, warm_ms)

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

# LLM-style problems: token counts from decode to large prefill against the
# projection and MLP matrices of 4k- and 8k-hidden models, plus squares.
DEFAULT_SHAPES = sorted({
    (m, n, k)
    for m in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    for n, k in ((4096, 4096), (12288, 4096), (14336, 4096), (4096, 14336),
                 (8192, 8192), (24576, 8192), (28672, 8192), (8192, 28672))
} | {(s, s, s) for s in (1024, 2048, 4096, 8192)})


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


def measure_candidates(labels: list[str], probe: Callable[[str], float], measure: Callable[[str], float],
                       reference: Callable[[], float], rounds: int = ROUNDS) -> Timings:
    """``interleaved`` times of the labels whose ``probe`` (a warm-up and a few launches) is
    within ``CUT`` times the fastest probe; the others are left out of the result."""
    probes = {label: probe(label) for label in labels}
    fastest = min(probes.values(), default=math.inf)
    return interleaved([label for label in labels if probes[label] <= CUT * fastest], measure, reference, rounds)


def tune(bundle, shapes: list[tuple[int, int, int]], dtype_name: str, iters: int,
         settle_ms: float = SETTLE_MS, record: Callable[[dict[str, dict]], None] | None = None) -> dict[str, dict]:
    """The entries of ``shapes`` on the loaded ``bundle``, ``{shape bucket: {"kernel": label,
    ...its measurements}}``; ``record`` gets them so far after every shape, so a run cut short
    (a tune of 33 large bf16 shapes takes about 5 minutes) keeps what it measured."""
    import torch

    from tilekiln._tensors import describe
    from tilekiln.problem import make_problem
    from tilekiln.select import layout_code, shape_bucket

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
        probes: dict[str, float] = {}

        def probe(kid):
            probes[kid] = warm_ms(runner(kid))
            return probes[kid]

        screen = measure_candidates(labels, probe, lambda kid: graph_ms(replay(kid), per_round, 0),
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
                             # what the screen cut, as its probe over the fastest probe (over CUT): the
                             # model fit (tilekiln/tuning/fit.py) scores a pick of one at least that slow
                             "cut": {kid: round(t / min(probes.values()), 2) for kid, t in sorted(probes.items())
                                     if kid not in screen.candidates},
                             "samples": {kid: [[round(t, TIME_DECIMALS), round(ref, TIME_DECIMALS)] for t, ref in pairs]
                                         for kid, pairs in sorted(timings.samples.items())}}
        print(f"{m:6d}x{n:6d}x{k:6d} {bucket:32s} {best} {flops / times[best] / 1e9:7.1f} TFLOP/s "
              f"{timings.reference_ms / times[best]:.3f}x baseline", flush=True)
        sets = replay = base = None  # free the operands and graphs before the next shape
        if record is not None:
            record(table)
    return table
