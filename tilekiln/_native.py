"""ctypes binding of a bundle's shared library (its ``tk_*`` C API, ABI 4).

The library is the bundle's kernels linked with the static CUDA runtime; it
needs only libc and the NVIDIA driver. A launch passes two blocks by address:
the plan's (:data:`PLAN`: kernel, device, sizes, strides), packed once per
problem signature, and a per-thread call block (:data:`CALL`: pointers and
stream), packed on every call. ``tk_run`` is bound without ``argtypes`` and
called with the two ctypes buffers, which ctypes passes as pointers without
per-argument conversion. On the H200 host the call block's pack costs 0.12 us
and crossing into C 0.15 us (bench/results/overhead-h200-2026-12-02.json);
the ABI-2 launch packed all 18 fields per call and took 11.7 us in all, the
two-block launch (ABI 3 on) 6.8. ABI 4 adds ``tk_max_active_clusters``.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from pathlib import Path

# tk_plan_t in templates/link/glue.c.j2: a/b/c strides (lead, batch); m, n, k, l;
# resident clusters; device ordinal; kernel index; a reserved word.
PLAN = struct.Struct("<6q8i")
# tk_call_t: a, b, c, stream, scale_a, scale_b.
CALL = struct.Struct("<6Q")

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
            ("tk_fallback_launches", [], ctypes.c_ulonglong),
            ("tk_error_name", [ctypes.c_int], ctypes.c_char_p),
            ("tk_error_string", [ctypes.c_int], ctypes.c_char_p),
            ("tk_device_count", [ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
            ("tk_device_attribute", [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
            ("tk_driver_version", [ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
            ("tk_max_active_clusters", [ctypes.c_int] * 6 + [ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        self._lib = lib
        # No argtypes: called only as run(plan_block, call_block) with two ctypes buffers.
        self.run = lib.tk_run
        self._local = threading.local()

    def call_buffer(self) -> ctypes.Array:
        """This thread's call block, reused by every launch on the thread."""
        try:
            return self._local.buf
        except AttributeError:
            buf = self._local.buf = ctypes.create_string_buffer(CALL.size)
            return buf

    @staticmethod
    def plan_block(index: int, device: int, static: tuple[int, ...]) -> ctypes.Array:
        """A plan's block: ``static`` is (a, b, c strides; m, n, k, l; clusters)."""
        block = ctypes.create_string_buffer(PLAN.size)
        PLAN.pack_into(block, 0, *static, device, index, 0)
        return block

    def fallback_launches(self) -> int:
        """Launches the driver refused and the CUDA runtime retried (see templates/link/shim.c)."""
        return self._lib.tk_fallback_launches()

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

    def max_active_clusters(self, index: int, device: int, threads: int, smem_bytes: int,
                            cluster: tuple[int, int]) -> tuple[int, int]:
        """(status, clusters of kernel ``index`` that ``device`` holds at once); the kernel must be loaded there."""
        v = ctypes.c_int(0)
        status = self._lib.tk_max_active_clusters(index, device, threads, smem_bytes, cluster[0], cluster[1],
                                                  ctypes.byref(v))
        return status, v.value
