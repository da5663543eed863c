"""The only place the builder reads environment variables.

``TILEKILN_ROOT``       project root (default: the current directory)
``TILEKILN_ARTIFACTS``  output directory (default: ``<root>/artifacts``)
``TILEKILN_CACHE_DIR``  build cache (default: ``<artifacts>/.cache``); share it
                        between checkouts or CI runs to reuse compiled kernels
``TILEKILN_DEBUG``      set (and not ``0``): an internal error prints its
                        traceback, as ``tilekiln --debug`` does
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    project_root: Path
    artifacts_dir: Path
    cache_dir: Path
    debug: bool


def settings(root: Path | None = None) -> Settings:
    project = (root or Path(os.environ.get("TILEKILN_ROOT", "."))).resolve()
    artifacts = Path(os.environ.get("TILEKILN_ARTIFACTS", project / "artifacts")).resolve()
    cache = Path(os.environ.get("TILEKILN_CACHE_DIR", artifacts / ".cache")).resolve()
    return Settings(project, artifacts, cache, os.environ.get("TILEKILN_DEBUG", "0") not in ("", "0"))
