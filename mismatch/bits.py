"""Log-prob values as the bits of their original dtype: the canonical form of a dump.

A value is stored as the unsigned integer its original dtype's bytes spell (``float32`` -> 32 bits),
written as fixed-width lowercase hex (``-1.0`` in float32 is ``"bf800000"``). Comparing those
integers is the bitwise compare DESIGN.md section 4 asks for: ``+0.0`` and ``-0.0`` differ, and so do
two NaNs with different payloads. The JSON float beside it in a dump is a convenience copy.

    dtype      width   from a Python float
    float64    64      exact
    float32    32      exact when the float is a float32 value (torch's ``.tolist()`` gives those)
    bfloat16   16      the top half of the float32 bits; the bottom half must be zero
    float16    16      exact when the float is a float16 value
"""

import math
import struct

# dtype name -> (bit width, struct format of the same width, or None for bfloat16).
DTYPES: dict[str, tuple[int, str | None]] = {
    "float64": (64, ">d"),
    "float32": (32, ">f"),
    "bfloat16": (16, None),
    "float16": (16, ">e"),
}
_UNSIGNED = {64: ">Q", 32: ">I", 16: ">H"}
_HEX_DIGITS = "0123456789abcdef"


def width(dtype: str) -> int:
    """Bits per value of ``dtype``; ValueError naming the known dtypes otherwise."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    return DTYPES[dtype][0]


def to_bits(value: float, dtype: str) -> int:
    """The bits of ``value`` as ``dtype``. ValueError when ``value`` is not exactly a ``dtype`` value
    (storing it would round it, and the dump would no longer hold what the producer computed)."""
    bits = width(dtype)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    value = float(value)
    fmt = DTYPES[dtype][1]
    if dtype == "bfloat16":
        pattern = struct.unpack(">I", struct.pack(">f", value))[0]
        if pattern & 0xFFFF:
            raise ValueError(f"{value!r} is not a bfloat16 value")
        pattern >>= 16
    else:
        try:
            packed = struct.pack(fmt, value)
        except OverflowError:
            raise ValueError(f"{value!r} is out of the {dtype} range") from None
        pattern = struct.unpack(_UNSIGNED[bits], packed)[0]
    if not math.isnan(value) and from_bits(pattern, dtype) != value:
        raise ValueError(f"{value!r} is not a {dtype} value (it would round)")
    return pattern


def from_bits(pattern: int, dtype: str) -> float:
    """The Python float that ``dtype`` bits ``pattern`` spell (exact; NaN payloads are not kept)."""
    bits = width(dtype)
    if dtype == "bfloat16":
        return struct.unpack(">f", struct.pack(">I", pattern << 16))[0]
    return struct.unpack(DTYPES[dtype][1], struct.pack(_UNSIGNED[bits], pattern))[0]


def normalize(pattern: int, dtype: str) -> int:
    """An integer view of ``dtype`` values, signed or unsigned (torch's ``.view(torch.int32)``
    gives signed ones), as the unsigned pattern. ValueError when it does not fit the width."""
    bits = width(dtype)
    if not isinstance(pattern, int) or isinstance(pattern, bool):
        raise ValueError(f"expected an integer bit pattern, got {pattern!r}")
    if not -(1 << (bits - 1)) <= pattern < (1 << bits):
        raise ValueError(f"{pattern} does not fit in {bits} bits")
    return pattern & ((1 << bits) - 1)


def to_hex(pattern: int, dtype: str) -> str:
    """Fixed-width lowercase hex: ``width(dtype) // 4`` digits."""
    return format(pattern, f"0{width(dtype) // 4}x")


def from_hex(text: str, dtype: str) -> int:
    """Inverse of ``to_hex``; ValueError unless ``text`` is exactly that many hex digits."""
    digits = width(dtype) // 4
    if not isinstance(text, str) or len(text) != digits or text.strip(_HEX_DIGITS):
        raise ValueError(f"expected {digits} lowercase hex digits, got {text!r}")
    return int(text, 16)
