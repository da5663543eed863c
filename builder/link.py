"""Link a bundle's kernel objects into one driver-only shared library.

Inputs: the exported objects, the rendered glue (``templates/link/glue.c.j2``:
kernel table plus the ``tk_*`` C API), the shim for the eight CUDA-runtime
symbols the objects import (``templates/link/shim.c``) and the static CUDA
runtime. A version script exports only ``tk_*``, so the many bundles a
process may load never clash on cudart or kernel symbols. ``readelf -d`` of
the result lists only libc and the dynamic loader: cudart opens libcuda at
run time.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from builder.objfile import EntryPoints
from builder.toolchain import toolchain
from tilekiln.manifest import ABI_VERSION

LINK_DIR = Path(__file__).resolve().parent.parent / "templates" / "link"
CFLAGS = ("-O2", "-fPIC", "-fvisibility=hidden", "-fno-ident")
LDFLAGS = ("-shared", "-Wl,-z,defs", "-Wl,--version-script=exports.map", "-Wl,--build-id=sha1")
LIBS = ("-ldl", "-lrt", "-lpthread")
EXPORTS_MAP = "{ global: tk_*; local: *; };\n"


@dataclass(frozen=True)
class LinkInput:
    kernel_id: str
    object_bytes: bytes
    entry: EntryPoints


class LinkError(RuntimeError):
    pass


def render_glue(bundle: str, kernels: list[LinkInput]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(LINK_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    rows = [{"id": k.kernel_id, "init": k.entry.init, "load": k.entry.load_to_device,
             "launch": k.entry.launch} for k in kernels]
    return env.get_template("glue.c.j2").render(bundle=bundle, abi_version=ABI_VERSION, kernels=rows)


def link_recipe() -> dict[str, object]:
    """How a library is made, apart from its glue, objects and toolchain: part of its cache key."""
    return {"cflags": list(CFLAGS), "ldflags": list(LDFLAGS), "libs": list(LIBS), "exports": EXPORTS_MAP,
            "shim_sha256": hashlib.sha256((LINK_DIR / "shim.c").read_bytes()).hexdigest()}


def link_library(bundle: str, kernels: list[LinkInput], output: Path) -> None:
    """Write the shared library to ``output``, whose name is its soname (the caller renames it into place)."""
    tools = toolchain()
    cflags = [*CFLAGS, f"-I{tools.cuda_include}"]
    with tempfile.TemporaryDirectory(prefix="tilekiln-link-") as tmp:
        work = Path(tmp)
        (work / "glue.c").write_text(render_glue(bundle, kernels))
        (work / "exports.map").write_text(EXPORTS_MAP)
        objects = []
        for i, k in enumerate(kernels):
            path = work / f"k{i:04d}.o"
            path.write_bytes(k.object_bytes)
            objects.append(path.name)
        _run([tools.cc, *cflags, "-c", "glue.c", "-o", "glue.o"], work)
        _run([tools.cc, *cflags, "-c", str(LINK_DIR / "shim.c"), "-o", "shim.o"], work)
        _run([tools.cc, *LDFLAGS, f"-Wl,-soname,{output.name}", "-o", "lib.so", "glue.o", "shim.o",
              *objects, str(tools.cudart_static), *LIBS], work)
        output.write_bytes((work / "lib.so").read_bytes())


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LinkError(f"{' '.join(cmd[:2])} ... failed:\n{proc.stderr.strip()[:2000]}")
