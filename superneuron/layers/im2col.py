"""The ``im2col`` convolution algorithm: a batch's columns, one GEMM per group, and the data
gradient as a convolution too (a gather, not col2im's scatter) where that pays.

With the whole batch at once (on a GPU, or where the CPU's chunks below find no room),
columns are laid out (C, kh, kw, N, Ho, Wo), so with groups they read as
(g, C/g·kh·kw, N·Ho·Wo) and match the weight's (g, K/g, C/g·kh·kw); the samples sit inside
the GEMM. The CPU's chunks lay them out in rows instead (layers/im2col_rows.py).

Building them takes no fills of column pieces where the workspace has room for a padded
copy: the input is first copied once into a zero-bordered buffer (C, N, H+2p, W+2p) (only its
borders are filled: four fills), and each tap's columns are then one strided copy of it
(split over the cores); without that room the columns are zeroed with one fill and each
tap's in-image part copied (measured 1-4 % faster than four fills per tap). Without padding
they are copied from the input itself. (One copy of a 6-D ``as_strided`` view of all the taps
at once measured slower than the nine copies.)

The data gradient of a stride-1 convolution that keeps its size and channels is the
convolution of dy, padded by
``d(k-1) - p``, with the kernel flipped and its in/out channels swapped: the same gather and
GEMM as the forward, where Caffe's col2im adds nine shifted copies into dx one by one; and the
weight gradient comes from the same columns of dy (x times them, read back flipped), so the
backward makes one gather, not two. With a stride, or where that convolution would cost more
than the scatter (see :func:`_spans`), the columns' gradient is added back tap by tap
(:func:`~.windows.scatter_add`).

On the CPU the batch goes through in chunks of samples (:func:`chunking`): a chunk's columns
(about :data:`CHUNK_COLUMNS` GEMM columns, a few MB), laid out in rows from a padded
channels-last copy of the chunk's input (layers/im2col_rows.py), are built and multiplied
while they are still in the core's cache, and y or dx is written from a chunk-sized product, where the whole
batch's columns would go out to memory and back (they are tens of MB). Runs of chunks
(``slots``) share the threads, each slot on one thread at a time with its own part of the
regions below, and with the weight gradient the chunks' parts summed in a slot's own sum
buffer, the slots' sums then added in slot order: every product is the same bit for bit on
any number of threads. The slots live in the regions the whole batch would use, so chunking
takes no workspace of its own; where the columns' region has no room beside the slots' rows
for their sums and padded copies and for the weight in rows order (weights large beside a
small batch's columns), or on a GPU, the whole batch goes at once, each copy and GEMM split
over the threads instead.

The workspace is a few regions reused in turn (see :func:`regions`): the columns of x or of
dy; the padded input or dy (read up into the columns first), then y or dy in (K, N, Ho·Wo)
order or x and then dx in (C, N, H·W) order; and a weight-sized buffer (the flipped weight,
then, with the whole batch at once, dw read back flipped). The padded copy costs no room of
its own.
"""

import collections
import math

import numpy

from . import im2col_rows as rows
from . import parallel
from .windows import scatter_add, window_taps

# Relative costs that decide how dx is taken (measured on the 2-core development machine, one
# thread): copying one element into columns costs about as long as 30 flops of a GEMM, and
# adding columns back into dx tap by tap (col2im) about 3.5 such copies per element.
COPY_FLOPS = 30
SCATTER_COPIES = 3.5
# The batch in chunks (see the module docstring): about this many GEMM columns (samples times
# output positions) per chunk, at least this many chunks where the batch allows, and at most
# this many runs of chunks (slots) side by side
CHUNK_COLUMNS = 4096
MIN_CHUNKS = 8
MAX_SLOTS = 4


