"""Convolution (Caffe's ``Convolution``) with three algorithms that trade speed for workspace.

Shapes: bottom (N, C, H, W), weight (K, C/g, kh, kw), bias (K,), top (N, K, Ho, Wo) with
Caffe's ``Ho = (H + 2p - (d(kh-1)+1)) // s + 1``. Everything is built from two moves along the
kernel taps (i, j): :func:`gather` copies the input pixel each output position sees through
one tap into a buffer (zero where it sees padding), and :func:`scatter_add` is its adjoint
(Caffe's col2im), used for the data gradient. Column buffers are laid out (C, kh, kw, ...),
so with groups they read as (g, C/g·kh·kw, ...) and match the weight's (g, K/g, C/g·kh·kw).

Algorithms, fastest first (the same three for forward and backward):

- ``im2col``: the whole batch's columns as (C·kh·kw, N·Ho·Wo) per group, one GEMM per group.
  The batch sits inside the GEMM, so the weight gradient needs no per-sample partial sums;
  the price is a top-sized buffer holding the top (or its gradient) in (K, N·Ho·Wo) order.
- ``im2col_chunked``: one sample's columns at a time; the forward GEMM writes into top[n]
  directly, the backward adds per-sample weight gradients through a weight-sized buffer.
  A pointwise convolution (1x1, stride 1, no pad) uses the input itself as its columns.
- ``direct``: for each tap and sample, the shifted input (C, Ho·Wo) times that tap's weight
  slice, accumulated through a product buffer; workspace about two feature maps of one sample.
  (Not offered for pointwise convolutions, where ``im2col_chunked`` already needs none.)

On a GPU with NVIDIA's cuDNN Frontend (``self.kernels``, set by the Graph; layers/cudnn.py)
float32 convolutions offer cuDNN's engines instead (``cudnn``, ``cudnn_lean``); the three
above remain the fallback where cuDNN refuses a shape.
"""

from . import register
from .base import Algo, Cost, Key, Layer, ParamSpec, parse_filler, workspace_bytes


