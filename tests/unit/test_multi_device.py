"""Several devices in one process, simulated: each kernel is loaded and prepared once per device,
whatever the threads do, and every plan launches on its operands' device."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tests.records import kernel_record, manifest
from tilekiln._native import PLAN
from tilekiln._tensors import Operand
from tilekiln.bundle import Bundle, DeviceInfo

KERNELS = (kernel_record(0, "k0_tn_128x256", (128, 256, 64)), kernel_record(1, "k1_tn_64x128", (64, 128, 64)))


class RecordingLibrary:
    """The bundle library's loading calls, counted, without a driver."""

    def __init__(self):
        self.calls: Counter = Counter()
        self.lock = threading.Lock()

    def kernel_ids(self):
        return [k.id for k in KERNELS]

    def kernel_families(self):
        return ["gemm"] * len(KERNELS)

    def init(self, index):
        with self.lock:
            self.calls["init", index] += 1
        return 0

    def load(self, index, device):
        with self.lock:
            self.calls["load", index, device] += 1
        return 0


def op(name, shape, device, strides=None):
    strides = strides or (shape[1], 1)
    return Operand(name, shape, strides, "bf16", 0x10000, device, None)


@pytest.fixture
def bundle(tmp_path):
    b = Bundle(tmp_path, manifest(KERNELS), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    b._lib = RecordingLibrary()
    return b


def test_each_kernel_is_prepared_once_per_device_under_concurrent_calls(bundle):
    errors = []

    def worker(device, seed):
        try:
            for i in range(50):
                m = 16 * (1 + (seed + i) % 64)
                plan = bundle.plan(op("a", (m, 512), device), op("b", (512, 1024), device, (1, 512)), None)
                fields = PLAN["gemm"].unpack(bytes(plan.block))
                assert fields[-3] == device, "the plan block launches on the operands' device"
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(d, s)) for d in (0, 1) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    calls = bundle._lib.calls
    used = {index for (kind, index, *_ ) in calls if kind == "load"}
    assert used, "no kernel was prepared"
    assert all(calls["init", index] == 1 for index in used)
    assert all(calls["load", index, device] == 1 for index in used for device in (0, 1))
    assert bundle.prepared == {(KERNELS[index].id, device) for index in used for device in (0, 1)}


def test_operands_on_two_devices_are_refused_before_any_load(bundle):
    with pytest.raises(ValueError, match="a is on cuda:0 but b is on cuda:1"):
        bundle.plan(op("a", (64, 512), 0), op("b", (512, 1024), 1, (1, 512)), None)
    assert not bundle._lib.calls and not bundle.prepared
