"""Manifest records for runtime tests without a built bundle: kernels and bundles as the builder
would describe them (tilekiln/spec.py, tilekiln/manifest.py), with made-up resources."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tilekiln._tensors import Operand
from tilekiln.manifest import (ABI_VERSION, MANIFEST_NAME, BundleInfo, DriverFloor, Manifest, Provenance, Sku,
                               TuningTable, manifest_digest)
from tilekiln.tuning.sku import TablePick
from tilekiln.spec import (MAX_EXTENT, Activation, Bias, Blob, CatalogRef, Cluster, Contract, DType, DTypes, KernelRecord,
                           Layout, Residual, Resources, Scalars, Scaling, Schedule, Scheduler, Symbols, TemplateRef, Tile,
                           Verified)


def kernel_record(index: int, kernel_id: str, tile: tuple[int, int, int], cluster=(1, 1), a: str = "k",
                  b: str = "k", dtypes: tuple[str, str, str, str] = ("bf16", "bf16", "f32", "bf16"), div: int = 8,
                  swap_ab: bool = False, verified_on: tuple[str, ...] = (), activation: str = "none",
                  bias: str = "none", scaling: str = "tensor", residual: str = "none",
                  scalars: str = "none", scheduler: str = "static", schedule: str = "cooperative",
                  sass: dict[str, int] | None = None) -> KernelRecord:
    """An sm90 kernel record; ``a``/``b`` are the operands' majorness as the runtime spells it;
    ``sass``: its SASS census (e.g. ``{"HGMMA": 4}`` for a warpgroup-MMA kernel; default none)."""
    from tilekiln.spec import KernelConfig

    config = KernelConfig(pipeline="sm90", dtypes=DTypes(*(DType(t) for t in dtypes)),
                          layout=Layout(a_k_major=a == "k", b_k_major=b == "k"), tile=Tile(*tile),
                          cluster=Cluster(*cluster), swap_ab=swap_ab, bias=Bias(bias),
                          activation=Activation(activation), scaling=Scaling(scaling), residual=Residual(residual),
                          scalars=Scalars(scalars), scheduler=Scheduler(scheduler), schedule=Schedule(schedule))
    return KernelRecord(
        index=index, id=kernel_id, config=config, stages=4, threads=384,
        contract=Contract(16, (div, div, div), MAX_EXTENT),
        resources=Resources(168, 200000, 1024, 0, 0, False, dict(sass or {})), cubin=Blob("0" * 64, 24000),
        source=Blob("0" * 64, 1000, f"sources/{kernel_id}.py.txt"), symbols=Symbols("p", "i", "l", "r"),
        catalog=CatalogRef("catalog/gemm/sm90.yaml", index), template=TemplateRef("sm90_gemm", "0" * 64),
        verified_on=tuple(Verified(sku, "2026-12-06", "580.159.04", 0.003) for sku in verified_on))


# The cards the runtime tests simulate, with the figures torch reports for them (name, compute
# capability, multi_processor_count, total_memory // 2**20).
H200 = Sku("NVIDIA H200", (9, 0), 132, 143156)
H100_SXM = Sku("NVIDIA H100 80GB HBM3", (9, 0), 132, 81089)
H100_PCIE = Sku("NVIDIA H100 PCIe", (9, 0), 114, 81008)


def pick(tuning: dict[str, str] | None = None) -> TablePick:
    """What a simulated H200 selects by: ``tuning`` as its own table, or no table."""
    return TablePick(H200, TuningTable(H200, tuple(sorted(tuning.items()))), True) if tuning else TablePick(H200, None)


def manifest(kernels: tuple[KernelRecord, ...] = (), tuning: dict[str, str] | None = None) -> Manifest:
    """An sm_90a bundle's manifest holding ``kernels``, and ``tuning`` as the build-time table of
    an H200 (the device the runtime tests simulate)."""
    return Manifest(
        schema_version="2.1",
        bundle=BundleInfo("sm90a", "0.1.0", "sm_90a", "a", (9, 0), ABI_VERSION, ">=0.5,<0.6",
                          DriverFloor(13000, "580.65.06"), "2.28"),
        library="lib/lib.so", files=(("lib/lib.so", "0" * 64),), kernels=tuple(kernels), toolchain=(),
        provenance=Provenance("unknown", "x86_64-linux", ()),
        tuning_tables=(TuningTable(H200, tuple(sorted(tuning.items()))),) if tuning else ())


def write_bundle(directory: Path, kernels: tuple[KernelRecord, ...] = (), tuning: dict[str, str] | None = None,
                 library: bytes = b"") -> Path:
    """A bundle directory that ``tilekiln.load`` verifies: ``manifest(kernels, tuning)`` with its
    self digest and a library file holding ``library`` (nothing here opens it)."""
    (directory / "lib").mkdir(parents=True)
    (directory / "lib" / "lib.so").write_bytes(library)
    data = dict(manifest(kernels, tuning).plain(), files={"lib/lib.so": hashlib.sha256(library).hexdigest()})
    data["integrity"] = {"manifest_sha256": manifest_digest(data)}
    (directory / MANIFEST_NAME).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return directory


def op(name, shape, strides=None, dtype="bf16", ptr=0x10000, device=0):
    """A runtime operand (no memory behind it) of ``shape``, row-major unless ``strides`` are given."""
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    return Operand(name, tuple(shape), tuple(strides), dtype, ptr, device, None)
