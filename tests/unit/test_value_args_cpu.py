"""By-value float32 launch arguments (tilekiln/spec.py, ValueArg): the call block's layout, the glue
that passes them, the runtime's packing and the launch signature every template renders."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from builder.compile.objfile import EntryPoints
from builder.package.link import LinkInput, render_glue
from tests.records import kernel_record, manifest
from tilekiln._native import CALL
from tilekiln._tensors import Operand
from tilekiln.bundle import NEUTRAL_VALUES, Bundle, DeviceInfo
from tilekiln.spec import FAMILIES, Family, TensorArg, ValueArg

ROOT = Path(__file__).resolve().parents[2]


def test_values_follow_the_pointers_in_whole_8_byte_words():
    one = Family("x", ("m", "n", "k", "l"), (TensorArg("c", ("m", "n", "l")),), (), values=(ValueArg("alpha"),))
    assert one.call_format == "<Qf" + "x" * 4 + "Q"
    assert one.arguments == ("c", "alpha", "resident_clusters", "stream")
    two = Family("y", ("m", "n", "k", "l"), (TensorArg("c", ("m", "n", "l")),), (),
                 values=(ValueArg("alpha"), ValueArg("beta", 0.0)))
    assert two.call_format == "<QffQ" and two.neutral_values == (1.0, 0.0)
    assert Family("z", ("m",), (), ()).call_format == "<Q"


def test_the_gemm_family_takes_alpha_and_beta_after_scale_result_and_the_others_none():
    gemm = FAMILIES["gemm"]
    assert gemm.values == (ValueArg("alpha"), ValueArg("beta"))
    assert gemm.arguments[-5:] == ("scale_result", "alpha", "beta", "resident_clusters", "stream")
    assert NEUTRAL_VALUES == gemm.neutral_values == (1.0, 1.0)
    assert all(f.values == () for name, f in FAMILIES.items() if name != "gemm")


def test_glue_passes_each_value_by_address_of_a_float_copied_from_the_call_block():
    entry = EntryPoints("p", "p_init", "p_load", "p_launch")
    text = render_glue("sm90a", [LinkInput("gemm_t", "gemm", b"", entry)])
    assert "  float alpha; /* by value" in text and "  float beta; /* by value" in text
    assert "float reserved" not in text  # two values fill the word
    assert "  float alpha = call->alpha;\n  float beta = call->beta;\n" in text
    assert "    &scale_result,\n    &alpha,\n    &beta,\n    &clusters, &stream, &result};" in text


class CallRecorder:
    """The library's launch entry, recording each call block it is given."""

    def __init__(self):
        self.blocks = []
        self.run = {"gemm": self._run}
        self._buf = ctypes.create_string_buffer(CALL["gemm"].size)

    def call_buffer(self, family):
        return self._buf

    def _run(self, plan_block, call_block):
        self.blocks.append(CALL["gemm"].unpack(bytes(call_block)))
        return 0

    def init(self, index):
        return 0

    def load(self, index, device):
        return 0


def test_a_launch_packs_the_neutral_values_unless_given_others(tmp_path):
    bundle = Bundle(tmp_path, manifest((kernel_record(0, "k0_tn_128x128", (128, 128, 64)),)),
                    device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    bundle._lib = CallRecorder()
    a = Operand("a", (256, 128), (128, 1), "bf16", 0x10000, 0, None)
    b = Operand("b", (128, 256), (1, 128), "bf16", 0x20000, 0, None)
    plan = bundle.plan(a, b, None)
    bundle.launch(plan, 0x10000, 0x20000, 0x30000, 7)
    bundle.launch(plan, 0x10000, 0x20000, 0x30000, 7, values=(-0.5, 0.25))
    first, second = bundle._lib.blocks
    assert first[:3] == (0x10000, 0x20000, 0x30000) and first[-3:] == (1.0, 1.0, 7)
    assert second[-3:] == (-0.5, 0.25, 7)


@pytest.fixture(scope="module")
def sm90_sources():
    from builder.check.validate import Project, validate_project
    from builder.render import render_kernel

    result = validate_project(Project(ROOT))
    return {c.entry.kernel_id: render_kernel(c).text for c in result.kernels
            if c.entry.config.family == "gemm" and c.entry.config.pipeline == "sm90"}


def test_every_dense_launcher_takes_the_values_and_a_kernel_that_does_not_use_them_keeps_them_on_the_host(
        sm90_sources):
    plain = sm90_sources["gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"]
    assert "                 alpha: cutlass.Float32, beta: cutlass.Float32,\n" \
           "                 resident_clusters: cutlass.Int32, stream: cuda.CUstream):" in plain
    assert "alpha = cutlass.Float32(1.0)" in plain and "beta = cutlass.Float32(1.0)" in plain
    launch = plain[plain.index("        self.kernel("):plain.index(".launch(")]
    assert "alpha" not in launch and "beta" not in launch
