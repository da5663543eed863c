"""The pinned build toolchain: where its pieces are and what versions they are.

Everything comes from wheels in the build environment (no system CUDA):
the CuTe DSL compiler, ``libcudart_static.a`` and the CUDA headers, and
``cuobjdump``. :func:`toolchain` fails closed: a missing piece is an error
naming the wheel to install, never a silent fallback to something on PATH,
because the toolchain versions are part of every cache key.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Distributions whose versions decide what the compiler emits; the DSL's CUDA
# flavour is in the *name* of its libs wheel, so all of them are listed.
FINGERPRINT_DISTRIBUTIONS = (
    "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
    "nvidia-cutlass-dsl-libs-cu13", "cuda-bindings", "nvidia-cuda-runtime",
)

HOST_TARGET = "llvm -mtriple=x86_64-unknown-linux-gnu"


class ToolchainError(RuntimeError):
    pass


@dataclass(frozen=True)
class Toolchain:
    cuda_include: Path
    cudart_static: Path
    cuobjdump: Path
    cc: str
    versions: tuple[tuple[str, str], ...]
    cc_version: str

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
                             "or `pip install -e '.[build]'`") from None


def _nvidia_dir() -> Path:
    import nvidia  # namespace package of the CUDA wheels

    for base in nvidia.__path__:
        candidate = Path(base) / "cu13"
        if (candidate / "include" / "cuda_runtime.h").exists():
            return candidate
    raise ToolchainError("CUDA 13 headers not found; install nvidia-cuda-runtime==13.0.96, "
                         "nvidia-cuda-crt and nvidia-cuda-cccl")


@lru_cache(maxsize=1)
def toolchain() -> Toolchain:
    versions = tuple((name, _distribution_version(name)) for name in FINGERPRINT_DISTRIBUTIONS)
    base = _nvidia_dir()
    cudart = base / "lib" / "libcudart_static.a"
    cuobjdump = base / "bin" / "cuobjdump"
    for path, wheel in ((cudart, "nvidia-cuda-runtime"), (cuobjdump, "nvidia-cuda-cuobjdump"),
                        (base / "include" / "crt" / "host_config.h", "nvidia-cuda-crt")):
        if not path.exists():
            raise ToolchainError(f"{path.name} not found under {base}; install the {wheel} wheel")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise ToolchainError("no C compiler (gcc) found; linking a bundle needs one")
    cc_version = subprocess.run([cc, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    return Toolchain(base / "include", cudart, cuobjdump, cc, versions, cc_version)
