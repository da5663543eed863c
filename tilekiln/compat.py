"""Which devices a bundle's code runs on, and what to say when the device is not one of them.

A bundle holds SASS for one target and no PTX, so the driver cannot
translate it for another GPU; the target's kind decides where it runs
(CUDA Programming Guide, "Compute Capability and Streaming Multiprocessor
Versions": architecture- and family-specific targets):

- ``a`` (arch-specific, ``sm_90a``): only on that exact compute capability.
- ``f`` (family-specific, ``sm_100f``): on the same major version with a
  minor version at least the target's (``sm_100f`` runs on 10.0 and 10.3).

Any other kind is refused: a runtime cannot vouch for code it does not know.
Imports only the standard library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekiln.errors import BundleCompatibilityError

if TYPE_CHECKING:
    from tilekiln.manifest import DriverFloor


def arch_runs_on(arch_kind: str, target: tuple[int, int], device: tuple[int, int]) -> bool:
    if arch_kind == "a":
        return tuple(device) == tuple(target)
    if arch_kind == "f":
        return device[0] == target[0] and device[1] >= target[1]
    return False


def arch_name(cc: tuple[int, int], kind: str) -> str:
    """``(9, 0), "a"`` -> ``sm_90a``: the target spelling used in manifests and the catalog."""
    return f"sm_{cc[0]}{cc[1]}{kind}"


# Family-portable ("f") targets start with compute capability 10.0 (CUDA 12.9);
# Hopper has only sm_90 and sm_90a.
FIRST_FAMILY_MAJOR = 10


def device_needs(cc: tuple[int, int]) -> str:
    """The targets whose bundles run on a device of compute capability ``cc``, in words."""
    exact, family = arch_name(cc, "a"), arch_name((cc[0], 0), "f")
    if cc[0] < FIRST_FAMILY_MAJOR:
        return exact
    if cc[1] == 0:
        return f"{exact} or {family}"
    return f"{exact}, or a family bundle sm_{cc[0]}Xf with X <= {cc[1]} (such as {family})"


def runs_on_rule(arch_kind: str, target: tuple[int, int]) -> str:
    if arch_kind == "a":
        return f"only on compute capability {target[0]}.{target[1]}"
    if arch_kind == "f":
        return f"on compute capability {target[0]}.x with x >= {target[1]}"
    return f"nowhere this runtime knows (unknown target kind {arch_kind!r})"


def wrong_device(bundle: str, arch: str, arch_kind: str, target: tuple[int, int], ordinal: int,
                 device: tuple[int, int], installed: str) -> BundleCompatibilityError:
    """The error for a bundle used on a device its code does not run on.

    ``installed`` says what the installed bundles cover (``discovery.describe_installed``).
    """
    return BundleCompatibilityError(
        f"bundle {bundle} holds {arch} code, which runs {runs_on_rule(arch_kind, target)}; "
        f"cuda:{ordinal} is compute capability {device[0]}.{device[1]} and needs a bundle for "
        f"{device_needs(device)}. {installed}")


def cuda_version_text(version: int) -> str:
    """13000 -> "13.0" (cudaDriverGetVersion's encoding: 1000 * major + 10 * minor)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def require_driver(bundle: str, requires: DriverFloor, installed: int | None) -> None:
    """Refuse a driver older than the bundle's static CUDA runtime needs (``bundle.driver_requires``).

    ``installed`` is cuDriverGetVersion, None where no driver is installed (nothing can run
    there, and loading for inspection is allowed)."""
    if installed is None or installed == 0:
        return
    needed = requires.cuda_version
    if installed < needed:
        raise BundleCompatibilityError(
            f"bundle {bundle} links the CUDA {cuda_version_text(needed)} runtime, which needs an NVIDIA driver "
            f"for CUDA {cuda_version_text(needed)} or newer (on Linux, driver {requires.linux_driver} or "
            f"newer); this machine's driver supports CUDA {cuda_version_text(installed)} "
            f"(cuDriverGetVersion {installed}). Update the NVIDIA driver to {requires.linux_driver} or newer.")
