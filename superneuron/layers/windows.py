"""A window's taps: which outputs see which pixels through each kernel tap (i, j), and the two
moves along them, :func:`gather` and its adjoint :func:`scatter_add`. Shared by Convolution
(conv.py, im2col.py) and Pooling (pool.py); it imports none of them."""

from ..errors import LayerError
from ..limits import MAX_WINDOW_TAPS, over


def _axis_spans(k, s, p, d, n_in, n_out):
    """Per kernel tap along one axis: ``(out_slice, in_slice)``, the output positions whose input
    index ``o*s + i*d - p`` lies in [0, n_in) and those inputs; None if the tap sees only padding."""
    spans = []
    for i in range(k):
        off = i * d - p
        lo = max(0, -(off // s))                    # first o with o*s + off >= 0
        hi = min(n_out, (n_in - 1 - off) // s + 1)  # one past the last o with o*s + off < n_in
        if hi <= lo:
            spans.append(None)
        else:
            spans.append((slice(lo, hi), slice(lo * s + off, (hi - 1) * s + off + 1, s)))
    return spans


def window_taps(kernel, stride, pad, dilation, in_hw, out_hw):
    """The kernel taps in scan order (row by row), each ``(i, j, out_index, in_index)``: indices
    of the outputs that see the image through tap (i, j) and of the pixels they see (None, None
    when the tap sees only padding). Shared with Pooling. LayerError for a window of more than
    MAX_WINDOW_TAPS taps."""
    if kernel[0] * kernel[1] > MAX_WINDOW_TAPS:
        raise LayerError(over(f"a {kernel[0]}x{kernel[1]} window of", kernel[0] * kernel[1], MAX_WINDOW_TAPS,
                              "MAX_WINDOW_TAPS", " taps"))
    rows, cols = (_axis_spans(kernel[a], stride[a], pad[a], dilation[a], in_hw[a], out_hw[a])
                  for a in (0, 1))
    taps = []
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            if r is None or c is None:
                taps.append((i, j, None, None))
            else:
                taps.append((i, j, (Ellipsis, r[0], c[0]), (Ellipsis, r[1], c[1])))
    return taps


def gather(xp, dst, src, out_index, in_index):
    """``dst[..., ho, wo]`` = the pixel of ``src`` that output (ho, wo) sees through one tap; 0 in
    the padding."""
    if out_index is None:
        dst.fill(0)
        return
    xp.copyto(dst[out_index], src[in_index])
    rows, cols = out_index[1], out_index[2]
    dst[..., :rows.start, :].fill(0)
    dst[..., rows.stop:, :].fill(0)
    dst[..., rows, :cols.start].fill(0)
    dst[..., rows, cols.stop:].fill(0)


def scatter_add(xp, dst, src, out_index, in_index):
    """The adjoint of :func:`gather`: add ``src``'s in-image positions onto the pixels of ``dst``
    that tap sees (one tap maps distinct outputs to distinct pixels, so no two adds collide)."""
    if out_index is None:
        return
    view = dst[in_index]
    xp.add(view, src[out_index], out=view)
