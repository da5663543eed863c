"""Runtime logic without a GPU: problem mapping, input errors, selection, explain, imports."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tilekiln.errors import NoKernelError
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.problem import make_problem
from tilekiln.select import (DEFAULT_MODEL, bucket_ceiling, check_kernel, choose, estimate, nominal_clusters,
                             shape_bucket, split_cost)
from tilekiln.spec import Schedule, Tile
from tilekiln.splitk import SPLITS, label, parse_label, sliced
from tests.records import H100_SXM, H200, kernel_record, manifest, op, pick, write_bundle

ROOT = Path(__file__).resolve().parents[2]


def kernel(index, tile, cluster=(1, 1), a="k", b="k", dtype="bf16", div=8, swap_ab=False):
    return kernel_record(index, f"k{index}_{a}{b}_{tile[0]}x{tile[1]}_c{cluster[0]}x{cluster[1]}", tile, cluster,
                         a, b, (dtype, dtype, "f32", dtype), div, swap_ab)


# -- problem mapping ----------------------------------------------------------------------------

def test_row_major_times_transposed_weight_is_tn():
    p = make_problem(op("a", (300, 520)), op("b", (520, 264), (1, 520)), None)
    assert (p.m, p.n, p.k, p.batch) == (300, 264, 520, 1)
    assert (p.a.major, p.a.lead) == ("k", 520) and (p.b.major, p.b.lead) == ("k", 520)
    assert p.out_shape == (300, 264)


def test_transposed_a_and_padded_leading_dims():
    p = make_problem(op("a", (300, 520), (1, 304)), op("b", (520, 264), (272, 1)), None)
    assert (p.a.major, p.a.lead) == ("m", 304) and (p.b.major, p.b.lead) == ("n", 272)


def test_batched_broadcast_b_folds_into_one_gemm():
    p = make_problem(op("a", (4, 200, 136)), op("b", (136, 72)), None)
    assert p.fold_batch and (p.m, p.batch) == (800, 1) and p.out_shape == (4, 200, 72)


def test_broadcast_a_keeps_the_batch_with_a_zero_stride():
    p = make_problem(op("a", (200, 136)), op("b", (4, 136, 72)), None)
    assert not p.fold_batch and p.batch == 4 and p.a.batch == 0 and p.b.batch == 136 * 72


def test_a_single_column_fits_either_majorness():
    """K = 1: a (M, 1) view of an M-major buffer keeps its aligned lead instead of a stride of 1."""
    p = make_problem(op("a", (464, 1), (1, 464)), op("b", (1, 339), (344, 1)), None)
    assert (p.a.major, p.a.lead) == ("m", 464)
    vec = make_problem(op("a", (1, 520)), op("b", (520, 264), (1, 520)), None)
    assert vec.a.lead % 16 == 0


def test_unaligned_n_allocates_a_padded_result():
    p = make_problem(op("a", (64, 64)), op("b", (64, 339)), None)
    assert p.out_shape == (64, 339) and p.c.lead == 344 and p.alloc_shape == (64, 344)
    assert check_kernel(KERNELS[0], make_problem(op("a", (64, 64)), op("b", (64, 339), (1, 64)), None)) is None


def test_zero_k_needs_no_layout():
    p = make_problem(op("a", (16, 0)), op("b", (0, 24)), None)
    assert p.k == 0 and p.out_shape == (16, 24)


@pytest.mark.parametrize("a, b, out, exc, text", [
    (op("a", (4, 4, 4, 4)), op("b", (4, 4)), None, ValueError, "2-D or 3-D"),
    (op("a", (8, 8)), op("b", (8, 8), dtype="f16"), None, TypeError, "same dtype"),
    (op("a", (8, 8), device=-1), op("b", (8, 8)), None, ValueError, "host memory"),
    (op("a", (8, 8)), op("b", (8, 8), device=1), None, ValueError, "same device"),
    (op("a", (8, 16)), op("b", (8, 8)), None, ValueError, "cannot be multiplied"),
    (op("a", (3, 8, 8)), op("b", (2, 8, 8)), None, ValueError, "broadcast"),
    (op("a", (8, 8), (16, 2)), op("b", (8, 8)), None, ValueError, "contiguous"),
    (op("a", (8, 8)), op("b", (8, 8)), op("out", (8, 4)), ValueError, "out: shape"),
    (op("a", (8, 8)), op("b", (8, 8)), op("out", (8, 8), dtype="f16"), TypeError, "out: dtype"),
    (op("a", (8, 8)), op("b", (8, 8)), op("out", (8, 8), (1, 8)), ValueError, "row-major"),
])
def test_input_errors_name_argument_and_requirement(a, b, out, exc, text):
    with pytest.raises(exc, match=text):
        make_problem(a, b, out)


# -- selection ------------------------------------------------------------------------------------

KERNELS = (
    kernel(0, (128, 256, 64)), kernel(1, (128, 256, 64), (2, 1)), kernel(2, (128, 128, 64)),
    kernel(3, (64, 128, 64)), kernel(4, (128, 128, 64), a="m"), kernel(5, (128, 128, 64), dtype="f16"),
)


def tn(m, n, k, batch=None):
    a_shape = (batch, m, k) if batch else (m, k)
    return make_problem(op("a", a_shape), op("b", (k, n), (1, k)), None)


def test_contract_rejections_say_why():
    p = tn(512, 512, 512)
    assert "dtype" in check_kernel(KERNELS[5], p)
    assert "layout" in check_kernel(KERNELS[4], p)
    odd = make_problem(op("a", (512, 100)), op("b", (100, 512), (1, 100)), None)
    assert "alignment" in check_kernel(KERNELS[0], odd) and "multiple of 8" in check_kernel(KERNELS[0], odd)
    assert check_kernel(KERNELS[0], p) is None


def test_large_square_prefers_the_largest_multicast_tile():
    choice = choose(KERNELS, tn(8192, 8192, 8192), sm_count=132, tuning=pick())
    assert choice.kernel.id == KERNELS[1].id and choice.how == "model"


def test_wave_quantisation_prefers_smaller_tiles_for_skinny_problems():
    # 128 x 2048: 8 tiles of 128x256 leave 124 of 132 SMs idle; 64x128 tiles make 32.
    choice = choose(KERNELS, tn(128, 2048, 8192), sm_count=132, tuning=pick())
    assert choice.kernel.config.tile.n < 256
    assert estimate(KERNELS[3], tn(128, 2048, 8192), 132) < estimate(KERNELS[0], tn(128, 2048, 8192), 132)


def test_resident_clusters_change_wave_count():
    p = tn(2048, 2048, 4096)
    assert estimate(KERNELS[2], p, 132) != estimate(KERNELS[2], p, 66)


def test_the_model_counts_the_clusters_the_device_holds():
    # 8192^2 in 128x256 tiles is 1024 2x1 cluster items: 16 waves of the nominal 66 clusters,
    # 26 if the device held only 40.
    p = tn(8192, 8192, 8192)
    assert choose(KERNELS, p, 132, pick()).kernel.id == KERNELS[1].id
    short = choose(KERNELS, p, 132, pick(), resident=lambda k: 40 if k.cluster_size > 1 else 132)
    assert short.kernel.id == KERNELS[0].id
    assert nominal_clusters(KERNELS[1], 132) == 66 and nominal_clusters(KERNELS[1], 1) == 1


def test_a_swapped_kernel_is_priced_on_the_transposed_problem():
    # The tile and cluster are the MMA's: a swapped kernel prices (m, n) as the plain one (n, m).
    swapped = kernel(7, (64, 16, 64), (2, 1), swap_ab=True)
    plain = kernel(8, (64, 16, 64), (2, 1))
    for m, n, k in ((16, 8192, 8192), (8192, 16, 8192), (130, 1000, 64)):
        assert estimate(swapped, tn(m, n, k), 66) == estimate(plain, tn(n, m, k), 66)
    # M = 16: 128 tiles of 64 columns of N, where unswapped 64-row tiles would pad M fourfold.
    choice = choose(KERNELS + (swapped,), tn(16, 8192, 8192), sm_count=132, tuning=pick())
    assert choice.kernel is swapped
    assert choose(KERNELS + (swapped,), tn(4096, 4096, 4096), sm_count=132, tuning=pick()).kernel is not swapped


def test_bucket_ceilings_step_by_half_octaves():
    assert [bucket_ceiling(v) for v in (1, 2, 3, 5, 7, 4096, 4097, 12288, 14336, 24576, 28672)] == \
        [1, 2, 3, 6, 8, 4096, 6144, 12288, 16384, 24576, 32768]
    assert shape_bucket(tn(256, 24576, 8192), "tn") != shape_bucket(tn(256, 28672, 8192), "tn")
    assert shape_bucket(tn(250, 24000, 8000), "tn") == shape_bucket(tn(256, 24576, 8192), "tn")


# -- split-K --------------------------------------------------------------------------------------

def partial_kernel(index, tile):
    return kernel_record(index, f"p{index}_{tile[0]}x{tile[1]}", tile, dtypes=("bf16", "bf16", "f32", "f32"))


def test_k_slices_are_batch_views_of_the_operands():
    p = sliced(tn(16, 8192, 8192), 4)
    assert (p.m, p.n, p.k, p.batch, p.out_dtype) == (16, 8192, 2048, 4, "f32")
    assert (p.a.lead, p.a.batch) == (8192, 2048) and (p.b.lead, p.b.batch) == (8192, 2048)
    assert (p.c.lead, p.c.batch) == (8192, 16 * 8192) and p.out_shape == (4, 16, 8192)
    # an M-major A steps through K by rows; a ragged N gets 16-byte workspace rows
    m_major = sliced(make_problem(op("a", (100, 4096), (1, 104)), op("b", (4096, 30), (1, 4096)), None), 2)
    assert (m_major.a.major, m_major.a.batch) == ("m", 2048 * 104) and m_major.c.lead == 32


def test_problems_that_cannot_be_split():
    assert sliced(tn(16, 8192, 8190), 4) is None  # K not divisible
    assert sliced(tn(16, 8192, 4096), 16) is None  # slices shallower than MIN_SLICE_K
    assert sliced(tn(16, 8192, 8192, batch=2), 2) is None  # already batched
    assert sliced(tn(8192, 8192, 8192), 2) is None  # the workspace would exceed its bound


def test_labels_name_the_split():
    assert label("k1", 1) == "k1" and parse_label(label("k1", 4)) == ("k1", 4)
    assert parse_label("gemm_x_tn_64x128x64_c1x1") == ("gemm_x_tn_64x128x64_c1x1", 1)


def test_model_splits_a_deep_problem_with_too_few_tiles():
    kernels = (*KERNELS, partial_kernel(6, (64, 128, 64)))
    p = tn(16, 8192, 8192)  # 64 tiles of 64x128 on 132 SMs
    assert choose(kernels, p, 132, pick()).split == 1  # without split candidates, no split
    choice = choose(kernels, p, 132, pick(), splits=(1, 2, 4))
    assert choice.kernel.id == "p6_64x128" and choice.split == 2 and choice.run.batch == 2
    assert choice.label == "p6_64x128/splitk2" and "accept p6_64x128/splitk4" in str(choice)
    # a large problem is not split, and the tuning table can name a split choice
    assert choose(kernels, tn(4096, 4096, 4096), 132, pick(), splits=(1, 2)).split == 1
    bucket = shape_bucket(p, "tn")
    assert choose(kernels, p, 132, pick({bucket: "p6_64x128/splitk4"}), splits=(1, 2, 4)).label == "p6_64x128/splitk4"


def test_a_split_k_pin_needs_torch_tensors(tmp_path):
    kernels = (*KERNELS, partial_kernel(6, (64, 128, 64)))
    bundle = Bundle(tmp_path, manifest(kernels), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    a, b = op("a", (16, 8192)), op("b", (8192, 8192), (1, 8192))
    out = op("out", (16, 8192))
    with pytest.raises(TypeError, match="split-K runs sum their partials through torch; pass torch tensors"):
        bundle.plan(a, b, out, kernel="p6_64x128/splitk2")
    assert bundle.choose(make_problem(a, b, out), "p6_64x128/splitk2", allow_split=True).split == 2


def test_tuning_table_overrides_the_model_when_the_kernel_fits():
    p = tn(8192, 8192, 8192)
    bucket = shape_bucket(p, "tn")
    assert choose(KERNELS, p, 132, pick({bucket: KERNELS[3].id})).kernel.id == KERNELS[3].id
    # a tuned kernel whose contract does not fit is ignored
    assert choose(KERNELS, p, 132, pick({bucket: KERNELS[4].id})).kernel.id == KERNELS[1].id


def test_explain_says_what_the_backward_gemms_run_on(tmp_path):
    """dA = dC·Bᵀ and dB = Aᵀ·dC for a contiguous dC: a kernel where one takes the layout,
    torch.matmul (and why) where none does."""
    kernels = (*KERNELS, kernel(6, (128, 128, 64), b="n"), kernel(7, (128, 128, 64), a="m", b="n"))
    bundle = Bundle(tmp_path, manifest(kernels), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    a, w = op("a", (256, 512)), op("w", (512, 384), (1, 512))
    lines = bundle._explain_backward(a, w, make_problem(a, w, None))
    assert [line.split(":")[0] for line in lines] == ["backward dA = dC·Bᵀ", "backward dB = Aᵀ·dC"]
    assert lines[0].endswith(f"{kernels[6].id} (model)") and lines[1].endswith(f"{kernels[7].id} (model)"), lines
    # N = 100 bf16: dC's 200-byte rows cannot be read by TMA
    a, w = op("a", (256, 512)), op("w", (512, 100))
    da, db = bundle._explain_backward(a, w, make_problem(a, w, None))
    assert "torch.matmul" in da and "torch.matmul" in db, (da, db)


def test_explain_lists_choice_and_rejections():
    text = str(choose(KERNELS, tn(1024, 1024, 1024), 132, pick()))
    assert text.startswith("chosen: ")
    assert text.count("reject") == 2 and "layout" in text and "dtype" in text


def test_extents_past_a_kernels_index_range_are_rejected_by_its_contract():
    """The plan block's extents are int32 (tilekiln/spec.py, MAX_EXTENT): a kernel refuses more."""
    p = make_problem(op("a", (2**31, 8)), op("b", (8, 8), (1, 8)), None)
    assert check_kernel(KERNELS[0], p) == "extent: M = 2147483648 exceeds the kernel's index range (2147483647)"
    assert choose(KERNELS, p, 132, pick()).kernel is None


