"""ctypes binding of a bundle's shared library (its ``tk_*`` C API, ABI 10).

The library is the bundle's kernels linked with the static CUDA runtime; it
needs only libc and the NVIDIA driver. A launch of a kernel of family F passes
two blocks by address to ``tk_run_F``, both laid out from F's arguments in
tilekiln/spec.py: the plan (``Family.plan_format``: tensor strides, blockwise
scale strides, extents, resident clusters, device, kernel index), packed once
per problem signature, and a per-thread call block (``Family.call_format``:
tensor, scale, vector, like and scalar pointers, the float32 values passed by value, then the
stream), packed on every call.
``tk_run_F`` is bound
without ``argtypes`` and called with the two ctypes buffers, which ctypes
passes as pointers without per-argument conversion. On the H200 host the call
block's pack costs 0.12 us and crossing into C 0.15 us
(bench/results/overhead-h200-2026-12-02.json); the ABI-2 launch packed all 18
fields per call and took 11.7 us in all, the two-block launch (ABI 3 on) 6.8.

The library is opened from the bytes whose sha256 the manifest lists, as
verified in memory (tilekiln/manifest.py, ``read_bundle``), never from its
path in the bundle, which anyone who can write the bundle could swap after
the check. :func:`open_private` writes those bytes to an anonymous memory
file (``memfd_create``) sealed against any change, and ``dlopen`` opens it as
``/proc/self/fd/N``: it has no name in any file system, so nothing can replace
it, and the seals keep even this process from changing it. Where the kernel
refuses that (no memfd, or ``vm.memfd_noexec=2``, or a security module that
forbids mapping it executable), the copy goes to a fresh private temporary
directory (mode 0700) instead, which only this user can write.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import struct
import tempfile
import threading

from tilekiln.spec import FAMILIES, Family

# The blocks of tk_run_<family> (templates/link/glue.c.j2), per family.
PLAN = {name: struct.Struct(f.plan_format) for name, f in FAMILIES.items()}
CALL = {name: struct.Struct(f.call_format) for name, f in FAMILIES.items()}

# cudaDeviceAttr values (driver_types.h).
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
# The memory files of opened libraries stay open for the life of the process: glibc knows a
# loaded library by the name it was opened as, so if /proc/self/fd/N were closed and N reused for
# another bundle's copy, dlopen of that name would return the first library.
_kept: list[int] = []


class LibraryOpenError(OSError):
    """Neither private copy of a library could be opened; the message says why each failed."""


def open_private(image: bytes, name: str) -> tuple[ctypes.CDLL, str]:
    """``dlopen`` of a private copy of ``image`` (the verified bytes of a library called ``name``);
    returns the library and the path it was opened as."""
    errors = []
    for what, copy in (("a sealed memfd", _memory_copy), ("a private temporary file", _temporary_copy)):
        try:
            return copy(image, name)
        except OSError as exc:
            errors.append(f"from {what}: {exc}")
    raise LibraryOpenError("; ".join(errors))


def _memory_copy(image: bytes, name: str) -> tuple[ctypes.CDLL, str]:
    """Open ``image`` from an anonymous memory file, sealed against writes and resizing."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        _write_all(fd, image)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        path = f"/proc/self/fd/{fd}"
        lib = ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_LOCAL", 0))
    except BaseException:
        os.close(fd)
        raise
    _kept.append(fd)
    return lib, path


def _temporary_copy(image: bytes, name: str) -> tuple[ctypes.CDLL, str]:
    """Open ``image`` from a file in a new temporary directory only this user can write; the
    file and directory are removed once it is mapped."""
    directory = tempfile.mkdtemp(prefix="tilekiln-")  # mode 0700, made by this call
    try:
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o500)
        try:
            _write_all(fd, image)
        finally:
            os.close(fd)
        return ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_LOCAL", 0)), path
    finally:
        # The mapping outlives the file, and a later copy gets another random directory, so
        # glibc never sees this name again.
        shutil.rmtree(directory, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class NativeLibrary:
    def __init__(self, image: bytes, name: str):
        """Open a private copy of ``image``, the verified bytes of the library file ``name``."""
        lib, self.path = open_private(image, name)
        for name, argtypes, restype in (
            ("tk_abi_version", [], ctypes.c_int),
            ("tk_kernel_count", [], ctypes.c_int),
            ("tk_kernel_id", [ctypes.c_int], ctypes.c_char_p),
            ("tk_kernel_family", [ctypes.c_int], ctypes.c_char_p),
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
        # No argtypes: called only as run[family](plan_block, call_block) with two ctypes buffers.
        self.run = {name: getattr(lib, f"tk_run_{name}") for name in self.families()}
        self._local = threading.local()

    def families(self) -> list[str]:
        """The families of the library's kernels (each has its tk_run_<family>)."""
        return sorted(set(self.kernel_families()))

    def kernel_families(self) -> list[str]:
        return [self._lib.tk_kernel_family(i).decode() for i in range(self._lib.tk_kernel_count())]

    def call_buffer(self, family: str) -> ctypes.Array:
        """This thread's call block of ``family``, reused by every launch on the thread."""
        try:
            return self._local.bufs[family]
        except AttributeError:
            self._local.bufs = {}
        except KeyError:
            pass
        buf = self._local.bufs[family] = ctypes.create_string_buffer(CALL[family].size)
        return buf

    @staticmethod
    def plan_block(family: Family, index: int, device: int, static: tuple[int, ...]) -> ctypes.Array:
        """A plan's block: ``static`` is the tensors' (lead, batch) strides, the scales' strides, the
        extents and the resident clusters, in the family's order; the device, the index and padding follow."""
        layout = PLAN[family.name]
        block = ctypes.create_string_buffer(layout.size)
        padding = (0,) * ((len(family.extents) + 3) % 2)  # the int32 fields fill whole 8-byte words
        layout.pack_into(block, 0, *static, device, index, *padding)
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
