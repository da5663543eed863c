"""Per-SKU tuning tables (tilekiln/tuning/sku.py): each device selects by the table of its own SKU,
else the nearest SKU's, else none, and explain says which; a tune of one SKU leaves the others'
tables alone; the manifest carries every table and still reads a 2.6 manifest's single table (no
GPU; synthetic bundles whose library is never opened)."""

from __future__ import annotations

import json

import pytest

from tests.records import H100_PCIE, H100_SXM, H200, kernel_record, manifest, write_bundle
from tilekiln import tune
from tilekiln._tensors import Operand
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.errors import BundleIntegrityError
from tilekiln.manifest import MANIFEST_NAME, Sku, TuningTable, manifest_digest, parse_manifest, read_manifest
from tilekiln.problem import make_problem
from tilekiln.select import layout_code, shape_bucket
from tilekiln.tuning.sku import pick_table
from tilekiln.tuning.table import write_tuning_file

KERNELS = (kernel_record(0, "k_wide", (128, 256, 64)), kernel_record(1, "k_square", (128, 128, 64)))


def tn(m: int, n: int, k: int, device: int = 0):
    """A bf16 ``a @ w.t()`` problem on cuda:``device``."""
    return make_problem(Operand("a", (m, k), (k, 1), "bf16", 0x10000, device, None),
                        Operand("b", (k, n), (1, k), "bf16", 0x10000, device, None), None)


SHAPE = (4096, 4096, 4096)
BUCKET = shape_bucket(tn(*SHAPE), layout_code(tn(*SHAPE)))


def table(sku: Sku, kernel: str, model: tuple[tuple[str, float], ...] = ()) -> TuningTable:
    return TuningTable(sku, ((BUCKET, kernel),), ((BUCKET, {"candidates": {kernel: 1.0}}),), model)


def devices(*skus: Sku):
    """A device query for cuda:0, cuda:1, ... of these SKUs."""
    def query(ordinal: int) -> DeviceInfo:
        s = skus[ordinal]
        return DeviceInfo(ordinal, s.compute_capability, s.sm_count, s.name, s.memory_mib)
    return query


def bundle_of(tmp_path, tables: tuple[TuningTable, ...], *skus: Sku) -> Bundle:
    m = manifest(KERNELS)
    return Bundle(tmp_path, type(m)(**{**m.__dict__, "tuning_tables": tables}), device_query=devices(*skus))


def test_a_device_selects_by_the_table_of_its_own_sku(tmp_path):
    bundle = bundle_of(tmp_path, (table(H100_SXM, "k_wide"), table(H200, "k_square")), H200)
    choice = bundle.choose(tn(*SHAPE))
    assert (choice.how, choice.kernel.id) == ("tuned", "k_square")
    assert str(choice).splitlines()[0] == "chosen: k_square (tuned: table of NVIDIA H200; compile-verified)"


def test_a_device_without_a_table_of_its_own_selects_by_the_nearest_skus():
    """Same compute capability first, then the nearest SM count, then the nearest memory size."""
    h200, sxm = table(H200, "k_square"), table(H100_SXM, "k_wide")
    blackwell = table(Sku("NVIDIA B200", (10, 0), 114, 81008), "k_wide")  # the PCIe card's size, another arch
    pick = pick_table((h200, sxm, blackwell), H100_PCIE)
    # H200 and H100 SXM both have 132 SMs; the SXM's 80 GB is nearer the PCIe card's
    assert pick.table is sxm and not pick.exact
    assert pick.source() == ("table of NVIDIA H100 80GB HBM3, nearest SKU to NVIDIA H100 PCIe: same sm_90, "
                             "132 vs 114 SMs, 81089 vs 81008 MiB")
    assert pick_table((h200, blackwell), H100_PCIE).table is h200
    assert pick_table((blackwell,), H100_PCIE).source().startswith(
        "table of NVIDIA B200, nearest SKU to NVIDIA H100 PCIe: sm_100 vs sm_90, 114 vs 114 SMs")
    # the order the tables come in decides nothing
    assert pick_table((sxm, h200, blackwell), H100_PCIE).table is sxm
    # a device the driver cannot name (only a stand-in for the CUDA runtime answers without one)
    unnamed = pick_table((h200, blackwell), Sku(None, (9, 0), 132, None))
    assert unnamed.table is h200 and not unnamed.exact
    assert unnamed.source() == ("table of NVIDIA H200, nearest SKU to an unnamed device: same sm_90, 132 vs 132 SMs, "
                                "143156 vs ? MiB")


