"""The selection model's constants (tilekiln/select.py, ``estimate``), and a table's fitted ones.

Every constant is a measured quantity, fitted to tunes' measurements: :data:`DEFAULT_MODEL` holds
the values and the evidence; a per-SKU tuning table (tilekiln/tuning/sku.py) may carry its own,
fitted on that SKU by ``tilekiln tune`` (tilekiln/tuning/fit.py), which :func:`model_of` lays
over the defaults. Standard library only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelParams:
    """The selection model's constants, each fitted to measurements (the evidence is in the comments
    of :data:`DEFAULT_MODEL`); a per-SKU tuning table may carry its own.

    Units: the model's time unit is one multiply-add of an SM's tensor cores at the operands'
    dense rate (an 8-bit MMA runs two per 16-bit one), so work, traffic and fixed costs add up.
    """

    # Reuse term: tile intensity m*n/(m+n) over itself plus this many elements.
    reuse_knee: float
    # Speed-up per doubling of a dense cluster (TMA multicast halves one operand's L2 traffic).
    multicast_gain: float
    # The same for a grouped kernel's cluster along M, whose CTAs share one group's B tile.
    grouped_multicast_gain: float
    # Price of one operand element an SM streams from DRAM, in MMA multiply-adds, on a card of
    # ``dram_gbps`` peak DRAM bandwidth (GB/s); :func:`on_device` moves it to another card's.
    macs_per_element: float
    dram_gbps: float
    # Rows of warpgroup MMAs (sm90) in flight at once that reach an SM's full MMA rate, and the
    # share of it that fewer rows (a 64-row tile, cooperative or ping-pong) reach.
    full_rate_rows: int
    lone_warpgroup: float
    # A 16-bit MMA's multiply-adds per microsecond on one SM, to put fixed costs in model units.
    sm_macs_per_us: float
    # The least time (us) one K step of a tile takes: the pipeline's round trip.
    step_us: float
    # What a split-K plan adds: the sum's launch (us) and each fp32 partial element it reads and
    # adds (in model units).
    launch_us: float
    partial_element: float


DEFAULT_MODEL = ModelParams(
    # With 20, 128x256 tiles rank above 128x128 above 64x128, as the H200 measurements of the
    # default catalog did (651, 598, 398 TFLOP/s at 8192^3; bench/results).
    reuse_knee=20.0,
    # Each doubling of the cluster size measured 5-13% faster at 8192^3 on the H200.
    multicast_gain=1.06,
    # Each group's B is read only by that group's tiles, so the L2 holds less of it for a
    # neighbour than a dense B. With the expected padding of GroupedProblem.row_tiles, 1.2 ranks
    # the H100's grouped kernels as measured at 4096 tokens (bench/results/h100-2026-12-07-grouped-
    # variants.json: the fastest of 128x128/128x256 c1x1/c2x1 on all eight layer and routing rows,
    # where 1.06 picked c2x1 for Qwen3-30B-A3B's 256-row groups at 0.89 and 0.95 of the fastest).
    grouped_multicast_gain=1.2,
    # About 150 flop/byte (the H200's achieved bf16 rate over its DRAM bandwidth) is 150 MACs per
    # 2-byte element, and an 8-bit MMA runs twice the MACs on half the bytes, so the price per
    # element holds for fp8. Ranking the candidates of the H200 tuning measurements
    # (bench/model_regret.py), the term took the model's pick from 1.031 to 1.021 of the fastest
    # (geomean; worst 1.19 to 1.08) in bf16 and from 1.044 to 1.022 (worst 1.20 to 1.12) in fp8.
    macs_per_element=150.0,
    # The H200's (HBM3e, 4.8 TB/s), whose tuning measurements fitted macs_per_element. Moved to
    # the H100's 3352 GB/s (on_device: 215 per element), the estimates of the H100 sweep's shapes
    # follow the measured times more closely and each kind of tile alike: held-out half, sd(log
    # measured/estimated) 0.211 -> 0.177, medians per kind 0.92-1.55 -> 0.84-1.19 (swapped-tile
    # decode shapes, priced by the weight they stream, 1.55 -> 1.19; split-K 1.16 -> 1.01); tuning
    # half 0.214 -> 0.186 (bench/model_calibration.py --dram-gbps 3352, h100-2026-12-07-sweep-bf16-*).
    dram_gbps=4800.0,
    full_rate_rows=128,
    lone_warpgroup=0.7,
    # H100 and H200 SXM: 989 dense bf16 TFLOP/s over 132 SMs.
    sm_macs_per_us=3.75e6,
    step_us=0.2,
    launch_us=2.0,
    partial_element=2.0,
)


PARAMETERS = tuple(f.name for f in dataclasses.fields(ModelParams))


def on_device(model: ModelParams, dram_gbps: float | None) -> ModelParams:
    """``model`` on a device of ``dram_gbps`` peak DRAM bandwidth: an element streamed from DRAM
    costs as much more MMA time as the bandwidth is lower than the one ``macs_per_element`` was
    fitted at (the MMA rate of the Hopper SKUs is the same: 989 dense bf16 TFLOP/s). Unchanged
    where the device's bandwidth is unknown (None)."""
    if not dram_gbps or dram_gbps == model.dram_gbps:
        return model
    return replace(model, macs_per_element=model.macs_per_element * model.dram_gbps / dram_gbps,
                   dram_gbps=float(dram_gbps))


def model_of(named: tuple[tuple[str, float], ...]) -> ModelParams:
    """:data:`DEFAULT_MODEL` with a table's fitted values (``TuningTable.model``) in place of its own.
    ValueError naming the parameter for a name the model does not have."""
    unknown = [name for name, _ in named if name not in PARAMETERS]
    if unknown:
        raise ValueError(f"model.{unknown[0]}: the selection model has no such parameter (it has "
                         f"{', '.join(PARAMETERS)})")
    types = {f.name: f.type for f in dataclasses.fields(ModelParams)}
    return replace(DEFAULT_MODEL, **{name: int(value) if types[name] == "int" else value for name, value in named})
