"""Fitting the selection model's constants to a SKU's measurements (tilekiln/tuning/fit.py), and
a table's fitted constants deciding the model's picks (tilekiln/model.py, tilekiln/select.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilekiln.manifest import TuningTable
from tilekiln.model import DEFAULT_MODEL, model_of, on_device
from tilekiln.select import choose
from tilekiln.tuning.fit import MIN_SHAPES, fit, model_time, problem_of, regret, samples
from tilekiln.tuning.sku import TablePick
from tests.records import H200, kernel_record

WGMMA = {"HGMMA": 4}
KERNELS = {k.id: k for k in (
    kernel_record(0, "k64x128", (64, 128, 64), (1, 2), sass=WGMMA),
    kernel_record(1, "k128x128", (128, 128, 64), (1, 2), sass=WGMMA),
    kernel_record(2, "k128x256", (128, 256, 64), sass=WGMMA),
    kernel_record(3, "k64x256pp", (64, 256, 64), schedule="pingpong", sass=WGMMA),
)}
# Shapes of rows between tile multiples, where 64-row tiles pad less than 128-row ones.
SHAPES = [(m, n, k) for m in (80, 144, 200, 272, 330, 400) for n, k in ((7168, 16384), (28672, 4096), (4096, 7168))]


def measured(truth, shapes=SHAPES):
    """Tuning-table measurements whose times are ``truth``'s estimates, as a tune records them."""
    out = []
    for m, n, k in shapes:
        bucket = f"bf16/bf16->bf16:tn:{m}x{n}x{k}:1"
        problem = problem_of(bucket, [m, n, k])
        times = {kid: model_time(kid, problem, KERNELS, 132, truth) / 1e9 for kid in KERNELS}
        out.append((bucket, {"shape": [m, n, k], "screen": times, "candidates": times, "flops": 2 * m * n * k}))
    return tuple(out)


@pytest.mark.parametrize("lone", [0.3, 1.0])
def test_the_fit_finds_how_fast_a_cards_single_warpgroups_issue(lone):
    truth = replace(DEFAULT_MODEL, lone_warpgroup=lone)
    shapes = samples(measured(truth), KERNELS)
    assert len(shapes) == len(SHAPES) >= MIN_SHAPES
    result = fit(shapes, KERNELS, 132)
    assert result.before[0] > 1.0  # the defaults mis-rank some shapes of this card
    assert result.after == pytest.approx((1.0, 1.0))  # the fitted constants rank every one right
    assert dict(result.fitted)["lone_warpgroup"] == pytest.approx(lone, abs=0.1)
    assert regret(shapes, KERNELS, 132, model_of(result.fitted)) == result.after


def test_a_card_the_defaults_describe_keeps_them():
    result = fit(samples(measured(DEFAULT_MODEL), KERNELS), KERNELS, 132)
    assert result.fitted == () and result.model == DEFAULT_MODEL and result.after == result.before


def test_too_few_shapes_keep_the_defaults():
    truth = replace(DEFAULT_MODEL, lone_warpgroup=1.0)
    result = fit(samples(measured(truth, SHAPES[:MIN_SHAPES - 1]), KERNELS), KERNELS, 132)
    assert result.fitted == () and result.shapes == MIN_SHAPES - 1


def test_what_the_screen_cut_counts_as_at_least_its_probe_ratio_slower():
    entry = {"shape": [144, 7168, 16384], "screen": {"k128x128": 0.1, "k128x256": 0.12},
             "cut": {"k64x128": 2.5, "gone": 3.0}}
    (sample,) = samples((("bf16/bf16->bf16:tn:144x7168x16384:1", entry),), KERNELS)
    # A cut kernel the bundle no longer has is left out; the others keep their times.
    assert sample.times == {"k128x128": 0.1, "k128x256": 0.12, "k64x128": pytest.approx(0.25)}


