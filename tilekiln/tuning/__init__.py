"""Tuning: measure which kernel is fastest per shape bucket, and keep the table beside the bundle.

One job per module; none imports torch at import time, and this package
imports none of them, so the runtime (``tilekiln/bundle.py``, which reads
tuning files) never pays for the GPU-side ones:

    timing.py   time GEMMs on a GPU (CUDA events and graphs, steady-state blocks, interleaving)
    policy.py   what a tune measures and what wins: candidates, screen, finalists, ``tune``
    table.py    the bundle's tuning file (tuning.json): read, verify, write, overlay
    sku.py      which table a device selects by: its SKU's, else the nearest SKU's
    merge.py    one table from several runs' measurements (``--merge``, no GPU)

The command line is ``python3 -m tilekiln.tune`` (tilekiln/tune.py).
"""
