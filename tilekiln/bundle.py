"""A loaded bundle: its kernels, lazy per-device loading and the GEMM call.

The library is opened from the bytes that were verified when the Bundle was
made (tilekiln/manifest.py, ``read_bundle``), through a private copy
(tilekiln/_native.py), never from its path in the bundle; once opened, the
Bundle lets go of the bytes. Nothing on the call path looks at the bundle's
files: what tilekiln.load re-checks on every call is in tilekiln/discovery.py.

Concurrency model: the library is opened, each kernel's cubin loaded
(``tk_init``) and its per-device attributes set (``tk_load``) lazily, the
first time a kernel runs on a device, under one re-entrant lock per bundle;
the hot path checks a set membership before taking it. Launches need no
lock: the argument block is per thread and the C launcher keeps no state.
Plans (validated problem + chosen kernel + packed static arguments) are
cached per operand signature, so a repeated call pays a dictionary look-up,
the pointer reads and one ctypes call. The tuning tables are read when the
Bundle is made and again only when :meth:`Bundle.reload_tuning` is called,
which replaces the tables, each device's pick of them and the plan cache as a
whole.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tilekiln import _native
from tilekiln._native import NativeLibrary
from tilekiln._tensors import Operand, contiguous_strides, describe, is_torch_tensor, transposed
from tilekiln.compat import arch_runs_on, require_driver, wrong_device
from tilekiln.errors import BundleError, LaunchError, NoKernelError
from tilekiln.manifest import Manifest, Sku, VerifiedBundle, read_bundle
from tilekiln.signing import require_signature, trust_for
from tilekiln.spec import FAMILIES, KernelRecord
from tilekiln.problem import GemmProblem, make_problem
from tilekiln.select import Choice, choose, choose_fused, nominal_clusters, refuses_out_rows
from tilekiln.splitk import SPLITS, parse_label, sliced_scale_strides
from tilekiln.tuning.sku import TablePick, pick_table
from tilekiln.tuning.table import overlay_tables, read_tuning_file


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    compute_capability: tuple[int, int]
    sm_count: int
    # As torch.cuda.get_device_name and total_memory // 2**20 report them; None where the driver
    # cannot be asked (below, _query_device).
    name: str | None
    memory_mib: int | None
    dram_gbps: int | None = None  # peak DRAM bandwidth (tilekiln._driver.dram_gbps)

    @property
    def sku(self) -> Sku:
        """The GPU model, which picks the device's tuning table (tilekiln/tuning/sku.py)."""
        return Sku(self.name, self.compute_capability, self.sm_count, self.memory_mib, self.dram_gbps)


@dataclass(frozen=True)
class Plan:
    """What a repeated call with the same signature needs."""

    problem: GemmProblem
    kernel_id: str  # the choice's label: "<kernel id>" or "<kernel id>/splitk<S>"
    block: object  # the packed tk_plan_t (a ctypes buffer); None: nothing to launch (empty result or K == 0)
    split: int = 1  # K slices; > 1: the kernel writes fp32 partials that are then summed (splitk.py)
    run: GemmProblem | None = None  # what the kernel runs: the problem itself, or its K slices
    family: str = ""  # the kernel's family: which tk_run_<family> and call block launch it
    align_mask: int = 0  # the kernel's contract: base alignment - 1, checked against every pointer
    # The trailing requested fields (GemmProblem.requested) the kernel does not compute: the torch
    # path applies them after it, unfused, e.g. (("activation", "silu"),) after a bias kernel.
    unfused: tuple[tuple[str, object], ...] = ()
    # The call's out= is what no kernel stores (the torch path, tilekiln/_torch/run.py): this plan is
    # the one without out, whose result torch finishes into out (applying ``unfused``, which then
    # holds a requested residual too).
    via_result: bool = False


DeviceQuery = Callable[[int], DeviceInfo]
# How many clusters of a kernel a device (ordinal) holds at once.
ClusterQuery = Callable[[KernelRecord, int], int]


PLAN_CACHE_LIMIT = 16384


