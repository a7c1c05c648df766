"""Gist's encodings of stashed feature maps (Jain et al. 2018): the kernels, and the bytes each
encoded form takes.

A feature map that lives from the forward to the backward (a *stash*) may be kept encoded in
between: an Encode step writes its encoded form, a Decode step writes the map back (or the
backward reads the encoded form itself), and the scheduler counts only the encoded bytes in
between. The codecs:

- ``sign``: one bit per value, set where it is > 0 (NaN and -0.0 are not), packed eight to a
  byte as ``numpy.packbits`` packs them (32x smaller than float32). Its Decode writes 1.0 where
  the bit is set and 0.0 elsewhere: a stand-in with the same signs, which is all that ReLU's
  backward reads of its top (``Layer.encodings`` says which backward reads what).
- ``sparse``: Gist's sparse storage (SSDC-like): the packed bitmask of the values whose bits
  are not all zero (so -0.0 is kept) and those values, in order. Exact for any tensor. How
  many values there are is known only at run time, so the form a plan counts is the worst
  case, every value kept (:func:`encoded_form`): never smaller than the map itself, so a plan
  never chooses it (see scheduler/encode.py); the kernels are here for when a bound is known.
- ``fp16``: the values in half precision (Gist's delayed precision reduction); lossy, used
  only when asked (``--lossy fp16``). Its Decode widens them back.
- ``argmax`` (max pooling's, see layers/pool.py): one byte per output, the index of the
  first maximum in its window; the backward reads it instead of its bottom and top.

Kernels are written once against ``xp`` (NumPy on the CPU, CuPy on the GPU) and allocate
nothing of their own: scratch comes from the step's workspace (``ctx.scratch``), sized by
:func:`workspace_of`.
"""

import math
from dataclasses import dataclass

import numpy as np

from .scratch import workspace_bytes

LOSSLESS = ("sign", "sparse", "argmax")
LOSSY = ("fp16",)
CODECS = LOSSLESS + LOSSY


@dataclass(frozen=True)
class Encoding:
    """An encoded form a layer's backward can read (``Layer.encodings``): ``codec`` (one of
    :data:`CODECS`), the ``bottoms`` and ``tops`` (indices) it stands for, and ``direct``: the
    backward reads the encoded form itself, in place of every operand ``backward_reads`` names
    (no Decode), else a Decode writes those operands back before it. ``form`` is the
    ``(shape, dtype)`` of the encoded storage, ``workspace`` and ``decode_workspace`` the
    scratch bytes of its Encode and Decode (a direct form is the layer's own, encoded by its
    ``encode``; a tensor form's are :func:`tensor_encoding`'s)."""

    codec: str
    bottoms: tuple = ()
    tops: tuple = ()
    direct: bool = False
    form: tuple = None
    workspace: int = 0
    decode_workspace: int = 0


def tensor_encoding(codec, shape, dtype):
    """The Encoding of tensor form ``codec`` (``sign``, ``sparse``, ``fp16``) of a ``shape``,
    ``dtype`` tensor: its storage and the scratch of its Encode and Decode."""
    return Encoding(codec, form=encoded_form(codec, shape, dtype), workspace=workspace_of(codec, shape, dtype),
                    decode_workspace=workspace_of(codec, shape, dtype, decode=True))


