"""What the build knows about one kernel of one target: compiled, cached or failed.

A :class:`BuildRecord` is made from a fresh compile result, from a cache
entry, or from a shard; :meth:`BuildRecord.artifact_meta` is the part of it
that describes the object itself (entry points, traced shared memory, cubin
resources). It is stored beside the object in the cache and in shard
outputs, so a cached or merged kernel never has its cubin inspected again.
It holds no timings: shard outputs must be byte-reproducible.

A failed record carries its :class:`~builder.diagnostics.Diagnostic`: a
compile-stage id (``COMPILE-FAILED``, ``COMPILE-SMEM-DRIFT``, ...; see
``builder.compile.job.COMPILE_HINTS``), the kernel id as subject, the kernel's
catalog entry as location and the facts that decided it. The build report
lists it per kernel and ``--format json`` with the other diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from builder.check.context import KernelContext
from builder.compile.cubin import CubinInfo
from builder.compile.objfile import EntryPoints
from builder.diagnostics import Diagnostic

ERROR_LINES = 12  # of a failure message, in the report and the printed summary


@dataclass(frozen=True)
class BuildRecord:
    kernel_id: str
    arch: str
    status: str  # compiled | cached | failed
    seconds: float
    error: str = ""
    ctx: KernelContext | None = None
    source: str = ""
    object_bytes: bytes = b""
    cubin: bytes = b""
    info: CubinInfo | None = None
    entry: EntryPoints | None = None
    key: str = ""
    traced_smem_bytes: int = -1
    diagnostic: Diagnostic | None = None  # why it failed (None for a record that passed)

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    @property
    def error_head(self) -> str:
        return "\n".join(self.error.strip().splitlines()[:ERROR_LINES])

    def report(self) -> dict:
        row = {"kernel": self.kernel_id, "arch": self.arch, "status": self.status,
               "compile_seconds": round(self.seconds, 3)}
        if self.info is not None:
            row.update(registers=self.info.registers, spills=self.info.spills,
                       local_bytes=self.info.local_bytes, stack_bytes=self.info.stack_bytes,
                       smem_bytes=self.ctx.plan.smem.total if self.ctx else None,
                       cubin_bytes=len(self.cubin), sass=dict(self.info.census))
        if self.error:
            row["error"] = self.error_head
        if self.diagnostic is not None:
            row["diagnostic"] = self.diagnostic.to_json()
        return row

    def artifact_meta(self) -> dict:
        info = self.info
        return {"entry": self.entry.__dict__, "traced_smem_bytes": self.traced_smem_bytes,
                "cubin": {"arch": info.arch, "registers": info.registers, "stack_bytes": info.stack_bytes,
                          "static_smem_bytes": info.static_smem_bytes, "local_bytes": info.local_bytes,
                          "census": [list(c) for c in info.census]}}


def record_from_meta(kernel_id: str, arch: str, status: str, seconds: float, meta: Mapping,
                     *, ctx: KernelContext, source: str, key: str, object_bytes: bytes, cubin: bytes) -> BuildRecord:
    """The inverse of :meth:`BuildRecord.artifact_meta`."""
    c = meta["cubin"]
    info = CubinInfo(c["arch"], c["registers"], c["stack_bytes"], c["static_smem_bytes"], c["local_bytes"],
                     tuple((op, n) for op, n in c["census"]))
    return BuildRecord(kernel_id, arch, status, seconds, ctx=ctx, source=source, object_bytes=object_bytes,
                        cubin=cubin, info=info, entry=EntryPoints(**meta["entry"]), key=key,
                        traced_smem_bytes=meta["traced_smem_bytes"])
