"""Winograd's minimal filtering (Lavin and Gray 2016) for 3x3, stride-1, undilated, ungrouped
convolutions on the CPU: the Convolution algorithm ``winograd`` is F(2x2, 3x3); F(4x4, 3x3)
is computed here too but not offered (slower than F(2x2, 3x3) on every shape measured in
NumPy, tools/bench_winograd.py, and rounding about 6x more than im2col).

Output tiles of m x m (m = 2 or 4) are computed from input tiles of a x a (a = m + 2) as
``Y = A^T [(G g G^T) . (B^T d B)] A``: the filters are transformed once per call into
``U`` (a², K, C), each input tile into ``V`` (a², C, tiles), and the a² products
``M[xi] = U[xi] @ V[xi]`` are a² GEMMs of K x C by C x tiles, 16 (or 36) multiply-adds per
tile for m² (4 or 16) outputs where im2col spends 9 per output: 2.25x (4x) fewer flops, for
transforms that are additions and subtractions on whole arrays (F(4x4, 3x3)'s also scale by
2, 4, 5 and 8, and its larger coefficients round more: see docs/pending/wino34.md for the
measured error).

The data gradient of such a convolution is itself one (``convolve(..., turned=True)``): the top
gradient, padded by 2 - p, correlated with the filters turned by 180 degrees and their in and
out channels swapped, so it goes through the same tiles (pads up to 2; a wider pad is
refused for the backward). The weight gradient is left to im2col (layers/im2col.py): run
first, in its own workspace, which the Winograd data gradient then reuses (a sample's dw is
taken before its dx is written over x's memory).

The batch goes in chunks of samples (about :data:`CHUNK_TILES` tiles each), runs of chunks
(slots) shared by the threads, each slot with its own two areas, used in turn: the padded
input (C, m, Hq, m, Wq, s) with the samples innermost so that every tap of a tile row or
column is a view with long contiguous runs, its rows transformed, then ``V``, ``M``, and the
output's two transform stages, each written into the area its input is not in. Every
product is computed the same way whatever the thread count: bits do not depend on it.
"""

import math

import numpy

from . import parallel

# Lavin and Gray's matrices: (B^T, G, A^T) per output tile size m
TRANSFORMS = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
         [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}
# Tiles per chunk: a chunk's V and M (a² x (C + K) x tiles floats) stay near a core's cache
CHUNK_TILES = 1024
MAX_SLOTS = 4


def refusal(layer, phase):
    """Why ``layer`` (a Convolution) cannot run ``phase`` by Winograd, or None: it needs a 3x3
    kernel, stride 1, dilation 1, one group, and for the backward a pad of at most 2."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    if layer.kernel != (3, 3) or layer.stride != (1, 1) or tuple(layer.dilation) != (1, 1):
        return "not a 3x3, stride-1, undilated convolution"
    if g != 1:
        return "grouped"
    if phase == "backward" and max(layer.pad) > 2:
        return "pad over 2 (the data gradient's pad 2 - p would be negative)"
    return None


class Tiling:
    """One Winograd convolution of an (n, c, h, w) input padded by ``pad`` into k channels,
    in m x m output tiles, and its chunks (:attr:`size` samples, :attr:`slots` runs)."""

    def __init__(self, m, n, c, h, w, k, pad):
        self.m, self.a = m, m + 2
        self.n, self.c, self.h, self.w, self.k, self.pad = n, c, h, w, k, tuple(pad)
        self.ho, self.wo = h + 2 * pad[0] - 2, w + 2 * pad[1] - 2
        self.th, self.tw = -(-self.ho // m), -(-self.wo // m)
        self.hq, self.wq = self.th + 1, self.tw + 1  # padded rows and columns, in units of m
        per_sample = self.th * self.tw
        self.size = max(1, min(n, CHUNK_TILES // per_sample))
        self.count = -(-n // self.size)
        self.slots = min(self.count, MAX_SLOTS)

    def shapes(self, s=None):
        """Per slot ``{name: shape}`` of a chunk of ``s`` samples (default: a full chunk)."""
        s, m, a, c, k = s or self.size, self.m, self.a, self.c, self.k
        t = (self.th, self.tw, s)
        return {"padded": (c, m, self.hq, m, self.wq, s), "rows": (a, c, self.th, m, self.wq, s),
                "V": (a, a, c) + t, "M": (a, a, k) + t, "O": (m, a, k) + t, "Y": (m, m, k) + t,
                "tmp": (max(c * self.th * m * self.wq, a * c * self.th * self.tw,
                            a * k * self.th * self.tw, m * k * self.th * self.tw) * s,)}

    def area_sizes(self):
        """Elements of a slot's two areas and its temporary (the latter only where the
        transforms scale: F(4x4, 3x3))."""
        sh = {name: math.prod(shape) for name, shape in self.shapes().items()}
        return (max(sh["padded"], sh["V"], sh["O"]), max(sh["rows"], sh["M"], sh["Y"]),
                sh["tmp"] if self.m == 4 else 0)

    def workspace_shapes(self, dtype):
        """``(shape, dtype)`` of every scratch array, in the order :func:`convolve` carves them."""
        a, k, c = self.a, self.k, self.c
        first, second, tmp = self.area_sizes()
        out = [((a * a * k * c,), dtype)]
        for _ in range(self.slots):
            out += [((first,), dtype), ((second,), dtype)] + ([((tmp,), dtype)] if tmp else [])
        return out


def tiling(layer, source, m=2):
    """The :class:`Tiling` of ``layer``'s forward (``source`` 'x') or of its data gradient as
    a convolution of dy ('dy')."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    if source == "x":
        return Tiling(m, n, c, h, w, k, layer.pad)
    return Tiling(m, n, k, ho, wo, c, tuple(2 - p for p in layer.pad))


