"""Exceptions raised by the tilekiln runtime.

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
    """A bundle file is missing, truncated or modified; nothing was loaded."""

    def __init__(self, bundle: str, file: str, problem: str):
        self.bundle, self.file, self.problem = bundle, file, problem
        super().__init__(f"bundle {bundle}: {file}: {problem}; reinstall the bundle (nothing was loaded)")

    def __reduce__(self):
        return (BundleIntegrityError, (self.bundle, self.file, self.problem))


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
