"""The few NVIDIA driver calls the runtime makes without a bundle library.

Used for inputs that are not torch tensors (which pointer lives on which
device), to describe the visible GPUs in error messages, for the name and
memory of a device that pick its tuning table (tilekiln/tuning/sku.py), and for its DRAM
bandwidth, which prices streamed operands in the selection model (tilekiln/model.py). libcuda is
opened on first use; a machine without the driver gets a clear error.
"""

from __future__ import annotations

import ctypes
import threading

_lock = threading.Lock()
_cuda = None

CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36
CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37


class DriverUnavailable(RuntimeError):
    pass


def _lib():
    global _cuda
    with _lock:
        if _cuda is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError:
                raise DriverUnavailable("the NVIDIA driver (libcuda.so.1) is not available on this machine") from None
            if lib.cuInit(0) != 0:
                raise DriverUnavailable("cuInit failed: no usable NVIDIA GPU")
            _cuda = lib
        return _cuda


def driver_version() -> int | None:
    """cuDriverGetVersion: the newest CUDA version the installed driver supports (13000 for
    CUDA 13.0); None on a machine without the driver. Needs no GPU and no cuInit."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


def pointer_device(ptr: int) -> int:
    """CUDA ordinal of the device that owns ``ptr``; -1 for host memory."""
    value = ctypes.c_int(-1)
    status = _lib().cuPointerGetAttribute(ctypes.byref(value), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                          ctypes.c_uint64(ptr))
    return value.value if status == 0 else -1


def _device(lib, device: int) -> ctypes.c_int:
    dev = ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), device) != 0:
        raise DriverUnavailable(f"no CUDA device {device}")
    return dev


def compute_capability(device: int) -> tuple[int, int]:
    lib = _lib()
    dev, major, minor = _device(lib, device), ctypes.c_int(), ctypes.c_int()
    lib.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return major.value, minor.value


def device_name(device: int) -> str:
    """cuDeviceGetName: the name torch.cuda.get_device_name reports, e.g. "NVIDIA H200"."""
    lib = _lib()
    name = ctypes.create_string_buffer(256)
    if lib.cuDeviceGetName(name, len(name), _device(lib, device)) != 0:
        raise DriverUnavailable(f"cuDeviceGetName failed for CUDA device {device}")
    return name.value.decode(errors="replace")


def memory_mib(device: int) -> int:
    """cuDeviceTotalMem in MiB: torch.cuda.get_device_properties(device).total_memory // 2**20."""
    lib = _lib()
    total = ctypes.c_size_t()
    if lib.cuDeviceTotalMem_v2(ctypes.byref(total), _device(lib, device)) != 0:
        raise DriverUnavailable(f"cuDeviceTotalMem failed for CUDA device {device}")
    return total.value >> 20


def dram_gbps(device: int) -> int | None:
    """Peak DRAM bandwidth in GB/s: two transfers per memory clock (kHz, as the driver gives it)
    across the bus (bits): 2619 MHz x 5120 bits is an H100 SXM's 3352. None where the driver
    reports neither."""
    lib = _lib()
    dev, clock_khz, bus_bits = _device(lib, device), ctypes.c_int(), ctypes.c_int()
    if (lib.cuDeviceGetAttribute(ctypes.byref(clock_khz), CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev)
            or lib.cuDeviceGetAttribute(ctypes.byref(bus_bits), CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev)):
        return None
    if clock_khz.value <= 0 or bus_bits.value <= 0:
        return None
    return round(2 * clock_khz.value * 1e3 * bus_bits.value / 8 / 1e9)


def zero_2d(ptr: int, pitch_bytes: int, width_bytes: int, height: int, stream: int) -> None:
    """Zero a (height x width_bytes) block with row pitch ``pitch_bytes``, stream-ordered."""
    status = _lib().cuMemsetD2D8Async(ctypes.c_uint64(ptr), ctypes.c_size_t(pitch_bytes), ctypes.c_ubyte(0),
                                      ctypes.c_size_t(width_bytes), ctypes.c_size_t(height),
                                      ctypes.c_void_p(stream))
    if status != 0:
        raise RuntimeError(f"cuMemsetD2D8Async failed with CUresult {status}")
