"""The glue's launch blocks, compiled by the bundle's own C compiler, have the layout the runtime packs.

The runtime packs each family's plan and call blocks with struct formats from tilekiln/spec.py
(Family.plan_format, Family.call_format) and the glue (templates/link/glue.c.j2) declares the
same blocks as C structs. A mismatch would hand the launcher a wrong pointer or value with no
error; these static assertions fail the compile instead, for every field's offset and each
block's size."""

from __future__ import annotations

import struct
import subprocess

import pytest

from builder.compile.objfile import EntryPoints
from builder.compile.toolchain import toolchain
from builder.package.link import CFLAGS, LinkInput, render_glue
from tilekiln.spec import FAMILIES, Family

pytestmark = pytest.mark.compile


def call_fields(family: Family) -> list[str]:
    """The call block's fields in order, as the glue names them (the padding word aside)."""
    pointers = [*(t.name for t in family.tensors), *(i.name for i in family.indices),
                *(s.name for s in family.scales), *(v.name for v in family.vectors),
                *(x.name for x in family.likes), *(x.name for x in family.scalars)]
    return [*pointers, *(x.name for x in family.values), "stream"]


def offsets(fmt: str) -> list[int]:
    """Byte offset of each field of a little-endian struct format (padding bytes ``x`` skipped)."""
    out, at = [], 0
    for code in fmt[1:]:
        if code != "x":
            out.append(at)
        at += struct.calcsize("<" + code)
    return out


def assertions(family: Family) -> str:
    lines = []
    call = f"tk_call_{family.name}_t"
    for name, offset in zip(call_fields(family), offsets(family.call_format), strict=True):
        lines.append(f'_Static_assert(offsetof({call}, {name}) == {offset}, "{family.name} call: {name}");')
    lines.append(f'_Static_assert(sizeof({call}) == {struct.calcsize(family.call_format)}, "{family.name} call size");')
    lines.append(f'_Static_assert(sizeof(tk_plan_{family.name}_t) == {struct.calcsize(family.plan_format)}, '
                 f'"{family.name} plan size");')
    for x in family.values:
        lines.append(f'_Static_assert(sizeof((({call} *)0)->{x.name}) == 4, "{x.name} is a float32");')
    return "\n".join(lines)


def test_every_family_block_matches_its_struct_format(tmp_path):
    tools = toolchain()
    kernels = [LinkInput(f"k_{name}", name, b"", EntryPoints(f"p{i}", f"p{i}_init", f"p{i}_load", f"p{i}_launch"))
               for i, name in enumerate(FAMILIES)]
    source = render_glue("layout", kernels) + "\n#include <stddef.h>\n" + "\n".join(
        assertions(f) for f in FAMILIES.values()) + "\n"
    (tmp_path / "glue.c").write_text(source)
    proc = subprocess.run([*tools.cc, "-target", "x86_64-linux-gnu.2.28", *CFLAGS, f"-I{tools.cuda_include}",
                           "-c", "glue.c", "-o", "glue.o"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_gemm_call_block_carries_alpha_and_beta_by_value():
    gemm = FAMILIES["gemm"]
    assert [x.name for x in gemm.values] == ["alpha", "beta"]
    fields = call_fields(gemm)
    at = dict(zip(fields, offsets(gemm.call_format), strict=True))
    # Eight pointers, the two float32 values in one 8-byte word, then the stream.
    assert (at["scale_result"], at["alpha"], at["beta"], at["stream"]) == (56, 64, 68, 72)
