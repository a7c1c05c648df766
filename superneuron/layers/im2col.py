"""The ``im2col`` convolution algorithm: the whole batch's columns, one GEMM per group, and
the data gradient as a convolution too (a gather, not col2im's scatter) where that pays.

Columns are laid out (C, kh, kw, N, Ho, Wo), so with groups they read as
(g, C/g·kh·kw, N·Ho·Wo) and match the weight's (g, K/g, C/g·kh·kw); the batch sits inside the
GEMM, so the weight gradient needs no per-sample partial sums.

Building them takes no fills of column pieces where the workspace has room for a padded
copy: the input is first copied once into a zero-bordered buffer (C, N, H+2p, W+2p) (only its
borders are filled: four fills), and each tap's columns are then one strided copy of it
(split over the cores); without that room each tap fills the columns its window leaves in
the padding (:func:`~.conv.gather`). Without padding they are copied from the input
itself. (One copy of a 6-D ``as_strided`` view of all the taps at once measured slower than
the nine copies.)

The data gradient of a stride-1 convolution that keeps its size and channels is the
convolution of dy, padded by
``d(k-1) - p``, with the kernel flipped and its in/out channels swapped: the same gather and
GEMM as the forward, where Caffe's col2im adds nine shifted copies into dx one by one; and the
weight gradient comes from the same columns of dy (x times them, read back flipped), so the
backward makes one gather, not two. With a stride, or where that convolution would cost more
than the scatter (see :func:`_spans`), the columns' gradient is added back tap by tap
(:func:`~.conv.scatter_add`).

The workspace is a few regions reused in turn (see :func:`regions`): the columns of x or of
dy; the padded input or dy (read up into the columns first), then y or dy in (K, N, Ho·Wo)
order or x and then dx in (C, N, H·W) order; and a weight-sized buffer (dw read back
flipped, then the flipped weight). The padded copy costs no room of its own.
"""

import math

from . import parallel

# Relative costs that decide how dx is taken (measured on the 2-core development machine, one
# thread): copying one element into columns costs about as long as 30 flops of a GEMM, and
# adding columns back into dx tap by tap (col2im) about 3.5 such copies per element.
COPY_FLOPS = 30
SCATTER_COPIES = 3.5


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
    each tap, zeros in the padding; ``pad_buf`` is flat room for the padded copy (unused
    without padding), free to be overwritten once this returns."""
    c, kh, kw, n, ho, wo = cols.shape
    h, w = src.shape[2:]
    ph, pw = pad
    (sy, sx), (dy, dx) = stride, dilation
    hp, wp = h + 2 * ph, w + 2 * pw
    if (ph or pw) and c * n * hp * wp > pad_buf.size:  # no room for a padded copy: fill per tap
        from .conv import gather, window_taps
        srct = src.transpose(1, 0, 2, 3)
        for i, j, out_index, in_index in window_taps((kh, kw), stride, pad, dilation, (h, w), (ho, wo)):
            gather(xp, cols[:, i, j], srct, out_index, in_index)
        return
    if ph or pw:
        padded = pad_buf[:c * n * hp * wp].reshape(c, n, hp, wp)
        padded[:, :, :ph].fill(0)
        padded[:, :, hp - ph:].fill(0)
        padded[:, :, ph:hp - ph, :pw].fill(0)
        padded[:, :, ph:hp - ph, wp - pw:].fill(0)
        parallel.copyto(xp, padded[:, :, ph:hp - ph, pw:wp - pw], src.transpose(1, 0, 2, 3))
        base = padded
    else:
        base = src.transpose(1, 0, 2, 3)
    for i in range(kh):  # one copy per tap: faster than one copy of a 6-D strided view
        for j in range(kw):
            tap = base[:, :, i * dy:i * dy + (ho - 1) * sy + 1:sy, j * dx:j * dx + (wo - 1) * sx + 1:sx]
            parallel.copyto(xp, cols[:, i, j], tap)


def im2col(layer, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
    """Any of ``y``, ``dw``, ``dx`` of ``layer``'s convolution (see the module docstring)."""
    assert y is None or dx is None  # both would need the top-sized buffer at once
    outputs = {name for name, a in (("y", y), ("dw", dw), ("dx", dx)) if a is not None}
    room = {name: ctx.scratch((size,), layer.dtype) for name, size in regions(layer, _declared(outputs))}
    if dx is not None and _spans(layer)[1] is not None:
        _gradients_from_dy_columns(layer, ctx.xp, room, weight, x, dy, dw, dx)
    else:
        _from_x_columns(layer, ctx.xp, room, weight, x, dy, y, dw, dx)