def test_no_kernel_lists_every_rejection(tmp_path):
    choice = choose(KERNELS[4:5], tn(64, 64, 64), 132, pick())
    assert choice.kernel is None and "layout" in str(choice)
    assert issubclass(NoKernelError, ValueError)


def test_an_out_whose_rows_no_kernel_stores_says_how_to_pad_them(tmp_path):
    bundle = Bundle(tmp_path, manifest(KERNELS[:1]),
                    device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    a, b = op("a", (64, 256)), op("b", (256, 100), (1, 256))
    with pytest.raises(NoKernelError, match=r"(?s)alignment: out leading stride 100 .*hint: .*\[:, :N\]"):
        bundle.plan(a, b, op("out", (64, 100)))
    with pytest.raises(NoKernelError) as other:
        bundle.plan(op("a", (64, 256), dtype="f16"), op("b", (256, 100), (1, 256), dtype="f16"), None)
    assert "hint" not in str(other.value), "the hint is for an out the kernels cannot store"


# -- zero JIT ------------------------------------------------------------------------------------

def test_runtime_imports_without_build_dependencies():
    """-S drops site-packages: cutlass, jinja2, pydantic and yaml cannot be imported at all. The
    tuning modules and the tune command import torch only inside the functions that time."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import tilekiln, tilekiln.bundle, "
            "tilekiln.select, tilekiln.problem, tilekiln.manifest, tilekiln.discovery, tilekiln.tuning.table, "
            "tilekiln.tuning.sku, "
            "tilekiln.tuning.timing, tilekiln.tuning.policy, tilekiln.tuning.merge, tilekiln.tune; "
            "banned = [m for m in ('builder', 'cutlass', 'jinja2', 'pydantic', 'yaml', 'torch') if m in sys.modules]; "
            "print(banned)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_explain_of_an_unscaled_call_imports_no_torch():
    """explain's scale-format handling lives in modules that import torch; a call that names no scale
    format must not load them (the runtime takes non-torch operands without torch installed)."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import tilekiln\n"
            "try:\n    tilekiln.explain(object(), object(), activation='relu', bias='bf16')\n"
            "except ImportError as e:\n    print('ImportError', e)\n"
            "except Exception:\n    print('ok')\n")
    # -S drops site-packages, so an import of torch fails; any other error (no bundle, no device) is fine.
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_tuning_runs_combine_by_relative_time_and_merge_without_a_gpu(tmp_path):
    """A kernel that won one run by a hair but lost the other by a lot does not win the merged table."""
    import json as _json

    import tilekiln
    from tilekiln import tune
    from tilekiln.manifest import MANIFEST_NAME
    from tilekiln.tuning.merge import combine
    from tilekiln.tuning.table import TIME_DECIMALS, TUNING_NAME

    def entry(**times):
        return {"kernel": min(times, key=times.get), "flops": 2e12, "shape": [1, 1, 1], "tflops": 0.0,
                "candidates": times}

    def bundle_of(name, ids):
        return write_bundle(tmp_path / name, tuple(kernel_record(i, kid, (128, 128, 64)) for i, kid in enumerate(ids)))

    run1 = {"b1": entry(x=1.00, y=1.01, z=2.0), "only1": entry(x=1.0)}
    run2 = {"b1": entry(x=1.20, y=1.02, w=0.5)}  # w: measured in one run only, not comparable
    table = combine([run1, run2])
    assert table["b1"]["kernel"] == "y" and set(table["b1"]["candidates"]) == {"x", "y"}
    assert table["b1"]["runs"] == 2 and table["b1"]["candidates"]["x"] == round((1.0 * 1.2) ** 0.5, TIME_DECIMALS)
    assert table["only1"]["kernel"] == "x" and table["only1"]["runs"] == 1
    # The baseline's time is carried when every run measured it (runs older than
    # the baseline pairing did not).
    assert "baseline_ms" not in table["b1"]
    paired = combine([{"b1": dict(run1["b1"], baseline_ms=2.0)}, {"b1": dict(run2["b1"], baseline_ms=8.0)}])
    assert paired["b1"]["baseline_ms"] == 4.0

    bundle = bundle_of("bundle", "xyzw")
    built = (bundle / MANIFEST_NAME).read_bytes()
    files = []
    for i, run in enumerate((run1, run2)):
        files.append(tmp_path / f"run{i}.json")
        files[-1].write_text(_json.dumps({**H200.plain(), "table": {}, "measurements": run}))
    out = tmp_path / "table.json"
    tune.main([str(bundle), "--merge", *map(str, files), "--table-out", str(out)])
    assert _json.loads(out.read_text())["table"] == {"b1": "y", "only1": "x"}
    # The table goes to the bundle's tuning file, which this process's Bundle now
    # selects by; the manifest stays as the build wrote it.
    assert [t["table"] for t in _json.loads((bundle / TUNING_NAME).read_text())["tables"]] == [{"b1": "y", "only1": "x"}]
    assert [(t.sku, dict(t.table)) for t in tilekiln.load(bundle).tables] == [(H200, {"b1": "y", "only1": "x"})]
    assert (bundle / MANIFEST_NAME).read_bytes() == built
    # y dropped from the bundle (rebuilt, here into another directory) since the
    # runs: it cannot be picked, and only1's bucket, whose one kernel x is still built, stays.
    tune.main([str(bundle_of("rebuilt", "xzw")), "--merge", *map(str, files), "--table-out", str(out)])
    assert _json.loads(out.read_text())["table"] == {"b1": "x", "only1": "x"}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / MANIFEST_NAME).write_text("{}")
    with pytest.raises(SystemExit, match="is not a bundle manifest"):
        tune.main([str(tmp_path / "broken"), "--merge", *map(str, files)])
    # A third file that copies run A's b3 (as --table-out does with what the bundle
    # held) and carries a merged entry: counted, the copy would turn b3 to x and the
    # merged entry would add b2.
    runs3 = {"A": {"b3": entry(x=1.0, y=1.05)}, "B": {"b3": entry(x=1.1, y=1.0)},
             "C": {"b3": entry(x=1.0, y=1.05), "b2": dict(entry(x=1.0), runs=2)}}
    for name, run in runs3.items():
        (tmp_path / f"{name}.json").write_text(_json.dumps({**H200.plain(), "measurements": run}))
    assert combine(list(runs3.values()))["b3"]["kernel"] == "x"
    tune.main([str(bundle), "--merge", *(str(tmp_path / f"{name}.json") for name in runs3), "--table-out", str(out)])
    table = _json.loads(out.read_text())["table"]
    assert table["b3"] == "y" and "b2" not in table
    assert table["b1"] == "y"  # the tuning file keeps what the earlier merge wrote there

    files[1].write_text(_json.dumps({**H100_SXM.plain(), "measurements": run2}))
    with pytest.raises(SystemExit, match=r"different devices \(NVIDIA H100 80GB HBM3: sm_90, 132 SMs, 81089 MiB, "
                                         r"NVIDIA H200: sm_90, 132 SMs, 143156 MiB\)"):
        tune.main([str(bundle), "--merge", *map(str, files)])
    files[1].write_text("{}")
    with pytest.raises(SystemExit, match=r"run1\.json: not a tuning file"):
        tune.main([str(bundle), "--merge", *map(str, files)])
    files[1].write_text(_json.dumps({**H200.plain(), "measurements": {"b1": {"candidates": {}}}}))
    with pytest.raises(SystemExit, match=r"run1\.json: not a tuning file .*b1"):
        tune.main([str(bundle), "--merge", *map(str, files)])


