"""Inspect a cubin: registers, spills, shared memory and a SASS census.

Costs no GPU time and answers the first performance questions: did the
matrix instructions we meant come out (``HGMMA``/``QGMMA`` on Hopper,
``UTC*MMA`` on Blackwell), is there local-memory traffic (``LDL``/``STL``, a
spill), how many registers does the kernel take. Uses the pinned
``cuobjdump`` (with ``nvdisasm`` beside it for ``-sass``).

:func:`compiled_for` reads the target the cubin was assembled for. The SASS
header (``code for sm_100``) drops the ``f`` of family targets (an sm_100f
cubin prints ``sm_100``), so it is read from the ptxas command line that
``.note.nv.tkinfo`` records (``-arch sm_100f``), which keeps it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from builder.compile.toolchain import cuda_binutils

# Opcode families reported in the build report and the manifest. UGETNEXTWORKID is
# clusterlaunchcontrol.try_cancel (``.BROADCAST`` for multicast::cluster::all), measured on the
# scheduler: clc kernels of nvidia-cutlass-dsl 4.8.1: a clc kernel's scheduler warp issues it.
CENSUS_OPCODES = ("HGMMA", "QGMMA", "IGMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA",
                  "UTMALDG", "UTMASTG", "STSM", "LDL", "STL", "UGETNEXTWORKID")

_RES_RE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_SASS_RE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_ARCH_RE = re.compile(r"\.target\s+(sm_\w+)")


@dataclass(frozen=True)
class CubinInfo:
    arch: str
    registers: int
    stack_bytes: int
    static_smem_bytes: int
    local_bytes: int
    census: tuple[tuple[str, int], ...]

    @property
    def spills(self) -> bool:
        counts = dict(self.census)
        return self.local_bytes > 0 or counts.get("LDL", 0) > 0 or counts.get("STL", 0) > 0

    def count(self, opcode: str) -> int:
        return dict(self.census).get(opcode, 0)


def inspect_cubin(cubin: bytes) -> CubinInfo:
    """Runs in the compile workers. The disassembly is the cost: the census reads
    ``nvdisasm -c -ndf`` (0.28 s of CPU per Hopper GEMM) rather than ``cuobjdump
    -sass`` (0.38 s: nvdisasm plus a dataflow analysis the census does not read;
    identical counts on all 30 cubins of the default and benchmark catalogs)."""
    with _on_disk(cubin) as (path, tools, env):
        res = _run([str(tools / "cuobjdump"), "-res-usage", str(path)], env)
        sass = _disassemble(path, tools, env)
    usage = _RES_RE.findall(res)
    if not usage:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{res[:500]}")
    regs, stack, shared, local = (max(int(u[i]) for u in usage) for i in range(4))
    arch = _ARCH_RE.search(sass)
    counts = Counter(m.group(1) for m in _SASS_RE.finditer(sass))
    census = tuple((op, counts.get(op, 0)) for op in CENSUS_OPCODES)
    return CubinInfo(arch.group(1) if arch else "unknown", regs, stack, shared, local, census)


def disassemble(cubin: bytes) -> str:
    """The cubin's SASS as ``inspect_cubin`` reads it (``nvdisasm -c -ndf``)."""
    with _on_disk(cubin) as (path, tools, env):
        return _disassemble(path, tools, env)


@contextlib.contextmanager
def _on_disk(cubin: bytes):
    """(path of ``cubin`` in a temporary file, the pinned binutils folder, an environment with it on PATH)."""
    tools = cuda_binutils()
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory(prefix="tilekiln-cubin-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        yield path, tools, env


def _disassemble(path: Path, tools: Path, env: dict) -> str:
    return _run([str(tools / "nvdisasm"), "-c", "-ndf", str(path)], env)


_TKINFO_ARCH = re.compile(rb"-arch (sm_\w+)")


def compiled_for(cubin: bytes) -> str:
    """The ``-arch`` the cubin was assembled for, e.g. ``sm_100f``; raises if it is not recorded."""
    from elftools.elf.elffile import ELFFile

    note = ELFFile(io.BytesIO(cubin)).get_section_by_name(".note.nv.tkinfo")
    match = _TKINFO_ARCH.search(note.data()) if note is not None else None
    if match is None:
        raise RuntimeError("the cubin records no ptxas -arch in .note.nv.tkinfo")
    return match.group(1).decode()


def _run(cmd: list[str], env: dict) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout
