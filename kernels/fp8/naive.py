"""Packed FP8 storage formats for the paged KV cache: the MLA latent and the DSA index key.

Both quantise to ``float8_e4m3fn`` with float32 scales ``amax / 448`` (448 is e4m3fn's largest finite
value), and pack each token into one row of bytes that a GPU kernel reads in place. Every multi-byte
field is stored little-endian (what ``Tensor.view(torch.uint8)`` gives on CPUs and GPUs alike).

MLA latent, FlashMLA's FP8 layout generalised (``G = Dc // group``, ``group = min(128, Dc)``)::

    byte 0          Dc            Dc + 4G              Dc + 4G + 2Dr
         | e4m3 x Dc | float32 x G | bfloat16 x Dr      |
           latent      one scale     rope part, not quantised
           values      per group

For ``Dc = 512, Dr = 64``: 512 + 16 + 128 = 656 bytes per token.

DSA index key, one scale for the whole key::

    byte 0          Di            Di + 4
         | e4m3 x Di | float32 x 1 |

For ``Di = 128``: 132 bytes per token.

Quantisation of a group ``x`` (computed in float32)::

    scale = max(amax(|x|) / 448, SCALE_FLOOR)
    q     = clamp(x / scale, -448, 448).to(float8_e4m3fn)      # round to nearest even
    x_hat = q.float() * scale

The floor keeps an all-zero group finite (it stores ``scale = SCALE_FLOOR`` and zeros); every group with
``amax >= 448 * SCALE_FLOOR`` (about 4.5e-10, far below real activations) keeps full relative precision,
and a smaller group still meets the bound below, with ``s = SCALE_FLOOR``. The clamp only
guards against ``x / scale`` rounding a hair above 448: some PyTorch versions cast values past 464 to
e4m3fn's NaN code rather than saturating. Inputs must be finite. The bytes are a pure function of the
input values, the same on every device (both divisions are IEEE tensor-by-tensor divisions).

Error bound per element (``s`` the group's scale; e4m3 has 3 mantissa bits, smallest normal ``2^-6``,
subnormal spacing ``2^-9``): rounding ``y = x / s`` to nearest gives ``|q - y| <= 2^-4 |y|`` where ``y``
is normal and ``|q - y| <= 2^-10`` where it is subnormal, so, with float32 rounding (``2^-24``) folded
in, ``|x - x_hat| <= (2^-4 + 2^-20) |x| + (2^-10 + 2^-20) s``; with ``s = amax / 448`` the absolute
term is about ``amax / 458752``, so it matters only for elements far below their group's largest.
"""

import torch

E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value; scales map each group's ``amax`` onto it."""

SCALE_FLOOR = 1e-12
"""Smallest stored scale, so an all-zero group gets a finite scale (and dequantises to zeros)."""

LATENT_GROUP = 128
"""Channels per latent scale (FlashMLA's tile width); latents narrower than this use one group."""


def latent_fp8_group_size(latent_dim: int) -> int:
    """Channels per scale for a latent of ``latent_dim`` channels: ``min(128, latent_dim)``.

    Raises:
        ValueError: when ``latent_dim`` is not positive or not a multiple of the group size.
    """
    if latent_dim <= 0:
        raise ValueError(f"latent_dim must be positive, got {latent_dim}")
    group = min(LATENT_GROUP, latent_dim)
    if latent_dim % group:
        raise ValueError(f"latent_dim {latent_dim} is not a multiple of the scale group {group}")
    return group


