"""The out= staging of the torch path (tilekiln/_torch/results.py, stage_for), run end to end on the
CPU: a stand-in library whose launches write the product into the C pointer they are handed, at the
row stride of the plan the call made, every row in whole 16-byte chunks as a TMA store writes it (the
chunk's bytes past N filled with garbage). An out= whose rows end short of 16 bytes (N = 100 bf16
columns in rows of 136) must keep its columns past N, get every element, and cost one launch. The
GPU suite found a staged call that staged its own stage without end and a grouped one whose plan's
strides were not its stage's; these run the same paths without a GPU."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

from tests.records import kernel_record, manifest
from tilekiln import grouped as grouped_module
from tilekiln._native import CALL
from tilekiln._tensors import describe
from tilekiln._torch import results, run, run_grouped
from tilekiln.bundle import Bundle, DeviceInfo

N, WIDTH = 100, 136  # 200-byte rows inside 272-byte ones: the chunk of column 99 reaches column 103
SENTINEL = 7.0
GARBAGE = 0x7F  # a chunk's bytes past N: 0x7f7f is a large bf16, never a product here
CHUNK = 16
OUT_BYTES = torch.bfloat16.itemsize  # every store here is bf16


class ChunkedStores:
    """The library's launch entries for the gemm, grouped and grouped_masked families. Each launch
    stores ``product()`` (the test's reference; the stand-in reads no operand memory) through the C
    pointer it is handed, at the row stride of the plan the call made (``plan.problem.c``), each row
    in whole 16-byte chunks; a grouped launch stores the rows each group owns as the kernel reads
    them through ``offs`` (cumulative row ends) or ``masked_m`` (rows per group)."""

    def __init__(self, product, plan_of, buffers):
        self.product, self.plan_of, self.buffers = product, plan_of, buffers
        self.targets = []  # the C pointer of each launch
        self.run = {"gemm": self._gemm, "grouped": self._grouped, "grouped_masked": self._masked}
        self._bufs = {family: ctypes.create_string_buffer(CALL[family].size) for family in self.run}

    def call_buffer(self, family):
        return self._bufs[family]

    def init(self, index):
        return 0

    def load(self, index, device):
        return 0

    def _store(self, base: int, lead: int, rows: torch.Tensor) -> None:
        """Rows of bf16 values at ``base`` + r * ``lead`` elements, each in whole 16-byte chunks."""
        data = rows.to(torch.bfloat16).contiguous()
        size = OUT_BYTES
        row_bytes = data.shape[-1] * size
        chunked = -(-row_bytes // CHUNK) * CHUNK
        if len(data):
            # A store past every buffer the call could hand the kernel fails here, not in the allocator.
            start, end = base, base + (len(data) - 1) * lead * size + chunked
            assert any(t.untyped_storage().data_ptr() <= start and end <= t.untyped_storage().data_ptr()
                       + t.untyped_storage().nbytes() for t in self.buffers), "a store past the end of its buffer"
        for r in range(data.shape[0]):
            ctypes.memmove(base + r * lead * size, data[r].data_ptr(), row_bytes)
            ctypes.memset(base + r * lead * size + row_bytes, GARBAGE, chunked - row_bytes)

    def _gemm(self, block, buf):
        pc = CALL["gemm"].unpack(bytes(buf))[2]
        self.targets.append(pc)
        self._store(pc, self.plan_of(block).problem.c.lead, self.product())
        return 0

    def _grouped(self, block, buf):
        pc, prows = CALL["grouped"].unpack(bytes(buf))[2:4]
        self.targets.append(pc)
        problem = self.plan_of(block).problem
        ends = (ctypes.c_int32 * problem.groups).from_address(prows)
        product, start, lead = self.product(), 0, problem.c.lead
        for g in range(problem.groups):
            end = max(start, min(ends[g], problem.m))
            self._store(pc + start * lead * OUT_BYTES, lead, product[start:end])
            start = end
        return 0

    def _masked(self, block, buf):
        pc, prows = CALL["grouped_masked"].unpack(bytes(buf))[2:4]
        self.targets.append(pc)
        problem = self.plan_of(block).problem
        counts = (ctypes.c_int32 * problem.groups).from_address(prows)
        product = self.product()  # (G, M_max, N)
        for g in range(problem.groups):
            owned = max(0, min(counts[g], problem.m))
            self._store(pc + g * problem.c.batch * OUT_BYTES, problem.c.lead, product[g, :owned])
        return 0


def _on_device_zero(t, name: str):
    """``describe`` of the test's host tensors as of a GPU's: device 0."""
    return dataclasses.replace(describe(t, name), device=0)


@dataclasses.dataclass
class Host:
    bundle: Bundle
    plans: dict  # the plans the calls made, by id of their block, for the stand-in library to read

    buffers: list  # the outs of the test and the stages the calls made: where a kernel may store

    def library(self, product) -> ChunkedStores:
        lib = ChunkedStores(product, lambda block: self.plans[id(block)], self.buffers)
        self.bundle._lib = lib
        return lib


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A bundle of a bf16 and an e4m3 tn kernel and a contiguous and a masked grouped bf16 kernel that
    runs host tensors on the stand-in library: the planner sees device 0, the stream is a constant."""
    def grouped(index: int, family: str, kernel_id: str, tile: tuple[int, int, int]):
        record = kernel_record(index, kernel_id, tile)
        return dataclasses.replace(record, config=dataclasses.replace(record.config, family=family))

    kernels = (kernel_record(0, "gemm_tn_128x128", (128, 128, 64)),
               grouped(1, "grouped_masked", "grouped_masked_tn_64x128", (64, 128, 64)),
               kernel_record(2, "gemm_e4m3_tn_128x128", (128, 128, 128), dtypes=("e4m3", "e4m3", "f32", "bf16")),
               grouped(3, "grouped", "grouped_tn_128x128", (128, 128, 64)))
    bundle = Bundle(tmp_path, manifest(kernels),
                    device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    real_plan, real_plan_grouped, plans, buffers = bundle.plan, grouped_module.plan_grouped, {}, []

    def plan(*args, **kwargs):
        made = real_plan(*args, **kwargs)
        plans[id(made.block)] = made
        return made

    def plan_grouped(*args, **kwargs):
        made = real_plan_grouped(*args, **kwargs)
        plans[id(made.block)] = made
        return made

    monkeypatch.setattr(bundle, "plan", plan)
    monkeypatch.setattr(grouped_module, "plan_grouped", plan_grouped)
    def stage_for(out, stream, keep=False):
        buffers.extend((out, results.stage_for(out, stream, keep)))
        return buffers[-1]

    monkeypatch.setattr(run, "raw_stream", lambda device: 7)
    for module in (run, run_grouped):
        monkeypatch.setattr(module, "describe", _on_device_zero)
        monkeypatch.setattr(module, "stream_handle", lambda stream, device: 7)
        monkeypatch.setattr(module, "stage_for", stage_for)
    return Host(bundle, plans, buffers)


def _view(*lead):
    """A NaN-filled (*lead, N) column slice of a (*lead, WIDTH) buffer whose other columns hold SENTINEL."""
    buffer = torch.full((*lead, WIDTH), float("nan"), dtype=torch.bfloat16)
    buffer[..., N:] = SENTINEL
    return buffer, buffer[..., :N]


def test_a_dense_out_whose_rows_end_short_of_16_bytes_keeps_its_columns_past_n(host):
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(N, 64, generator=gen).to(torch.bfloat16)
    want = a.float() @ w.float().t()
    lib = host.library(lambda: want)
    buffer, out = _view(40)
    assert run.run_gemm(host.bundle, a, w.t(), out, None) is out
    assert len(lib.targets) == 1
    assert (buffer[:, N:] == SENTINEL).all(), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_a_scaled_out_whose_rows_end_short_of_16_bytes_keeps_its_columns_past_n(host, monkeypatch):
    # Host scales are on device -1, not the plan's 0; the scales' checks have tests of their own.
    monkeypatch.setattr(run, "check_tensor_scale", lambda name, scale, device: None)
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(24, 128, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(N, 128, generator=gen).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.tensor([0.5]), torch.tensor([2.0])
    want = a.float() @ w.float().t()  # the scales multiply to 1
    lib = host.library(lambda: want)
    buffer, out = _view(24)
    assert run.run_scaled_gemm(host.bundle, a, w.t(), scale_a, scale_b, None, out, None, None) is out
    assert len(lib.targets) == 1
    assert (buffer[:, N:] == SENTINEL).all(), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_an_out_whose_rows_end_on_16_bytes_is_written_in_place(host):
    a = torch.randn(8, 64).to(torch.bfloat16)
    w = torch.randn(96, 64).to(torch.bfloat16)
    want = a.float() @ w.float().t()
    lib = host.library(lambda: want)
    out = torch.empty(8, 96, dtype=torch.bfloat16)
    run.run_gemm(host.bundle, a, w.t(), out, None)
    assert lib.targets == [out.data_ptr()], "a row of 192 bytes needs no stage"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_a_masked_grouped_out_keeps_the_rows_no_group_owns_and_the_columns_past_n(host):
    groups, slots, k = 3, 8, 64
    counts = torch.tensor([5, 0, 8], dtype=torch.int32)
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(groups, slots, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(groups, N, k, generator=gen).to(torch.bfloat16)
    want = a.float() @ w.float().transpose(1, 2)
    lib = host.library(lambda: want)
    buffer, out = _view(groups, slots)
    assert run_grouped.run_grouped_gemm(host.bundle, a, w.transpose(1, 2), counts, None, None, out, None,
                                        masked=True) is out
    assert len(lib.targets) == 1
    assert (buffer[..., N:] == SENTINEL).all(), "the chunk past column 99 reached the caller's columns"
    for g, rows in enumerate(counts.tolist()):
        torch.testing.assert_close(out[g, :rows].float(), want[g, :rows].to(torch.bfloat16).float())
        assert out[g, rows:].isnan().all(), f"group {g}: a row it does not own was written"


def test_a_contiguous_grouped_out_keeps_the_columns_past_n(host):
    rows = [3, 0, 9, 4]
    offs = torch.tensor(rows, dtype=torch.int32).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(sum(rows), 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(len(rows), N, 64, generator=gen).to(torch.bfloat16)
    starts = [0, *offs.tolist()[:-1]]
    want = torch.cat([a[s:s + r].float() @ w[g].float().t() for g, (s, r) in enumerate(zip(starts, rows))])
    lib = host.library(lambda: want)
    buffer, out = _view(sum(rows))
    assert run_grouped.run_grouped_gemm(host.bundle, a, w.transpose(1, 2), offs, None, None, out, None) is out
    assert len(lib.targets) == 1
    assert (buffer[:, N:] == SENTINEL).all(), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())
