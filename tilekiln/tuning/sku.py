"""Which of a bundle's tuning tables a device selects by: its own SKU's, else the nearest SKU's.

A bundle carries one table per SKU it was tuned on (the manifest's ``tuning_tables``, with the
tuning file's over them: tilekiln/tuning/table.py), and a process may drive an H100 and an H200
at once, so the table is picked per device (``Bundle.table_for``) by :func:`pick_table`. The
:class:`TablePick` it returns is what ``tilekiln/select.py`` looks buckets up in, what ``explain``
names, and where the chosen SKU's fitted model parameters (``TuningTable.model``) come from.
Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tilekiln.manifest import Sku, TuningTable


def sku_distance(table: Sku, device: Sku) -> tuple:
    """How far ``table``'s SKU is from ``device``'s, compared as a tuple (smaller is nearer):

    1. a different compute capability: it decides which instructions run and how fast each SM
       issues them (wgmma against tcgen05; 10.0 against 10.3), so a table of another one ranks
       kernels for another machine, whatever its size;
    2. the SM count's difference: it decides wave quantisation, which tile wins a shape at all
       (the model's ``waves``; an H100 PCIe's 114 SMs split a grid unlike an SXM's 132);
    3. the memory size's difference: tables do not state their card's bandwidth, and within one
       compute capability the memory size tells the HBM generation apart (80 GB HBM3 at 3.35 TB/s
       against 141 GB HBM3e at 4.8 TB/s on Hopper), which ranks the memory-bound shapes (the
       device's own bandwidth, from the driver, prices them in the model: tilekiln/model.py,
       on_device);
    4. the table's device name, so that equal distances pick the same table in every process.

    A device the driver cannot name (Bundle._query_device) never matches a table exactly.

    A fact a table does not state (a manifest of schema 2.6 or older) counts as farther than
    any stated one.
    """
    return (table.compute_capability != device.compute_capability,
            _gap(table.sm_count, device.sm_count), _gap(table.memory_mib, device.memory_mib), table.name)


def _gap(a: int | None, b: int | None) -> float:
    return math.inf if a is None or b is None else abs(a - b)


@dataclass(frozen=True)
class TablePick:
    """The table ``device`` selects by (None: the model decides), and why it is that one."""

    device: Sku
    table: TuningTable | None
    exact: bool = False  # the table was measured on a device of this name
    buckets: dict[str, str] = field(init=False, compare=False, repr=False)  # the table, for look-up

    def __post_init__(self):
        object.__setattr__(self, "buckets", dict(self.table.table) if self.table is not None else {})

    @property
    def model(self) -> tuple[tuple[str, float], ...]:
        """The chosen SKU's fitted selector-model parameters (empty: the model's own constants)."""
        return self.table.model if self.table is not None else ()

    def source(self) -> str:
        """Which table this is, for ``explain``: "table of NVIDIA H200", or the nearest SKU's with
        the facts that made it nearest, or that there is none."""
        if self.table is None:
            return "no table for this device's SKU"
        if self.exact:
            return f"table of {self.table.device}"
        t, d = self.table.sku, self.device
        cc = (f"same {_arch(d.compute_capability)}" if t.compute_capability == d.compute_capability
              else f"{_arch(t.compute_capability)} vs {_arch(d.compute_capability)}")
        return (f"table of {t.name}, nearest SKU to {d.name or 'an unnamed device'}: {cc}, "
                f"{_facts(t.sm_count, d.sm_count, 'SMs')}, "
                f"{_facts(t.memory_mib, d.memory_mib, 'MiB')}")

    def decided(self, tuned: bool, bucket: str) -> str:
        """What decided a choice: the table (``tuned``), or the model and why the table did not."""
        if tuned or self.table is None:
            return self.source()
        return f"no choice for {bucket} in the {self.source()}"


def _arch(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def _facts(table: int | None, device: int | None, unit: str) -> str:
    def text(v: int | None) -> str:
        return "?" if v is None else str(v)
    return f"{text(table)} vs {text(device)} {unit}"


def pick_table(tables: tuple[TuningTable, ...], device: Sku) -> TablePick:
    """The table measured on a device named as ``device`` is; otherwise the nearest SKU's
    (:func:`sku_distance`); with no table, none (the model decides)."""
    for table in tables:
        if table.device == device.name:
            return TablePick(device, table, True)
    if not tables:
        return TablePick(device, None)
    nearest = min(tables, key=lambda t: sku_distance(t.sku, device))
    return TablePick(device, nearest)
