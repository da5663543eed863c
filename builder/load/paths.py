"""How paths are shown in diagnostics and manifests: relative to the project root when inside it."""

from __future__ import annotations

from pathlib import Path


def display_path(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(path)
