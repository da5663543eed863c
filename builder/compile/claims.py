"""Compile claims: builds that share a cache compile each missing object once.

Before it compiles an object the cache lacks, a build claims the object's
key: an exclusive file lock ``<cache>/locks/<kind>/<key>.claim``, taken
without waiting and held until the object is committed to the cache or has
failed. A build that finds a key claimed by another build compiles its other
misses first, then waits for that claim and looks in the cache again: the
holder's entry is there, or the holder failed or died (the OS releases the
lock of a dead process), and the waiting build claims the key and compiles
the object itself.

No deadlock: a build waits for a claim only while it holds none. It holds
one open file per claim, at most :data:`MAX_HELD` at once.

Must not import the DSL or the pipeline; ``builder.pipeline.build`` drives it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, TypeVar

from filelock import FileLock, Timeout

# Far below the usual limit of 1024 open files, leaving room for the pool's pipes.
MAX_HELD = 256

T = TypeVar("T")


class Claims:
    """The claims one build holds on keys of one kind of cache entry; a context manager that releases them all."""

    def __init__(self, cache_root: Path, kind: str):
        self._dir = cache_root / "locks" / kind
        self._held: dict[str, FileLock] = {}

    def __enter__(self) -> "Claims":
        return self

    def __exit__(self, *exc) -> None:
        for key in list(self._held):
            self.release(key)

    def take(self, items: Iterable[T], key_of) -> tuple[list[T], list[T]]:
        """Claim what no build holds, at most :data:`MAX_HELD` held: (claimed, the rest).

        A key this build holds already (two items of one key) goes to the rest: its
        object is in the cache, or failed, once this build releases it.
        """
        claimed, rest = [], []
        for item in items:
            key = key_of(item)
            if key not in self._held and len(self._held) < MAX_HELD and self._acquire(key, timeout=0):
                claimed.append(item)
            else:
                rest.append(item)
        return claimed, rest

    def wait(self, key: str) -> None:
        """Block until this build holds ``key``'s claim: its holder committed, failed or died."""
        self._acquire(key, timeout=-1)

    def release(self, key: str) -> None:
        lock = self._held.pop(key, None)
        if lock is not None:
            lock.release()

    def _acquire(self, key: str, timeout: float) -> bool:
        self._dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self._dir / f"{key}.claim"))
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            return False
        self._held[key] = lock
        return True
