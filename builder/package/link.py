"""Link a bundle's kernel objects into one driver-only shared library.

Inputs: the exported objects, the rendered glue (``templates/link/glue.c.j2``:
kernel table plus the ``tk_*`` C API), the shim for the eight CUDA-runtime
symbols the objects import (``templates/link/shim.c``) and the static CUDA
runtime. A version script exports only ``tk_*``, so the many bundles a
process may load never clash on cudart or kernel symbols. ``readelf -d`` of
the result lists only glibc's libraries: cudart opens libcuda at run time.

The compiler and linker are the pinned zig's clang and lld, aimed at the
catalog's glibc (``-target x86_64-linux-gnu.2.28``): zig links against stub
libraries holding exactly that glibc's symbol versions, so the library runs
on every system with that glibc or newer, wherever it was linked. The host's
gcc linked against the host's glibc; on Debian 12 (2.36) that made every
bundle need ``GLIBC_2.34`` (cudart's pthread and ``dl*`` calls bind to the
versions glibc 2.34 gave them in libc), shutting out RHEL 8 and Ubuntu 20.04.
Linked by zig for 2.28, the sm90a library needs ``GLIBC_2.17`` at most.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from builder.check.derive import Tcgen05Plan
from builder.compile.objfile import EntryPoints
from builder.compile.records import BuildRecord
from builder.compile.toolchain import toolchain
from tilekiln.manifest import ABI_VERSION
from tilekiln.spec import BLOCK_EXTENTS, BLOCKWISE_BLOCK, FAMILIES, Scaling

LINK_DIR = Path(__file__).resolve().parents[2] / "templates" / "link"
# -g0: zig's clang emits DWARF by default, which names the directory it ran in.
CFLAGS = ("-O2", "-g0", "-fPIC", "-fvisibility=hidden", "-fno-ident")
LDFLAGS = (
    "-shared",
    # zig builds the libc glue it links (libc_nonshared, compiler_rt) in the link's mode;
    # in the default debug mode it would also build a UBSan runtime nothing uses.
    "-O2",
    # ... and -O2 turns on lld's --gc-sections, which gcc never did: keep every section.
    "-Wl,--no-gc-sections",
    # zig's libc_nonshared objects carry DWARF naming the directory they were first built in
    # and zig's install path; stripping that (and the local symbol table, which no reader
    # uses: the runtime binds the exported tk_* symbols) keeps the bytes a function of the inputs.
    "-s",
    "-Wl,-z,defs", "-Wl,--version-script=exports.map", "-Wl,--build-id=sha1",
)
LIBS = ("-ldl", "-lrt", "-lpthread")
EXPORTS_MAP = "{ global: tk_*; local: *; };\n"


@dataclass(frozen=True)
class LinkInput:
    kernel_id: str
    family: str
    object_bytes: bytes
    entry: EntryPoints
    scaling: Scaling = Scaling.TENSOR
    oversized_smem: int = 0  # dynamic shared memory loaded on the oversized carveout; 0: the opt-in limit


class LinkError(RuntimeError):
    pass


# The glue's TK_SCALING_* values (templates/link/glue.c.j2).
_GLUE_SCALING = {Scaling.TENSOR: 0, Scaling.BLOCKWISE: 1, Scaling.ROWWISE: 2}


def render_glue(bundle: str, kernels: list[LinkInput]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(LINK_DIR)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    families = sorted({k.family for k in kernels})
    rows = [{"id": k.kernel_id, "family": families.index(k.family), "init": k.entry.init,
             "load": k.entry.load_to_device, "launch": k.entry.launch,
             "scaling": _GLUE_SCALING[k.scaling], "oversized_smem": k.oversized_smem} for k in kernels]
    return env.get_template("glue.c.j2").render(bundle=bundle, abi_version=ABI_VERSION, kernels=rows,
                                                families=[FAMILIES[f] for f in families],
                                                block_extents=BLOCK_EXTENTS, block=BLOCKWISE_BLOCK)


def link_input(record: BuildRecord) -> LinkInput:
    """What the glue's kernel table holds of a compiled kernel."""
    cfg, plan = record.ctx.entry.config, record.ctx.plan
    oversized = plan.smem.dynamic_bytes if isinstance(plan, Tcgen05Plan) and plan.oversized_launch else 0
    return LinkInput(record.kernel_id, cfg.family, record.object_bytes, record.entry, cfg.scaling, oversized)


def link_recipe() -> dict[str, object]:
    """How a library is made, apart from its glue, objects, glibc target and toolchain: part of its cache key."""
    return {"cflags": list(CFLAGS), "ldflags": list(LDFLAGS), "libs": list(LIBS), "exports": EXPORTS_MAP,
            "shim_sha256": hashlib.sha256((LINK_DIR / "shim.c").read_bytes()).hexdigest()}


def zig_target(glibc: tuple[int, int]) -> str:
    """The target triple that makes zig compile and link for ``glibc`` on x86-64 Linux."""
    return f"x86_64-linux-gnu.{glibc[0]}.{glibc[1]}"


def link_library(bundle: str, kernels: list[LinkInput], output: Path, glibc: tuple[int, int]) -> None:
    """Write the shared library to ``output``, whose name is its soname (the caller renames it into place).

    ``glibc`` is the oldest glibc it must run on; the caller checks the result against it.
    """
    tools = toolchain()
    cc = [*tools.cc, "-target", zig_target(glibc)]
    cflags = [*CFLAGS, f"-I{tools.cuda_include}"]
    # Beside the output, in the build's scratch space: the next build sweeps it if this one is killed.
    with tempfile.TemporaryDirectory(prefix="tilekiln-link-", dir=output.parent) as tmp:
        work = Path(tmp)
        (work / "glue.c").write_text(render_glue(bundle, kernels))
        (work / "exports.map").write_text(EXPORTS_MAP)
        objects = []
        for i, k in enumerate(kernels):
            path = work / f"k{i:04d}.o"
            path.write_bytes(k.object_bytes)
            objects.append(path.name)
        _run([*cc, *cflags, "-c", "glue.c", "-o", "glue.o"], work)
        _run([*cc, *cflags, "-c", str(LINK_DIR / "shim.c"), "-o", "shim.o"], work)
        _run([*cc, *LDFLAGS, f"-Wl,-soname,{output.name}", "-o", "lib.so", "glue.o", "shim.o",
              *objects, str(tools.cudart_static), *LIBS], work)
        output.write_bytes((work / "lib.so").read_bytes())


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LinkError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr.strip()[:2000]}")
