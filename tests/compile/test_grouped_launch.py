"""The grouped kernels' host launch path against the recording stand-in for the driver
(tests/compile/test_launch_record.py): three grouped kernels (clusters along N and along M), built
deviceless and linked with the recorder, are planned and launched through tilekiln.grouped (the
path of ``tilekiln.grouped_gemm``), and each must launch as check_grouped_launches says."""

from __future__ import annotations

import pytest

from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_launch_record import Recorded, check_grouped_launches, link_recording_library
from tilekiln._tensors import Operand
from tilekiln.grouped import launch_grouped, make_grouped_problem, plan_grouped

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - tile: [128, 256, 64]
    cluster: [1, 1]
  - tile: [64, 128, 64]
    cluster: [1, 2]
    schedule: pingpong
  - tile: [128, 128, 64]
    cluster: [2, 1]
""", family="grouped", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn")
# (total_M, N, K, G): decode-sized, ragged, large with many groups, one group.
PROBLEMS = ((16, 4096, 4096, 8), (1008, 1040, 528, 3), (8192, 1536, 2048, 128), (300, 256, 128, 1))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    base = tmp_path_factory.mktemp("grouped")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    bundle = result.bundles[0]
    return Recorded(bundle, link_recording_library(bundle, base / "lib"), base)


def test_every_grouped_kernel_launches_as_its_plan_says(recorded):
    assert check_grouped_launches(recorded, PROBLEMS) == set(recorded.records) and len(recorded.records) == 3


def test_a_misaligned_offs_pointer_is_refused_before_the_launch(recorded):
    kernel_id = sorted(recorded.records)[0]
    a = Operand("a", (64, 128), (128, 1), "bf16", 0x7F0000000000, 0, None)
    b = Operand("b", (2, 128, 256), (256 * 128, 1, 128), "bf16", 0x7F1000000000, 0, None)
    offs = Operand("offs", (2,), (1,), "i32", 0x7F3000000002, 0, None)
    grouped = plan_grouped(recorded.bundle, make_grouped_problem(a, b, offs, None, False), kernel_id)
    before = len(recorded.events())
    with pytest.raises(ValueError, match="offs: data pointer 0x7f3000000002 is not 4-byte aligned"):
        launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, 0x7F2000000000, offs.ptr, 0)
    with pytest.raises(ValueError, match="out: data pointer 0x7f2000000008 is not 16-byte aligned"):
        launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, 0x7F2000000008, 0x7F3000000000, 0)
    assert not [e for e in recorded.events()[before:] if e["event"] == "launch"]
