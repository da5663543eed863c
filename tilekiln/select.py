"""Choose a kernel for a problem, and say why.

Cheapest checks first: dtype, operand majorness, then the kernel's contract
(stride divisibility for 16-byte TMA rows, index range). Among the kernels
that accept the problem, a measured choice from the bundle's tuning table
wins if one exists for the problem's shape bucket; otherwise the analytic
model estimates the time of each:

    time ~ waves x (CTA tile work) / (per-CTA efficiency)

``waves`` counts how many rounds of the persistent grid the output cluster
tiles need on this device's SM count (wave quantisation), the CTA tile work
includes the padding a tile wastes at the matrix edge (tile efficiency), and
the efficiency term favours tiles with more reuse per byte loaded and
clusters that share loads through TMA multicast. The model only ranks
candidates; ``tilekiln tune`` replaces it with measurements where it errs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilekiln.manifest import KernelInfo
from tilekiln.problem import GemmProblem

# The model's reuse term: tile intensity m*n/(m+n) over itself plus this
# constant (elements). With 20, 128x256 tiles rank above 128x128 above 64x128,
# as the H200 measurements of the default catalog did (651, 598, 398 TFLOP/s
# at 8192^3; bench/results).
_REUSE_KNEE = 20.0
# Each doubling of the cluster size, which halves one operand's L2 traffic
# through multicast, measured 5-13% faster at 8192^3 on the H200.
_MULTICAST_GAIN = 1.06


@dataclass(frozen=True)
class Candidate:
    kernel: KernelInfo
    accepted: bool
    reason: str
    estimate: float = math.inf  # model time, arbitrary units; lower is better


@dataclass(frozen=True)
class Choice:
    kernel: KernelInfo | None
    how: str  # "tuned", "model" or "none"
    candidates: tuple[Candidate, ...]

    def __str__(self) -> str:
        lines = [f"chosen: {self.kernel.id if self.kernel else 'none'} ({self.how})"]
        for c in sorted(self.candidates, key=lambda c: (not c.accepted, c.estimate, c.kernel.id)):
            mark = "accept" if c.accepted else "reject"
            est = f" estimate {c.estimate:.3g}" if c.accepted else ""
            lines.append(f"  {mark} {c.kernel.id}:{est} {c.reason}")
        return "\n".join(lines)


def shape_bucket(problem: GemmProblem, kernel_layout: str) -> str:
    """Tuning-table key: dtype, layout and the power-of-two ceiling of M, N, K, L."""
    def p2(v: int) -> int:
        return 1 << max(0, (v - 1).bit_length())
    return f"{problem.dtype}:{kernel_layout}:{p2(problem.m)}x{p2(problem.n)}x{p2(problem.k)}:{p2(problem.batch)}"


def layout_code(problem: GemmProblem) -> str:
    return ("t" if problem.a.major == "k" else "n") + ("n" if problem.b.major == "k" else "t")


def check_kernel(kernel: KernelInfo, problem: GemmProblem) -> str | None:
    """Why ``kernel`` cannot run ``problem``, or None if it can."""
    want = (problem.a_dtype, problem.b_dtype, problem.out_dtype)
    have = (kernel.dtypes[0], kernel.dtypes[1], kernel.dtypes[3])
    if want != have:
        return f"dtype: kernel computes {have[0]}/{have[1]}->{have[2]}, the call needs {problem.dtype}"
    if kernel.a_major != problem.a.major:
        return f"layout: kernel wants A {kernel.a_major}-major, a is {problem.a.major}-major"
    if kernel.b_major != problem.b.major:
        return f"layout: kernel wants B {kernel.b_major}-major, b is {problem.b.major}-major"
    div_a, div_b, div_c = kernel.contract.stride_divisibility
    for name, layout, div in (("a", problem.a, div_a), ("b", problem.b, div_b), ("out", problem.c, div_c)):
        for what, stride in (("leading", layout.lead), ("batch", layout.batch)):
            if stride % div:
                return (f"alignment: {name} {what} stride {stride} is not a multiple of {div} elements "
                        f"({kernel.contract.base_alignment} bytes, needed by TMA)")
    return None


def estimate(kernel: KernelInfo, problem: GemmProblem, sm_count: int) -> float:
    tm, tn, _ = kernel.tile
    cm, cn = kernel.cluster
    cluster_tiles = math.ceil(math.ceil(problem.m / tm) / cm) * math.ceil(math.ceil(problem.n / tn) / cn)
    items = cluster_tiles * problem.batch
    resident = max(1, sm_count // kernel.cluster_size)
    waves = math.ceil(items / resident)
    intensity = tm * tn / (tm + tn)
    efficiency = intensity / (intensity + _REUSE_KNEE) * _MULTICAST_GAIN ** math.log2(kernel.cluster_size)
    return waves * tm * tn * max(problem.k, 1) / efficiency


def choose(kernels: tuple[KernelInfo, ...], problem: GemmProblem, sm_count: int,
           tuning: dict[str, str]) -> Choice:
    candidates = []
    for k in kernels:
        why = check_kernel(k, problem)
        if why is None:
            candidates.append(Candidate(k, True, "contract fits", estimate(k, problem, sm_count)))
        else:
            candidates.append(Candidate(k, False, why))
    accepted = [c for c in candidates if c.accepted]
    if not accepted:
        return Choice(None, "none", tuple(candidates))
    tuned_id = tuning.get(shape_bucket(problem, layout_code(problem)))
    tuned = [c for c in accepted if c.kernel.id == tuned_id]
    if tuned:
        return Choice(tuned[0].kernel, "tuned", tuple(candidates))
    best = min(accepted, key=lambda c: (c.estimate, c.kernel.id))
    return Choice(best.kernel, "model", tuple(candidates))