def test_tuning_skips_candidates_whose_probe_is_far_slower_than_the_fastest():
    from tilekiln.tuning import policy

    cut = policy.CUT
    # b: within CUT x a, probed before c but over CUT x c; c: the fastest; d: within
    # CUT x c; e: just over it.
    true_ms = {"a": 10.0, "b": 10.0 * 1.9, "c": 8.0, "d": 8.0 * cut * 0.9, "e": 8.0 * cut * 1.05}
    probed, measured = [], []

    def probe(label):
        probed.append(label)
        return true_ms[label]

    def measure(label):
        measured.append(label)
        return true_ms[label]

    timings = policy.measure_candidates(list(true_ms), probe, measure, lambda: 4.0, rounds=3)
    assert probed == ["a", "b", "c", "d", "e"]
    assert timings.candidates == {label: true_ms[label] for label in "acd"} and timings.reference_ms == 4.0
    # Round-robin, each round starting one candidate later.
    assert measured == list("acd" "cda" "dac")


def test_tuning_is_not_fooled_by_a_card_that_slows_as_it_heats():
    from tilekiln.tuning import policy

    # b is 1% faster, but every launch runs 1% slower than the one before: timed
    # one after the other, a (first) would read faster.
    true_ms, calls = {"a": 10.0, "b": 9.9}, []

    def measure(label):
        calls.append(label)
        return true_ms[label] * (1 + 0.01 * (len(calls) - 1))

    timings = policy.measure_candidates(["a", "b"], true_ms.get, measure, lambda: 5.0, rounds=4)
    assert min(timings.candidates, key=timings.candidates.get) == "b"
    assert calls.count("a") == calls.count("b") == 4