def test_explain_names_the_nearest_skus_table_and_the_model_when_there_is_none(tmp_path):
    near = bundle_of(tmp_path, (table(H200, "k_square"),), H100_PCIE)
    choice = near.choose(tn(*SHAPE))
    assert (choice.how, choice.kernel.id) == ("tuned", "k_square")
    assert str(choice).splitlines()[0] == (
        "chosen: k_square (tuned: table of NVIDIA H200, nearest SKU to NVIDIA H100 PCIe: same sm_90, "
        "132 vs 114 SMs, 143156 vs 81008 MiB; compile-verified)")
    untuned = near.choose(tn(256, 256, 256))
    assert untuned.how == "model" and untuned.decided.startswith(
        f"no choice for {shape_bucket(tn(256, 256, 256), 'tn')} in the table of NVIDIA H200, nearest SKU")
    bare = bundle_of(tmp_path, (), H200).choose(tn(*SHAPE))
    assert bare.how == "model" and f"({bare.how}: no table for this device's SKU;" in str(bare)


def test_two_devices_in_one_process_select_by_their_own_tables(tmp_path):
    bundle = bundle_of(tmp_path, (table(H200, "k_square"), table(H100_SXM, "k_wide", (("macs_per_element", 90.0),))),
                       H200, H100_SXM)
    on_h200, on_h100 = bundle.choose(tn(*SHAPE, device=0)), bundle.choose(tn(*SHAPE, device=1))
    assert (on_h200.kernel.id, on_h100.kernel.id) == ("k_square", "k_wide")
    assert "table of NVIDIA H200;" in str(on_h200) and "table of NVIDIA H100 80GB HBM3;" in str(on_h100)
    # the chosen SKU's fitted model parameters come with its table
    assert bundle.table_for(0).model == () and bundle.table_for(1).model == (("macs_per_element", 90.0),)


def test_a_tune_of_one_sku_leaves_the_other_skus_table_alone(tmp_path):
    """``tune --merge`` of H100 runs writes the H100's table of the tuning file: the H200 keeps its
    build-time choice, and ``--table-out`` writes the H100's table only."""
    directory = write_bundle(tmp_path / "sm90a", KERNELS, {BUCKET: "k_square"})  # an H200's build-time table
    entry = {"kernel": "k_wide", "flops": 2 * 4096**3, "shape": list(SHAPE), "tflops": 1.0,
             "candidates": {"k_wide": 1.0, "k_square": 2.0}}
    run, other_host = tmp_path / "h100-run.json", tmp_path / "h100-run-2.json"
    run.write_text(json.dumps({**H100_SXM.plain(), "table": {}, "measurements": {BUCKET: entry}}))
    # the same card model on another host, whose driver reserves a little more of its memory
    again = dict(entry, candidates={"k_wide": 1.1, "k_square": 2.0})
    other_host.write_text(json.dumps({**H100_SXM.plain(), "memory_mib": 81082, "table": {},
                                      "measurements": {BUCKET: again}}))
    out = tmp_path / "h100.json"
    tune.main([str(directory), "--merge", str(run), str(other_host), "--table-out", str(out)])

    written = json.loads(out.read_text())
    assert (written["device"], written["memory_mib"], written["table"]) == (
        "NVIDIA H100 80GB HBM3", 81089, {BUCKET: "k_wide"})
    assert written["measurements"][BUCKET]["runs"] == 2
    bundle = Bundle.open(directory, device_query=devices(H200, H100_SXM))
    assert [t.device for t in bundle.tuning_file] == ["NVIDIA H100 80GB HBM3"]
    assert [(t.device, dict(t.table)) for t in bundle.tables] == [
        ("NVIDIA H100 80GB HBM3", {BUCKET: "k_wide"}), ("NVIDIA H200", {BUCKET: "k_square"})]
    assert bundle.choose(tn(*SHAPE, device=0)).kernel.id == "k_square"
    assert bundle.choose(tn(*SHAPE, device=1)).kernel.id == "k_wide"


