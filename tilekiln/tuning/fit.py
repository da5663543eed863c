"""Fit the selection model's constants to one SKU's measurements, so that shapes no table holds
are ranked as that card ranks them.

A tune keeps, per shape bucket, the time of every candidate its screen did not cut
(``screen``, else the finalists' ``candidates``; tilekiln/tuning/policy.py) and, since this
session's tunes, how much slower the ones it cut probed (``cut``). :func:`regret`
scores a :class:`~tilekiln.model.ModelParams` on them: for each measured shape, the measured time
of the model's pick among the measured candidates over the fastest one, as a geometric mean
(what a user pays where the model decides) and the worst. :func:`fit` moves the constants of
:data:`GRID` one at a time over their grids, keeping a value where it lowers the regret, for
:data:`ROUNDS` rounds, and keeps the defaults unless the fit gains at least :data:`MIN_GAIN` on
at least :data:`MIN_SHAPES` shapes: a handful of buckets fits noise, not the card.

Standard library only; ``tilekiln tune`` runs it after measuring (and after ``--merge``) and
stores the result as the table's ``model``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Callable

from tilekiln._tensors import Operand
from tilekiln.model import DEFAULT_MODEL, ModelParams, on_device
from tilekiln.problem import GemmProblem, make_problem
from tilekiln.select import estimate, nominal_clusters, split_cost
from tilekiln.spec import KernelRecord
from tilekiln.splitk import parse_label, sliced

# The constants a fit moves, over grids around the measured defaults (tilekiln/model.py). The
# others are facts of the card (sm_macs_per_us), or need shapes that tunes do not vary (the
# multicast gains: a tune measures each shape's clusters side by side, but the gains' evidence
# is at 8192^3 and in grouped layers).
GRID: dict[str, tuple[float, ...]] = {
    "lone_warpgroup": (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    "step_us": (0.0, 0.1, 0.2, 0.3, 0.4),
    "reuse_knee": (10.0, 20.0, 30.0, 45.0, 60.0),
    "macs_per_element": (75.0, 110.0, 150.0, 200.0, 300.0),
    "launch_us": (1.0, 2.0, 4.0, 8.0),
    "partial_element": (0.5, 2.0, 8.0),
}
ROUNDS = 3
MIN_SHAPES = 12
# Two tunes of the same shapes on the H200 disagreed by 0.55% on average (tilekiln/tuning/policy.py,
# ROUNDS): a smaller gain is within the measurements' own spread.
MIN_GAIN = 0.005


@dataclass(frozen=True)
class Sample:
    """One measured shape: its problem and each measured choice's time (ms), by label."""

    bucket: str
    problem: GemmProblem
    times: dict[str, float]


def problem_of(bucket: str, shape: list[int]) -> GemmProblem:
    """The problem a tuning-table entry measured (``dtype:layout:bucket:batch`` and its shape),
    on contiguous operands as the tune made them."""
    dtypes, layout, _, _ = bucket.split(":")
    (a_dtype, b_dtype), out_dtype = dtypes.split("->")[0].split("/"), dtypes.split("->")[1]
    m, n, k = shape

    def operand(name: str, rows: int, cols: int, row_major: bool, dtype: str) -> Operand:
        return Operand(name, (rows, cols), (cols, 1) if row_major else (1, rows), dtype, 0x10000, 0, None)

    a = operand("a", m, k, layout[0] == "t", a_dtype)
    b = operand("b", k, n, layout[1] == "t", b_dtype)
    return make_problem(a, b, None, out_dtype if a_dtype != out_dtype else None)


def samples(measurements: tuple[tuple[str, dict], ...], kernels: dict[str, KernelRecord]) -> list[Sample]:
    """The shapes of a table's ``measurements`` with two or more measured choices still in the bundle."""
    out = []
    for bucket, entry in measurements:
        times = entry.get("screen") or entry.get("candidates") or {}
        if times:
            # A choice the screen cut ran at least its probe's ratio to the fastest probe slower.
            fastest = min(times.values())
            times = times | {label: ratio * fastest for label, ratio in entry.get("cut", {}).items()}
        times = {label: t for label, t in times.items() if parse_label(label)[0] in kernels}
        if len(times) < 2 or "shape" not in entry:
            continue
        try:
            problem = problem_of(bucket, entry["shape"])
        except (ValueError, KeyError):
            continue  # not a bucket tilekiln.select.shape_bucket writes: nothing to rank it as
        out.append(Sample(bucket, problem, times))
    return out