def test_tuning_scores_each_candidate_against_the_baseline_timed_right_after_it():
    from tilekiln.tuning import policy

    # The card's speed jumps between 1x and 1.4x from one measurement to the
    # next, in a pattern that lands every sample of a on a slow phase (the
    # rounds time a, b, b, a, a, b, b, a): a's raw median is the slower one
    # though a is 2% faster. The baseline, timed right after each
    # sample in the same phase, cancels the jump.
    true_ms, baseline_ms = {"a": 9.8, "b": 10.0}, 4.0
    phase = iter([1.4, 1.0, 1.0, 1.4] * 2)
    current = []

    def measure(label):
        current.append(next(phase))
        return true_ms[label] * current[-1]

    def reference():
        return baseline_ms * current[-1]

    raw = policy.measure_candidates(["a", "b"], true_ms.get, measure, lambda: 1.0, rounds=4).candidates
    assert min(raw, key=raw.get) == "b"
    phase = iter([1.4, 1.0, 1.0, 1.4] * 2)
    timings = policy.measure_candidates(["a", "b"], true_ms.get, measure, reference, rounds=4)
    assert min(timings.candidates, key=timings.candidates.get) == "a"
    assert timings.candidates["a"] / timings.candidates["b"] == pytest.approx(0.98)


def test_one_slow_baseline_block_does_not_pick_the_steady_winner():
    from tilekiln.tuning import policy, timing

    # b is 5% faster; the baseline runs at half speed once, in the block right
    # after a's first steady sample (the fp8 baseline's slow blocks,
    # policy.SUSTAINED_ROUNDS). With two rounds a's median ratio is the mean of a
    # halved and a true one, and a wins.
    true_ms, baseline_ms = {"a": 10.0, "b": 9.5}, 5.0

    def run(rounds):
        calls = []

        def measure(label):
            calls.append(label)
            return true_ms[label]

        def reference():
            return baseline_ms * (2.0 if calls == ["a"] else 1.0)

        return timing.interleaved(["a", "b"], measure, reference, rounds)

    two = run(2).candidates
    assert min(two, key=two.get) == "a"
    steady = run(policy.SUSTAINED_ROUNDS)
    assert min(steady.candidates, key=steady.candidates.get) == "b"
    assert steady.candidates == {"a": 10.0, "b": 9.5} and steady.reference_ms == baseline_ms
    assert steady.samples["a"][0] == (10.0, 10.0) and len(steady.samples["b"]) == policy.SUSTAINED_ROUNDS


