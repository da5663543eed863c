"""Shard outputs: what ``tilekiln build --shard I/N`` writes and ``tilekiln merge`` reads.

One directory per bundle of the selection, even when this shard got none of
its kernels, so a merge can tell a complete set of shards from a partial one::

    <out>/shards/<bundle>/<I>-of-<N>/shard.json        what was built, and from which selection
    <out>/shards/<bundle>/<I>-of-<N>/objects/<id>.o    exported objects of the kernels that passed
    <out>/shards/<bundle>/<I>-of-<N>/cubins/<id>.cubin
    <out>/shards/<bundle>/<I>-of-<N>/build-report.json timings and errors (not an artifact)

``shard.json`` lists per kernel its id, cache key (which names the rendered
source, options, arch and toolchain it was compiled from), ``ok`` or
``failed``, and for those that passed the artifact metadata and the sha256 of
both files. It holds no timings, so a shard is byte-reproducible.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from builder.compile.records import BuildRecord
from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.package.bundle import bundle_name
from builder.package.publish import REPORT_NAME, publish_tree

SHARD_SCHEMA = 1
SHARD_FILE = "shard.json"


def shard_dir(out_dir: Path, bundle: str, index: int, count: int) -> Path:
    return out_dir / "shards" / bundle / f"{index}-of-{count}"


@dataclass(frozen=True)
class ShardKernel:
    kernel_id: str
    key: str
    ok: bool
    meta: Mapping | None
    object_file: str = ""
    object_sha256: str = ""
    cubin_file: str = ""
    cubin_sha256: str = ""


@dataclass(frozen=True)
class Shard:
    path: Path
    bundle: str
    arch: str
    index: int
    count: int
    selection: Mapping[str, tuple[str, ...]]  # pipelines, arches, only
    kernels: tuple[ShardKernel, ...]

    def read(self, relative: str, sha256: str) -> bytes:
        data = (self.path / relative).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise DiagnosticError([Diagnostic(
                "SHARD-CORRUPT", f"{relative} does not match its sha256 in {SHARD_FILE}", Location(str(self.path)),
                "copy the shard again or rebuild it")])
        return data

    def report_rows(self) -> dict[str, dict]:
        """The shard's build report by kernel id (errors and timings); empty if it is missing."""
        try:
            report = json.loads((self.path / REPORT_NAME).read_bytes())
            return {row["kernel"]: row for row in report["kernels"]}
        except (OSError, ValueError, KeyError, TypeError):
            return {}


def write_shard(out_dir: Path, arch: str, index: int, count: int, selection: Mapping[str, tuple[str, ...]],
                records: list[BuildRecord], report: bytes) -> Path:
    files: dict[str, bytes] = {}
    kernels = []
    for r in records:
        row = {"id": r.kernel_id, "key": r.key, "status": "ok" if r.ok else "failed"}
        if r.ok:
            obj, cub = f"objects/{r.kernel_id}.o", f"cubins/{r.kernel_id}.cubin"
            files[obj], files[cub] = r.object_bytes, r.cubin
            row.update(meta=r.artifact_meta(),
                       files={"object": {"path": obj, "sha256": hashlib.sha256(r.object_bytes).hexdigest()},
                              "cubin": {"path": cub, "sha256": hashlib.sha256(r.cubin).hexdigest()}})
        kernels.append(row)
    bundle = bundle_name(arch)
    description = {"schema": SHARD_SCHEMA, "bundle": bundle, "arch": arch, "shard": [index, count],
                   "selection": {k: list(v) for k, v in selection.items()}, "kernels": kernels}
    files[SHARD_FILE] = (json.dumps(description, indent=1, sort_keys=True) + "\n").encode()
    return publish_tree(out_dir, shard_dir(out_dir, bundle, index, count), files, report)


def load_shards(paths: list[Path]) -> list[Shard]:
    """Read shard directories; a directory without ``shard.json`` is searched one and two levels down
    (so ``artifacts/shards`` or ``artifacts/shards/sm90a`` name all shards below them)."""
    found: list[Path] = []
    problems: list[Diagnostic] = []
    for path in paths:
        if (path / SHARD_FILE).is_file():
            found.append(path)
            continue
        below = sorted(p.parent for p in [*path.glob(f"*/{SHARD_FILE}"), *path.glob(f"*/*/{SHARD_FILE}")])
        if not below:
            problems.append(Diagnostic("SHARD-MISSING", f"{path} holds no {SHARD_FILE}", Location(str(path)),
                                       "pass the directories written by `tilekiln build --shard I/N` "
                                       "(artifacts/shards/<bundle>/<I>-of-<N>)"))
        found.extend(below)
    shards = []
    for path in dict.fromkeys(p.resolve() for p in found):
        try:
            shards.append(_parse(path, json.loads((path / SHARD_FILE).read_bytes())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(Diagnostic("SHARD-CORRUPT", f"cannot read {SHARD_FILE}: {exc}",
                                       Location(str(path / SHARD_FILE)), "copy the shard again or rebuild it"))
    if problems:
        raise DiagnosticError(problems)
    return shards


def _parse(path: Path, data: dict) -> Shard:
    if data["schema"] != SHARD_SCHEMA:
        raise ValueError(f"shard schema {data['schema']} is not {SHARD_SCHEMA}; rebuild the shards with this tilekiln")
    kernels = []
    for k in data["kernels"]:
        if k["status"] == "ok":
            f = k["files"]
            kernels.append(ShardKernel(k["id"], k["key"], True, k["meta"], f["object"]["path"],
                                       f["object"]["sha256"], f["cubin"]["path"], f["cubin"]["sha256"]))
        else:
            kernels.append(ShardKernel(k["id"], k["key"], False, None))
    index, count = data["shard"]
    selection = {name: tuple(data["selection"][name]) for name in ("pipelines", "arches", "only")}
    return Shard(path, data["bundle"], data["arch"], int(index), int(count), selection, tuple(kernels))
