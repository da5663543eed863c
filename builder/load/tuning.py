"""The measured selection tables kept in ``catalog/tuning/<bundle>.json``.

``python3 -m tilekiln.tune`` measures a bundle on a GPU machine and writes
the bundle's tuning file (tilekiln/tuning/table.py); its ``--table-out`` file,
``{device, table, measurements}``, is what is committed here. Every later
build ships the committed table as the manifest's ``tuning`` key
(builder/package/manifest.py), and validation treats the kernels it names as
selectable (rule SHADOWED). Table values are choice labels: a kernel id, or
``<id>/splitk<S>`` (tilekiln/splitk.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from tilekiln.splitk import parse_label


def tuning_dir(root: Path) -> Path:
    return root / "catalog" / "tuning"


def read_tuning(root: Path, bundle: str) -> dict | None:
    """The committed tuning data of ``bundle``, or None if it has none."""
    path = tuning_dir(root) / f"{bundle}.json"
    return json.loads(path.read_text()) if path.exists() else None


def tuned_kernel_ids(root: Path) -> frozenset[str]:
    """Every kernel id some committed tuning table names."""
    ids = set()
    for path in sorted(tuning_dir(root).glob("*.json")):
        ids.update(parse_label(choice)[0] for choice in read_tuning(root, path.stem).get("table", {}).values())
    return frozenset(ids)
