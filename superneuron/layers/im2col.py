"""The ``im2col`` convolution algorithm: the whole batch's columns, one GEMM per group, and
the data gradient as a convolution too (a gather, never a scatter where the stride is 1).

Columns are laid out (C, kh, kw, N, Ho, Wo), so with groups they read as
(g, C/g·kh·kw, N·Ho·Wo) and match the weight's (g, K/g, C/g·kh·kw); the batch sits inside the
GEMM, so the weight gradient needs no per-sample partial sums.

Building them takes one strided copy, not one per tap: the input is first copied once into a
zero-bordered buffer (C, N, H+2p, W+2p) (only its borders are filled, a few large fills), and
the columns are then a single ``as_strided`` view of it, copied whole (split over the cores).
Without padding the view is of the input itself.

The data gradient of a stride-1 convolution is the convolution of dy, padded by
``d(k-1) - p``, with the kernel flipped and its in/out channels swapped: the same gather and
GEMM as the forward, where Caffe's col2im adds nine shifted copies into dx one by one. With a
stride the columns' gradient is still added back tap by tap (:func:`~.conv.scatter_add`).

The workspace is a few regions reused in turn (see :func:`regions`): padded input or dy,
columns of x or of dy, the top-sized (K, N, Ho·Wo) buffer of y or dy (later dx's (C, N, H·W)),
and the flipped weight.
"""

from . import parallel


def _spans(layer):
    """Geometry: ``(n, c, h, w, k, g, ho, wo)`` and the pads (ph, pw) of the dx-convolution,
    or None when dx must be scattered (a stride, or a pad wider than the kernel's reach)."""
    geo = layer.geometry
    if layer.stride != (1, 1):
        return geo, None
    back = tuple(d * (kk - 1) - p for kk, p, d in zip(layer.kernel, layer.pad, layer.dilation, strict=True))
    return geo, (back if min(back) >= 0 else None)