def test_a_tables_fitted_constants_decide_the_models_pick():
    problem = problem_of("bf16/bf16->bf16:tn:1x1x1:1", [144, 128256, 8192])
    kernels = (KERNELS["k64x128"], KERNELS["k128x256"])
    by_default = choose(kernels, problem, 132, TablePick(H200, None))
    assert by_default.kernel.id == "k128x256"
    # On a card whose one warpgroup issues at the full rate, the 64-row tile's lesser padding wins.
    table = TuningTable(H200, (), (), (("lone_warpgroup", 1.0),))
    assert choose(kernels, problem, 132, TablePick(H200, table, True)).kernel.id == "k64x128"


def test_a_card_of_less_dram_bandwidth_pays_more_mma_time_per_streamed_element():
    h100 = on_device(DEFAULT_MODEL, 3352)
    assert h100.macs_per_element == pytest.approx(DEFAULT_MODEL.macs_per_element * DEFAULT_MODEL.dram_gbps / 3352)
    assert h100.dram_gbps == 3352 and on_device(h100, DEFAULT_MODEL.dram_gbps) == pytest.approx(DEFAULT_MODEL)
    assert on_device(DEFAULT_MODEL, None) is DEFAULT_MODEL


def test_the_devices_bandwidth_reaches_the_estimate_of_a_weight_streaming_shape():
    decode = problem_of("bf16/bf16->bf16:tn:1x1x1:1", [2, 57344, 8192])
    kernels = (KERNELS["k64x128"],)
    fast, slow = (choose(kernels, decode, 132, TablePick(replace(H200, dram_gbps=gbps), None)) for gbps in (4800, 2400))
    # Streaming the weight is most of a decode step (the rest is the padded tile's MMAs): half the
    # bandwidth, well over 1.4 times the time.
    assert 1.4 < slow.candidates[0].microseconds / fast.candidates[0].microseconds <= 2.0
    assert choose(kernels, decode, 132, TablePick(H200, None)).candidates[0].microseconds == fast.candidates[0].microseconds


def test_a_fit_on_a_card_starts_from_its_bandwidth_and_stores_the_bandwidth_a_fitted_price_holds_at():
    on_h100 = on_device(DEFAULT_MODEL, 3352)
    # The defaults moved to the card's bandwidth describe it: nothing to store.
    assert fit(samples(measured(on_h100), KERNELS), KERNELS, 132, 3352).fitted == ()
    truth = replace(on_h100, lone_warpgroup=1.0)
    result = fit(samples(measured(truth), KERNELS), KERNELS, 132, 3352)
    assert dict(result.fitted) == {"lone_warpgroup": pytest.approx(1.0, abs=0.1)}
    assert result.base == on_h100
    priced = replace(result, model=replace(result.model, macs_per_element=300.0))
    assert dict(priced.fitted)["dram_gbps"] == 3352 and dict(priced.fitted)["macs_per_element"] == 300.0
    # On a card of twice the bandwidth, that table's price halves.
    assert on_device(model_of(priced.fitted), 6704).macs_per_element == pytest.approx(150.0)


def test_a_parameter_the_model_does_not_have_is_refused_naming_it():
    with pytest.raises(ValueError, match="model.bogus: the selection model has no such parameter"):
        model_of((("bogus", 1.0),))
    assert model_of((("full_rate_rows", 64.0),)).full_rate_rows == 64


def test_tune_merge_keeps_the_constants_it_fits_as_the_tables_model(tmp_path):
    import json

    import tilekiln
    from tilekiln import tune
    from tests.records import write_bundle

    truth = replace(DEFAULT_MODEL, lone_warpgroup=1.0)
    run = {bucket: dict(entry, kernel=min(entry["candidates"], key=entry["candidates"].get), tflops=1.0)
           for bucket, entry in measured(truth)}
    (tmp_path / "run.json").write_text(json.dumps({**H200.plain(), "table": {}, "measurements": run}))
    bundle = write_bundle(tmp_path / "bundle", tuple(KERNELS.values()))
    out = tmp_path / "table.json"
    tune.main([str(bundle), "--merge", str(tmp_path / "run.json"), "--table-out", str(out)])
    assert json.loads(out.read_text())["model"] == {"lone_warpgroup": 1.0}
    assert tilekiln.load(bundle).tables[0].model == (("lone_warpgroup", 1.0),)
