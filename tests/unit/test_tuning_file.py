"""The tuning file beside a bundle's manifest (tilekiln/tuning/table.py): written, verified, merged
over the build-time table of its device, followed by an open Bundle only when told to, and reported by
`tilekiln inspect` as load sees it (no GPU; synthetic bundles whose library is never opened)."""

from __future__ import annotations

import json
import os

import pytest

from tests.records import H100_SXM, H200, kernel_record, write_bundle
from tilekiln import discovery
from tilekiln._tensors import Operand
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.errors import BundleIntegrityError, TuningFileWarning
from tilekiln.manifest import MANIFEST_NAME, Sku, TuningTable, read_manifest
from tilekiln.problem import make_problem
from tilekiln.select import layout_code, shape_bucket
from tilekiln.tuning.table import TUNING_NAME, add_measured, overlay, read_tuning_file, tuning_digest, write_tuning_file

KERNELS = (kernel_record(0, "k_wide", (128, 256, 64)), kernel_record(1, "k_square", (128, 128, 64)))


def tn(m: int, n: int, k: int):
    """A bf16 ``a @ w.t()`` problem on cuda:0."""
    return make_problem(Operand("a", (m, k), (k, 1), "bf16", 0x10000, 0, None),
                        Operand("b", (k, n), (1, k), "bf16", 0x10000, 0, None), None)


def bucket(m: int, n: int, k: int) -> str:
    problem = tn(m, n, k)
    return shape_bucket(problem, layout_code(problem))


def simulated(ordinal: int) -> DeviceInfo:
    return DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156)


def measured(table: dict[str, str], device: Sku = H200) -> TuningTable:
    return TuningTable(device, tuple(sorted(table.items())),
                       tuple(sorted((b, {"candidates": {label: 1.0}}) for b, label in table.items())))


def test_a_tuning_file_round_trips_and_names_the_manifest_it_was_measured_against(tmp_path):
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    built = (directory / MANIFEST_NAME).read_bytes()
    manifest = read_manifest(directory)
    table = measured({bucket(4096, 4096, 4096): "k_wide"})
    h100 = TuningTable(H100_SXM, table.table, table.measurements, (("macs_per_element", 120.5),))
    path = write_tuning_file(directory, (table, h100), manifest.sha256)

    assert path == directory / TUNING_NAME
    data = json.loads(path.read_text())
    assert data["schema_version"] == "2.0"
    assert [(t["device"], t["sm_count"], t["memory_mib"]) for t in data["tables"]] == [
        ("NVIDIA H100 80GB HBM3", 132, 81089), ("NVIDIA H200", 132, 143156)]
    assert data["tables"][0]["model"] == {"macs_per_element": 120.5} and "model" not in data["tables"][1]
    assert data["manifest_sha256"] == json.loads(built)["integrity"]["manifest_sha256"] == manifest.sha256
    assert data["integrity"] == {"tuning_sha256": tuning_digest(data)}
    assert read_tuning_file(directory, manifest) == (h100, table)
    # written after the build: not one of the manifest's hashed files, and the manifest is as built
    assert TUNING_NAME not in dict(manifest.files) and (directory / MANIFEST_NAME).read_bytes() == built


@pytest.mark.parametrize("damage, problem", [
    ("edited", "content does not match its recorded sha256"),
    ("truncated", "not valid JSON"),
    ("malformed", "malformed"),
])
def test_a_damaged_tuning_file_is_refused_naming_it(tmp_path, damage, problem):
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    path = write_tuning_file(directory, (measured({bucket(4096, 4096, 4096): "k_wide"}),),
                             read_manifest(directory).sha256)
    data = json.loads(path.read_text())
    if damage == "edited":  # a hand edit that keeps the JSON valid
        data["tables"][0]["table"] = {b: "k_square" for b in data["tables"][0]["table"]}
        path.write_text(json.dumps(data))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    else:  # digest intact, content not a table
        data["tables"][0]["table"] = ["k_square"]
        data["integrity"] = {"tuning_sha256": tuning_digest(data)}
        path.write_text(json.dumps(data))
    with pytest.raises(BundleIntegrityError, match=problem) as info:
        Bundle.open(directory)
    assert (info.value.bundle, info.value.file) == ("sm90a", TUNING_NAME)
    assert "delete it" in str(info.value)


@pytest.mark.parametrize("belongs_to", ["another manifest", "another schema"])
def test_another_builds_or_formats_tuning_file_is_ignored_with_a_warning(tmp_path, belongs_to):
    """A stale file (pip leaves one behind when it upgrades a bundle wheel that was tuned in place)
    costs the tuning, not the bundle: it loads with its build-time table."""
    build_time = {bucket(4096, 4096, 4096): "k_square"}
    directory = write_bundle(tmp_path / "sm90a", KERNELS, build_time)
    manifest = read_manifest(directory)
    table = measured({bucket(4096, 4096, 4096): "k_wide"})
    if belongs_to == "another manifest":
        path = write_tuning_file(directory, (table,), "f" * 64)
        says = "measured against another manifest.json"
    else:  # the single-table file of schema 1.0, which an older runtime's tune wrote
        path = write_tuning_file(directory, (table,), manifest.sha256)
        data = {"schema_version": "1.0", "manifest_sha256": manifest.sha256, "device": "NVIDIA H200",
                "table": dict(table.table), "measurements": dict(table.measurements)}
        data["integrity"] = {"tuning_sha256": tuning_digest(data)}
        path.write_text(json.dumps(data))
        says = "has tuning file schema '1.0'"
    with pytest.warns(TuningFileWarning, match=says) as warned:
        bundle = Bundle.open(directory, device_query=simulated)
    assert str(path) in str(warned[0].message)
    assert bundle.tuning_file == () and [dict(t.table) for t in bundle.tables] == [build_time]
    assert bundle.choose(tn(4096, 4096, 4096)).kernel.id == "k_square"