def test_finalists_are_the_screens_fastest_within_the_window():
    from tilekiln.tuning import policy

    times = {"a": 10.0, "b": 10.0 * policy.WINDOW, "c": 10.0 * policy.WINDOW * 1.01, "d": 10.5, "e": 10.2}
    assert policy.finalists(times) == ["a", "e", "d", "b"]
    assert policy.finalists(times, most=2) == ["a", "e"]
    assert policy.finalists({"x": 1.0, "w": 1.0}) == ["w", "x"]  # ties in label order


def test_finalists_bring_every_walk_of_their_group():
    from tilekiln.tuning import policy

    # "a-sw4" is outside the window and "d" is past the two fastest groups, but
    # "a-sw4" walks the tiles of "a" in another order, which only steady state ranks
    times = {"a": 10.0, "a-sw4": 10.0 * policy.WINDOW * 1.1, "b": 10.1, "d": 10.2}
    group = lambda label: label.split("-")[0]  # noqa: E731
    assert policy.finalists(times, group, most=2) == ["a", "b", "a-sw4"]
    assert policy.finalists(times, most=2) == ["a", "b"]


def test_tuning_blocks_are_the_benchs_blocks():
    from tilekiln.tuning import timing

    assert timing.block_launches(2 * 16384 * 28672 * 8192) == 10  # 11 ms a launch: at least 10
    assert timing.block_launches(2 * 2048 * 8192 * 8192) == 72  # about 2e13 flops a block
    assert timing.block_launches(2 * 16 * 4096 * 4096) == 200  # at most 200


def test_steady_state_blocks_run_after_their_own_settling_launches(monkeypatch):
    from tilekiln.tuning import timing

    assert timing.settle_launches(2.0, 100.0) == 50
    assert timing.settle_launches(0.001, 100.0) == timing.SETTLE_MAX_LAUNCHES
    assert timing.settle_launches(2.0, 0.0) == 0
    calls = []
    monkeypatch.setattr(timing, "median_event_ms", lambda fn, iters: calls.append(("timed", iters)) or 1.5)
    assert timing.steady_ms(lambda i: calls.append(("settle", i)), 10, 3) == 1.5
    assert calls == [("settle", 0), ("settle", 1), ("settle", 2), ("timed", 10)]
    calls.clear()
    assert timing.warm_ms(lambda i: calls.append(("settle", i))) == 1.5
    assert calls == [("settle", 0), ("settle", 1), ("settle", 2), ("timed", 3)]


def test_graph_blocks_replay_about_as_many_launches_as_eager_blocks(monkeypatch):
    from tilekiln.tuning import timing

    launches = timing.GRAPH_LAUNCHES
    for iters in (launches + 1, 2 * launches, 72, 200):  # enough replays for iters, not a whole one more
        timed, untimed = timing.graph_replays(iters, 0)
        assert (timed - 1) * launches < iters <= timed * launches and untimed == 0
    assert timing.graph_replays(launches * 20, launches * 5 + 1) == (20, 6)  # settling rounds up
    assert timing.graph_replays(1, 0) == (2, 0)  # median_event_ms drops its first replay
    calls = []
    monkeypatch.setattr(timing, "steady_ms", lambda fn, iters, settle: calls.append((iters, settle)) or 4.0)
    assert timing.graph_ms(lambda i: None, launches * 20, launches * 5) == 4.0 / launches  # ms per launch
    assert calls == [(20, 5)]


def test_walk_groups_join_kernels_that_differ_only_in_their_raster_walk():
    from tilekiln.tuning import policy
    from tilekiln.spec import Raster

    base = kernel(0, (128, 256, 64), (2, 1))
    walks = [replace(base, index=i + 1, id=f"{base.id}_r{raster}_sw{sw}",
                     config=replace(base.config, raster=Raster(raster), swizzle=sw))
             for i, (raster, sw) in enumerate([("m", 4), ("m", 8), ("m", 16), ("n", 8)])]
    other_cluster = kernel(9, (128, 256, 64), (1, 1))
    other_stages = replace(base, index=10, id=base.id + "_s5", stages=5)
    kernels = {k.id: k for k in [base, *walks, other_cluster, other_stages]}
    assert len({policy.walk_key(kernels, k.id) for k in [base, *walks]}) == 1
    assert policy.walk_key(kernels, base.id) != policy.walk_key(kernels, other_cluster.id)
    assert policy.walk_key(kernels, base.id) != policy.walk_key(kernels, other_stages.id)
    assert policy.walk_key(kernels, label(base.id, 2)) != policy.walk_key(kernels, base.id)
    assert policy.walk_key(kernels, label(walks[0].id, 2)) == policy.walk_key(kernels, label(base.id, 2))