def out_rows_hint(choice: Choice) -> str:
    """The fix a NoKernelError names where a kernel refused out='s row stride (rows not 16 bytes apart)."""
    if not any(refuses_out_rows(c) for c in choice.candidates):
        return ""
    return ("\nhint: the kernels store out's rows 16 bytes apart (TMA); pass an out whose rows are padded, e.g. "
            "torch.empty(M, L, dtype=...)[:, :N] with L * element size a multiple of 16, or leave out to "
            "tilekiln, which returns such a view")


# Why loading a kernel planned on the oversized carveout fails where the glue's first request does.
_OVERSIZED_HINT = ("; the kernel needs {} B of shared memory per CTA, more than the opt-in limit, and is loaded "
                   "on the oversized carveout: that needs a driver that knows the function attribute "
                   "CU_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE (17; documented from CUDA 13.4) and a device whose "
                   "MAX_OVERSIZED_SHARED_MEMORY_PER_BLOCK (attribute 150) holds it (SM 10.7); use a kernel "
                   "of fewer stages on this system")
# What a gemm-family launch passes for its by-value arguments when the call asks for none.
NEUTRAL_VALUES = FAMILIES["gemm"].neutral_values

# tilekiln._torch once the first torch tensors arrive: the runtime imports torch only then.
_torch_path = None


def torch_path():
    """tilekiln._torch, imported (with torch, and its operators registered) on first use."""
    global _torch_path
    from tilekiln import _torch

    _torch_path = _torch
    return _torch


def raise_misaligned(pa: int, pb: int, pc: int, alignment: int) -> None:
    for name, p in (("a", pa), ("b", pb), ("out", pc)):
        if p % alignment:
            raise ValueError(f"{name}: data pointer 0x{p:x} is not {alignment}-byte aligned (offset {p % alignment}); "
                             "the kernel loads and stores with TMA, whose contract needs aligned bases")


