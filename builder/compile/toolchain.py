"""The pinned build toolchain: where its pieces are and what versions they are.

Everything comes from wheels in the build environment (no system CUDA, no
system C compiler): the CuTe DSL compiler, ``libcudart_static.a`` and the
CUDA headers, ``cuobjdump``, and zig (the ``ziglang`` wheel), whose clang and
lld compile and link the bundle library against the glibc version the catalog
targets rather than the build host's. :func:`toolchain` fails closed: a
missing piece is an error naming the wheel to install, never a silent
fallback to something on PATH, because the toolchain versions are part of
every cache key.

Two fingerprints, so each cache key holds what decides its step and no more:
:func:`compiler_fingerprint` (DSL wheels, CUDA runtime, Python minor version;
computable in a compile worker that has no zig) keys compiled kernels and is
reported back by every worker, so a Ray node with a different toolchain is
caught; :attr:`Toolchain.fingerprint` (the same wheels plus zig) keys linked
libraries.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tilekiln.manifest import DriverFloor

# Distributions whose versions decide what the compiler emits; the DSL's CUDA
# flavour is in the *name* of its libs wheel, so all of them are listed.
FINGERPRINT_DISTRIBUTIONS = (
    "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
    "nvidia-cutlass-dsl-libs-cu13", "cuda-bindings", "nvidia-cuda-runtime",
)

# cuobjdump output (registers, SASS census) is stored with each cached kernel.
INSPECTOR_DISTRIBUTIONS = ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm")

HOST_TARGET = "llvm -mtriple=x86_64-unknown-linux-gnu"

# The oldest Linux driver of each CUDA major release (CUDA Toolkit release notes, "CUDA Toolkit
# and Corresponding Driver Versions"). Minor-version compatibility lets every driver of a major
# release run a static runtime of that major, so a bundle needs the floor of its runtime's major.
LINUX_DRIVER_FLOOR = {12: "525.60.13", 13: "580.65.06"}


class ToolchainError(RuntimeError):
    pass


@dataclass(frozen=True)
class Toolchain:
    cuda_include: Path
    cudart_static: Path
    cuobjdump: Path
    cc: tuple[str, ...]  # the C compiler and linker: ``zig cc``
    versions: tuple[tuple[str, str], ...]
    cc_version: str  # e.g. "zig 0.17.1"

    @property
    def fingerprint(self) -> str:
        text = "\n".join(f"{k}=={v}" for k, v in self.versions) + f"\ncc={self.cc_version}"
        return hashlib.sha256(text.encode()).hexdigest()

    def version(self, distribution: str) -> str:
        return dict(self.versions)[distribution]


def _distribution_version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        raise ToolchainError(f"the build toolchain needs the {name} wheel; run `make build-kernels` "
                             "or `pip install tilekiln-build`") from None


def _nvidia_dir() -> Path:
    import nvidia  # namespace package of the CUDA wheels

    for base in nvidia.__path__:
        candidate = Path(base) / "cu13"
        if (candidate / "include" / "cuda_runtime.h").exists():
            return candidate
    raise ToolchainError("CUDA 13 headers not found; install nvidia-cuda-runtime==13.0.96, "
                         "nvidia-cuda-crt and nvidia-cuda-cccl")


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@lru_cache(maxsize=1)
def compiler_versions() -> tuple[tuple[str, str], ...]:
    return tuple((name, _distribution_version(name)) for name in FINGERPRINT_DISTRIBUTIONS)


@lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """What decides a compile's output. The DSL rewrites Python ASTs, so the
    interpreter's minor version is part of it (a Ray node on another Python
    would otherwise be trusted)."""
    python = f"python=={sys.version_info.major}.{sys.version_info.minor}"
    return _digest([f"{k}=={v}" for k, v in compiler_versions()] + [python])


@lru_cache(maxsize=1)
def inspector_fingerprint() -> str:
    return _digest([f"{name}=={_distribution_version(name)}" for name in INSPECTOR_DISTRIBUTIONS])


@lru_cache(maxsize=1)
def cuda_binutils() -> Path:
    """The directory of the pinned ``cuobjdump`` and ``nvdisasm``: all a compile worker needs besides the DSL."""
    bin_dir = _nvidia_dir() / "bin"
    for name, wheel in (("cuobjdump", "nvidia-cuda-cuobjdump"), ("nvdisasm", "nvidia-cuda-nvdisasm")):
        if not (bin_dir / name).exists():
            raise ToolchainError(f"{name} not found under {bin_dir}; install the {wheel} wheel")
    return bin_dir


@lru_cache(maxsize=1)
def driver_floor() -> DriverFloor:
    """Read from the linked runtime's own header (``CUDART_VERSION``), not from a wheel version."""
    header = _nvidia_dir() / "include" / "cuda_runtime_api.h"
    match = re.search(r"^#define CUDART_VERSION\s+(\d+)\s*$", header.read_text(errors="replace"), re.MULTILINE)
    if match is None:
        raise ToolchainError(f"{header} does not define CUDART_VERSION; reinstall nvidia-cuda-runtime")
    major = int(match.group(1)) // 1000
    if major not in LINUX_DRIVER_FLOOR:
        raise ToolchainError(f"the CUDA runtime is version {match.group(1)}, and builder/compile/toolchain.py's "
                             f"LINUX_DRIVER_FLOOR does not know the driver floor of CUDA {major}; add it "
                             "from the CUDA release notes")
    return DriverFloor(1000 * major, LINUX_DRIVER_FLOOR[major])


@lru_cache(maxsize=1)
def toolchain() -> Toolchain:
    versions = compiler_versions()
    base = _nvidia_dir()
    cudart = base / "lib" / "libcudart_static.a"
    for path, wheel in ((cudart, "nvidia-cuda-runtime"),
                        (base / "include" / "crt" / "host_config.h", "nvidia-cuda-crt")):
        if not path.exists():
            raise ToolchainError(f"{path.name} not found under {base}; install the {wheel} wheel")
    zig = zig_binary()
    zig_version = subprocess.run([str(zig), "version"], capture_output=True, text=True).stdout.strip()
    return Toolchain(base / "include", cudart, cuda_binutils() / "cuobjdump", (str(zig), "cc"), versions,
                     f"zig {zig_version}")


def zig_binary() -> Path:
    """The zig binary inside the ``ziglang`` wheel's package directory."""
    spec = importlib.util.find_spec("ziglang")
    zig = None if spec is None else Path(next(iter(spec.submodule_search_locations))) / "zig"
    if zig is None or not zig.is_file():
        raise ToolchainError("zig not found; linking a bundle needs the ziglang wheel "
                             "(pip install tilekiln-build, or `make build-kernels`)")
    return zig