def test_a_failed_graph_capture_names_the_side(monkeypatch):
    import contextlib
    import types

    from tilekiln.tuning import timing

    def graph(_):
        @contextlib.contextmanager
        def capturing():
            yield
        return capturing()

    cuda = types.SimpleNamespace(CUDAGraph=lambda: types.SimpleNamespace(replay=lambda: None), graph=graph)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    calls = []
    replay = timing.graphed(calls.append, "1024x1024x1024 baseline")
    assert calls == list(range(timing.GRAPH_LAUNCHES)) and replay(0) is None

    def fails(i):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore torch detail")

    with pytest.raises(timing.CaptureError) as err:
        timing.graphed(fails, "16x8192x8192 gemm_sm90_x")
    assert str(err.value) == ("16x8192x8192 gemm_sm90_x: its launches could not be captured in a CUDA graph "
                              "(CUDA error: operation not permitted when stream is capturing)")


@pytest.mark.parametrize("torch_module, says", [
    (None, "bench/gemm.py times kernels on a CUDA GPU through torch, which is not installed here"),
    ("no-gpu", "bench/gemm.py times kernels on a CUDA GPU, and torch sees none here"),
])
def test_timing_tools_without_torch_or_a_gpu_exit_with_what_is_missing(monkeypatch, torch_module, says):
    import types

    from tilekiln.tuning import timing

    if torch_module == "no-gpu":
        torch_module = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", torch_module)
    with pytest.raises(SystemExit) as err:
        timing.require_cuda_torch("bench/gemm.py")
    assert str(err.value).startswith(says)


def test_timing_tools_get_torch_when_a_gpu_is_there(monkeypatch):
    import types

    from tilekiln.tuning import timing

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert timing.require_cuda_torch("tilekiln tune") is fake


def test_a_verification_run_replaces_only_its_own_card_models_evidence():
    from tilekiln.verify import merge_record, sku

    assert sku("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3" and sku("NVIDIA H200") == "H200"
    entry = {"cubin_sha256": "0" * 64, "max_rel_error": 0.001, "runs": 2}
    h100 = {"sku": "H100 80GB HBM3", "date": "2026-12-01", "kernels": {"k1": entry, "k2": entry}, "failed": []}
    h200 = {"sku": "H200", "date": "2026-12-02", "kernels": {"k1": entry}, "failed": []}
    merged = merge_record(merge_record(None, "sm90a", h200), "sm90a", h100)
    assert [r["sku"] for r in merged["records"]] == ["H100 80GB HBM3", "H200"]
    # A later H100 run of k1 only: the earlier H100 record keeps k2, the H200 record all it had.
    again = merge_record(merged, "sm90a", {**h100, "date": "2026-12-06", "kernels": {"k1": entry}})
    assert [(r["sku"], r["date"], sorted(r["kernels"])) for r in again["records"]] == [
        ("H100 80GB HBM3", "2026-12-01", ["k2"]), ("H100 80GB HBM3", "2026-12-06", ["k1"]),
        ("H200", "2026-12-02", ["k1"])]
    # A run covering both (one failing) leaves the earlier H100 record nothing: it goes.
    last = merge_record(again, "sm90a", {**h100, "date": "2026-12-07", "kernels": {"k1": entry}, "failed": ["k2"]})
    assert [(r["sku"], r["date"]) for r in last["records"]] == [("H100 80GB HBM3", "2026-12-07"), ("H200", "2026-12-02")]


@pytest.mark.parametrize("clock_khz, bus_bits, status, gbps", [
    (2619000, 5120, 0, 3352),  # an H100 SXM (HBM3)
    (0, 5120, 0, None),  # a driver that reports no memory clock
    (2619000, 5120, 1, None),  # an attribute the driver refuses
])
def test_the_dram_bandwidth_is_two_transfers_per_memory_clock_across_the_bus(monkeypatch, clock_khz, bus_bits,
                                                                              status, gbps):
    import types

    from tilekiln import _driver

    values = {_driver.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: clock_khz,
              _driver.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: bus_bits}

    def get_attribute(ref, attr, dev):
        ref._obj.value = values[attr]
        return status

    fake = types.SimpleNamespace(cuDeviceGet=lambda ref, ordinal: 0, cuDeviceGetAttribute=get_attribute)
    monkeypatch.setattr(_driver, "_lib", lambda: fake)
    assert _driver.dram_gbps(0) == gbps


def test_unverified_leaves_out_only_cubins_that_passed_on_the_same_card_model():
    from tilekiln.verify import verified_cubins

    old, new = "0" * 64, "1" * 64
    records = {"records": [
        {"sku": "H100 80GB HBM3", "kernels": {"k1": {"cubin_sha256": old}, "k2": {"cubin_sha256": old}}, "failed": ["k3"]},
        {"sku": "H200", "kernels": {"k4": {"cubin_sha256": old}}, "failed": []}]}
    done = verified_cubins(records, "H100 80GB HBM3")
    assert done == {("k1", old), ("k2", old)}
    # A rebuilt k1 with another cubin, the failed k3 and the H200's k4 still run on an H100.
    assert ("k1", new) not in done and not any(kid in ("k3", "k4") for kid, _ in done)
    assert verified_cubins(None, "H200") == frozenset()


def test_unverified_needs_the_file_it_reads(capsys):
    from tilekiln.verify import main

    with pytest.raises(SystemExit) as exc:
        main(["sm90a", "--unverified"])
    assert exc.value.code == 2 and "--unverified reads the records of --out" in capsys.readouterr().err


def test_explain_says_whether_the_chosen_kernel_ran_on_hardware():
    k = KERNELS[0]
    verified = kernel_record(k.index, k.id, (128, 256, 64), verified_on=("H100 80GB HBM3", "H200"))
    text = str(choose((verified,), tn(1024, 1024, 1024), 132, pick()))
    assert text.splitlines()[0] == (f"chosen: {verified.id} (model: no table for this device's SKU; hardware-verified "
                                    "on H100 80GB HBM3, H200)")
    assert "(model: no table for this device's SKU; compile-verified)" in str(
        choose(KERNELS[:1], tn(1024, 1024, 1024), 132, pick()))


def test_a_requested_activation_runs_only_on_a_kernel_that_computes_it():
    """A call asking for silu takes a silu kernel; one asking for nothing never takes it; where no
    kernel computes what is asked, the plain kernel runs and the rest is left to torch, never dropped."""
    from tilekiln.select import choose_fused

    silu = kernel_record(7, "k7_silu", (128, 256, 64), activation="silu")
    kernels = (*KERNELS, silu)
    asked = replace(tn(1024, 1024, 1024), requested=(("activation", "silu"),))
    assert check_kernel(KERNELS[0], asked) == "activation: kernel computes none, the call asks for silu"
    assert check_kernel(silu, tn(1024, 1024, 1024)) == "activation: kernel computes silu, the call asks for none"
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 132, pick()), asked)
    assert choice.kernel is silu and unfused == ()
    gelu = replace(asked, requested=(("activation", "geluerf"),))
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 132, pick()), gelu)
    assert choice.kernel is not None and choice.kernel.config.activation.value == "none"
    assert unfused == (("activation", "geluerf"),)


def test_a_requested_bias_runs_on_a_kernel_of_its_type_and_the_epilogue_fuses_its_leading_part():
    """A bias is asked for by type; the epilogue adds it before the activation, so a kernel that adds
    the bias alone leaves torch a correct intermediate to finish, but one with the activation alone
    cannot run a bias call (the bias would come after the activation)."""
    from tilekiln.problem import requested_epilogue
    from tilekiln.select import choose_fused

    bias = kernel_record(7, "k7_biasbf16", (128, 256, 64), bias="bf16")
    bias_silu = kernel_record(8, "k8_biasbf16_silu", (128, 256, 64), bias="bf16", activation="silu")
    relu = kernel_record(9, "k9_relu", (128, 256, 64), activation="relu")
    kernels = (*KERNELS, bias, bias_silu, relu)
    assert requested_epilogue(bias="bf16", activation="none") == (("bias", "bf16"),)
    assert requested_epilogue(activation="relu", bias="f32") == (("bias", "f32"), ("activation", "relu"))
    assert requested_epilogue(bias="none", activation="none") == ()

    def fused(**asked):
        problem = replace(tn(1024, 1024, 1024), requested=requested_epilogue(**asked))
        choice, unfused = choose_fused(lambda p: choose(kernels, p, 132, pick()), problem)
        return choice.kernel.id, unfused

    assert check_kernel(bias, tn(1024, 1024, 1024)) == "bias: kernel computes bf16, the call asks for none"
    assert fused(bias="bf16") == ("k7_biasbf16", ())
    assert fused(bias="bf16", activation="silu") == ("k8_biasbf16_silu", ())
    assert fused(bias="bf16", activation="geluerf") == ("k7_biasbf16", (("activation", "geluerf"),))
    # No f32 bias kernel: the plain GEMM runs and torch adds the bias, then applies relu; the relu
    # kernel is no use, as its activation would come before the bias.
    plain, unfused = fused(bias="f32", activation="relu")
    assert plain.startswith("k") and "bias" not in plain and "relu" not in plain
    assert unfused == (("bias", "f32"), ("activation", "relu"))
    assert fused(activation="relu") == ("k9_relu", ())


def test_a_requested_epilogue_never_runs_split_k():
    """The epilogue belongs to the sum of the K slices, not to each fp32 partial."""
    deep = tn(64, 4096, 8192)
    assert sliced(deep, 2) is not None
    assert sliced(replace(deep, requested=(("bias", "bf16"),)), 2) is None
    assert sliced(replace(deep, requested=(("activation", "silu"),)), 2) is None


def swiglu_problem(m, n, k, out=None):
    from tilekiln.problem import requested_epilogue

    return make_problem(op("a", (m, k)), op("b", (k, n), (1, k)), out, None, requested_epilogue(activation="swiglu"))


def test_a_swiglu_problem_writes_half_the_columns_and_checks_out_against_them():
    p = swiglu_problem(100, 2 * 200, 64)
    assert (p.n, p.out_n, p.out_shape) == (400, 200, (100, 200))
    assert p.c.lead == 200 and p.alloc_shape == (100, 200)
    # 2 x 100 columns of bf16: rows padded to 16 bytes
    assert swiglu_problem(8, 2 * 100, 64).c.lead == 104
    with pytest.raises(ValueError, match="b: 401 columns, an odd count"):
        swiglu_problem(8, 401, 64)
    with pytest.raises(ValueError, match=r"out: shape \[8, 400\] does not match the result shape \[8, 200\]"):
        swiglu_problem(8, 400, 64, op("out", (8, 400)))
    assert swiglu_problem(8, 400, 64, op("out", (8, 200))).c.lead == 200


def test_swiglu_runs_only_on_a_swiglu_kernel_for_whole_gate_up_block_pairs():
    """A swiglu kernel pairs 64-row gate and up blocks: I not a multiple of 64, or no swiglu
    kernel, and the plain GEMM runs over all N columns (ungated) with torch pairing them after."""
    from tilekiln.select import choose_fused

    swiglu = kernel_record(7, "k7_swiglu", (128, 256, 64), activation="swiglu")
    silu = kernel_record(8, "k8_silu", (128, 256, 64), activation="silu")
    kernels = (*KERNELS, swiglu, silu)
    fits = swiglu_problem(1024, 2 * 14336, 4096)
    assert check_kernel(swiglu, tn(1024, 2 * 14336, 4096)) == \
        "activation: kernel computes swiglu, the call asks for none"
    assert check_kernel(silu, fits) == "activation: kernel computes silu, the call asks for swiglu"
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 132, pick()), fits)
    assert choice.kernel is swiglu and unfused == () and choice.run.out_shape == (1024, 14336)
    ragged = swiglu_problem(1024, 2 * 100, 4096)
    assert check_kernel(swiglu, ragged) == ("swiglu: I = N/2 = 100 is not a multiple of the kernel's 64-row gate and "
                                            "up blocks (its tiles pair whole blocks)")
    # I = 100 with a swiglu kernel in the bundle, and I = 14336 without one
    for problem, available, columns in ((ragged, kernels, 200), (fits, (*KERNELS, silu), 2 * 14336)):
        choice, unfused = choose_fused(lambda p: choose(available, p, 132, pick()), problem)
        assert choice.kernel.config.activation.value == "none" and unfused == (("activation", "swiglu"),)
        # the plain GEMM's problem: all N columns into a result tilekiln allocates
        assert choice.run.out_shape == (1024, columns) and choice.run.c.lead >= columns



