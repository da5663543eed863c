"""Content-addressed build cache (compiled kernels, linked libraries).

Layout: ``<root>/v1/<kind>/<key[:2]>/<key>/`` holding the entry's files and
``meta.json``, which is written last and names every file with its sha256.

Concurrency model:

* An entry is built in ``<root>/tmp/<unique>/`` (files fsynced), then moved
  into place with one ``rename`` of the directory while holding the entry's
  file lock, after checking again that no valid entry appeared meanwhile.
  A reader therefore sees either no entry or a complete one; a process
  killed at any point leaves at most a stray temp directory, never a
  half-written entry. Work is done outside the lock; the lock is held only
  for the check-and-rename (milliseconds).
* A read verifies ``meta.json`` (its full key must match: the directory name
  alone is never trusted) and every file's sha256, and hands out the bytes it
  verified, never a second read of the files. A corrupt entry is a miss; it
  is moved to ``<root>/quarantine/`` so the next write can replace it.
* Two builds missing one entry compile it once: see :mod:`builder.compile.claims`
  (locks under ``<root>/locks/`` too).
* Temporary names carry the host and process id, so :meth:`ContentCache.sweep`
  can remove what killed processes of this host left behind without touching
  a live writer's work (the cache may be shared between machines).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from filelock import FileLock

from builder.fsutil import fsync_dir, remove_path
from tilekiln._files import write_synced

SCHEMA = 1


def canonical_key(parts: Mapping[str, object]) -> str:
    """sha256 of the canonical JSON of ``parts`` (sorted keys, no whitespace)."""
    text = json.dumps({"schema": SCHEMA, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    key: str
    directory: Path
    meta: dict
    files: Mapping[str, bytes]  # as verified against meta.json, or as written

    def read(self, name: str) -> bytes:
        return self.files[name]


class ContentCache:
    def __init__(self, root: Path):
        self.root = root

    def _entry_dir(self, kind: str, key: str) -> Path:
        return self.root / f"v{SCHEMA}" / kind / key[:2] / key

    def _lock(self, kind: str, key: str) -> FileLock:
        path = self.root / "locks" / kind / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path))

    def get(self, kind: str, key: str) -> CacheEntry | None:
        directory = self._entry_dir(kind, key)
        if not directory.exists():
            return None
        entry = self._verify(directory, key)
        if entry is None:
            self._quarantine(kind, key, directory)
        return entry

    def temp_path(self, label: str) -> Path:
        """A fresh path under ``<root>/tmp`` that :meth:`sweep` recognises once its writer is dead."""
        directory = self.root / "tmp"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / f"{label}.{_HOST}.{os.getpid()}.{uuid.uuid4().hex}"

    @contextmanager
    def scratch(self, label: str) -> Iterator[Path]:
        """A private working directory under ``<root>/tmp``, removed afterwards."""
        path = self.temp_path(label)
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def sweep(self) -> int:
        """Remove temporary files and directories of dead processes of this host; return how many."""
        removed = 0
        try:
            children = list((self.root / "tmp").iterdir())
        except OSError:
            return 0
        for path in children:
            parts = path.name.rsplit(".", 3)
            if len(parts) != 4 or parts[1] != _HOST or not parts[2].isdigit() or _alive(int(parts[2])):
                continue
            remove_path(path)
            removed += 1
        return removed

    def put(self, kind: str, key: str, files: Mapping[str, bytes], meta: Mapping[str, object]) -> CacheEntry:
        tmp = self.temp_path(key)
        tmp.mkdir()
        try:
            for name, data in files.items():
                write_synced(tmp / name, data)
            record = {"key": key, "meta": dict(meta),
                      "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}}
            write_synced(tmp / "meta.json", json.dumps(record, sort_keys=True, indent=1).encode())
            final = self._entry_dir(kind, key)
            final.parent.mkdir(parents=True, exist_ok=True)
            with self._lock(kind, key):
                existing = self._verify(final, key) if final.exists() else None
                if existing is not None:
                    return existing
                if final.exists():
                    self._quarantine(kind, key, final)
                os.rename(tmp, final)
                fsync_dir(final.parent)
            return CacheEntry(key, final, dict(meta), dict(files))
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _verify(self, directory: Path, key: str) -> CacheEntry | None:
        try:
            record = json.loads((directory / "meta.json").read_bytes())
            if record.get("key") != key:
                return None
            files = {}
            for name, digest in record["files"].items():
                files[name] = (directory / name).read_bytes()
                if hashlib.sha256(files[name]).hexdigest() != digest:
                    return None
            return CacheEntry(key, directory, record["meta"], files)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _quarantine(self, kind: str, key: str, directory: Path) -> None:
        target = self.root / "quarantine" / f"{kind}-{key}-{uuid.uuid4().hex[:8]}"
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(directory, target)
        except OSError:
            pass  # another process moved or replaced it first


# Dots would break the ``label.host.pid.uuid`` split of temporary names.
_HOST = socket.gethostname().replace(".", "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
