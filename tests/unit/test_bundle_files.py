"""What `tilekiln.load` refuses in a bundle directory before anything is loaded, and how a later
load of the same path notices a change (tilekiln/bundle_files.py, tilekiln/manifest.py,
tilekiln/discovery.py; docs/security.md). Synthetic bundles whose library is never opened."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import tilekiln
from tests.records import kernel_record, write_bundle
from tilekiln import _files
from tilekiln.bundle_files import temporary_of
from tilekiln.errors import BundleIntegrityError
from tilekiln.manifest import MANIFEST_NAME, manifest_digest

LIBRARY = "lib/lib.so"
IMAGE = b"\x7fELF library bytes"


class Blocked(Exception):
    """Not an OSError, which a reader might report as an unreadable file."""


@contextmanager
def time_bound(seconds: int = 5):
    """Fail instead of hanging: a load that opens a FIFO for reading blocks forever."""
    def expire(signum, frame):
        raise Blocked(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(directory: Path) -> BundleIntegrityError:
    with time_bound(), pytest.raises(BundleIntegrityError) as info:
        tilekiln.load(directory)
    return info.value


def rewrite_manifest(directory: Path, change) -> None:
    data = json.loads((directory / MANIFEST_NAME).read_text())
    change(data)
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    (directory / MANIFEST_NAME).write_text(json.dumps(data))


@pytest.fixture
def bundle(tmp_path) -> Path:
    return write_bundle(tmp_path / "sm90a", (kernel_record(0, "k_square", (128, 128, 64)),), library=IMAGE)


@pytest.mark.parametrize("extra,named", [("lib/libextra.so", "lib/libextra.so"), ("kernel.cubin", "kernel.cubin"),
                                         ("lib/kernel.cubin", "lib/kernel.cubin"), ("loader.py", "loader.py"),
                                         ("nested/deeper/file", "nested")])
def test_a_file_the_manifest_does_not_list_is_refused_by_name(bundle, extra, named):
    (bundle / extra).parent.mkdir(parents=True, exist_ok=True)
    (bundle / extra).write_bytes(b"unlisted")
    assert refused(bundle).file == named


def test_an_empty_directory_the_manifest_does_not_need_is_refused(bundle):
    (bundle / "plugins").mkdir()
    assert refused(bundle).file == "plugins"


@pytest.mark.parametrize("name", ["build-report.json", "signature.json"])
def test_the_files_beside_the_manifest_are_allowed_but_only_as_regular_files(bundle, name):
    (bundle / name).write_text("{}")  # neither is read unless a signature is required
    assert tilekiln.load(bundle).name == "sm90a"
    (bundle / name).unlink()
    (bundle / name).mkdir()
    assert refused(bundle).file == name


def test_a_temporary_file_of_a_tune_in_progress_is_allowed(bundle, monkeypatch):
    """write_atomic's temporary name, as it really spells it, for the files rewritten in place."""
    names = []
    real_replace = os.replace
    monkeypatch.setattr(_files.os, "replace", lambda src, dst: names.append(Path(src).name) or real_replace(src, dst))
    _files.write_atomic(bundle / "tuning.json", "{}")
    (bundle / "tuning.json").unlink()
    (bundle / names[0]).write_text("{}")
    assert temporary_of(names[0]) == "tuning.json"
    assert tilekiln.load(bundle).name == "sm90a"
    (bundle / names[0].replace("tuning", "manifest")).write_text("{}")  # not a file rewritten in place
    assert refused(bundle).file.startswith(".manifest.json.")


@pytest.mark.parametrize("target", [LIBRARY, MANIFEST_NAME, "signature.json"])
def test_a_symbolic_link_is_refused_wherever_it_points(bundle, tmp_path, target):
    outside = tmp_path / "outside"
    outside.write_bytes((bundle / target).read_bytes() if (bundle / target).exists() else b"{}")
    (bundle / target).unlink(missing_ok=True)
    (bundle / target).symlink_to(outside)
    assert refused(bundle).file == target


def test_a_linked_directory_is_refused(bundle, tmp_path):
    (bundle / "lib").rename(tmp_path / "lib-elsewhere")
    (bundle / "lib").symlink_to(tmp_path / "lib-elsewhere")
    assert refused(bundle).file == "lib"