def test_the_model_prices_the_operand_panels_a_wave_reloads():
    plain = kernel(9, (128, 256, 64), (2, 1))
    banded = replace(plain, config=replace(plain.config, swizzle=8))
    # 128 x 32 cluster tiles: walked down M without a band, a wave of 66 clusters touches 66 A
    # panels for 1 B panel, and every wave reloads them; a band of 8 columns touches 9 A panels.
    big = tn(16384, 8192, 8192)
    assert estimate(banded, big, 66) < 0.95 * estimate(plain, big, 66)
    # A grid of one wave reads each operand once whatever the walk.
    small = tn(1024, 4096, 4096)
    assert estimate(banded, small, 66) == pytest.approx(estimate(plain, small, 66), rel=0.02)
    # A decode-sized M is priced by the weight it streams: rows past M are never read.
    assert estimate(plain, tn(16, 8192, 8192), 66) < estimate(plain, tn(128, 8192, 8192), 66)


# -- the model's warpgroup, K-step and split-K terms ----------------------------------------------

WGMMA = {"HGMMA": 4}


def test_a_warpgroup_alone_issues_slower_than_two():
    """A 64-row cooperative tile has one MMA warpgroup; the model prices it at the lone-warpgroup
    rate, so at M = 144 against a wide N (three 64-row tiles or two 128-row ones) the 128-row
    tile wins, as measured (64x128 c1x2 read 0.42 of cuBLAS at 144x128256x8192 on the H100)."""
    narrow = kernel_record(20, "narrow", (64, 128, 64), (1, 2), sass=WGMMA)
    wide = kernel_record(21, "wide", (128, 256, 64), sass=WGMMA)
    lm_head = tn(144, 128256, 8192)
    assert choose((narrow, wide), lm_head, 132, pick()).kernel is wide
    # Without the warpgroup term (a census with no warpgroup MMA) the narrow tile ranked first.
    plain = (replace(narrow, resources=replace(narrow.resources, sass={})),
             replace(wide, resources=replace(wide.resources, sass={})))
    assert choose(plain, lm_head, 132, pick()).kernel.id == "narrow"
    model = DEFAULT_MODEL
    assert estimate(narrow, lm_head, 66) == pytest.approx(estimate(plain[0], lm_head, 66) / model.lone_warpgroup,
                                                          rel=0.35)


def test_ping_pong_warpgroups_take_turns_at_the_mma():
    """Ping-pong's two warpgroups alternate mainloops (one's epilogue overlaps the other's MMAs),
    so a 64-row ping-pong tile issues at the lone rate like a 64-row cooperative one (64x192 read
    0.52 to 0.67 of cuBLAS at M = 144 on the H100), and a 128-row one at the full rate."""
    pingpong = kernel_record(22, "pp", (64, 192, 64), schedule="pingpong", sass=WGMMA)
    cooperative = replace(pingpong, id="coop", config=replace(pingpong.config, schedule=Schedule.COOPERATIVE))
    for p in (tn(144, 7168, 16384), tn(144, 57344, 8192)):
        assert estimate(pingpong, p, 132) == pytest.approx(estimate(cooperative, p, 132))
        unit = replace(pingpong, resources=replace(pingpong.resources, sass={}))
        assert estimate(pingpong, p, 132) > 1.2 * estimate(unit, p, 132)
    wide = replace(pingpong, config=replace(pingpong.config, tile=Tile(128, 192, 64)))
    assert estimate(wide, tn(4096, 4096, 4096), 132) == pytest.approx(
        estimate(replace(wide, resources=replace(wide.resources, sass={})), tn(4096, 4096, 4096), 132))


def test_a_k_step_costs_at_least_the_pipeline_round_trip():
    """DeepSeek-V3's kv_a_proj (N 576, K 7168) took 24 us on 64x16 swapped tiles at every M from
    1 to 205: 112 K steps at the model's step floor, not the few MMAs each step runs."""
    swapped = kernel_record(23, "swap", (64, 16, 64), (2, 1), swap_ab=True, sass=WGMMA)
    model = DEFAULT_MODEL
    floor = 7168 // 64 * model.step_us * model.sm_macs_per_us
    for m in (1, 23, 144):
        assert floor <= estimate(swapped, tn(m, 576, 7168), 66) < 1.1 * floor


def test_split_k_adds_the_sum_to_the_slices_estimate():
    partial = kernel_record(24, "part", (64, 16, 64), swap_ab=True, dtypes=("bf16", "bf16", "f32", "f32"),
                            sass=WGMMA)
    unsplit = kernel_record(25, "swap", (64, 16, 64), (2, 1), swap_ab=True, sass=WGMMA)
    kv_a = tn(23, 576, 7168)
    choice = choose((partial, unsplit), kv_a, 132, pick(), (1, *SPLITS))
    assert choice.kernel is partial and choice.split > 1
    chosen = next(c for c in choice.candidates if c.accepted and c.label == choice.label)
    assert chosen.estimate == pytest.approx(estimate(partial, sliced(kv_a, choice.split), 132)
                                            + split_cost(kv_a, choice.split))
    # The sum's cost grows with the slices: more slices than K steps pay for nothing.
    assert split_cost(kv_a, 14) > split_cost(kv_a, 2) > 0


def test_explain_gives_each_candidates_estimate_in_microseconds():
    """The model's units are an SM's multiply-add times; explain shows them as microseconds on the
    device (ModelParams.sm_macs_per_us, twice the rate for 8-bit operands)."""
    swapped = kernel_record(26, "swap", (64, 16, 64), (2, 1), swap_ab=True, sass=WGMMA)
    choice = choose((swapped,), tn(23, 576, 7168), 132, pick())
    (candidate,) = choice.candidates
    assert candidate.microseconds == pytest.approx(candidate.estimate / DEFAULT_MODEL.sm_macs_per_us)
    # 112 K steps at the 0.2 us floor: the 24 us the H100 took
    assert f"accept swap: estimate {candidate.microseconds:.3g} us; contract fits" in str(choice)
    assert 22 < candidate.microseconds < 25


def test_verify_reads_a_masked_result_and_refuses_rows_past_the_counts():
    torch = pytest.importorskip("torch")
    from tilekiln.verify import _masked_rows

    out = torch.full((2, 3, 4), float("nan"))
    out[0, :2], out[1, :1] = 1.0, 2.0
    got = _masked_rows(torch, out, [2, 1])
    assert got.shape == (3, 4) and got[:2].eq(1.0).all() and got[2].eq(2.0).all()
    out[1, 2, 0] = 0.0  # a row past group 1's count was written
    assert _masked_rows(torch, out, [2, 1]).isnan().all()
