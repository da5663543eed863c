"""Kernel configurations as frozen values.

A :class:`KernelConfig` is one point of the catalog after sweep expansion: the
geometry and numerics of one kernel, independent of the arch it is compiled
for. It is *canonical*: optional choices equal to their default are stored as
``None``, so equal kernels compare (and name) equal. ``naming`` turns it into
its id and back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from builder.dtypes import DType


class Schedule(str, enum.Enum):
    """How the consumer warpgroups share work (sm90).

    cooperative: all consumer warpgroups work on one CTA tile, split along M.
    pingpong: each consumer warpgroup owns a whole tile and the two alternate,
    so one's epilogue overlaps the other's mainloop.
    """

    COOPERATIVE = "cooperative"
    PINGPONG = "pingpong"


class Raster(str, enum.Enum):
    """Order in which a persistent CTA walks output tiles: down M first or along N first."""

    M = "m"
    N = "n"


class Operand(str, enum.Enum):
    """A GEMM input in the problem's terms: A (M x K) or B (K x N)."""

    A = "a"
    B = "b"


@dataclass(frozen=True)
class DTypes:
    a: DType
    b: DType
    acc: DType
    c: DType

    @property
    def tokens(self) -> tuple[str, str, str, str]:
        return (self.a.value, self.b.value, self.acc.value, self.c.value)


@dataclass(frozen=True)
class Layout:
    """Operand majorness in BLAS letters: A ``t`` = row-major (K-major), ``n`` = M-major;
    B ``n`` = column-major K x N (K-major), ``t`` = N-major. C is always row-major."""

    a_k_major: bool
    b_k_major: bool

    @property
    def swapped(self) -> "Layout":
        """The layout of the swapped product B^T A^T: its A is this B and its B this A."""
        return Layout(a_k_major=self.b_k_major, b_k_major=self.a_k_major)

    @property
    def code(self) -> str:
        return ("t" if self.a_k_major else "n") + ("n" if self.b_k_major else "t")

    @classmethod
    def from_code(cls, code: str) -> "Layout":
        if len(code) != 2 or code[0] not in "tn" or code[1] not in "tn":
            raise ValueError(f"layout must be two letters from t/n such as 'tn', got {code!r}")
        return cls(a_k_major=code[0] == "t", b_k_major=code[1] == "n")


@dataclass(frozen=True)
class Tile:
    """The CTA tile: the M x N output block one CTA computes and the K elements
    of one pipeline stage. Under a 2-CTA MMA a CTA pair covers 2M x N."""

    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Cluster:
    m: int
    n: int

    @property
    def size(self) -> int:
        return self.m * self.n


@dataclass(frozen=True)
class BlockScale:
    """Block-scaled operands: one ``scale``-typed factor per ``block`` consecutive K elements."""

    scale: DType
    block: int


@dataclass(frozen=True)
class KernelConfig:
    """One GEMM kernel: C[M,N] = A[M,K] @ B[K,N], batched over L."""

    pipeline: str
    dtypes: DTypes
    layout: Layout
    tile: Tile
    cluster: Cluster
    schedule: Schedule = Schedule.COOPERATIVE
    raster: Raster = Raster.M
    swizzle: int = 1
    stages: int | None = None  # None: the largest count that fits shared memory
    cta_group: int = 1  # CTAs per MMA instruction: 2 pairs CTAs along M (tcgen05 only)
    block_scale: BlockScale | None = None  # None: dense operands
    # True: the kernel computes C^T = B^T A^T, so the MMA's M runs along the
    # problem's N and a skinny M (a decode batch) fills the MMA's N instead of
    # padding its 64-row M. tile, cluster and stages are in the MMA's terms;
    # dtypes, layout and the kernel's arguments stay the problem's.
    swap_ab: bool = False
    # Problem operands whose TMA loads carry the L2 hint EVICT_FIRST: data read
    # once (the weights of a skinny GEMM) then gives way first, so the operand
    # every CTA re-reads stays in the L2.
    evict_first: frozenset[Operand] = frozenset()

    @property
    def mma_evict_first(self) -> tuple[bool, bool]:
        """Whether the MMA's own A and B loads are hinted EVICT_FIRST (the problem's B and A when swapped)."""
        a, b = Operand.A in self.evict_first, Operand.B in self.evict_first
        return (b, a) if self.swap_ab else (a, b)

    @property
    def mma_dtypes(self) -> DTypes:
        """The types of the MMA's own A and B operands (the problem's B and A when swapped)."""
        d = self.dtypes
        return DTypes(d.b, d.a, d.acc, d.c) if self.swap_ab else d

    @property
    def mma_layout(self) -> Layout:
        """The majorness of the MMA's own A and B operands."""
        return self.layout.swapped if self.swap_ab else self.layout
