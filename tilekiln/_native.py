"""ctypes binding of a bundle's shared library (its ``tk_*`` C API, ABI 1).

The library is the bundle's kernels linked with the static CUDA runtime; it
needs only libc and the NVIDIA driver. One argument block per launch is
packed with :data:`ARGS` (one ``struct.pack_into`` call) and passed by
address, which keeps the per-call cost of crossing into C to one ctypes call.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from pathlib import Path

# tk_args_t in templates/link/glue.c.j2: a, b, c, scale_a, scale_b, stream;
# a/b/c strides (2 each); m, n, k, l; resident clusters; device ordinal.
ARGS = struct.Struct("<6Q6q6i")

# cudaDeviceAttr values (driver_types.h).
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76


class NativeLibrary:
    def __init__(self, path: Path):
        self.path = path
        lib = ctypes.CDLL(str(path), mode=getattr(ctypes, "RTLD_LOCAL", 0))
        for name, argtypes, restype in (
            ("tk_abi_version", [], ctypes.c_int),
            ("tk_kernel_count", [], ctypes.c_int),
            ("tk_kernel_id", [ctypes.c_int], ctypes.c_char_p),
            ("tk_init", [ctypes.c_int], ctypes.c_int),
            ("tk_load", [ctypes.c_int, ctypes.c_int], ctypes.c_int),
            ("tk_launch", [ctypes.c_int, ctypes.c_void_p], ctypes.c_int),
            ("tk_error_name", [ctypes.c_int], ctypes.c_char_p),
            ("tk_error_string", [ctypes.c_int], ctypes.c_char_p),
            ("tk_device_count", [ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
            ("tk_device_attribute", [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
            ("tk_driver_version", [ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        self._lib = lib
        self.launch = lib.tk_launch
        self._local = threading.local()

    def args_buffer(self) -> ctypes.Array:
        """A per-thread argument block, reused by every launch on that thread."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = ctypes.create_string_buffer(ARGS.size)
        return buf

    @property
    def abi_version(self) -> int:
        return self._lib.tk_abi_version()

    def kernel_ids(self) -> list[str]:
        return [self._lib.tk_kernel_id(i).decode() for i in range(self._lib.tk_kernel_count())]

    def init(self, index: int) -> int:
        return self._lib.tk_init(index)

    def load(self, index: int, device: int) -> int:
        return self._lib.tk_load(index, device)

    def error_name(self, code: int) -> str:
        name = self._lib.tk_error_name(code)
        return name.decode() if name else f"cudaError {code}"

    def error_string(self, code: int) -> str:
        text = self._lib.tk_error_string(code)
        return text.decode() if text else ""

    def device_count(self) -> tuple[int, int]:
        n = ctypes.c_int(0)
        return self._lib.tk_device_count(ctypes.byref(n)), n.value

    def device_attribute(self, attribute: int, device: int) -> tuple[int, int]:
        v = ctypes.c_int(0)
        return self._lib.tk_device_attribute(attribute, device, ctypes.byref(v)), v.value
