"""Pieces every pipeline's plan shares: alignment and the shared-memory tally."""

from __future__ import annotations

from dataclasses import dataclass

from builder.load.facts import PipelineFacts
from tilekiln.spec import MAX_EXTENT, Contract, DTypes


def tma_contract(dtypes: DTypes, facts: PipelineFacts) -> Contract:
    """Every operand is read or written by TMA: 16-byte aligned bases and strides (in each
    operand's elements), and the 32-bit extents of the launch's plan block."""
    align = facts.require("tma_alignment_bytes")
    return Contract(align, (dtypes.a.elements_per(align), dtypes.b.elements_per(align),
                            dtypes.c.elements_per(align)), MAX_EXTENT)


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class SmemUse:
    """Shared memory of one CTA, by buffer. ``dynamic_bytes`` is the template's
    ``Storage`` struct (alignment padding included); the DSL's static
    reservation comes on top."""

    barrier_bytes: int
    a_bytes: int
    b_bytes: int
    epilogue_bytes: int
    dynamic_bytes: int
    static_bytes: int
    operand_end: int  # offset just past the last MMA operand byte (descriptor reach)
    scale_bytes: int = 0  # block-scale factor rings (SFA + SFB)
    table_bytes: int = 0  # int32 tables beside the barriers (a grouped kernel's group table)

    @property
    def total(self) -> int:
        return self.dynamic_bytes + self.static_bytes

    @property
    def operand_address_end(self) -> int:
        """The shared-window address just past the last MMA operand byte, what a descriptor
        encodes: the dynamic ``Storage`` struct starts after the static reservation."""
        return self.static_bytes + self.operand_end

    @property
    def padding(self) -> int:
        return (self.dynamic_bytes - self.barrier_bytes - self.a_bytes - self.b_bytes - self.epilogue_bytes
                - self.scale_bytes - self.table_bytes)


def storage_layout(barriers: int, a: int, b: int, epilogue: int, align: int, scales: int = 0) -> tuple[int, int]:
    """(struct size, operand end) of a template ``Storage`` struct: barriers, then the
    scale rings (if any), A, B and the epilogue buffer, each aligned to ``align``."""
    offset = align_up(barriers, align)
    if scales:
        offset = align_up(offset + scales, align)
    offset = align_up(offset + a, align)
    operand_end = offset + b
    if not epilogue:
        return align_up(operand_end, align), operand_end
    return align_up(align_up(operand_end, align) + epilogue, align), operand_end