def model_time(label: str, problem: GemmProblem, kernels: dict[str, KernelRecord], sm_count: int,
               model: ModelParams) -> float:
    """The model's estimate of the choice ``label`` (a kernel id, or its split-K label) as
    tilekiln.select.choose prices it, on ``sm_count`` SMs."""
    kernel_id, split = parse_label(label)
    kernel = kernels[kernel_id]
    run = problem if split == 1 else sliced(problem, split)
    if run is None:
        return math.inf
    cost = estimate(kernel, run, nominal_clusters(kernel, sm_count), model)
    return cost + (split_cost(problem, split, model) if split > 1 else 0.0)


def model_pick(sample: Sample, kernels: dict[str, KernelRecord], sm_count: int, model: ModelParams) -> str:
    """The measured choice of ``sample`` the model ranks first (ties by label, as choose breaks them)."""
    return min(sample.times, key=lambda label: (model_time(label, sample.problem, kernels, sm_count, model), label))


def regret(shapes: list[Sample], kernels: dict[str, KernelRecord], sm_count: int,
           model: ModelParams) -> tuple[float, float]:
    """(geometric mean, worst) over ``shapes`` of the model's pick's measured time over the fastest
    (1.0 and 1.0 where there are none)."""
    if not shapes:
        return 1.0, 1.0
    ratios = []
    for s in shapes:
        ratios.append(s.times[model_pick(s, kernels, sm_count, model)] / min(s.times.values()))
    return math.exp(statistics.fmean(math.log(r) for r in ratios)), max(ratios)


@dataclass(frozen=True)
class Fit:
    """The fitted constants (the defaults where the fit did not pay) and the regret before and after."""

    model: ModelParams
    shapes: int
    before: tuple[float, float]
    after: tuple[float, float]
    base: ModelParams = DEFAULT_MODEL  # where the fit started: the defaults on the tuned card

    @property
    def fitted(self) -> tuple[tuple[str, float], ...]:
        """The constants that differ from the fit's start, as a table's ``model`` stores them; with
        a fitted ``macs_per_element``, the bandwidth it holds at (``dram_gbps``), so that a device
        of another bandwidth moves it (tilekiln.model.on_device)."""
        moved = [name for name in GRID if getattr(self.model, name) != getattr(self.base, name)]
        if "macs_per_element" in moved:
            moved.append("dram_gbps")
        return tuple(sorted((name, float(getattr(self.model, name))) for name in moved))


def fit(shapes: list[Sample], kernels: dict[str, KernelRecord], sm_count: int, dram_gbps: float | None = None,
        log: Callable[[str], None] = lambda line: None) -> Fit:
    """Coordinate descent over :data:`GRID` from the defaults on a card of ``dram_gbps`` peak DRAM
    bandwidth (None: as they stand), scored by :func:`regret`."""
    base = on_device(DEFAULT_MODEL, dram_gbps)
    before = regret(shapes, kernels, sm_count, base)
    if len(shapes) < MIN_SHAPES:
        log(f"model fit: {len(shapes)} measured shapes, fewer than {MIN_SHAPES}: the defaults stand")
        return Fit(base, len(shapes), before, before, base)
    model, score = base, before
    for _ in range(ROUNDS):
        moved = False
        for name, values in GRID.items():
            for value in values:
                trial = replace(model, **{name: value})
                trial_score = regret(shapes, kernels, sm_count, trial)
                if trial_score < score:
                    model, score, moved = trial, trial_score, True
        if not moved:
            break
    if before[0] / score[0] < 1 + MIN_GAIN:
        log(f"model fit: regret {before[0]:.4f} -> {score[0]:.4f} on {len(shapes)} shapes, under "
            f"{MIN_GAIN:.1%}: the defaults stand")
        return Fit(base, len(shapes), before, before, base)
    result = Fit(model, len(shapes), before, score, base)
    log(f"model fit: regret {before[0]:.4f} (worst {before[1]:.3f}) -> {score[0]:.4f} (worst {score[1]:.3f}) "
        f"on {len(shapes)} shapes: {', '.join(f'{n}={v:g}' for n, v in result.fitted)}")
    return result