@pytest.mark.parametrize("target", [LIBRARY, MANIFEST_NAME])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_is_refused_without_blocking(bundle, target, kind):
    (bundle / target).unlink()
    os.mkfifo(bundle / target) if kind == "fifo" else (bundle / target).mkdir()
    problem = refused(bundle)
    assert problem.file == target


def test_a_fifo_tuning_file_does_not_block_a_load(bundle):
    os.mkfifo(bundle / "tuning.json")
    assert refused(bundle).file == "tuning.json"


@pytest.mark.parametrize("case", ["deeply nested", "nested 200 levels", "huge index", "infinite index",
                                  "float index", "bool index", "negative index", "indexes out of order",
                                  "huge tile", "string threads", "NaN", "nul in a path",
                                  "a name kept for the files beside it"])
def test_a_hostile_manifest_is_an_integrity_error_naming_it(bundle, case):
    def change(data):
        kernel = data["kernels"][0]
        if case == "nested 200 levels":
            nest = []
            for _ in range(200):
                nest = [nest]
            data["padding"] = nest
        elif case == "huge index":
            kernel["index"] = 10**40
        elif case == "infinite index":
            kernel["index"] = float("inf")  # written as Infinity, then spelled 1e999
        elif case == "float index":
            kernel["index"] = 0.0
        elif case == "bool index":
            kernel["index"] = False
        elif case == "negative index":
            kernel["index"] = -1
        elif case == "indexes out of order":
            kernel["index"] = 1
        elif case == "huge tile":
            kernel["config"]["tile"] = [2**40, 128, 64]
        elif case == "string threads":
            kernel["threads"] = "384"
        elif case == "NaN":
            kernel["resources"]["registers"] = float("nan")
        elif case == "nul in a path":
            data["files"]["lib/\x00.so"] = "0" * 64
        elif case == "a name kept for the files beside it":
            data["files"]["tuning.json"] = "0" * 64

    if case == "deeply nested":
        text = (bundle / MANIFEST_NAME).read_text()
        (bundle / MANIFEST_NAME).write_text(text[:-2] + ', "padding": ' + "[" * 50_000 + "]" * 50_000 + "}")
    else:
        rewrite_manifest(bundle, change)
        text = (bundle / MANIFEST_NAME).read_text()
        (bundle / MANIFEST_NAME).write_text(text.replace("Infinity", "1e999"))
    problem = refused(bundle)
    assert problem.file == MANIFEST_NAME


# -- loading the same path again ----------------------------------------------------------------


def test_an_unchanged_bundle_is_the_same_bundle_and_a_touched_one_too(bundle):
    first = tilekiln.load(bundle)
    assert tilekiln.load(bundle) is first
    os.utime(bundle / LIBRARY)  # a new identity, the same bytes: verified again, the same Bundle
    assert tilekiln.load(bundle) is first


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_library_changed_after_the_load_is_refused_on_the_next_load(bundle, how):
    first = tilekiln.load(bundle)
    tampered = bytes(b ^ 1 for b in IMAGE)
    time.sleep(0.02)  # past a coarse file system timestamp tick (kernels before 6.13)
    if how == "in place":
        with open(bundle / LIBRARY, "r+b") as f:
            f.write(tampered)  # same size, same inode
    else:
        (bundle / "swap").write_bytes(tampered)
        os.replace(bundle / "swap", bundle / LIBRARY)
    assert refused(bundle).file == LIBRARY
    assert refused(bundle).file == LIBRARY  # the damaged bundle was forgotten, not cached
    (bundle / LIBRARY).write_bytes(IMAGE)
    again = tilekiln.load(bundle)
    assert again is not first and again.manifest == first.manifest


def test_a_file_added_after_the_load_is_refused_on_the_next_load(bundle):
    tilekiln.load(bundle)
    (bundle / "lib" / "preload.so").write_bytes(b"")
    assert refused(bundle).file == "lib/preload.so"


def test_a_bundle_rebuilt_in_place_is_a_new_bundle_and_the_old_one_keeps_its_own(bundle, tmp_path):
    first = tilekiln.load(bundle)
    rebuilt = write_bundle(tmp_path / "staging", (kernel_record(0, "k_wide", (128, 256, 64)),), library=b"other")
    for path in sorted(bundle.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    bundle.rmdir()
    rebuilt.rename(bundle)
    second = tilekiln.load(bundle)
    assert second is not first and [k.id for k in second.kernels] == ["k_wide"]
    assert [k.id for k in first.kernels] == ["k_square"] and first._image == IMAGE
