"""Which bundle runs on which device, and which manifests the runtime refuses (no GPU, no DSL).

Bundles here are synthetic: a manifest with no kernels and an empty library
file, enough for the runtime's reader and arch check, which read only the
manifest. Devices are simulated through ``Bundle``'s injectable device query.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import tilekiln
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.compat import arch_runs_on, device_needs
from tilekiln.errors import BundleCompatibilityError, BundleIntegrityError
from tilekiln.manifest import ABI_VERSION, SUPPORTED_SCHEMA_MAJOR, DriverFloor, manifest_digest
from tests.records import manifest


def write_bundle(base: Path, arch: str, kind: str, cc: tuple[int, int], **overrides) -> Path:
    name = arch.replace("_", "")
    directory = base / name
    (directory / "lib").mkdir(parents=True)
    (directory / "lib" / "lib.so").write_bytes(b"")
    data = manifest().plain()
    data["bundle"].update(name=name, arch=arch, arch_kind=kind, compute_capability=list(cc))
    data.update(schema_version=f"{SUPPORTED_SCHEMA_MAJOR}.0", library="lib/lib.so",
                files={"lib/lib.so": hashlib.sha256(b"").hexdigest()})
    data.update(overrides)
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    (directory / "manifest.json").write_text(json.dumps(data))
    return directory


def simulated(cc: tuple[int, int], calls: list[int] | None = None):
    def query(ordinal: int) -> DeviceInfo:
        if calls is not None:
            calls.append(ordinal)
        return DeviceInfo(ordinal, cc, 132, "simulated GPU", 81920)

    return query


@pytest.mark.parametrize("kind,target,device,runs", [
    ("a", (9, 0), (9, 0), True),
    ("a", (10, 0), (10, 3), False),   # arch-specific code is not forward compatible, even within a major
    ("a", (10, 3), (10, 0), False),
    ("f", (10, 0), (10, 0), True),
    ("f", (10, 0), (10, 3), True),    # family code runs on later minors of its major
    ("f", (10, 3), (10, 0), False),
    ("f", (10, 0), (11, 0), False),
    ("f", (10, 0), (9, 0), False),
    ("", (9, 0), (9, 0), False),      # an unknown kind is refused, never guessed
])
def test_arch_rules(kind, target, device, runs):
    assert arch_runs_on(kind, target, device) is runs


def test_device_needs_names_exact_and_family_targets():
    assert device_needs((9, 0)) == "sm_90a"  # Hopper has no family target
    assert device_needs((10, 0)) == "sm_100a or sm_100f"
    text = device_needs((10, 3))
    assert "sm_103a" in text and "sm_10Xf with X <= 3" in text and "sm_100f" in text


def test_wrong_device_is_refused_before_the_library_is_opened(tmp_path, monkeypatch):
    hopper = write_bundle(tmp_path, "sm_90a", "a", (9, 0))
    write_bundle(tmp_path, "sm_100a", "a", (10, 0))
    monkeypatch.setenv("TILEKILN_BUNDLE_PATH", str(tmp_path))
    calls: list[int] = []
    bundle = Bundle.open(hopper, device_query=simulated((10, 0), calls))
    with pytest.raises(BundleCompatibilityError) as info:
        bundle.device(0)
    message = str(info.value)
    assert "bundle sm90a holds sm_90a code, which runs only on compute capability 9.0" in message
    assert "cuda:0 is compute capability 10.0 and needs a bundle for sm_100a or sm_100f" in message
    assert "Installed bundles cover: sm100a (sm_100a, TILEKILN_BUNDLE_PATH), sm90a (sm_90a, " in message
    assert message.endswith("Those that run on compute capability 10.0: sm100a.")
    assert bundle._lib is None, "the library must not be opened for a device the bundle cannot serve"
    with pytest.raises(BundleCompatibilityError):
        bundle.device(0)  # a refusal is not cached as a usable device
    assert calls == [0, 0]


def test_matching_device_is_queried_once(tmp_path):
    calls: list[int] = []
    bundle = Bundle.open(write_bundle(tmp_path, "sm_90a", "a", (9, 0)), device_query=simulated((9, 0), calls))
    assert bundle.device(1).compute_capability == (9, 0)
    assert bundle.device(1).sm_count == 132
    assert calls == [1]


def test_family_bundle_runs_on_later_minors_only(tmp_path):
    family = write_bundle(tmp_path, "sm_100f", "f", (10, 0))
    assert Bundle.open(family, device_query=simulated((10, 3))).device(0).compute_capability == (10, 3)
    with pytest.raises(BundleCompatibilityError, match=r"runs on compute capability 10\.x with x >= 0; "
                                                        r"cuda:0 is compute capability 11\.0 and needs a bundle "
                                                        r"for sm_110a or sm_110f"):
        Bundle.open(family, device_query=simulated((11, 0))).device(0)


def test_default_bundle_says_what_is_installed_and_what_the_device_needs(tmp_path, monkeypatch):
    write_bundle(tmp_path, "sm_90a", "a", (9, 0))
    monkeypatch.setenv("TILEKILN_BUNDLE_PATH", str(tmp_path))
    monkeypatch.setattr("tilekiln._driver.compute_capability", lambda device: (10, 3))
    with pytest.raises(BundleCompatibilityError) as info:
        tilekiln._default_bundle(0)
    message = str(info.value)
    assert "no installed bundle runs on cuda:0 (compute capability 10.3" in message
    assert "sm_103a, or a family bundle sm_10Xf with X <= 3" in message
    assert "sm90a (sm_90a, TILEKILN_BUNDLE_PATH)" in message and "None runs on compute capability 10.3." in message


def test_future_schema_major_is_refused_naming_both_versions(tmp_path):
    future = f"{SUPPORTED_SCHEMA_MAJOR + 1}.0"
    directory = write_bundle(tmp_path, "sm_90a", "a", (9, 0), schema_version=future)
    with pytest.raises(BundleCompatibilityError) as info:
        tilekiln.load(directory)
    assert f"manifest schema version {future} is not supported" in str(info.value)
    assert f"reads schema {SUPPORTED_SCHEMA_MAJOR}.x" in str(info.value)


def test_future_schema_major_is_named_even_if_its_digest_rules_differ(tmp_path):
    directory = write_bundle(tmp_path, "sm_90a", "a", (9, 0), schema_version=f"{SUPPORTED_SCHEMA_MAJOR + 1}.0")
    data = json.loads((directory / "manifest.json").read_text())
    data["integrity"] = {"digest": "computed some other way"}
    (directory / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleCompatibilityError, match="schema version"):
        tilekiln.load(directory)


def test_newer_minor_schema_with_unknown_keys_loads(tmp_path):
    directory = write_bundle(tmp_path, "sm_90a", "a", (9, 0), schema_version=f"{SUPPORTED_SCHEMA_MAJOR}.7",
                             added_in_a_later_minor={"anything": 1})
    assert Bundle.open(directory).arch == "sm_90a"


def test_other_library_abi_is_refused(tmp_path):
    directory = write_bundle(tmp_path, "sm_90a", "a", (9, 0))
    data = json.loads((directory / "manifest.json").read_text())
    data["bundle"]["abi_version"] = ABI_VERSION + 1
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    (directory / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleCompatibilityError, match=f"ABI version {ABI_VERSION + 1} differs from this "
                                                        f"runtime's ABI {ABI_VERSION}"):
        Bundle.open(directory)


@pytest.mark.parametrize("files,library,problem", [
    ({"../outside.so": "0" * 64}, "../outside.so", "outside the bundle directory"),
    ({"/etc/x": "0" * 64, "lib/lib.so": hashlib.sha256(b"").hexdigest()}, "lib/lib.so", "outside the bundle"),
    ({"cubins/a.cubin": "0" * 64}, "lib/lib.so", "not among the hashed files"),
])
def test_manifest_must_hash_the_library_and_stay_inside_the_bundle(tmp_path, files, library, problem):
    directory = write_bundle(tmp_path, "sm_90a", "a", (9, 0), files=files, library=library)
    with pytest.raises(BundleIntegrityError, match=problem) as info:
        Bundle.open(directory)
    assert info.value.file == "manifest.json"


FLOOR = {"cuda_version": 13000, "linux_driver": "580.65.06"}


def test_an_older_driver_is_refused_with_both_versions_and_the_fix(tmp_path, monkeypatch):
    from tilekiln import _driver

    bundle_dir = write_bundle(tmp_path, "sm_90a", "a", (9, 0))
    monkeypatch.setattr(_driver, "driver_version", lambda: 12040)
    with pytest.raises(BundleCompatibilityError) as info:
        tilekiln.load(bundle_dir)
    message = str(info.value)
    assert "links the CUDA 13.0 runtime" in message and "supports CUDA 12.4 (cuDriverGetVersion 12040)" in message
    assert "Update the NVIDIA driver to 580.65.06 or newer" in message
    for installed in (13000, 13020, None):  # the floor itself, a newer driver, no driver (inspection only)
        monkeypatch.setattr(_driver, "driver_version", lambda v=installed: v)
        assert Bundle.open(bundle_dir).manifest.bundle.driver_requires == DriverFloor(**FLOOR)
