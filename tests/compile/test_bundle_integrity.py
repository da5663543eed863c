"""A damaged bundle is refused before its library is opened; a bundle for another arch before
anything is loaded; the library opened is the one whose bytes were verified, whatever happens to
its file afterwards (the small two-kernel bundle, devices simulated)."""

from __future__ import annotations

import _ctypes
import os
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


def opened_from_memory(lib) -> bool:
    """Whether ``lib`` (a NativeLibrary) was opened from a sealed memory copy of its bytes."""
    return os.readlink(lib.path).startswith(f"/memfd:{Path(LIBRARY).name}")


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


def test_an_intact_copy_loads_its_library_from_memory_never_from_its_path(bundle_copy):
    bundle = tilekiln.load(bundle_copy)
    assert len(bundle._library().kernel_ids()) == 2
    assert opened_from_memory(bundle._library()) and not mapped(bundle_copy / LIBRARY)
    assert bundle._library().abi_version == bundle.manifest.bundle.abi_version == ABI_VERSION


@pytest.mark.parametrize("when", ["after the load", "right after its sha256 was checked"])
def test_a_library_swapped_after_it_was_verified_is_not_the_one_opened(bundle_copy, tmp_path, monkeypatch, when):
    """Another shared library (CPython's _ctypes) put in the library's place: were it opened, it would
    have no tk_* functions; what opens is the verified library, and the next load refuses the swap."""
    from tilekiln import manifest

    other = tmp_path / "other.so"
    shutil.copy(_ctypes.__file__, other)

    def swap() -> None:
        os.replace(shutil.copy(other, tmp_path / "swap.so"), bundle_copy / LIBRARY)

    if when == "after the load":
        bundle = tilekiln.load(bundle_copy)
        swap()
    else:
        real = manifest.verify_files

        def verify_then_swap(*args):
            real(*args)
            swap()

        monkeypatch.setattr(manifest, "verify_files", verify_then_swap)
        bundle = tilekiln.load(bundle_copy)
        monkeypatch.undo()
    assert (bundle_copy / LIBRARY).read_bytes() == other.read_bytes()
    assert bundle._library().kernel_ids() == [k.id for k in bundle.kernels]
    assert opened_from_memory(bundle._library()) and not mapped(bundle_copy / LIBRARY)
    with pytest.raises(BundleIntegrityError) as info:
        tilekiln.load(bundle_copy)
    assert info.value.file == LIBRARY


def test_without_memfd_the_library_opens_from_a_private_copy_it_then_removes(bundle_copy, monkeypatch):
    def refuse(*args):
        raise PermissionError(13, "memfd_create refused (vm.memfd_noexec=2)")

    monkeypatch.setattr(os, "memfd_create", refuse)
    lib = tilekiln.load(bundle_copy)._library()
    assert len(lib.kernel_ids()) == 2
    assert not Path(lib.path).parent.exists() and not mapped(bundle_copy / LIBRARY)


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
    bundle = Bundle.open(bundle_copy, device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
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
    from tests.records import H100_PCIE
    from tilekiln.tuning.table import add_measured, table_of, write_tuning_file

    before = tilekiln.load(bundle_copy)
    assert tilekiln.load(bundle_copy) is before
    built = (bundle_copy / "manifest.json").read_bytes()
    kernel = before.manifest.kernels[0].id
    bucket = "bf16:tn:512x512x512:1"
    assert all(dict(t.table).get(bucket) != kernel for t in before.tables)
    table = add_measured(None, {bucket: {"kernel": kernel, "flops": 2 * 512**3, "shape": [512, 512, 512],
                                         "candidates": {kernel: 0.01}}}, H100_PCIE)
    write_tuning_file(bundle_copy, (table,), before.manifest.sha256)
    before.reload_tuning()
    assert tilekiln.load(bundle_copy) is before and dict(table_of(before.tables, H100_PCIE.name).table)[bucket] == kernel
    assert (bundle_copy / "manifest.json").read_bytes() == built
    # a process that opens the bundle afterwards reads the same table, and its files still verify
    assert dict(table_of(Bundle.open(bundle_copy).tables, H100_PCIE.name).table)[bucket] == kernel
