"""A damaged bundle is refused before its library is opened; a bundle for another arch before
anything is loaded (the small two-kernel bundle, devices simulated)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tilekiln
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.errors import BundleCompatibilityError, BundleIntegrityError
from tilekiln.manifest import ABI_VERSION

pytestmark = pytest.mark.compile

LIBRARY = "lib/libtilekiln_sm90a.so"


def mapped(path: Path) -> bool:
    """Whether this process has ``path`` mapped, i.e. the library was opened."""
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def first(directory: Path, pattern: str) -> str:
    return str(sorted(directory.glob(pattern))[0].relative_to(directory))


@pytest.fixture
def bundle_copy(small_build, tmp_path) -> Path:
    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    return copy


def test_an_intact_copy_loads_and_maps_its_library(bundle_copy):
    """The control for the cases below: ``mapped`` does see an opened library."""
    bundle = tilekiln.load(bundle_copy)
    assert not mapped(bundle_copy / LIBRARY)
    assert len(bundle._library().kernel_ids()) == 2
    assert mapped(bundle_copy / LIBRARY)
    assert bundle._library().abi_version == bundle.manifest.bundle.abi_version == ABI_VERSION


@pytest.mark.parametrize("case", ["library byte", "source byte", "manifest byte",
                                  "library truncated", "manifest deleted", "source deleted"])
def test_damage_is_refused_naming_the_file_and_nothing_is_loaded(bundle_copy, case):
    target = {"library byte": LIBRARY, "library truncated": LIBRARY, "manifest byte": "manifest.json",
              "manifest deleted": "manifest.json", "source byte": first(bundle_copy, "sources/*.py.txt"),
              "source deleted": first(bundle_copy, "sources/*.py.txt")}[case]
    path = bundle_copy / target
    if case.endswith("byte"):
        flip_byte(path)
    elif case.endswith("truncated"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()
    expected = {"deleted": "missing", "truncated": "sha256 mismatch",
                "byte": "sha256 mismatch|does not match its recorded sha256|not valid JSON"}[case.split()[-1]]
    with pytest.raises(BundleIntegrityError, match=expected) as info:
        tilekiln.load(bundle_copy)
    assert info.value.file == target
    assert info.value.bundle == "sm90a"
    assert not mapped(bundle_copy / LIBRARY)


def test_a_bundle_for_another_arch_is_refused_before_loading(bundle_copy, relabel_bundle, monkeypatch):
    monkeypatch.delenv("TILEKILN_BUNDLE_PATH", raising=False)
    relabel_bundle(bundle_copy, "sm_100a", "a", (10, 0))
    bundle = Bundle.open(bundle_copy, device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132))
    assert bundle.arch == "sm_100a"
    with pytest.raises(BundleCompatibilityError) as info:
        bundle.device(0)
    message = str(info.value)
    assert "holds sm_100a code, which runs only on compute capability 10.0" in message
    assert "cuda:0 is compute capability 9.0 and needs a bundle for sm_90a" in message
    assert not bundle._initialized and not mapped(bundle_copy / LIBRARY)


def test_a_retuned_bundle_follows_its_new_tuning_file(bundle_copy):
    """``tilekiln tune`` writes the tuning file of a bundle this process may already have open, then
    calls ``reload_tuning`` on it: the same Bundle follows the new table, and the manifest, verified
    at load, is never rewritten."""
    from tilekiln.tuning.table import add_measured, write_tuning_file

    before = tilekiln.load(bundle_copy)
    assert tilekiln.load(bundle_copy) is before
    built = (bundle_copy / "manifest.json").read_bytes()
    kernel = before.manifest.kernels[0].id
    bucket = "bf16:tn:512x512x512:1"
    assert dict(before.tuning.table if before.tuning else ()).get(bucket) != kernel
    table = add_measured(None, {bucket: {"kernel": kernel, "flops": 2 * 512**3, "shape": [512, 512, 512],
                                         "candidates": {kernel: 0.01}}}, "test")
    write_tuning_file(bundle_copy, table, before.manifest.sha256)
    before.reload_tuning()
    assert tilekiln.load(bundle_copy) is before and dict(before.tuning.table)[bucket] == kernel
    assert (bundle_copy / "manifest.json").read_bytes() == built
    # a process that opens the bundle afterwards reads the same table, and its files still verify
    assert dict(Bundle.open(bundle_copy).tuning.table)[bucket] == kernel