def test_the_tuning_files_table_of_a_device_overlays_only_that_devices_build_time_table(tmp_path):
    directory = write_bundle(tmp_path / "sm90a", KERNELS, {BUCKET: "k_square"})
    other = shape_bucket(tn(8192, 8192, 8192), "tn")
    h100 = TuningTable(H100_SXM, ((other, "k_square"),))
    write_tuning_file(directory, (h100,), read_manifest(directory).sha256)
    bundle = Bundle.open(directory, device_query=devices(H200, H100_SXM))
    # the H100's table holds its own bucket only, not the H200's build-time one
    assert dict(bundle.table_for(1).table.table) == {other: "k_square"}
    assert bundle.choose(tn(*SHAPE, device=1)).how == "model"
    assert dict(bundle.table_for(0).table.table) == {BUCKET: "k_square"}


def test_the_manifest_carries_every_skus_table_and_its_model_through_a_round_trip(tmp_path):
    tables = (table(H100_SXM, "k_wide", (("macs_per_element", 90.0), ("reuse_knee", 20.0))), table(H200, "k_square"))
    m = manifest(KERNELS)
    m = type(m)(**{**m.__dict__, "tuning_tables": tables})
    data = m.plain()
    assert [t["device"] for t in data["tuning_tables"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert data["tuning_tables"][0]["model"] == {"macs_per_element": 90.0, "reuse_knee": 20.0}
    assert "tuning" not in data
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    again = parse_manifest(json.dumps(data).encode(), "sm90a")
    assert again.tuning_tables == tables


def test_a_manifest_of_schema_2_6_with_its_single_table_still_reads_and_selects(tmp_path):
    """Up to 2.6 the manifest held one ``tuning`` table stating only its device name: it reads as
    that device's table with the bundle's compute capability, and unknown SM count and memory."""
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    data = json.loads((directory / MANIFEST_NAME).read_text())
    data.pop("integrity")
    data.update(schema_version="2.6", tuning={"device": "NVIDIA H200", "table": {BUCKET: "k_square"},
                                              "measurements": {}})
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    (directory / MANIFEST_NAME).write_text(json.dumps(data))
    old = read_manifest(directory)
    assert old.tuning_tables == (TuningTable(Sku("NVIDIA H200", (9, 0), None, None), ((BUCKET, "k_square"),)),)
    bundle = Bundle.open(directory, device_query=devices(H200, H100_PCIE))
    assert str(bundle.choose(tn(*SHAPE))).startswith("chosen: k_square (tuned: table of NVIDIA H200;")
    assert bundle.choose(tn(*SHAPE, device=1)).decided == (
        "table of NVIDIA H200, nearest SKU to NVIDIA H100 PCIe: same sm_90, ? vs 114 SMs, ? vs 81008 MiB")


@pytest.mark.parametrize("tables, problem", [
    ([{**H200.plain(), "table": {}}, {**H200.plain(), "table": {}}], "two tables of one device"),
    ([{**H200.plain(), "sm_count": True, "table": {}}], "sm_count"),
    ([{**H200.plain(), "table": {}, "model": {"macs_per_element": "x"}}], "model.macs_per_element"),
])
def test_a_malformed_tuning_tables_key_is_refused_naming_the_manifest(tmp_path, tables, problem):
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    data = json.loads((directory / MANIFEST_NAME).read_text())
    data.pop("integrity")
    data["tuning_tables"] = tables
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    with pytest.raises(BundleIntegrityError, match=f"{MANIFEST_NAME}: malformed .*{problem}"):
        parse_manifest(json.dumps(data).encode(), "sm90a")
