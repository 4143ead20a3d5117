"""Byte sizes as flags write them (``64K``, ``1M``, ``2G``: binary units) and as tables print them."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(text: str, flag: str) -> list[int]:
    """``"64K,1M"`` -> ``[65536, 1048576]``.

    Raises:
        ValueError: a part that is not a positive size, naming ``flag``.
    """
    sizes = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("B").removesuffix("I")
        digits, unit = (part[:-1], part[-1]) if part[-1:] in ("K", "M", "G") else (part, "")
        if not digits.isdigit() or int(digits) < 1:
            raise ValueError(f"{flag}: expected comma-separated sizes like 64K,1M,16M, got {text!r}")
        sizes.append(int(digits) * _UNITS[unit])
    return sizes


def size_name(size: int) -> str:
    """``65536`` -> ``"64 KiB"`` (the largest unit that divides it)."""
    for unit in ("G", "M", "K"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]} {unit}iB"
    return f"{size} B"