def _spans(layer):
    """Geometry: ``(n, c, h, w, k, g, ho, wo)`` and the pads (ph, pw) of the dx-convolution,
    or None when dx is scattered: where the stride is not 1, where the pad is wider than the
    kernel's reach, or where that convolution would cost more time or room (it works at the
    input's size, with dy's K channels: a convolution without padding that shrinks the image,
    as LeNet's, would pay for the full correlation more than the scatter costs, and one that
    changes the channel count, as a bottleneck's 1x1s, would need a larger workspace, which
    could lift a plan's peak)."""
    geo = layer.geometry
    n, c, h, w, k, g, ho, wo = geo
    if layer.stride != (1, 1):
        return geo, None
    back = tuple(d * (kk - 1) - p for kk, p, d in zip(layer.kernel, layer.pad, layer.dilation, strict=True))
    gemms = 2 * 2 * k * (c // g)  # flops of the two GEMMs per tap and position
    gathered = h * w * (gemms + COPY_FLOPS * k)
    scattered = ho * wo * (gemms + COPY_FLOPS * (1 + SCATTER_COPIES) * c)
    # no more room than x's columns and y: dy's columns, and x (then dx) in (C, N, H*W) order
    # and a weight-sized buffer, small beside them only where the maps are large
    smaller = (k * h * w <= c * ho * wo and c * h * w <= k * ho * wo
               and 4 * (c // g) * math.prod(layer.kernel) <= n * ho * wo)
    return geo, (back if min(back) >= 0 and gathered <= scattered and smaller else None)


def _declared(outputs):
    """The outputs an algorithm declares its workspace for, from those a call computes: a
    convolution's backward declares dx even where the graph needs none (the first layer)."""
    return outputs | {"dx"} if outputs == {"dw"} else outputs


def regions(layer, outputs):
    """``[(name, elements)]``: the workspace regions of the declared ``outputs`` (of 'y',
    'dw', 'dx'), in the order they are carved, each sized for the most it holds in turn."""
    (n, c, h, w, k, g, ho, wo), back = _spans(layer)
    kh, kw = layer.kernel
    ph, pw = layer.pad
    # a padded copy lives in the top-sized region where it fits (it is read up into the columns
    # before that region is written), so that it costs no room: a larger workspace than the
    # plain columns' could lift a plan's peak
    need = {"cols": [], "top": [], "small": [0]}

    def x_columns():  # the input's columns and y (or dy) in (K, N, Ho*Wo) order
        need["cols"].append(c * kh * kw * n * ho * wo)
        need["top"].append(k * n * ho * wo)

    if "y" in outputs or "dw" in outputs:
        x_columns()
    if "dx" in outputs and back is None:
        x_columns()  # the columns' gradient, scattered back
    elif "dx" in outputs:  # dy's columns; x or dx in (C, N, H*W) order; a weight-sized buffer
        need["cols"].append(k * kh * kw * n * h * w)
        need["top"].append(c * n * h * w)
        need["small"].append(k * (c // g) * kh * kw)
    return [(name, max(sizes)) for name, sizes in need.items() if max(sizes)]


def workspace_shapes(layer, outputs):
    """The regions as ``(shape, dtype)`` pairs for :func:`~.base.workspace_bytes`."""
    return [((size,), layer.dtype) for _, size in regions(layer, outputs)]


def columns(xp, cols, src, pad_buf, kernel, stride, pad, dilation):
    """``cols`` (C, kh, kw, N, Ho, Wo) = what each output sees of ``src`` (N, C, H, W) through
    each tap, zeros in the padding, each copy split over the threads; ``pad_buf`` is flat room
    for the padded copy (unused without padding), free to be overwritten once this returns."""
    def copyto(dst, src_):
        parallel.copyto(xp, dst, src_)

    c, kh, kw, n, ho, wo = cols.shape
    h, w = src.shape[2:]
    ph, pw = pad
    (sy, sx), (dy, dx) = stride, dilation
    hp, wp = h + 2 * ph, w + 2 * pw
    if (ph or pw) and c * n * hp * wp > pad_buf.size:  # no room for a padded copy
        srct = src.transpose(1, 0, 2, 3)
        cols.fill(0)
        for i, j, out_index, in_index in window_taps((kh, kw), stride, pad, dilation, (h, w), (ho, wo)):
            if out_index is not None:
                copyto(cols[:, i, j][out_index], srct[in_index])
        return
    if ph or pw:
        padded = pad_buf[:c * n * hp * wp].reshape(c, n, hp, wp)
        padded[:, :, :ph].fill(0)
        padded[:, :, hp - ph:].fill(0)
        padded[:, :, ph:hp - ph, :pw].fill(0)
        padded[:, :, ph:hp - ph, wp - pw:].fill(0)
        copyto(padded[:, :, ph:hp - ph, pw:wp - pw], src.transpose(1, 0, 2, 3))
        base = padded
    else:
        base = src.transpose(1, 0, 2, 3)
    for i in range(kh):  # one copy per tap: faster than one copy of a 6-D strided view
        for j in range(kw):
            tap = base[:, :, i * dy:i * dy + (ho - 1) * sy + 1:sy, j * dx:j * dx + (wo - 1) * sx + 1:sx]
            copyto(cols[:, i, j], tap)


def chunking(layer, outputs, xp=None):
    """``(samples per chunk, slots, padded)`` for ``layer``'s declared ``outputs``, or None to
    take the whole batch at once (see the module docstring): on NumPy, where the batch makes
    at least two chunks and the columns' region has room, beside one chunk's rows per slot,
    for each slot's weight-gradient sum and part and its padded channels-last copy of the
    chunk's input (``padded`` elements: of x, of dy, or of the scattered dx, the largest that
    the outputs may need), and for the weight in rows order (layers/im2col_rows.py)."""
    if xp is not None and getattr(xp, "__name__", "numpy") != "numpy":
        return None
    (n, c, h, w, k, g, ho, wo), back = _spans(layer)
    weight = k * (c // g) * math.prod(layer.kernel)
    cols = dict(regions(layer, _declared(outputs)))["cols"]
    per_sample = cols // n
    size = max(1, min(-(-CHUNK_COLUMNS // (ho * wo)), n // MIN_CHUNKS))
    count = -(-n // size)
    if count < 2:
        return None
    sums = 2 * weight if "dw" in outputs else 0
    sources = [(c, layer.pad)] + ([(k, back)] if back is not None and "dx" in outputs else [])
    padded = max(ch * size * (h + 2 * ph) * (w + 2 * pw) for ch, (ph, pw) in sources)
    for slots in range(min(count, MAX_SLOTS), 0, -1):
        if slots * (size * per_sample + sums + padded) + weight <= cols:
            return size, slots, padded
    return None


def _chunk_areas(layer, room, plan, dw_wanted):
    """``(areas, weight room)``: per slot its rows' area, its top-sized area, (with dw) its sum
    and part buffers and the room for its padded copy, and one weight-sized buffer, all carved
    from the workspace regions."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    size, slots, padded = plan
    wsize = k * (c // g) * math.prod(layer.kernel)
    per_cols, per_top = room["cols"].size // n, room["top"].size // n
    areas, end = [], slots * size * per_cols
    pads = end + (2 * slots * wsize if dw_wanted else 0)
    for r in range(slots):
        cols = room["cols"][r * size * per_cols:(r + 1) * size * per_cols]
        top = room["top"][r * size * per_top:(r + 1) * size * per_top]
        sums = None
        if dw_wanted:
            base = end + 2 * r * wsize
            sums = (room["cols"][base:base + wsize], room["cols"][base + wsize:base + 2 * wsize])
        areas.append((cols, top, sums, room["cols"][pads + r * padded:pads + (r + 1) * padded]))
    wroom = room["cols"][pads + slots * padded:pads + slots * padded + wsize]
    return areas, wroom


def _run_chunks(layer, plan, areas, kernel):
    """``kernel(span, cols_area, top_area, sums, first, pad_area)`` over every chunk: slot r
    takes its run of chunks in order, and the slots share the threads."""
    n = layer.geometry[0]
    size, slots, _ = plan
    count = -(-n // size)

    def run_slots(r0, r1):
        for r in range(r0, r1):
            cols, top, sums, pad = areas[r]
            for j, i in enumerate(range(r * count // slots, (r + 1) * count // slots)):
                kernel((i * size, min(n, i * size + size)), cols, top, sums, j == 0, pad)

    parallel.run(run_slots, slots, parallel.MIN_CHUNK)


def _in_rows(layer, room, plan, operands, back):
    """Any of y, dw, dx, chunk by chunk, with the columns in rows (layers/im2col_rows.py);
    ``back``: the pads of dx's convolution of dy, or None to scatter dx."""
    weight, x, dy, y, dw, dx = operands
    areas, wroom = _chunk_areas(layer, room, plan, dw is not None)
    by_dy = back is not None
    if by_dy:
        kernel = rows.from_dy_rows(layer, rows.weight_rows(layer, weight, wroom, flipped=True), back,
                                   x, dy, dw, dx)
    else:
        kernel = rows.from_x_rows(layer, rows.weight_rows(layer, weight, wroom), x, dy, y, dw, dx)
    _run_chunks(layer, plan, areas, kernel)
    if dw is not None:
        rows.write_dw(layer, dw, _total(areas), flipped=by_dy)


def _total(areas):
    """The slots' sums added in slot order, in the first slot's sum."""
    total = areas[0][2][0]
    for _, _, (other, _), _ in areas[1:]:
        numpy.add(total, other, out=total)
    return total


def im2col(layer, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
    """Any of ``y``, ``dw``, ``dx`` of ``layer``'s convolution (see the module docstring)."""
    assert y is None or dx is None  # both would need the top-sized buffer at once
    outputs = {name for name, a in (("y", y), ("dw", dw), ("dx", dx)) if a is not None}
    declared = _declared(outputs)
    room = {name: ctx.scratch((size,), layer.dtype) for name, size in regions(layer, declared)}
    plan = chunking(layer, declared, ctx.xp)
    back = _spans(layer)[1] if dx is not None else None  # dx by a convolution of dy, or scattered
    by_dy = back is not None
    operands = Operands(weight, x, dy, y, dw, dx)
    if plan is not None:
        _in_rows(layer, room, plan, operands, back)
    else:
        (_gradients_from_dy_columns if by_dy else _from_x_columns)(layer, ctx.xp, room, operands)


Operands = collections.namedtuple("Operands", "weight x dy y dw dx")  # of one call, None: not wanted


def _from_x_columns(layer, xp, room, operands):
    """y, dw and a scattered dx of the whole batch through the columns of x (dx: of dy's
    product with the weight), each copy and GEMM split over the threads."""
    weight, x, dy, y, dw, dx = operands
    n, c, h, w, k, g, ho, wo = layer.geometry
    (kh, kw), p = layer.kernel, ho * wo
    kg, ckk = k // g, c // g * kh * kw
    w3 = weight.reshape(g, kg, ckk)
    cols = room["cols"][:c * kh * kw * n * p].reshape(c, kh, kw, n, ho, wo)
    cols3 = cols.reshape(g, ckk, n * p)
    top = room["top"][:k * n * p].reshape(k, n, p)  # y or dy with the samples inside the GEMM
    if y is not None or dw is not None:
        columns(xp, cols, x, room["top"], layer.kernel, layer.stride, layer.pad, layer.dilation)
    if dy is not None:
        parallel.copyto(xp, top, dy.reshape(n, k, p).transpose(1, 0, 2))
    if dw is not None:
        parallel.matmul(xp, top.reshape(g, kg, n * p), cols3.transpose(0, 2, 1), dw.reshape(g, kg, ckk))
    if y is not None:  # after dw, which reads dy from ``top``
        parallel.matmul(xp, w3, cols3, top.reshape(g, kg, n * p))
        parallel.copyto(xp, y.reshape(n, k, p), top.transpose(1, 0, 2))
    if dx is not None:  # the columns' gradient replaces the columns, added back tap by tap
        parallel.matmul(xp, w3.transpose(0, 2, 1), top.reshape(g, kg, n * p), cols3)
        dx.fill(0)
        dxt = dx.transpose(1, 0, 2, 3)
        for i, j, out_index, in_index in layer._taps:
            scatter_add(xp, dxt, cols[:, i, j], out_index, in_index)


def _gradients_from_dy_columns(layer, xp, room, operands):
    """dx and dw of a stride-1 convolution from one gather of the whole batch, dy's columns
    (padded by d(k-1) - p): dx is their product with the flipped kernel (C and K swapped), and
    dw the product of x with them, read back flipped; each copy and GEMM split over the
    threads."""
    weight, x, dy, _, dw, dx = operands
    (n, c, h, w, k, g, ho, wo), back = _spans(layer)
    (kh, kw), hw = layer.kernel, h * w
    cg, kkk = c // g, k // g * kh * kw
    by_tap = room["small"].reshape(g, cg, k // g, kh, kw)  # (C, K) swapped, taps flipped
    xp.copyto(by_tap, weight.reshape(g, k // g, cg, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4))
    flipped = by_tap.reshape(g, cg, kkk)
    dcols = room["cols"][:k * kh * kw * n * hw].reshape(k, kh, kw, n, h, w)
    columns(xp, dcols, dy, room["top"], layer.kernel, (1, 1), back, layer.dilation)
    dcols3 = dcols.reshape(g, kkk, n * hw)
    both = room["top"][:c * n * hw].reshape(c, n, hw)  # x, then dx, in (C, N, H*W) order
    if dw is not None:  # dw's flipped sum in dw itself, read back through the weight's buffer
        parallel.copyto(xp, both, x.reshape(n, c, hw).transpose(1, 0, 2))
        parallel.matmul(xp, both.reshape(g, cg, n * hw), dcols3.transpose(0, 2, 1), dw.reshape(g, cg, kkk))
    parallel.matmul(xp, flipped, dcols3, both.reshape(g, cg, n * hw))
    parallel.copyto(xp, dx.reshape(n, c, hw), both.transpose(1, 0, 2))
    if dw is not None:
        xp.copyto(by_tap.reshape(-1), dw.reshape(-1))
        xp.copyto(dw.reshape(g, k // g, cg, kh, kw),
                  by_tap.reshape(g, cg, k // g, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4))