class Bundle:
    """A verified bundle. ``device_query`` answers what device ``ordinal`` is and
    ``cluster_query`` how many clusters of a kernel it holds at once; by default the
    bundle's library asks the driver. A simulated device (tests) has no driver to
    ask, so with ``device_query`` alone the cluster count is the nominal
    SM count / cluster size.

    Kernels are selected by ``tables``: the manifest's build-time tables, one per SKU, each
    with the buckets of the same device's table in the bundle's tuning file (``tuning_file``,
    written by ``tilekiln tune``; tilekiln/tuning/table.py) in place of its own. Each device
    selects by the table of its own SKU, else the nearest SKU's (:meth:`table_for`). Making a
    Bundle reads that file and raises :class:`BundleIntegrityError` if it is damaged.

    ``verified``: what :func:`tilekiln.manifest.read_bundle` read of the directory, whose
    library bytes the Bundle opens; a Bundle made without (a test's, from a manifest alone)
    has no library to open."""

    def __init__(self, directory: Path, manifest: Manifest, device_query: DeviceQuery | None = None,
                 cluster_query: ClusterQuery | None = None, verified: VerifiedBundle | None = None):
        self.directory = directory
        self.manifest = manifest
        self._image = verified.library if verified is not None else None  # dropped once opened
        # What tilekiln.load compares and checks on a later call (tilekiln/discovery.py).
        self.identity = verified.identity if verified is not None else None
        self.signature = verified.signature if verified is not None else None
        self.ref = str(directory)  # how the torch operators name this bundle (tilekiln/_torch/streams.py)
        self._device_query = device_query or self._query_device
        if cluster_query is None:
            cluster_query = self._query_clusters if device_query is None else self._nominal_clusters
        self._cluster_query = cluster_query
        self._clusters: dict[tuple[int, tuple[int, int]], int] = {}
        self._lock = threading.RLock()
        self._lib: NativeLibrary | None = None
        self._initialized: set[int] = set()
        self._ready: set[tuple[int, int]] = set()
        self._devices: dict[int, DeviceInfo] = {}
        self._plans: dict[tuple, Plan] = {}
        self._picks: dict[int, TablePick] = {}
        self.reload_tuning()

    @classmethod
    def open(cls, directory: Path, device_query: DeviceQuery | None = None, trusted_keys=None) -> "Bundle":
        """Verify the bundle in ``directory`` (its files, its signature when ``trusted_keys`` or
        ``TILEKILN_TRUSTED_KEYS`` require one: tilekiln/signing.py), its tuning file if it has one,
        and that the installed driver can run its CUDA runtime (nothing is opened before that)."""
        from tilekiln._driver import driver_version

        verified = read_bundle(directory)
        manifest = verified.manifest
        trust = trust_for(trusted_keys)
        if trust is not None:
            require_signature(manifest.name, manifest.sha256, verified.signature, trust)
        require_driver(manifest.name, manifest.bundle.driver_requires, driver_version())
        return cls(directory, manifest, device_query, verified=verified)

    def reload_tuning(self) -> None:
        """Read the bundle's tuning file again and select by it from now on; the plans cached so
        far, chosen under the old table, are dropped. ``tilekiln tune`` calls it after writing
        the file, so that this process's Bundle follows the new table without looking at the
        files on every call. A plan being made on another thread meanwhile may still be cached
        under the old table."""
        measured = read_tuning_file(self.directory, self.manifest)
        with self._lock:
            self.tuning_file = measured
            self.tables = overlay_tables(self.manifest.tuning_tables, measured)
            self._picks = {}
            self._plans = {}

    def table_for(self, ordinal: int) -> TablePick:
        """The tuning table device ``ordinal`` selects by: its SKU's, else the nearest SKU's, else
        none (tilekiln/tuning/sku.py); picked once per device until :meth:`reload_tuning`."""
        pick = self._picks.get(ordinal)
        if pick is None:
            pick = pick_table(self.tables, self.device(ordinal).sku)
            self._picks[ordinal] = pick
        return pick

    def __repr__(self) -> str:
        return f"<tilekiln bundle {self.name} {self.version} ({self.arch}, {len(self.kernels)} kernels)>"

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def arch(self) -> str:
        return self.manifest.arch

    @property
    def kernels(self):
        return self.manifest.kernels

    # -- loading -------------------------------------------------------------------------------

    def _library(self) -> NativeLibrary:
        if self._lib is None:
            with self._lock:
                if self._lib is None:
                    lib = self._open_library()
                    if (lib.kernel_ids() != [k.id for k in self.kernels]
                            or lib.kernel_families() != [k.config.family for k in self.kernels]):
                        raise BundleError(f"bundle {self.name}: the library's kernel table does not match "
                                          "manifest.json; rebuild or reinstall the bundle")
                    self._lib, self._image = lib, None
        return self._lib

    def _open_library(self) -> NativeLibrary:
        if self._image is None:
            raise BundleError(f"bundle {self.name}: this Bundle was made from a manifest alone and holds no "
                              "verified library to open; open the bundle with tilekiln.load")
        try:
            return NativeLibrary(self._image, Path(self.manifest.library).name)
        except _native.LibraryOpenError as exc:
            raise BundleError(f"bundle {self.name}: {self.manifest.library} cannot be opened ({exc}); if the "
                              "temporary directory is mounted noexec, set TMPDIR to one that is not") from None

    def device(self, ordinal: int) -> DeviceInfo:
        """Device ``ordinal``, checked once against the bundle's target before any kernel is loaded on it."""
        info = self._devices.get(ordinal)
        if info is None:
            with self._lock:
                info = self._devices.get(ordinal)
                if info is None:
                    info = self._device_query(ordinal)
                    self._require_runs_on(info)
                    self._devices[ordinal] = info
        return info

    def _require_runs_on(self, info: DeviceInfo) -> None:
        m = self.manifest
        if not arch_runs_on(m.arch_kind, m.compute_capability, info.compute_capability):
            from tilekiln.discovery import describe_installed

            raise wrong_device(m.name, m.arch, m.arch_kind, m.compute_capability, info.ordinal,
                               info.compute_capability, describe_installed(info.compute_capability))

    def _query_device(self, ordinal: int) -> DeviceInfo:
        from tilekiln._driver import DriverUnavailable, device_name, dram_gbps, memory_mib

        lib = self._library()
        values = []
        for attr in (_native.ATTR_COMPUTE_CAPABILITY_MAJOR, _native.ATTR_COMPUTE_CAPABILITY_MINOR,
                     _native.ATTR_MULTIPROCESSOR_COUNT):
            status, value = lib.device_attribute(attr, ordinal)
            if status:
                raise BundleError(f"cannot query cuda:{ordinal}: {lib.error_name(status)} "
                                  f"({lib.error_string(status)})")
            values.append(value)
        try:
            name, memory, bandwidth = device_name(ordinal), memory_mib(ordinal), dram_gbps(ordinal)
        except DriverUnavailable:
            # The library answered without libcuda: a stand-in for the CUDA runtime does that
            # (tests/compile/launch_recorder.c), never a driver. The device then selects by the
            # nearest SKU's table on its compute capability and SM count alone.
            name, memory, bandwidth = None, None, None
        return DeviceInfo(ordinal, (values[0], values[1]), values[2], name, memory, bandwidth)

    def resident_clusters(self, kernel: KernelRecord, device: int) -> int:
        """How many clusters of ``kernel`` a persistent launch on ``device`` starts: as many as
        the device holds at once. Asked once per device and cluster shape, since every
        kernel runs one CTA per SM (its pipeline stages fill the shared memory), so the
        shape alone decides how the GPCs fit clusters."""
        key = (device, kernel.config.cluster)
        count = self._clusters.get(key)
        if count is None:
            with self._lock:
                count = self._clusters.get(key)
                if count is None:
                    count = self._cluster_query(kernel, device)
                    if count < 1:
                        raise BundleError(f"{kernel.id}: cuda:{device} cannot hold one {kernel.config.cluster.m}x"
                                          f"{kernel.config.cluster.n} cluster of {kernel.threads}-thread CTAs with "
                                          f"{kernel.dynamic_smem_bytes} B of shared memory each; use a "
                                          "kernel with a smaller cluster")
                    self._clusters[key] = count
        return count

    def _nominal_clusters(self, kernel: KernelRecord, device: int) -> int:
        return nominal_clusters(kernel, self.device(device).sm_count)

    def _query_clusters(self, kernel: KernelRecord, device: int) -> int:
        if kernel.cluster_size == 1:
            return self.device(device).sm_count
        self._ensure_ready(kernel.index, device)
        lib = self._library()
        status, count = lib.max_active_clusters(kernel.index, device, kernel.threads, kernel.dynamic_smem_bytes,
                                                (kernel.config.cluster.m, kernel.config.cluster.n))
        if status:
            raise BundleError(f"{kernel.id}: asking cuda:{device} how many of its clusters fit failed with "
                              f"{lib.error_name(status)} ({lib.error_string(status)})")
        return count

    @property
    def prepared(self) -> frozenset[tuple[str, int]]:
        """(kernel id, device ordinal) of every kernel loaded and prepared on a device so far: each
        pair once, however many threads asked for it (the multi-GPU tests count on it)."""
        return frozenset((self.kernels[index].id, device) for index, device in self._ready)

    def _ensure_ready(self, index: int, device: int) -> None:
        if (index, device) in self._ready:
            return
        with self._lock:
            if (index, device) in self._ready:
                return
            lib = self._library()
            self.device(device)
            if index not in self._initialized:
                status = lib.init(index)
                if status:
                    raise BundleError(f"{self.kernels[index].id}: loading the cubin failed with "
                                      f"{lib.error_name(status)} ({lib.error_string(status)})")
                self._initialized.add(index)
            status = lib.load(index, device)
            if status:
                kernel = self.kernels[index]
                raise BundleError(f"{kernel.id}: preparing it for cuda:{device} failed with "
                                  f"{lib.error_name(status)} ({lib.error_string(status)})"
                                  + (_OVERSIZED_HINT.format(kernel.resources.smem_bytes)
                                     if kernel.resources.oversized_smem else ""))
            self._ready.add((index, device))

    # -- planning ------------------------------------------------------------------------------

    def plan(self, a: Operand, b: Operand, out: Operand | None, kernel: str | None = None,
             out_dtype: str | None = None, allow_split: bool = False,
             requested: tuple[tuple[str, object], ...] = (), scale_strides: tuple[int, ...] = ()) -> Plan:
        """Validate the operands and choose; ``allow_split``: the caller can sum split-K partials.
        ``requested`` (GemmProblem.requested) that no kernel computes is left to the caller
        (``Plan.unfused``), never dropped. ``scale_strides``: each scale's two non-unit strides
        (blockwise scales, checked by the caller); per-tensor scales have none (zeros)."""
        problem = make_problem(a, b, out, out_dtype, requested)
        if problem.empty or problem.k == 0:
            return Plan(problem, "", None, unfused=requested)
        if kernel is None:
            choice, unfused = choose_fused(lambda p: self.choose(p, None, allow_split), problem)
        else:
            choice, unfused = self.choose(problem, kernel, allow_split), ()
        if choice.kernel is None:
            raise NoKernelError(f"bundle {self.name} has no kernel for {problem.dtype} "
                                f"{list(a.shape)} @ {list(b.shape)}:\n{choice}{out_rows_hint(choice)}")
        if choice.split > 1 and not allow_split:
            raise TypeError(f"kernel={kernel!r}: split-K runs sum their partials through torch; "
                            "pass torch tensors")
        k, run = choice.kernel, choice.run
        # Loading happens here, on the slow path, so a cached plan can launch directly.
        self._ensure_ready(k.index, problem.device)
        clusters = self.resident_clusters(k, problem.device)
        family = k.family
        strides = tuple(s for t in family.tensors for s in (getattr(run, t.name).lead, getattr(run, t.name).batch))
        scales = scale_strides or (0,) * (2 * len(family.scales))
        if scale_strides and choice.split > 1:
            scales = sliced_scale_strides(family, scale_strides, run.k)
        static = (*strides, *scales, *(run.extent(e) for e in family.extents), clusters)
        return Plan(problem, choice.label, NativeLibrary.plan_block(family, k.index, problem.device, static),
                    choice.split, run, family.name, k.contract.base_alignment - 1, unfused)

    def remember(self, key: tuple, plan: Plan) -> None:
        """Cache a plan; a process that sees very many distinct shapes starts over
        rather than growing without bound (a plan is rebuilt in about 20 us)."""
        if len(self._plans) >= PLAN_CACHE_LIMIT:
            self._plans.clear()
        self._plans[key] = plan

    def choose(self, problem: GemmProblem, kernel: str | None = None, allow_split: bool = False) -> Choice:
        """``kernel`` pins one choice by label: a kernel id, or ``<id>/splitk<S>``."""
        kernels, splits = self.kernels, ((1, *SPLITS) if allow_split else (1,))
        if kernel is not None:
            kernel_id, split = parse_label(kernel)
            kernels, splits = tuple(k for k in self.kernels if k.id == kernel_id), (split,)
            if not kernels:
                raise NoKernelError(f"kernel={kernel!r}: bundle {self.name} has no such kernel")
        return self.choose_among(kernels, problem, splits)

    def choose_among(self, kernels: tuple[KernelRecord, ...], problem, splits: tuple[int, ...] = (1,)) -> Choice:
        """tilekiln.select.choose over ``kernels`` with what the problem's device gives it: its SM
        count, its tuning table (:meth:`table_for`) and the clusters each kernel runs at once."""
        device = problem.device
        return choose(kernels, problem, self.device(device).sm_count, self.table_for(device), splits,
                      lambda k: self.resident_clusters(k, device))

    def explain(self, a, b, out=None, out_dtype: str | None = None, backward: bool | None = None,
                requested: tuple[tuple[str, object], ...] = ()) -> Choice:
        """Which kernel would run for these operands, and why each other one would not.

        ``out_dtype`` (a dtype token such as ``"bf16"``) explains a scaled fp8 GEMM.
        ``backward`` adds what the two GEMMs of the gradient (dA = dC·Bᵀ, dB = Aᵀ·dC,
        for a contiguous dC) run on; by default when ``a`` or ``b`` requires grad.
        ``requested``: the fused epilogue asked for; where no kernel computes it, the choice
        is the plain GEMM's and a note says torch applies the rest.
        """
        a_op, b_op = describe(a, "a"), describe(b, "b")
        problem = make_problem(a_op, b_op, describe(out, "out") if out is not None else None, out_dtype,
                               requested)
        split = is_torch_tensor(a) and is_torch_tensor(b)
        choice, unfused = choose_fused(lambda p: self.choose(p, allow_split=split), problem)
        if unfused:
            rest = ", ".join(f"{name} {value}" for name, value in unfused)
            choice = replace(choice, notes=(f"unfused: no kernel computes {rest}; torch applies it after "
                                            f"{choice.label}",))
        if backward is None:
            backward = any(getattr(t, "requires_grad", False) for t in (a, b))
        if not backward or out_dtype is not None:
            return choice
        return replace(choice, notes=choice.notes + self._explain_backward(a_op, b_op, problem))

    def explain_grouped(self, a, b, rows, out=None, masked: bool = False,
                        requested: tuple[tuple[str, object], ...] = ()) -> Choice:
        """Which grouped kernel ``grouped_gemm(a, b, rows)`` (``grouped_gemm_masked`` when
        ``masked``) would run, and why not the others (fp8 inputs: the scaled kernels). ``requested``:
        the epilogue asked for (swiglu, row-wise scales, a block scale); a swiglu no kernel fuses is the ungated
        GEMM's choice, with a note that torch pairs the columns."""
        from tilekiln.grouped import choose_grouped_fused, make_grouped_problem, make_masked_problem
        from tilekiln.spec import SCALED_INPUTS

        a_op = describe(a, "a")
        make = make_masked_problem if masked else make_grouped_problem
        problem = make(a_op, describe(b, "b"), describe(rows, "masked_m" if masked else "offs"),
                       describe(out, "out") if out is not None else None,
                       a_op.dtype in SCALED_INPUTS or dict(requested).get("block_scale") is not None, requested)
        choice, unfused = choose_grouped_fused(self, problem)
        if unfused:
            rest = ", ".join(f"{name} {value}" for name, value in unfused)
            choice = replace(choice, notes=(f"unfused: no kernel computes {rest}; torch applies it after "
                                            f"{choice.label}",))
        return choice

    def _explain_backward(self, a: Operand, b: Operand, problem: GemmProblem) -> tuple[str, ...]:
        grad = Operand("grad", problem.out_shape, contiguous_strides(problem.out_shape), problem.out_dtype, 0,
                       problem.device, None)
        lines = []
        for what, x, y in (("dA = dC·Bᵀ", grad, transposed(b)), ("dB = Aᵀ·dC", transposed(a), grad)):
            try:
                choice = self.choose(make_problem(x, y, None), allow_split=True)
                runs_on = (f"{choice.label} ({choice.how})" if choice.kernel is not None else
                           "torch.matmul (no kernel of the bundle accepts it)")
            except (ValueError, TypeError) as exc:
                runs_on = f"torch.matmul ({exc})"
            lines.append(f"backward {what}: {runs_on}")
        return tuple(lines)

    # -- running -------------------------------------------------------------------------------

    def gemm(self, a, b, out=None, *, stream=None, kernel: str | None = None):
        """``a @ b`` with torch.matmul semantics, on the inputs' device and the current stream.

        ``kernel`` pins one choice by the label ``explain`` prints (a kernel id, or
        ``<kernel id>/splitk<S>``) instead of letting the selector choose.
        """
        fast = _torch_path
        if fast is not None and isinstance(a, fast.Tensor) and isinstance(b, fast.Tensor):
            return fast.gemm(self, a, b, out, stream, kernel)
        if is_torch_tensor(a) and is_torch_tensor(b):
            return torch_path().gemm(self, a, b, out, stream, kernel)
        return self._generic_gemm(a, b, out, stream, kernel)

    def linear(self, x, weight, bias=None, *, activation=None, residual=None, out=None):
        """``tilekiln.linear`` on this bundle's kernels."""
        if not (is_torch_tensor(x) and is_torch_tensor(weight)):
            raise TypeError("linear takes torch tensors (x and weight); the operands given are "
                            f"{type(x).__name__} and {type(weight).__name__}")
        return torch_path().linear(self, x, weight, bias, activation, residual, out)

    def addmm(self, input, mat1, mat2, *, beta=1, alpha=1, out=None):
        """``tilekiln.addmm`` on this bundle's kernels."""
        if not (is_torch_tensor(mat1) and is_torch_tensor(mat2)):
            raise TypeError("addmm takes torch tensors (mat1 and mat2); the operands given are "
                            f"{type(mat1).__name__} and {type(mat2).__name__}")
        return torch_path().addmm(self, input, mat1, mat2, beta, alpha, out)

    def swiglu(self, x, w_gate_up, *, out=None):
        """``tilekiln.swiglu`` on this bundle's kernels."""
        if not (is_torch_tensor(x) and is_torch_tensor(w_gate_up)):
            raise TypeError("swiglu takes torch tensors (x and w_gate_up); the operands given are "
                            f"{type(x).__name__} and {type(w_gate_up).__name__}")
        return torch_path().swiglu(self, x, w_gate_up, out)

    def scaled_gemm(self, a, b, scale_a, scale_b, *, bias=None, out_dtype=None, out=None, stream=None,
                    kernel: str | None = None, scale_format: str | None = None, scale_result=None, activation=None):
        """``(a @ b) * scale_a * scale_b + bias`` for fp8 inputs, like ``torch._scaled_mm``.

        ``scale_format`` None reads the scales' shapes: one-element float32 tensors on the inputs'
        device are per-tensor scales, (M, 1) and (1, N) float32 ones row-wise (``"tensor"``,
        ``"rowwise"``). ``"blockwise"``: per-block float32 scales in the layouts of
        tilekiln/blockwise.py (``quantize_fp8_blockwise`` makes them). ``"mxfp8"``: e4m3 ``a`` (M, K)
        and ``b`` (K, N) K-major with e8m0 scales per 32 elements of K, each in the hardware layout
        ``tilekiln.blockscaled.to_blocked`` makes (CC 10.x bundles). ``"nvfp4"`` (e4m3 scales per 16)
        and ``"mxfp4"`` (e8m0 per 32): e2m1 ``a`` (M, K/2) and ``b`` (K/2, N) K-major, packed two per
        byte as torch.float4_e2m1fn_x2 (``tilekiln.blockscaled.quantize_operand``). ``bias``: None or an (N,)
        vector of the result's type or float32. ``out_dtype`` defaults to bfloat16;
        ``torch.float8_e4m3fn`` writes ``saturate(value * scale_result)``, ``scale_result`` a
        one-element float32 tensor on the inputs' device (``tilekiln.scaled_gemm``). ``activation``
        None or ``"swiglu"``: ``silu(gate) * up`` of b's interleaved gate and up columns, (M, N/2)
        (``tilekiln.scaled_gemm``).
        """
        if not (is_torch_tensor(a) and is_torch_tensor(b)):
            raise TypeError("scaled_gemm takes torch tensors (a and b); the operands given are "
                            f"{type(a).__name__} and {type(b).__name__}")
        return torch_path().scaled_gemm(self, a, b, scale_a, scale_b, out_dtype, out, stream, kernel, scale_format,
                                        bias, scale_result, activation)

    def grouped_gemm(self, a, b, offs, *, scale_a=None, scale_b=None, out=None, stream=None,
                     kernel: str | None = None, scale_format: str | None = None):
        """``tilekiln.grouped_gemm`` on this bundle's kernels; ``kernel`` pins one by id."""
        if not (is_torch_tensor(a) and is_torch_tensor(b)):
            raise TypeError("grouped_gemm takes torch tensors (a and b); the operands given are "
                            f"{type(a).__name__} and {type(b).__name__}")
        return torch_path().grouped_gemm(self, a, b, offs, scale_a, scale_b, out, stream, kernel,
                                         scale_format=scale_format)

    def grouped_gemm_masked(self, a, b, masked_m, *, scale_a=None, scale_b=None, out=None, stream=None,
                            kernel: str | None = None, scale_format: str | None = None):
        """``tilekiln.grouped_gemm_masked`` on this bundle's kernels; ``kernel`` pins one by id."""
        if not (is_torch_tensor(a) and is_torch_tensor(b)):
            raise TypeError("grouped_gemm_masked takes torch tensors (a and b); the operands given are "
                            f"{type(a).__name__} and {type(b).__name__}")
        return torch_path().grouped_gemm(self, a, b, masked_m, scale_a, scale_b, out, stream, kernel, masked=True,
                                         scale_format=scale_format)

    def grouped_swiglu(self, a, w_gate_up, offs, *, scale_a=None, scale_b=None, out=None, stream=None,
                       kernel: str | None = None, scale_format: str | None = None):
        """``tilekiln.grouped_swiglu`` on this bundle's kernels; ``kernel`` pins one by id."""
        if not (is_torch_tensor(a) and is_torch_tensor(w_gate_up)):
            raise TypeError("grouped_swiglu takes torch tensors (a and w_gate_up); the operands given are "
                            f"{type(a).__name__} and {type(w_gate_up).__name__}")
        return torch_path().grouped_swiglu(self, a, w_gate_up, offs, scale_a, scale_b, out, stream, kernel,
                                           scale_format=scale_format)

    def grouped_swiglu_masked(self, a, w_gate_up, masked_m, *, scale_a=None, scale_b=None, out=None, stream=None,
                              kernel: str | None = None, scale_format: str | None = None):
        """``tilekiln.grouped_swiglu_masked`` on this bundle's kernels; ``kernel`` pins one by id."""
        if not (is_torch_tensor(a) and is_torch_tensor(w_gate_up)):
            raise TypeError("grouped_swiglu_masked takes torch tensors (a and w_gate_up); the operands given are "
                            f"{type(a).__name__} and {type(w_gate_up).__name__}")
        return torch_path().grouped_swiglu(self, a, w_gate_up, masked_m, scale_a, scale_b, out, stream, kernel,
                                           masked=True, scale_format=scale_format)

    def launch(self, plan: Plan, pa: int, pb: int, pc: int, stream: int, scale_a: int = 0,
               scale_b: int = 0, bias: int = 0, residual: int = 0, scale_result: int = 0,
               values: tuple[float, ...] = NEUTRAL_VALUES) -> None:
        """Launch a plan made by :meth:`plan` (which loaded its kernel on its device); ``bias``: the
        address of the (N,) bias vector, read only by a kernel that adds one; ``residual``: the
        address of an (M, N) residual at C's strides, read only by a kernel that adds one;
        ``scale_result``: the address of one float32, read only by a kernel with an 8-bit float C;
        ``values``: the gemm family's by-value float32 arguments (FAMILIES["gemm"].values), read only
        by a kernel that uses them."""
        if (pa | pb | pc) & plan.align_mask:
            raise_misaligned(pa, pb, pc, plan.align_mask + 1)
        lib = self._lib
        buf = lib.call_buffer(plan.family)
        _native.CALL[plan.family].pack_into(buf, 0, pa, pb, pc, scale_a, scale_b, bias, residual, scale_result,
                                              *values, stream)
        status = lib.run[plan.family](plan.block, buf)
        if status:
            raise LaunchError(plan.kernel_id, lib.error_name(status), lib.error_string(status))

    def _generic_gemm(self, a, b, out, stream, kernel):
        a_op, b_op = describe(a, "a"), describe(b, "b")
        out_op = describe(out, "out") if out is not None else None
        plan = self.plan(a_op, b_op, out_op, kernel)
        if out_op is None:
            try:
                import torch
            except ImportError:
                raise TypeError("out: pass an output array when the inputs are not torch tensors "
                                "(tilekiln allocates results only through torch, which is not installed)") from None
            return torch_path().gemm(self, torch.as_tensor(a, device=f"cuda:{a_op.device}"),
                                     torch.as_tensor(b, device=f"cuda:{b_op.device}"), None, stream, kernel)
        if plan.block is None:
            p = plan.problem
            if p.k == 0 and not p.empty:  # torch semantics: a sum over nothing is zero
                from tilekiln._driver import zero_2d

                for i in range(p.batch):
                    zero_2d(out_op.ptr + i * p.c.batch * out_op.itemsize, p.c.lead * out_op.itemsize,
                            p.n * out_op.itemsize, p.m, 0 if stream is None else int(stream))
            return out
        self.launch(plan, a_op.ptr, b_op.ptr, out_op.ptr, 0 if stream is None else int(stream))
        return out