def conv_out_size(n, k, s, p, d=1):
    """Caffe's output size along one axis."""
    return (n + 2 * p - (d * (k - 1) + 1)) // s + 1


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
    when the tap sees only padding). Shared with Pooling."""
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


@register
class Convolution(Layer):
    """2-D convolution with groups and dilation; Caffe's parameters, flattened."""

    KEYS = {
        "num_output": Key("int", doc="output channels K"),
        "kernel_size": Key("pair", doc="kernel height and width"),
        "stride": Key("pair", (1, 1)),
        "pad": Key("pair", (0, 0), doc="zero padding on each side"),
        "dilation": Key("pair", (1, 1)),
        "group": Key("int", 1, doc="channel groups; C and K must both divide by it"),
        "bias_term": Key("bool", True),
        "weight_filler": Key("filler", parse_filler("msra")),
        "bias_filler": Key("filler", parse_filler("constant")),
    }

    def setup(self, bottom_shapes):
        shape = tuple(bottom_shapes[0])
        if len(shape) != 4:
            self.fail(f"expects a 4-D bottom (N, C, H, W), got {shape}")
        n, c, h, w = shape
        cfg = self.cfg
        k, g = cfg["num_output"], cfg["group"]
        kernel, stride, pad, dil = cfg["kernel_size"], cfg["stride"], cfg["pad"], cfg["dilation"]
        if k < 1 or g < 1:
            self.fail(f"num_output ({k}) and group ({g}) must be >= 1")
        if min(kernel) < 1 or min(stride) < 1 or min(dil) < 1 or min(pad) < 0:
            self.fail(f"kernel_size {list(kernel)}, stride {list(stride)} and dilation "
                      f"{list(dil)} must be >= 1 and pad {list(pad)} >= 0")
        if c % g:
            self.fail(f"{c} input channels are not divisible by group {g}")
        if k % g:
            self.fail(f"num_output {k} is not divisible by group {g}")
        ho, wo = (conv_out_size((h, w)[a], kernel[a], stride[a], pad[a], dil[a]) for a in (0, 1))
        if ho < 1 or wo < 1:
            extent = [d * (kk - 1) + 1 for kk, d in zip(kernel, dil, strict=True)]
            self.fail(f"input {h}x{w} (pad {list(pad)}) is smaller than the kernel's extent "
                      f"{extent[0]}x{extent[1]}")
        self.geometry = (n, c, h, w, k, g, ho, wo)
        self._taps = window_taps(kernel, stride, pad, dil, (h, w), (ho, wo))
        self._pointwise = kernel == (1, 1) and stride == (1, 1) and pad == (0, 0)
        self.bottom_shapes, self.top_shapes = [shape], [(n, k, ho, wo)]
        return list(self.top_shapes)

    def param_specs(self):
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.cfg["kernel_size"]
        specs = [ParamSpec("weight", (k, c // g, kh, kw), self.cfg["weight_filler"],
                           fan_in=c // g * kh * kw, fan_out=k * kh * kw)]
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("bias", (k,), self.cfg["bias_filler"], fan_in=1, fan_out=1))
        return specs

    def backward_reads(self):
        return (0,), ()

    def _cudnn_key(self):
        cfg = self.cfg
        return (self.geometry, cfg["kernel_size"], cfg["stride"], cfg["pad"], cfg["dilation"])

    def _cudnn_algorithms(self, phase):
        if self.kernels is None or self.dtype != "float32":
            return []
        return self.kernels.conv_algorithms(self._cudnn_key(), phase)

    def algorithms(self, phase):
        vendor = self._cudnn_algorithms(phase)
        if vendor:
            return vendor
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.cfg["kernel_size"]
        dt, p, cg = self.dtype, ho * wo, c // g
        cols = (0,) if self._pointwise else (c * kh * kw, p)  # one sample's columns
        if phase == "forward":
            chunked = workspace_bytes((cols, dt))
            direct = workspace_bytes(((k, cg), dt), ((c, p), dt), ((k, p), dt))
        else:
            chunked = workspace_bytes((cols, dt), ((k, cg * kh * kw), dt))
            direct = workspace_bytes(((k, cg), dt), ((c, p), dt), ((k, cg), dt))
        algos = [Algo("im2col", workspace_bytes(((c * kh * kw, n * p), dt), ((k, n * p), dt)), 1.0),
                 Algo("im2col_chunked", chunked, 0.8)]
        if not self._pointwise:
            algos.append(Algo("direct", direct, 0.5))
        return algos

    def cost(self):
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.cfg["kernel_size"]
        flops = 2.0 * n * k * ho * wo * (c // g) * kh * kw
        item = self.dtype.itemsize
        x, y, wt = n * c * h * w * item, n * k * ho * wo * item, k * (c // g) * kh * kw * item
        return Cost(flops, 2 * flops, float(x + y + wt), float(2 * x + y + 2 * wt))

    # -- kernels -------------------------------------------------------------------------
    def _shapes(self):
        """(N, K, g, K/g, C/g·kh·kw, Ho·Wo): the GEMM dimensions."""
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.cfg["kernel_size"]
        return n, k, g, k // g, c // g * kh * kw, ho * wo

    def _add_bias(self, xp, top, params):
        if self.cfg["bias_term"]:
            xp.add(top, params["bias"].reshape(1, -1, 1, 1), out=top)

    def _bias_grad(self, xp, dy, param_grads):
        if self.cfg["bias_term"]:
            xp.sum(dy, axis=(0, 2, 3), out=param_grads["bias"])

    def forward(self, ctx, bottoms, tops, params):
        algo = ctx.algo or self.algorithms("forward")[0].name
        if algo.startswith("cudnn"):
            self.kernels.conv_forward(self._cudnn_key(), algo, bottoms[0], params["weight"],
                                      tops[0], ctx.workspace)
            self._add_bias(ctx.xp, tops[0], params)
            return
        getattr(self, "_forward_" + algo)(ctx, bottoms[0], tops[0], params)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        algo = ctx.algo or self.algorithms("backward")[0].name
        if algo.startswith("cudnn"):
            self.kernels.conv_backward(self._cudnn_key(), algo, bottoms[0], params["weight"],
                                       top_grads[0], bottom_grads[0], param_grads["weight"],
                                       ctx.workspace)
            self._bias_grad(ctx.xp, top_grads[0], param_grads)
            return
        getattr(self, "_backward_" + algo)(ctx, bottoms[0], top_grads[0], bottom_grads[0],
                                           params["weight"], param_grads)

    def _batch_columns(self, ctx, x):
        """The whole batch's columns, (C, kh, kw, N, Ho, Wo) in a (g, C/g·kh·kw, N·Ho·Wo) view."""
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.cfg["kernel_size"]
        col = ctx.scratch((c, kh, kw, n, ho, wo), x.dtype)
        xt = x.transpose(1, 0, 2, 3)
        for i, j, out_index, in_index in self._taps:
            gather(ctx.xp, col[:, i, j], xt, out_index, in_index)
        return col

    def _forward_im2col(self, ctx, x, top, params):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        col = self._batch_columns(ctx, x)
        y = ctx.scratch((k, n, p), x.dtype)
        xp.matmul(params["weight"].reshape(g, kg, ckk), col.reshape(g, ckk, n * p),
                  out=y.reshape(g, kg, n * p))
        xp.copyto(top.reshape(n, k, p), y.transpose(1, 0, 2))
        self._add_bias(xp, top, params)

    def _backward_im2col(self, ctx, x, dy, dx, weight, param_grads):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        col = self._batch_columns(ctx, x)
        cols = col.reshape(g, ckk, n * p)
        dyt = ctx.scratch((k, n, p), x.dtype)
        xp.copyto(dyt, dy.reshape(n, k, p).transpose(1, 0, 2))
        dyt = dyt.reshape(g, kg, n * p)
        xp.matmul(dyt, cols.transpose(0, 2, 1), out=param_grads["weight"].reshape(g, kg, ckk))
        self._bias_grad(xp, dy, param_grads)
        if dx is None:
            return
        xp.matmul(weight.reshape(g, kg, ckk).transpose(0, 2, 1), dyt, out=cols)  # dcol
        dx.fill(0)
        dxt = dx.transpose(1, 0, 2, 3)
        for i, j, out_index, in_index in self._taps:
            scatter_add(xp, dxt, col[:, i, j], out_index, in_index)

    def _sample_columns(self, ctx, x):
        """A buffer for one sample's columns, (C, kh, kw, Ho, Wo), and a function filling it."""
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.cfg["kernel_size"]
        if self._pointwise:
            return None, lambda i: x[i]
        col = ctx.scratch((c, kh, kw, ho, wo), x.dtype)

        def columns(s):
            for i, j, out_index, in_index in self._taps:
                gather(ctx.xp, col[:, i, j], x[s], out_index, in_index)
            return col
        return col, columns

    def _forward_im2col_chunked(self, ctx, x, top, params):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        w3 = params["weight"].reshape(g, kg, ckk)
        _, columns = self._sample_columns(ctx, x)
        for s in range(n):
            xp.matmul(w3, columns(s).reshape(g, ckk, p), out=top[s].reshape(g, kg, p))
        self._add_bias(xp, top, params)

    def _backward_im2col_chunked(self, ctx, x, dy, dx, weight, param_grads):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        col, columns = self._sample_columns(ctx, x)
        part = ctx.scratch((g, kg, ckk), x.dtype)
        dw = param_grads["weight"].reshape(g, kg, ckk)
        wt = weight.reshape(g, kg, ckk).transpose(0, 2, 1)
        self._bias_grad(xp, dy, param_grads)
        if dx is not None and col is not None:
            dx.fill(0)
        for s in range(n):
            cols = columns(s).reshape(g, ckk, p)
            dys = dy[s].reshape(g, kg, p)
            xp.matmul(dys, cols.transpose(0, 2, 1), out=dw if s == 0 else part)
            if s:
                xp.add(dw, part, out=dw)
            if dx is None:
                continue
            if col is None:  # pointwise: the sample's gradient is its column gradient
                xp.matmul(wt, dys, out=dx[s].reshape(g, ckk, p))
                continue
            xp.matmul(wt, dys, out=cols)
            for i, j, out_index, in_index in self._taps:
                scatter_add(xp, dx[s], col[:, i, j], out_index, in_index)

    def _by_tap(self, weight):
        """``weight`` as (g, K/g, C/g, kh, kw): ``[..., i, j]`` is tap (i, j)'s slice, a view."""
        n, c, h, w, k, g, ho, wo = self.geometry
        return weight.reshape((g, k // g, c // g) + tuple(self.cfg["kernel_size"]))

    def _direct_buffers(self, ctx, x):
        """One tap's weight slice (contiguous, for the GEMM) and one sample's shifted input."""
        n, c, h, w, k, g, ho, wo = self.geometry
        return ctx.scratch((g, k // g, c // g), x.dtype), ctx.scratch((c, ho, wo), x.dtype)

    def _forward_direct(self, ctx, x, top, params):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        cg = x.shape[1] // g
        w_tap, shifted = self._direct_buffers(ctx, x)
        weight = self._by_tap(params["weight"])
        prod = ctx.scratch((g, kg, p), x.dtype)
        if self.cfg["bias_term"]:
            xp.copyto(top, params["bias"].reshape(1, -1, 1, 1))
        else:
            top.fill(0)
        for i, j, out_index, in_index in self._taps:
            if out_index is None:
                continue  # this tap sees only padding
            xp.copyto(w_tap, weight[..., i, j])
            for s in range(n):
                gather(xp, shifted, x[s], out_index, in_index)
                xp.matmul(w_tap, shifted.reshape(g, cg, p), out=prod)
                ys = top[s].reshape(g, kg, p)
                xp.add(ys, prod, out=ys)

    def _backward_direct(self, ctx, x, dy, dx, weight, param_grads):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        cg = x.shape[1] // g
        w_tap, shifted = self._direct_buffers(ctx, x)
        part = ctx.scratch((g, kg, cg), x.dtype)
        param_grads["weight"].fill(0)
        weight, dw = self._by_tap(weight), self._by_tap(param_grads["weight"])
        self._bias_grad(xp, dy, param_grads)
        if dx is not None:
            dx.fill(0)
        for i, j, out_index, in_index in self._taps:
            if out_index is None:
                continue
            dw_tap = dw[..., i, j]
            xp.copyto(w_tap, weight[..., i, j])
            for s in range(n):
                gather(xp, shifted, x[s], out_index, in_index)
                dys = dy[s].reshape(g, kg, p)
                xp.matmul(dys, shifted.reshape(g, cg, p).transpose(0, 2, 1), out=part)
                xp.add(dw_tap, part, out=dw_tap)
                if dx is not None:
                    xp.matmul(w_tap.transpose(0, 2, 1), dys, out=shifted.reshape(g, cg, p))
                    scatter_add(xp, dx[s], shifted, out_index, in_index)