def regions(layer, outputs):
    """``[(name, shape)]``: the workspace regions of ``outputs`` (of 'y', 'dw', 'dx'), each
    region sized for the largest thing it holds in turn, in the order they are carved."""
    (n, c, h, w, k, g, ho, wo), back = _spans(layer)
    kh, kw = layer.kernel
    ph, pw = layer.pad
    pads, cols, tops = [], [], []
    if "y" in outputs or "dw" in outputs:
        cols.append(c * kh * kw * n * ho * wo)
        tops.append(k * n * ho * wo)
        if ph or pw:
            pads.append(c * n * (h + 2 * ph) * (w + 2 * pw))
    flipped = 0
    if "dx" in outputs:
        if back is None:  # the columns' gradient, scattered back
            cols.append(c * kh * kw * n * ho * wo)
            tops.append(k * n * ho * wo)
        else:
            cols.append(k * kh * kw * n * h * w)
            tops.append(c * n * h * w)
            if back[0] or back[1]:
                pads.append(k * n * (ho + 2 * back[0]) * (wo + 2 * back[1]))
            flipped = k * (c // g) * kh * kw
    out = [("pad", (max(pads),))] if pads else []
    out += [("cols", (max(cols),)), ("top", (max(tops),))]
    return out + ([("flipped", (flipped,))] if flipped else [])


def workspace_shapes(layer, outputs):
    """The regions as ``(shape, dtype)`` pairs for :func:`~.base.workspace_bytes`."""
    return [(shape, layer.dtype) for _, shape in regions(layer, outputs)]


def columns(xp, cols, src, pad_buf, kernel, stride, pad, dilation):
    """``cols`` (C, kh, kw, N, Ho, Wo) = what each output sees of ``src`` (N, C, H, W) through
    each tap, zeros in the padding; ``pad_buf`` is flat room for the padded copy (unused, and
    may be None, without padding)."""
    c, kh, kw, n, ho, wo = cols.shape
    h, w = src.shape[2:]
    ph, pw = pad
    if ph or pw:
        hp, wp = h + 2 * ph, w + 2 * pw
        padded = pad_buf[:c * n * hp * wp].reshape(c, n, hp, wp)
        padded[:, :, :ph].fill(0)
        padded[:, :, hp - ph:].fill(0)
        padded[:, :, ph:hp - ph, :pw].fill(0)
        padded[:, :, ph:hp - ph, wp - pw:].fill(0)
        parallel.copyto(xp, padded[:, :, ph:hp - ph, pw:wp - pw], src.transpose(1, 0, 2, 3))
        sc, sn, sh, sw = padded.strides
        base = padded
    else:
        sn, sc, sh, sw = src.strides
        base = src
    (sy, sx), (dy, dx) = stride, dilation
    view = xp.lib.stride_tricks.as_strided(
        base, (c, kh, kw, n, ho, wo), (sc, sh * dy, sw * dx, sn, sh * sy, sw * sx))
    parallel.copyto(xp, cols, view)


def im2col(layer, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
    """Any of ``y``, ``dw``, ``dx`` of ``layer``'s convolution (see the module docstring)."""
    from .conv import scatter_add
    assert y is None or dx is None  # both would need the top-sized buffer at once
    xp, dt = ctx.xp, layer.dtype
    (n, c, h, w, k, g, ho, wo), back = _spans(layer)
    (kh, kw), p = layer.kernel, ho * wo
    kg, ckk = k // g, c // g * kh * kw
    outputs = {name for name, a in (("y", y), ("dw", dw), ("dx", dx)) if a is not None}
    scatter = dx is not None and back is None
    room = {name: ctx.scratch(shape, dt) for name, shape in regions(layer, outputs or {"y"})}
    if y is not None or dw is not None or scatter:  # y or dy with the batch inside the GEMM
        top = room["top"][:k * n * p].reshape(k, n, p)
    w3 = weight.reshape(g, kg, ckk)
    if y is not None or dw is not None:
        cols = room["cols"][:c * kh * kw * n * p].reshape(c, kh, kw, n, ho, wo)
        columns(xp, cols, x, room.get("pad"), layer.kernel, layer.stride, layer.pad, layer.dilation)
        cols3 = cols.reshape(g, ckk, n * p)
    if dw is not None or scatter:
        parallel.copyto(xp, top, dy.reshape(n, k, p).transpose(1, 0, 2))
    if dw is not None:
        xp.matmul(top.reshape(g, kg, n * p), cols3.transpose(0, 2, 1), out=dw.reshape(g, kg, ckk))
    if y is not None:  # after dw, which reads dy from ``top``
        xp.matmul(w3, cols3, out=top.reshape(g, kg, n * p))
        parallel.copyto(xp, y.reshape(n, k, p), top.transpose(1, 0, 2))
    if dx is None:
        return
    if scatter:  # the columns' gradient, added back tap by tap
        dcols = room["cols"][:c * kh * kw * n * p].reshape(c, kh, kw, n, ho, wo)
        xp.matmul(w3.transpose(0, 2, 1), top.reshape(g, kg, n * p), out=dcols.reshape(g, ckk, n * p))
        dx.fill(0)
        dxt = dx.transpose(1, 0, 2, 3)
        for i, j, out_index, in_index in layer._taps:
            scatter_add(xp, dxt, dcols[:, i, j], out_index, in_index)
        return
    # dx = conv(dy padded by d(k-1) - p, the flipped kernel with C and K swapped), stride 1
    flipped = room["flipped"].reshape(g, c // g, kg, kh, kw)
    xp.copyto(flipped, weight.reshape(g, kg, c // g, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4))
    dcols = room["cols"][:k * kh * kw * n * h * w].reshape(k, kh, kw, n, h, w)
    columns(xp, dcols, dy, room.get("pad"), layer.kernel, (1, 1), back, layer.dilation)
    dxt = room["top"][:c * n * h * w].reshape(c, n, h * w)
    xp.matmul(flipped.reshape(g, c // g, kg * kh * kw), dcols.reshape(g, kg * kh * kw, n * h * w),
              out=dxt.reshape(g, c // g, n * h * w))
    parallel.copyto(xp, dx.reshape(n, c, h * w), dxt.transpose(1, 0, 2))