def latent_fp8_bytes(latent_dim: int, rope_dim: int) -> int:
    """Bytes per token of a packed latent: ``Dc + 4 * (Dc // group) + 2 * Dr`` (656 for 512, 64)."""
    if rope_dim < 0:
        raise ValueError(f"rope_dim must be non-negative, got {rope_dim}")
    group = latent_fp8_group_size(latent_dim)
    return latent_dim + 4 * (latent_dim // group) + 2 * rope_dim


def index_key_fp8_bytes(index_dim: int) -> int:
    """Bytes per token of a packed index key: ``Di + 4`` (132 for 128)."""
    if index_dim <= 0:
        raise ValueError(f"index_dim must be positive, got {index_dim}")
    return index_dim + 4


def _quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x [N, D]`` in groups of ``group`` channels.

    Returns:
        ``(q [N, D] float8_e4m3fn, scale [N, D // group] float32)``, both contiguous.
    """
    n, d = x.shape
    grouped = x.to(torch.float32).reshape(n, d // group, group)
    amax = grouped.abs().amax(dim=-1)
    # tensor / tensor: CUDA divides by a Python scalar as a multiply by its rounded reciprocal, which
    # would make GPU bytes differ from CPU bytes in the scale's last bit
    scale = (amax / torch.full_like(amax, E4M3_MAX)).clamp_min(SCALE_FLOOR)
    scaled = (grouped / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn).reshape(n, d), scale.contiguous()


def _dequantize_groups(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """``q [N, D] float8_e4m3fn`` times ``scale [N, D // group]``, as float32 ``[N, D]``."""
    n, d = q.shape
    grouped = q.to(torch.float32).reshape(n, d // group, group) * scale.unsqueeze(-1)
    return grouped.reshape(n, d)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret ``t [N, D]`` as its little-endian bytes ``[N, D * itemsize]`` uint8."""
    return t.contiguous().view(torch.uint8)


def _from_bytes(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a byte slice ``raw [N, D * itemsize]`` as ``[N, D]`` of ``dtype``.

    The slice is copied to fresh storage first: a view into a packed row starts at an arbitrary byte
    offset, and ``view(dtype)`` needs the offset and row stride aligned to ``dtype``'s size. The copy
    is flattened so that zero-width slices (no rope part) view too.
    """
    n, width = raw.shape[0], raw.shape[1] // dtype.itemsize
    flat = raw.clone(memory_format=torch.contiguous_format).view(-1)
    return flat.view(dtype).view(n, width)


def _check_2d(name: str, t: torch.Tensor, dim: int) -> None:
    if t.dim() != 2 or t.shape[1] != dim:
        raise ValueError(f"{name} must have shape [N, {dim}], got {list(t.shape)}")


def _check_packed(packed: torch.Tensor, row_bytes: int) -> None:
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be uint8, got {packed.dtype}")
    _check_2d("packed", packed, row_bytes)


def pack_latent_fp8(latent: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
    """Pack MLA latents and their rope keys into FP8 rows (layout in the module docstring).

    Args:
        latent: ``[N, Dc]`` compressed KV latent, any float dtype and strides.
        k_rope: ``[N, Dr]`` rope part of the key, stored as bfloat16 unquantised.

    Returns:
        ``[N, latent_fp8_bytes(Dc, Dr)]`` uint8, contiguous, on ``latent``'s device.
    """
    if latent.dim() != 2:
        raise ValueError(f"latent must have shape [N, Dc], got {list(latent.shape)}")
    n, latent_dim = latent.shape
    if k_rope.dim() != 2 or k_rope.shape[0] != n:
        raise ValueError(f"k_rope must have shape [{n}, Dr], got {list(k_rope.shape)}")
    group = latent_fp8_group_size(latent_dim)
    q, scale = _quantize_groups(latent, group)
    rope = k_rope.to(device=latent.device, dtype=torch.bfloat16)
    return torch.cat([_as_bytes(q), _as_bytes(scale), _as_bytes(rope)], dim=-1)


def unpack_latent_fp8(
    packed: torch.Tensor, latent_dim: int, rope_dim: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantise packed latent rows.

    Args:
        packed: ``[N, latent_fp8_bytes(Dc, Dr)]`` uint8 rows from ``pack_latent_fp8``, any strides.
        latent_dim: ``Dc``.
        rope_dim: ``Dr``.
        dtype: dtype of both outputs.

    Returns:
        ``(latent [N, Dc], k_rope [N, Dr])`` in ``dtype``; ``k_rope`` is exactly the packed bfloat16.
    """
    _check_packed(packed, latent_fp8_bytes(latent_dim, rope_dim))
    group = latent_fp8_group_size(latent_dim)
    scale_end = latent_dim + 4 * (latent_dim // group)
    q = _from_bytes(packed[:, :latent_dim], torch.float8_e4m3fn)
    scale = _from_bytes(packed[:, latent_dim:scale_end], torch.float32)
    rope = _from_bytes(packed[:, scale_end:], torch.bfloat16)
    return _dequantize_groups(q, scale, group).to(dtype), rope.to(dtype)


def pack_index_key_fp8(keys: torch.Tensor) -> torch.Tensor:
    """Pack DSA index keys into FP8 rows with one scale per key.

    Args:
        keys: ``[N, Di]`` indexer keys, any float dtype and strides.

    Returns:
        ``[N, Di + 4]`` uint8, contiguous, on ``keys``' device.
    """
    if keys.dim() != 2:
        raise ValueError(f"keys must have shape [N, Di], got {list(keys.shape)}")
    index_dim = keys.shape[1]
    index_key_fp8_bytes(index_dim)
    q, scale = _quantize_groups(keys, index_dim)
    return torch.cat([_as_bytes(q), _as_bytes(scale)], dim=-1)


def unpack_index_key_fp8(
    packed: torch.Tensor, index_dim: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise packed index-key rows.

    Args:
        packed: ``[N, Di + 4]`` uint8 rows from ``pack_index_key_fp8``, any strides.
        index_dim: ``Di``.
        dtype: output dtype.

    Returns:
        ``[N, Di]`` in ``dtype``.
    """
    _check_packed(packed, index_key_fp8_bytes(index_dim))
    q = _from_bytes(packed[:, :index_dim], torch.float8_e4m3fn)
    scale = _from_bytes(packed[:, index_dim:], torch.float32)
    return _dequantize_groups(q, scale, index_dim).to(dtype)
