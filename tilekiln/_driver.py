"""The few NVIDIA driver calls the runtime makes without a bundle library.

Used for inputs that are not torch tensors (which pointer lives on which
device) and to describe the visible GPUs in error messages. libcuda is
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


def compute_capability(device: int) -> tuple[int, int]:
    lib = _lib()
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), device) != 0:
        raise DriverUnavailable(f"no CUDA device {device}")
    lib.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return major.value, minor.value


def zero_2d(ptr: int, pitch_bytes: int, width_bytes: int, height: int, stream: int) -> None:
    """Zero a (height x width_bytes) block with row pitch ``pitch_bytes``, stream-ordered."""
    status = _lib().cuMemsetD2D8Async(ctypes.c_uint64(ptr), ctypes.c_size_t(pitch_bytes), ctypes.c_ubyte(0),
                                      ctypes.c_size_t(width_bytes), ctypes.c_size_t(height),
                                      ctypes.c_void_p(stream))
    if status != 0:
        raise RuntimeError(f"cuMemsetD2D8Async failed with CUresult {status}")