def combine(xp, out, coefs, sources, tmp):
    """``out = sum(coef * source)`` over the nonzero ``coefs`` (``sources(j)``: the j-th
    array), by additions and subtractions where a coefficient is +-1, through ``tmp``
    (``out``-sized, may be None where no coefficient needs it) otherwise."""
    terms = [(coef, j) for j, coef in enumerate(coefs) if coef != 0]
    (c0, j0), rest = terms[0], terms[1:]
    if rest and abs(c0) == 1 and abs(rest[0][0]) == 1:  # the first two in one pass
        (c1, j1), rest = rest[0], rest[1:]
        if c0 == c1:
            xp.add(sources(j0), sources(j1), out=out)
            if c0 == -1:
                xp.negative(out, out=out)
        elif c0 == 1:
            xp.subtract(sources(j0), sources(j1), out=out)
        else:
            xp.subtract(sources(j1), sources(j0), out=out)
    elif c0 == 1:
        xp.copyto(out, sources(j0))
    elif c0 == -1:
        xp.negative(sources(j0), out=out)
    else:
        xp.multiply(sources(j0), c0, out=out)
    for coef, j in rest:
        src = sources(j)
        if coef == 1:
            xp.add(out, src, out=out)
        elif coef == -1:
            xp.subtract(out, src, out=out)
        else:
            xp.multiply(src, coef, out=tmp)
            xp.add(out, tmp, out=out)


