"""The CPU's chunks of the ``im2col`` convolution, with the columns laid out in rows.

layers/im2col.py takes the batch in chunks of samples on the CPU (its ``chunking``); this
module is what each chunk does there. A chunk's input (x, or dy for the data gradient) is
first copied, transposed, into a zero-bordered channels-last buffer (N, H+2p, W+2p, C); its
columns are then one copy of a strided view of that buffer, laid out per group as rows, one
per output position, each holding the taps' channels (g, N·Ho·Wo, kh·kw·C/g): the kw taps of
a kernel row are kw·C/g contiguous elements of the buffer, so the copy moves runs, not single
channels. The GEMMs then take the rows as their long left operand and the (reordered) weight
as their short right one, with every output position a row of the product, in which layout
OpenBLAS's kernels run at 77-100 GFLOP/s on the development machine where the columns'
layout (taps·C, N·Ho·Wo) ran CIFAR ResNet-20's 16-channel convolutions at 35-52 GFLOP/s
(one chunk's three GEMMs, forward, weight and data gradients: 0.72 against 1.32 ms). Products
in (N·Ho·Wo, K) order are copied back to (N, K, Ho, Wo), as the columns' product in
(K, N·Ho·Wo) order was.

The weight in rows order is written once per call, before the chunks, into room the plan
keeps for it; everything else a chunk touches is its slot's own (see im2col.chunking).
"""

import math

import numpy

_as_strided = numpy.lib.stride_tricks.as_strided


def weight_rows(layer, weight, out, flipped=False):
    """``out`` (g, kh·kw·C/g, K/g): the weight in the rows' order, (kh, kw, C/g) down each
    group's column of K/g. ``flipped``: the data gradient's weight instead, taps reversed and
    C and K swapped: (g, kh·kw·K/g, C/g)."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    kh, kw = layer.kernel
    w5 = weight.reshape(g, k // g, c // g, kh, kw)
    if flipped:  # (g, kh, kw, K/g, C/g), taps reversed
        view = out.reshape(g, kh, kw, k // g, c // g)
        numpy.copyto(view, w5[:, :, :, ::-1, ::-1].transpose(0, 3, 4, 1, 2))
    else:  # (g, kh, kw, C/g, K/g)
        view = out.reshape(g, kh, kw, c // g, k // g)
        numpy.copyto(view, w5.transpose(0, 3, 4, 2, 1))
    return out.reshape(g, -1, (c if flipped else k) // g)


def padded_channels_last(area, src, pad):
    """``src`` (N, C, H, W) copied into ``area`` as (N, H+2ph, W+2pw, C), zero borders."""
    b, ch, h, w = src.shape
    ph, pw = pad
    buf = area[:b * (h + 2 * ph) * (w + 2 * pw) * ch].reshape(b, h + 2 * ph, w + 2 * pw, ch)
    if ph:
        buf[:, :ph].fill(0)
        buf[:, h + ph:].fill(0)
    if pw:
        buf[:, ph:h + ph, :pw].fill(0)
        buf[:, ph:h + ph, w + pw:].fill(0)
    numpy.copyto(buf[:, ph:h + ph, pw:w + pw], src.transpose(0, 2, 3, 1))
    return buf


def rows_of(area, buf, groups, kernel, stride, dilation, out_hw):
    """The rows (g, N·Ho·Wo, kh·kw·C/g) of the padded channels-last ``buf``, copied into
    ``area``: row (n, y, x) holds, tap by tap, the C/g channels that output sees."""
    b, _, _, ch = buf.shape
    cg, (kh, kw), (sy, sx), (dy, dx), (ho, wo) = ch // groups, kernel, stride, dilation, out_hw
    sb, sh, sw, sc = buf.strides
    rows = area[:groups * b * ho * wo * kh * kw * cg].reshape(groups, b, ho, wo, kh, kw, cg)
    view = _as_strided(buf, rows.shape, (cg * sc, sb, sh * sy, sw * sx, sh * dy, sw * dx, sc))
    numpy.copyto(rows, view)
    return rows.reshape(groups, b * ho * wo, kh * kw * cg)


def to_channels_first(dst, prod, groups):
    """``dst`` (N, g·k, H, W) from ``prod`` (g, N·H·W, k)."""
    b, _, h, w = dst.shape
    k = prod.shape[2]
    numpy.copyto(dst.reshape(b, groups, k, h * w), prod.reshape(groups, b, h * w, k).transpose(1, 0, 3, 2))


def to_rows(area, src, groups):
    """``src`` (N, g·k, H, W) copied into ``area`` as (g, N·H·W, k)."""
    b, ch, h, w = src.shape
    k = ch // groups
    out = area[:ch * b * h * w].reshape(groups, b, h * w, k)
    numpy.copyto(out, src.reshape(b, groups, k, h * w).transpose(1, 0, 3, 2))
    return out.reshape(groups, b * h * w, k)


def add_part(prod_a, prod_b, sums, first):
    """``sums[0]`` += a @ b (the first part written), through ``sums[1]``."""
    total = sums[0][:math.prod(prod_a.shape[:-1]) * prod_b.shape[-1]].reshape(
        prod_a.shape[:-1] + prod_b.shape[-1:])
    if first:
        numpy.matmul(prod_a, prod_b, out=total)
    else:
        part = sums[1][:total.size].reshape(total.shape)
        numpy.matmul(prod_a, prod_b, out=part)
        numpy.add(total, part, out=total)


def from_x_rows(layer, wrows, x, dy, y, dw, dx):
    """A chunk's ``kernel(span, cols, top, sums, first, pad)`` for y, dw and a scattered dx
    through the rows of x (``wrows``: the weight in rows order, :func:`weight_rows`)."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    (kh, kw), cg, kg = layer.kernel, c // g, k // g

    def chunk(span, cols_area, top_area, sums, first, pad_area):
        s0, s1 = span
        b = s1 - s0
        rows = None
        if y is not None or dw is not None:
            buf = padded_channels_last(pad_area, x[s0:s1], layer.pad)
            rows = rows_of(cols_area, buf, g, layer.kernel, layer.stride, layer.dilation, (ho, wo))
        dyr = None if dy is None else to_rows(top_area, dy[s0:s1], g)  # (g, P, K/g)
        if dw is not None:  # (g, K/g, kh·kw·C/g)
            add_part(dyr.transpose(0, 2, 1), rows, sums, first)
        if y is not None:
            prod = top_area[:k * b * ho * wo].reshape(g, b * ho * wo, kg)
            numpy.matmul(rows, wrows, out=prod)
            to_channels_first(y[s0:s1], prod, g)
        if dx is not None:  # each tap's gradient, added back into a padded dx
            by_tap = cols_area[:g * kh * kw * b * ho * wo * cg].reshape(g, kh * kw, b * ho * wo, cg)
            numpy.matmul(dyr[:, None], wrows.reshape(g, kh * kw, cg, kg).transpose(0, 1, 3, 2), out=by_tap)
            _scatter_taps(layer, pad_area, by_tap, dx[s0:s1])
    return chunk


