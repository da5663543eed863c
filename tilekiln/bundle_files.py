"""What a bundle directory may hold, how the runtime reads its files, and how it tells later
that they have not changed (docs/security.md). Standard library only.

A bundle directory holds exactly ``manifest.json``, the files its ``files`` lists, the
directories on their way, and these files written beside them after or apart from the build:

- ``signature.json``: ``tilekiln sign``'s signature of the manifest (tilekiln/signing.py);
- ``tuning.json``: ``tilekiln tune``'s table (tilekiln/tuning/table.py verifies it by its own digest);
- ``build-report.json``: the build's timings, which the runtime never reads;
- the temporary file ``write_atomic`` (tilekiln/_files.py) writes while it replaces one of
  the last two, so that a load racing a tune or a rebuild's report is not refused.

Every entry is a regular file or a directory. :func:`check_entries` refuses, by name, anything
else: another file (a stray library in ``lib/``, a ``.py`` a loader might import), a symbolic
link wherever it points, a FIFO, a socket or a device.

Reading. :func:`scan` lists the tree with ``lstat`` and opens nothing, so a FIFO cannot block
it. :func:`read_file` opens a file one path component at a time below the bundle's directory,
each with ``O_NOFOLLOW`` (a link swapped in after the scan is refused, not followed); it checks
with ``lstat`` that the name is a regular file before it opens it, opens it with
``O_NONBLOCK`` (a FIFO swapped in meanwhile cannot block the open either) and checks the
opened file again with ``fstat`` before it reads it whole. Callers verify the bytes it returns
and use those bytes, never the path again.

Identity. :func:`identity` of a scan is each entry's name and kind (but those of the
regular files of :data:`REWRITTEN`) and, for the files the runtime verifies (the manifest, the listed files, the signature), ``(device, inode, size,
modification time, change time, mode)``: a file rewritten in place gets a new change time (the
kernel sets it; a user cannot set it back), a file replaced gets a new inode, an entry added
or removed changes the names. :func:`read_file` returns the ``fstat`` taken before it read, so
an identity made from those and the scan describes exactly the bytes that were verified.
Equal identities therefore mean the bytes verified then are the bytes there now, unless a
privileged user reset the clock, or a same-size rewrite landed within the file system's
timestamp granularity (a few milliseconds) of the verification.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterable

from tilekiln._files import temporary_of
from tilekiln.errors import BundleIntegrityError

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "signature.json"
TUNING_NAME = "tuning.json"
BUILD_REPORT_NAME = "build-report.json"
# Files beside the manifest that its `files` does not list.
UNLISTED = (SIGNATURE_NAME, TUNING_NAME, BUILD_REPORT_NAME)
# Of those, the ones rewritten in place (write_atomic) while a bundle may be loaded.
REWRITTEN = (TUNING_NAME, BUILD_REPORT_NAME)

_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link"),
          (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
          (stat.S_ISBLK, "block device"))
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Scan = dict[str, os.stat_result]  # relative path ("/"-separated) -> its lstat


def kind(st: os.stat_result) -> str:
    for test, name in _KINDS:
        if test(st.st_mode):
            return name
    return "special file"


def scan(label: str, root: int) -> Scan:
    """Every entry below the directory open as ``root`` with its ``lstat``; symbolic links are
    listed, not followed. Raises :class:`BundleIntegrityError` when it cannot be listed."""
    try:
        return _scan(root)
    except OSError as exc:
        raise BundleIntegrityError(label, ".", f"cannot be listed ({exc.strerror})") from None


def _scan(root: int) -> Scan:
    found: Scan = {}
    pending = [("", os.dup(root))]
    try:
        while pending:
            prefix, fd = pending.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        relative = prefix + entry.name
                        st = found[relative] = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            pending.append((relative + "/", os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=fd)))
            finally:
                os.close(fd)
    finally:
        for _, fd in pending:
            os.close(fd)
    return found


def check_entries(label: str, entries: Scan, listed: Iterable[str]) -> None:
    """Refuse every entry that is not a listed file, an unlisted file of :data:`UNLISTED` (or a
    temporary one of :data:`REWRITTEN`), or a directory on the way to a listed file; and every
    one of them that is not a regular file or a directory. Raises :class:`BundleIntegrityError`
    naming the first such entry, in path order."""
    files = {MANIFEST_NAME, *UNLISTED, *listed}
    directories = {parent for f in files for parent in _parents(f)}
    for relative in sorted(entries):
        what = kind(entries[relative])
        if what == "directory" and relative in directories:
            continue
        if what == "file" and (relative in files or _rewritten(relative)):
            continue
        if relative in files:
            raise BundleIntegrityError(label, relative, f"is a {what}, not a regular file", _fix(relative))
        if relative in directories:
            raise BundleIntegrityError(label, relative, f"is a {what}, not a directory", _fix(relative))
        raise BundleIntegrityError(
            label, relative, f"is a {what} that manifest.json does not list",
            f"remove it (a bundle holds only the files its manifest lists, {', '.join(UNLISTED)}), or reinstall "
            "the bundle")


def read_file(label: str, root: int, relative: str, fix: str | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``relative`` below the directory open as ``root``, and its
    ``fstat`` from before they were read. Raises :class:`BundleIntegrityError` naming the file
    (and ``fix``, by default to reinstall the bundle) when it is missing, unreadable, not a
    regular file, or a symbolic link or below one."""
    fix = fix or _fix(relative)
    *parents, name = relative.split("/")
    opened: list[int] = []
    try:
        where = root
        for part in parents:
            where = os.open(part, _DIRECTORY_FLAGS, dir_fd=where)
            opened.append(where)
        st = os.stat(name, dir_fd=where, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise BundleIntegrityError(label, relative, f"is a {kind(st)}, not a regular file", fix)
        fd = os.open(name, _FILE_FLAGS, dir_fd=where)
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BundleIntegrityError(label, relative, f"became a {kind(st)} while it was opened", fix)
            return f.read(), st
    except FileNotFoundError:
        raise BundleIntegrityError(label, relative, "missing", fix) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            problem = "is a symbolic link or lies below one, or below a file"
        else:
            problem = f"unreadable ({exc.strerror})"
        raise BundleIntegrityError(label, relative, problem, fix) from None
    finally:
        for fd in reversed(opened):
            os.close(fd)


def open_directory(label: str, directory: Path) -> int:
    """A descriptor of the bundle directory itself (which may be reached through a link, as an
    installed path often is); close it after use."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise BundleIntegrityError(label, ".", f"cannot be opened as a directory ({exc.strerror})") from None


Identity = frozenset


def identity(entries: Scan, verified: dict[str, os.stat_result]) -> Identity:
    """The names and kinds of ``entries``, with the stat key of each file in ``verified``. The
    files of :data:`REWRITTEN` and their temporaries are left out while they are regular files:
    a tune or a build rewrites them while the bundle is loaded, and the runtime reads the
    tuning file only through :func:`read_file` and its own digest."""
    return frozenset((relative, what, _key(verified[relative]) if relative in verified else None)
                     for relative, st in entries.items()
                     if (what := kind(st)) != "file" or not _rewritten(relative))


def current_identity(label: str, directory: Path, verified: Iterable[str]) -> Identity:
    """The identity of ``directory`` as it is now, the ``verified`` files' stat keys from a fresh
    scan; raises :class:`BundleIntegrityError` when it cannot be opened."""
    root = open_directory(label, directory)
    try:
        entries = scan(label, root)
    finally:
        os.close(root)
    return identity(entries, {r: entries[r] for r in verified if r in entries})


def _rewritten(relative: str) -> bool:
    """Whether ``relative`` is a file of :data:`REWRITTEN` or the temporary file of one."""
    return relative in REWRITTEN or temporary_of(relative) in REWRITTEN


def _parents(relative: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``."""
    parts = relative.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _fix(relative: str) -> str:
    if relative in REWRITTEN:
        return f"delete {relative}"
    return "reinstall or rebuild the bundle"