def packed_bytes(n):
    """Bytes of ``n`` bits packed eight to a byte."""
    return -(-n // 8)


def encoded_form(codec, shape, dtype):
    """``(shape, dtype)`` of the storage of ``codec``'s form of a ``shape``/``dtype`` tensor:
    what the plan counts (for ``sparse``, the worst case: every value kept)."""
    n, dtype = math.prod(map(int, shape)), np.dtype(dtype)
    if codec == "sign":
        return (packed_bytes(n),), np.dtype(np.uint8)
    if codec == "sparse":
        return (_sparse_values_at(n, dtype) + n * dtype.itemsize,), np.dtype(np.uint8)
    if codec == "fp16":
        return tuple(shape), np.dtype(np.float16)
    if codec == "argmax":
        return tuple(shape), np.dtype(np.uint8)
    raise ValueError(f"unknown codec {codec!r}")


def _sparse_values_at(n, dtype):
    """Where the values begin in a sparse form: after the mask, aligned for the value type."""
    return -(-packed_bytes(n) // dtype.itemsize) * dtype.itemsize


def workspace_of(codec, shape, dtype, decode=False):
    """Bytes of scratch the Encode (or, with ``decode``, the Decode) of ``codec`` needs."""
    n = math.prod(map(int, shape))
    if codec in ("sign", "sparse"):  # one byte per value: the flags, or one bit plane
        return workspace_bytes(((n,), np.bool_), ((packed_bytes(n),), np.uint8))
    return 0


# -- bits ---------------------------------------------------------------------------------------

def pack_bits(xp, flags, out, scratch):
    """``out`` (uint8, ``packed_bytes(flags.size)``) = ``flags`` (bool, flat) packed eight to a
    byte, the first flag in the high bit, as ``numpy.packbits``; ``scratch``: uint8 of
    ``out``'s size. Eight strided passes, no allocation."""
    n = flags.size
    whole = n // 8
    out.fill(0)
    as_bytes = flags.view(np.uint8)
    for bit in range(8):
        count = whole + (bit < n % 8)  # the last byte takes the flags past the whole bytes
        if not count:
            continue
        plane = scratch[:count]
        xp.left_shift(as_bytes[bit::8][:count], 7 - bit, out=plane)
        xp.bitwise_or(out[:count], plane, out=out[:count])


def unpack_bits(xp, packed, out, scratch):
    """The inverse of :func:`pack_bits`: ``out`` (any numeric dtype, flat) = 1 where the bit is
    set, 0 elsewhere; ``scratch``: uint8 of ``packed``'s size."""
    n = out.size
    whole = n // 8
    for bit in range(8):
        count = whole + (bit < n % 8)
        if not count:
            continue
        plane = scratch[:count]
        xp.right_shift(packed[:count], 7 - bit, out=plane)
        xp.bitwise_and(plane, 1, out=plane)
        xp.copyto(out[bit::8][:count], plane, casting="unsafe")


def _scratch(ctx, n):
    """The flags (bool, ``n``) and the bit plane (uint8) of a sign or sparse kernel."""
    return ctx.scratch((n,), np.bool_), ctx.scratch((packed_bytes(n),), np.uint8)


def _bits_of(xp, x):
    """``x`` (flat) as unsigned integers of its width: a value's bits, for exact comparisons."""
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


# -- the codecs ---------------------------------------------------------------------------------

def encode(ctx, codec, x, out):
    """Write ``codec``'s form of ``x`` into ``out`` (an array of :func:`encoded_form`)."""
    xp, flat = ctx.xp, x.reshape(-1)
    if codec == "sign":
        flags, plane = _scratch(ctx, flat.size)
        xp.greater(flat, 0, out=flags)
        pack_bits(xp, flags, out, plane)
    elif codec == "sparse":
        flags, plane = _scratch(ctx, flat.size)
        xp.not_equal(_bits_of(xp, flat), 0, out=flags)
        pack_bits(xp, flags, out[:packed_bytes(flat.size)], plane)
        # how many values follow: read back (a host sync on a GPU, counted; gist's sparse form only)
        count = int(ctx.host_value(xp.count_nonzero(flags), "the sparse encoding's count"))
        start = _sparse_values_at(flat.size, flat.dtype)
        values = out[start:start + count * flat.dtype.itemsize].view(flat.dtype)
        xp.compress(flags, flat, out=values)
    elif codec == "fp16":
        xp.copyto(out.reshape(-1), flat, casting="same_kind")
    else:
        raise ValueError(f"codec {codec!r} has no tensor encoder")


def decode(ctx, codec, encoded, x):
    """Write into ``x`` what ``codec``'s form ``encoded`` stands for (``sign``: 1.0 where the
    value was > 0, 0.0 elsewhere; ``sparse``: the values exactly; ``fp16``: the rounded values)."""
    xp, flat = ctx.xp, x.reshape(-1)
    if codec == "sign":
        flags, plane = _scratch(ctx, flat.size)
        unpack_bits(xp, encoded, flat, plane)
    elif codec == "sparse":
        flags, plane = _scratch(ctx, flat.size)
        unpack_bits(xp, encoded[:packed_bytes(flat.size)], flags, plane)
        count = int(ctx.host_value(xp.count_nonzero(flags), "the sparse decoding's count"))
        start = _sparse_values_at(flat.size, flat.dtype)
        flat.fill(0)
        xp.place(flat, flags, encoded[start:start + count * flat.dtype.itemsize].view(flat.dtype))
    elif codec == "fp16":
        xp.copyto(flat, encoded.reshape(-1))
    else:
        raise ValueError(f"codec {codec!r} has no tensor decoder")