def _scatter_taps(layer, pad_area, by_tap, dx):
    """dx (N, C, H, W) = the sum over taps of their gradients ``by_tap`` (g, taps, N·Ho·Wo,
    C/g) put back where each tap read, through a zeroed padded channels-last buffer in
    ``pad_area``. By tap, not in rows: each tap's add then reads whole rows of the image
    (Wo·C/g contiguous elements, not C/g; LeNet's conv2, 25 adds: 136 against 340 us a
    chunk, for 274 against 165 us of GEMM)."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    (kh, kw), (ph, pw), (sy, sx), (dy, dx_) = layer.kernel, layer.pad, layer.stride, layer.dilation
    b, cg = dx.shape[0], c // g
    buf = pad_area[:b * (h + 2 * ph) * (w + 2 * pw) * c].reshape(b, h + 2 * ph, w + 2 * pw, g, cg)
    buf.fill(0)
    taps = by_tap.reshape(g, kh, kw, b, ho, wo, cg)
    for i in range(kh):
        for j in range(kw):
            view = buf[:, i * dy:i * dy + (ho - 1) * sy + 1:sy, j * dx_:j * dx_ + (wo - 1) * sx + 1:sx]
            numpy.add(view, taps[:, i, j].transpose(1, 2, 3, 0, 4), out=view)
    numpy.copyto(dx, buf[:, ph:h + ph, pw:w + pw].reshape(b, h, w, c).transpose(0, 3, 1, 2))


def from_dy_rows(layer, frows, back, x, dy, dw, dx):
    """A chunk's kernel for dx and (where ``dw`` is asked for) dw's sum of a stride-1
    convolution from one gather, dy's rows (padded by ``back``): dx is their product with the
    flipped weight (``frows``), and dw's flipped, (C, K)-swapped sum the product of x's rows
    with them."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    cg = c // g

    def chunk(span, cols_area, top_area, sums, first, pad_area):
        s0, s1 = span
        b = s1 - s0
        buf = padded_channels_last(pad_area, dy[s0:s1], back)
        drows = rows_of(cols_area, buf, g, layer.kernel, (1, 1), layer.dilation, (h, w))
        both = top_area[:c * b * h * w]  # x's rows (g, Q, C/g), then dx's
        if dw is not None:
            xr = to_rows(both, x[s0:s1], g)
            add_part(xr.transpose(0, 2, 1), drows, sums, first)  # (g, C/g, kh·kw·K/g)
        prod = both.reshape(g, b * h * w, cg)
        numpy.matmul(drows, frows, out=prod)
        to_channels_first(dx[s0:s1], prod, g)
    return chunk


def write_dw(layer, dw, total, flipped=False):
    """dw (K, C/g, kh, kw) from the chunks' sum ``total``: (g, K/g, kh·kw·C/g) in rows order,
    or, ``flipped``, (g, C/g, kh·kw·K/g) with the taps reversed."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    kh, kw = layer.kernel
    out = dw.reshape(g, k // g, c // g, kh, kw)
    if flipped:
        src = total.reshape(g, c // g, kh, kw, k // g)[:, :, ::-1, ::-1].transpose(0, 4, 1, 2, 3)
    else:
        src = total.reshape(g, k // g, kh, kw, c // g).transpose(0, 1, 4, 2, 3)
    numpy.copyto(out, src)