def _from_x_columns(layer, xp, room, weight, x, dy, y, dw, dx):
    """y, dw and a scattered dx through the columns of x (dx: of dy's product with the weight)."""
    from .conv import scatter_add
    n, c, h, w, k, g, ho, wo = layer.geometry
    (kh, kw), p = layer.kernel, ho * wo
    kg, ckk = k // g, c // g * kh * kw
    cols = room["cols"][:c * kh * kw * n * p].reshape(c, kh, kw, n, ho, wo)
    cols3 = cols.reshape(g, ckk, n * p)
    top = room["top"][:k * n * p].reshape(k, n, p)  # y or dy with the batch inside the GEMM
    w3 = weight.reshape(g, kg, ckk)
    if y is not None or dw is not None:
        columns(xp, cols, x, room["top"], layer.kernel, layer.stride, layer.pad, layer.dilation)
    if dy is not None:
        parallel.copyto(xp, top, dy.reshape(n, k, p).transpose(1, 0, 2))
    if dw is not None:
        xp.matmul(top.reshape(g, kg, n * p), cols3.transpose(0, 2, 1), out=dw.reshape(g, kg, ckk))
    if y is not None:  # after dw, which reads dy from ``top``
        xp.matmul(w3, cols3, out=top.reshape(g, kg, n * p))
        parallel.copyto(xp, y.reshape(n, k, p), top.transpose(1, 0, 2))
    if dx is not None:  # the columns' gradient replaces the columns, added back tap by tap
        xp.matmul(w3.transpose(0, 2, 1), top.reshape(g, kg, n * p), out=cols3)
        dx.fill(0)
        dxt = dx.transpose(1, 0, 2, 3)
        for i, j, out_index, in_index in layer._taps:
            scatter_add(xp, dxt, cols[:, i, j], out_index, in_index)


def _gradients_from_dy_columns(layer, xp, room, weight, x, dy, dw, dx):
    """dx and dw of a stride-1 convolution from one gather, dy's columns (padded by
    d(k-1) - p): dx is their product with the flipped kernel (C and K swapped), and dw the
    product of x with them, read back flipped."""
    (n, c, h, w, k, g, ho, wo), back = _spans(layer)
    (kh, kw), hw = layer.kernel, h * w
    cg, kkk = c // g, k // g * kh * kw
    dcols = room["cols"][:k * kh * kw * n * hw].reshape(k, kh, kw, n, h, w)
    columns(xp, dcols, dy, room["top"], layer.kernel, (1, 1), back, layer.dilation)
    dcols3 = dcols.reshape(g, kkk, n * hw)
    by_tap = room["small"].reshape(g, cg, k // g, kh, kw)  # (C, K) swapped, taps flipped
    both = room["top"][:c * n * hw].reshape(c, n, hw)  # x, then dx, in (C, N, H*W) order
    if dw is not None:
        parallel.copyto(xp, both, x.reshape(n, c, hw).transpose(1, 0, 2))
        xp.matmul(both.reshape(g, cg, n * hw), dcols3.transpose(0, 2, 1), out=by_tap.reshape(g, cg, kkk))
        xp.copyto(dw.reshape(g, k // g, cg, kh, kw), by_tap[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4))
    xp.copyto(by_tap, weight.reshape(g, k // g, cg, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4))
    xp.matmul(by_tap.reshape(g, cg, kkk), dcols3, out=both.reshape(g, cg, n * hw))
    parallel.copyto(xp, dx.reshape(n, c, hw), both.transpose(1, 0, 2))
