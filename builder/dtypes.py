"""The one spelling table for element types.

Each dtype has one token (used in YAML, kernel ids, manifests and the runtime),
its storage width in bits and the CuTe DSL type name the templates use.
"""

from __future__ import annotations

import enum


class DType(str, enum.Enum):
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    TF32 = "tf32"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    I8 = "i8"
    U8 = "u8"
    I32 = "i32"
    E2M1 = "e2m1"
    E8M0 = "e8m0"
    E5M3 = "e5m3"

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def cutlass_name(self) -> str:
        return _CUTLASS[self]

    def elements_per(self, nbytes: int) -> int:
        """How many elements fill ``nbytes`` bytes (e.g. 16 B of bf16 = 8)."""
        return nbytes * 8 // self.bits


_BITS = {
    DType.BF16: 16, DType.F16: 16, DType.F32: 32, DType.TF32: 32, DType.E4M3: 8, DType.E5M2: 8,
    DType.I8: 8, DType.U8: 8, DType.I32: 32, DType.E2M1: 4, DType.E8M0: 8, DType.E5M3: 8,
}

_CUTLASS = {
    DType.BF16: "BFloat16", DType.F16: "Float16", DType.F32: "Float32", DType.TF32: "TFloat32",
    DType.E4M3: "Float8E4M3FN", DType.E5M2: "Float8E5M2", DType.I8: "Int8", DType.U8: "Uint8",
    DType.I32: "Int32", DType.E2M1: "Float4E2M1FN", DType.E8M0: "Float8E8M0FNU",
    DType.E5M3: "Float8E5M3",
}
