"""The torch path's launches run on host tensors: a stand-in for a bundle's library that stores a
test's reference product through the C pointer each launch is handed, at the strides of the plan the
call made, every row in whole 16-byte chunks as a TMA store writes it. What the host side of a call
decides (the stage an out= is written through, a split-K workspace and its sum, the rows a grouped
call owns) then runs without a GPU; the kernels' own arithmetic is the GPU suite's."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import torch

from tests.records import manifest
from tilekiln import grouped as grouped_module
from tilekiln._native import CALL
from tilekiln._tensors import describe
from tilekiln._torch import results, run, run_grouped
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.spec import KernelRecord

CHUNK = 16  # a TMA store writes a row in whole 16-byte chunks
GARBAGE = 0x7F  # a chunk's bytes past a row's end: 0x7f7f is a large bf16, never a product here
STORED = {"bf16": torch.bfloat16, "f32": torch.float32}


class HostLibrary:
    """The launch entries of the gemm, grouped and grouped_masked families. A launch stores
    ``product(plan)`` (the test's reference: (M, N), or (L, M, N) for a batch; a split plan's
    (S, M, N) partial products; the stand-in reads no operand memory) through its C pointer at the
    plan's strides; a grouped launch
    stores the rows each group owns as the kernel reads them through ``offs`` (cumulative row ends)
    or ``masked_m`` (rows per group). A store that would leave every buffer in ``buffers`` fails."""

    def __init__(self, product, plan_of, buffers):
        self.product, self.plan_of, self.buffers = product, plan_of, buffers
        self.targets = []  # the C pointer of each launch
        self.run = {"gemm": self._gemm, "grouped": self._grouped,
                    "grouped_masked": lambda block, buf: self._grouped(block, buf, masked=True)}
        self._bufs = {family: ctypes.create_string_buffer(CALL[family].size) for family in self.run}

    def call_buffer(self, family):
        return self._bufs[family]

    def init(self, index):
        return 0

    def load(self, index, device):
        return 0

    def _store(self, base: int, lead: int, rows: torch.Tensor, dtype: torch.dtype) -> None:
        """Rows of ``dtype`` values at ``base`` + r * ``lead`` elements, each in whole 16-byte chunks.

        The last row's chunk may end past its buffer's last element, but not past the next 16-byte
        boundary: a CUDA allocation starts 16-byte aligned (the caching allocator rounds blocks to
        512 bytes), so that tail is the buffer's own slack on a GPU. Here the tail past the host
        buffer is checked, not written (it would be the host heap's)."""
        data = rows.to(dtype).contiguous()
        size = data.element_size()
        row_bytes = data.shape[-1] * size
        chunked = -(-row_bytes // CHUNK) * CHUNK
        if not len(data):
            return
        start, end = base, base + (len(data) - 1) * lead * size + chunked
        owner = next((t for t in self.buffers if t.untyped_storage().data_ptr() <= start
                      and end <= -(-(t.untyped_storage().data_ptr() + t.untyped_storage().nbytes()) // CHUNK) * CHUNK),
                     None)
        # A store past every buffer the call could hand the kernel fails here, not in the allocator.
        assert owner is not None, "a store past the end of its buffer"
        limit = owner.untyped_storage().data_ptr() + owner.untyped_storage().nbytes()
        for r in range(data.shape[0]):
            row = base + r * lead * size
            ctypes.memmove(row, data[r].data_ptr(), row_bytes)
            ctypes.memset(row + row_bytes, GARBAGE, max(0, min(chunked, limit - row) - row_bytes))

    def _gemm(self, block, buf):
        pc = CALL["gemm"].unpack(bytes(buf))[2]
        self.targets.append(pc)
        plan = self.plan_of(block)
        problem = plan.run if plan.split > 1 else plan.problem
        dtype = STORED[problem.out_dtype]
        values = self.product(plan)
        if problem.batch == 1:  # a folded batch's rows are one matrix's
            self._store(pc, problem.c.lead, values.reshape(-1, values.shape[-1]), dtype)
            return 0
        for entry in range(problem.batch):  # a batch entry, or a split plan's K slice
            self._store(pc + entry * problem.c.batch * dtype.itemsize, problem.c.lead, values[entry], dtype)
        return 0

    def _grouped(self, block, buf, masked: bool = False):
        pc, prows = CALL["grouped_masked" if masked else "grouped"].unpack(bytes(buf))[2:4]
        self.targets.append(pc)
        plan = self.plan_of(block)
        problem, dtype = plan.problem, STORED[plan.problem.out_dtype]
        table = (ctypes.c_int32 * problem.groups).from_address(prows)  # masked_m, or offs (row ends)
        product, start = self.product(plan), 0  # (G, M_max, N) masked, else (total_M, N)
        for g in range(problem.groups):
            if masked:
                rows, at = product[g, :max(0, min(table[g], problem.m))], g * problem.c.batch
            else:
                end = max(start, min(table[g], problem.m))
                rows, at, start = product[start:end], start * problem.c.lead, end
            self._store(pc + at * dtype.itemsize, problem.c.lead, rows, dtype)
        return 0


@dataclasses.dataclass
class Host:
    """A bundle whose calls on host tensors run on a :class:`HostLibrary`."""

    bundle: Bundle
    plans: dict  # the plans the calls made, by id of their block, for the stand-in to read
    buffers: list  # where a launch may store: the outs given, the results, stages and workspaces made

    def library(self, product) -> HostLibrary:
        lib = HostLibrary(product, lambda block: self.plans[id(block)], self.buffers)
        self.bundle._lib = lib
        return lib


def _on_device_zero(t, name: str):
    """``describe`` of a host tensor as of a GPU's: device 0."""
    return dataclasses.replace(describe(t, name), device=0)


def host_bundle(directory: Path, monkeypatch, kernels: tuple[KernelRecord, ...]) -> Host:
    """A bundle of ``kernels`` on a simulated H200 whose torch calls take host tensors: the planner
    sees device 0, every stream handle is a constant, and the results, stages and split-K
    workspaces the calls allocate are recorded as buffers a launch may store into."""
    bundle = Bundle(directory, manifest(kernels),
                    device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    real_plan, real_plan_grouped, plans, buffers = bundle.plan, grouped_module.plan_grouped, {}, []

    def recorded(make):
        def plan(*args, **kwargs):
            made = make(*args, **kwargs)
            plans[id(made.block)] = made
            return made
        return plan

    def stage_for(out, stream, keep=False):
        buffers.extend((out, results.stage_for(out, stream, keep)))
        return buffers[-1]

    def partials(shape, device):
        buffers.append(results.partials(shape, device))
        return buffers[-1]

    def allocate(shape, k, dtype, device):
        buffers.append(results.allocate(shape, k, dtype, device))
        return buffers[-1]

    monkeypatch.setattr(bundle, "plan", recorded(real_plan))
    monkeypatch.setattr(grouped_module, "plan_grouped", recorded(real_plan_grouped))
    monkeypatch.setattr(run, "raw_stream", lambda device: 7)
    monkeypatch.setattr(run, "current_stream", lambda device: 7)
    monkeypatch.setattr(run, "partials", partials)
    for module in (run, run_grouped):
        monkeypatch.setattr(module, "describe", _on_device_zero)
        monkeypatch.setattr(module, "stream_handle", lambda stream, device: 7)
        monkeypatch.setattr(module, "stage_for", stage_for)
        monkeypatch.setattr(module, "allocate", allocate)
    return Host(bundle, plans, buffers)