def convolve(xp, plan, ws, weight, x, y, turned=False):
    """``y`` (N, K, Ho, Wo) = the correlation of ``x`` (N, C, H, W), padded by ``plan.pad``,
    with ``weight`` (K, C, 3, 3) by F(m x m, 3 x 3); with ``turned``, ``weight`` is (C, K, 3, 3)
    and is used turned by 180 degrees with its channels swapped (the data gradient's
    filters). ``ws``: the scratch arrays of ``plan.workspace_shapes``, in order."""
    a2 = plan.a * plan.a
    u = ws[0]
    if turned:
        _filters(xp, plan.m, weight, u.reshape(a2, plan.c, plan.k), True)
        u = u.reshape(a2, plan.c, plan.k).transpose(0, 2, 1)  # BLAS reads it transposed
    else:
        _filters(xp, plan.m, weight, u.reshape(a2, plan.k, plan.c), False)
        u = u.reshape(a2, plan.k, plan.c)
    per = 3 if plan.m == 4 else 2
    slots = [ws[1 + per * r:1 + per * (r + 1)] for r in range(plan.slots)]

    def run_slots(r0, r1):
        for r in range(r0, r1):
            for i in range(r * plan.count // plan.slots, (r + 1) * plan.count // plan.slots):
                lo = i * plan.size
                _chunk(xp, plan, u, slots[r], x[lo:lo + plan.size], y[lo:lo + plan.size])

    parallel.run(run_slots, plan.slots, parallel.MIN_CHUNK, xp)


def _filters(xp, m, weight, u, turned):
    """``u`` (a², K, C) = G g G^T of every filter g of ``weight`` (K, C, 3, 3), as one small
    GEMM of the Kronecker product G x G (a² x 9) by the filters (9 x K·C); ``turned``: of
    the filters turned by 180 degrees (the taps reversed), for the data gradient, whose
    (C, K) product the caller reads transposed."""
    gk = xp.asarray(_kron(m, weight.dtype))
    if turned:
        gk = gk[:, ::-1]
    xp.matmul(gk, weight.reshape(-1, 9).T, out=u.reshape(u.shape[0], -1))


_krons = {}


def _kron(m, dtype):
    """G x G as an (a², 9) array of ``dtype``, made once per (m, dtype)."""
    key = (m, numpy.dtype(dtype).str)
    if key not in _krons:
        g = numpy.array(TRANSFORMS[m][1], numpy.float64)
        _krons[key] = numpy.ascontiguousarray(numpy.kron(g, g).astype(dtype))
    return _krons[key]


def _chunk(xp, plan, u, areas, x, y):
    """One chunk of samples: ``x`` (s, C, H, W) into ``y`` (s, K, Ho, Wo)."""
    m, a = plan.m, plan.a
    bt, _, at = TRANSFORMS[m]
    s = x.shape[0]
    sh = plan.shapes(s)
    first, second = areas[0], areas[1]
    tmp_flat = areas[2] if len(areas) > 2 else None

    def view(area, name):
        return area[:math.prod(sh[name])].reshape(sh[name])

    def tmp_like(arr):
        return None if tmp_flat is None else tmp_flat[:arr.size].reshape(arr.shape)

    padded = view(first, "padded")
    _pad_into(xp, plan, padded, x)
    rows = view(second, "rows")  # rows[i] = sum_r B^T[i, r] * the r-th row of each tile
    for i in range(a):
        combine(xp, rows[i], bt[i], lambda r: padded[:, r % m, r // m:r // m + plan.th], tmp_like(rows[i]))
    v = view(first, "V")  # v[:, j] = sum_q B^T[j, q] * the q-th column of each tile's rows
    for j in range(a):
        out = v[:, j]
        combine(xp, out, bt[j], lambda q: rows[:, :, :, q % m, q // m:q // m + plan.tw], tmp_like(out))
    t = plan.th * plan.tw * s
    prod = view(second, "M")
    xp.matmul(u, v.reshape(a * a, plan.c, t), out=prod.reshape(a * a, plan.k, t))
    half = view(first, "O")  # half[i] = sum_p A^T[i, p] * M[p]
    for i in range(m):
        combine(xp, half[i], at[i], lambda p: prod[p], tmp_like(half[i]))
    out_tiles = view(second, "Y")  # out_tiles[:, j] = sum_q A^T[j, q] * half[:, q]
    for j in range(m):
        out = out_tiles[:, j]
        combine(xp, out, at[j], lambda q: half[:, q], tmp_like(out))
    for i in range(m):
        rows_i = len(range(i, plan.ho, m))
        for j in range(m):
            cols_j = len(range(j, plan.wo, m))
            xp.copyto(y[:, :, i::m, j::m], out_tiles[i, j][:, :rows_i, :cols_j].transpose(3, 0, 1, 2))


def _pad_into(xp, plan, padded, x):
    """``padded`` (C, m, Hq, m, Wq, s) = ``x`` (s, C, H, W) with ``plan.pad`` zeros around, the
    padded row R = m q + r at [:, r, q] (columns alike), the samples innermost."""
    m, (ph, pw) = plan.m, plan.pad
    padded.fill(0)
    for r in range(m):
        i0 = (r - ph) % m
        rows = len(range(i0, plan.h, m))
        if not rows:
            continue
        q0 = (i0 + ph) // m
        for c in range(m):
            j0 = (c - pw) % m
            cols = len(range(j0, plan.w, m))
            if not cols:
                continue
            p0 = (j0 + pw) // m
            xp.copyto(padded[:, r, q0:q0 + rows, c, p0:p0 + cols],
                      x[:, :, i0::m, j0::m].transpose(1, 2, 3, 0))


# Tiles at which the work fixed per call (the filters' transform, 16 K C floats written and
# read back by the GEMMs) costs as much as the tiles' own: fitted to VGG-16's layers at 32x32,
# batch 16 (tools/bench_winograd.py, 2026-11-28): forward 0.98 at 512 channels on 4x4 maps
# (64 tiles), 0.43 on 2x2 maps (16 tiles), against 1.56 on 7x7 maps at batch 16 (256 tiles)
FIXED_TILES = 32


def speed(layer, phase):
    """Winograd's speed against im2col's on the CPU (the cost model divides im2col's
    estimate by it): a line in the channels q = log2(sqrt(C K)) (the GEMMs it saves grow as
    C K, its transforms as C + K, so it pays on wide layers alone), times the share of the
    work that the tiles take beside the filters' transform (:data:`FIXED_TILES`) and the
    share of the tiles' outputs that are kept (odd maps compute a row and a column more).
    Fitted to tools/bench_winograd.py (2026-11-28, one thread, CPU time, median of 3-5
    rounds; 3x3 pad 1 convolutions): forward 0.68-0.82 at 16-64 channels, 0.96-1.18 at 128,
    1.21-1.45 at 256, 1.56 at 512 (7x7 maps); the line stays under most of them (a wrong
    Winograd costs more than a missed one). The backward (dw by im2col, dx by Winograd,
    against im2col's one gather for both) measured 0.68-0.91 up to 128 channels on large
    batches of tiles, 0.98-1.19 at 256-512: counted at most 1.0, so that im2col keeps it
    unless a measured table (``--profile``) says otherwise."""
    n, c, h, w, k, g, ho, wo = layer.geometry
    q = math.log2(math.sqrt(c * k))
    th, tw = -(-ho // 2), -(-wo // 2)
    tiles = n * th * tw
    share = tiles / (tiles + FIXED_TILES) * (ho * wo) / (4 * th * tw)
    if phase == "forward":
        return max(0.7, 0.95 + 0.18 * (q - 6.5)) * share
    return min(1.0, max(0.65, 0.8 + 0.08 * (q - 6)) * share)
