"""The one way tilekiln replaces a file: readers see the old content or the new, never half.

Used by the runtime's tools (``tune``, ``verify``) and by the builder (reports, wheels,
schemas, published trees). Standard library only.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

# What write_atomic names its temporary file: ``.<name>.<pid>-<12 hex>.tmp``.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9]+-[0-9a-f]{12}\.tmp")


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it to disk before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` in one rename: a synced temporary file beside it (same
    directory, so the rename stays on one file system), named after it with the pid and a
    random part, so concurrent writers never share one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
    try:
        write_synced(tmp, data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def temporary_of(name: str) -> str | None:
    """The name of the file that the :func:`write_atomic` temporary file ``name`` replaces, or None
    if ``name`` is not one."""
    found = _TEMPORARY.fullmatch(name)
    return found.group("name") if found else None
