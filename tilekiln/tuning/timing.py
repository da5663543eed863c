"""Time GEMMs on a GPU: CUDA events, CUDA graphs, steady-state blocks, interleaved rounds.

The measuring primitives that ``tilekiln/tuning/policy.py`` (what to time and
what wins) and the bench scripts (bench/*.py) share. Standard library at import;
torch is imported inside the functions that time on a GPU, so the runtime
never imports it through this module.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

L2_BYTES = 60 * 2**20

# Untimed launches of the same kernel before each steady-state block: a 150
# ms block's median launch already read steady-state clocks (the comment on
# WINDOW in tilekiln/tuning/policy.py); the count is capped since the host
# enqueues about one launch per 7 us.
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