def test_the_tuning_files_buckets_win_over_the_build_time_table(tmp_path):
    both, build_only, file_only = bucket(4096, 4096, 4096), bucket(256, 4096, 4096), bucket(8192, 8192, 8192)
    directory = write_bundle(tmp_path / "sm90a", KERNELS, {both: "k_square", build_only: "k_square"})
    write_tuning_file(directory, (measured({both: "k_wide", file_only: "k_wide"}),), read_manifest(directory).sha256)

    bundle = Bundle.open(directory, device_query=simulated)
    assert [dict(t.table) for t in bundle.tables] == [{both: "k_wide", build_only: "k_square", file_only: "k_wide"}]
    assert [dict(t.table) for t in bundle.manifest.tuning_tables] == [{both: "k_square", build_only: "k_square"}]
    for shape, kid in (((4096, 4096, 4096), "k_wide"), ((256, 4096, 4096), "k_square")):
        choice = bundle.choose(tn(*shape))
        assert (choice.how, choice.kernel.id) == ("tuned", kid)
    # measurements travel with their bucket's choice; the file's SKU facts (as the driver read
    # them when it was tuned) name the merged table
    base = TuningTable(Sku("NVIDIA H200", (9, 0), None, None), ((both, "k_square"), (build_only, "k_square")),
                       ((both, {"candidates": {"k_square": 2.0}}), (build_only, {"candidates": {"k_square": 3.0}})))
    merged = overlay(base, measured({both: "k_wide"}))
    assert merged.sku == H200
    assert dict(merged.measurements) == {both: {"candidates": {"k_wide": 1.0}},
                                         build_only: {"candidates": {"k_square": 3.0}}}
    assert overlay(base, None) is base and overlay(None, merged) is merged
    # tune's entries, as policy.tune returns them, over an earlier file's table
    entries = {file_only: {"kernel": "k_square", "flops": 2 * 8192**3, "candidates": {"k_square": 9.0}}}
    again = add_measured(measured({both: "k_wide"}), entries, H200)
    assert dict(again.table) == {both: "k_wide", file_only: "k_square"}
    assert dict(again.measurements)[file_only] == {"flops": 2 * 8192**3, "candidates": {"k_square": 9.0}}


def test_an_open_bundle_reads_no_file_on_load_and_follows_a_new_table_when_told(tmp_path, monkeypatch):
    """A later load lists the directory (tilekiln/discovery.py) but opens no file of it; a new
    tuning file is no change to the bundle it checks."""
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    first = discovery.open_bundle(directory)
    assert first.tables == ()

    files_opened = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):
        if not flags & os.O_DIRECTORY:
            files_opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(Bundle, "open", classmethod(lambda cls, *a, **k: pytest.fail("opened again")))
    for _ in range(3):
        assert discovery.open_bundle(directory) is first
    assert files_opened == []  # the manifest above all

    # A table written meanwhile is not looked for on a call, only on reload_tuning,
    # which also drops the plans chosen under the old table.
    table = measured({bucket(4096, 4096, 4096): "k_wide"})
    write_tuning_file(directory, (table,), first.manifest.sha256)
    first._plans["chosen before"] = object()
    first._picks[0] = object()
    assert discovery.open_bundle(directory).tables == ()
    first.reload_tuning()
    assert first.tables == (table,) and first.tuning_file == (table,) and not first._plans and not first._picks
    assert discovery.open_bundle(directory) is first



def test_inspect_reports_the_table_a_tuned_directory_selects_by_and_a_damaged_file_as_load_does(tmp_path):
    from builder.cli.inspection import inspect_json
    from builder.package.artifact import open_artifact

    built, tuned = bucket(256, 4096, 4096), bucket(4096, 4096, 4096)
    directory = write_bundle(tmp_path / "sm90a", KERNELS, {built: "k_square"})
    path = write_tuning_file(directory, (measured({tuned: "k_wide"}), measured({tuned: "k_square"}, H100_SXM)),
                             read_manifest(directory).sha256)
    report = inspect_json(open_artifact(directory))
    assert report["integrity"] == {"ok": True, "problem": None}
    assert [(t["device"], t["table"]) for t in report["tuning_tables"]] == [
        ("NVIDIA H100 80GB HBM3", {tuned: "k_square"}), ("NVIDIA H200", {built: "k_square", tuned: "k_wide"})]
    assert [t["table"] for t in report["tuning_file"]] == [{tuned: "k_square"}, {tuned: "k_wide"}]
    path.write_text(path.read_text().replace("k_wide", "k_square"))
    problem = inspect_json(open_artifact(directory))["integrity"]["problem"]
    assert problem.startswith(f"bundle sm90a: {TUNING_NAME}: content does not match its recorded sha256")
