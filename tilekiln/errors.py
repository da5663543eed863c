"""Exceptions and warnings raised by the tilekiln runtime.

Input problems are ``ValueError``/``TypeError`` subclasses so callers that
already handle torch's errors handle ours; bundle problems have their own
types. Every class keeps its fields and pickles (for worker processes).
"""

from __future__ import annotations


class TilekilnError(Exception):
    """Base of the runtime's own exceptions."""


class BundleError(TilekilnError):
    """A bundle cannot be found, read or used."""


class BundleIntegrityError(BundleError):
    """A bundle file is missing, truncated or modified; nothing was loaded. ``fix`` says what to do
    (for the files a build wrote: reinstall the bundle)."""

    def __init__(self, bundle: str, file: str, problem: str, fix: str = "reinstall the bundle"):
        self.bundle, self.file, self.problem, self.fix = bundle, file, problem, fix
        super().__init__(f"bundle {bundle}: {file}: {problem}; {fix} (nothing was loaded)")

    def __reduce__(self):
        return (BundleIntegrityError, (self.bundle, self.file, self.problem, self.fix))


class BundleCompatibilityError(BundleError):
    """The bundle is for another runtime version or another GPU."""


class NoKernelError(ValueError, TilekilnError):
    """No kernel of the bundle accepts the inputs; the message lists why each was rejected."""


class LaunchError(RuntimeError, TilekilnError):
    """The CUDA launch failed; ``error`` is the CUDA error name."""

    def __init__(self, kernel: str, error: str, detail: str):
        self.kernel, self.error, self.detail = kernel, error, detail
        super().__init__(f"{kernel}: launch failed with {error}: {detail}")

    def __reduce__(self):
        return (LaunchError, (self.kernel, self.error, self.detail))


class TuningFileWarning(UserWarning):
    """A bundle's tuning file belongs to another build or format and is ignored; the bundle
    selects by its build-time table (tilekiln/tuning/table.py)."""
