"""Convolution (Caffe's ``Convolution``) with algorithms that trade speed for workspace.

Shapes: bottom (N, C, H, W), weight (K, C/g, kh, kw), bias (K,), top (N, K, Ho, Wo) with
Caffe's ``Ho = (H + 2p - (d(kh-1)+1)) // s + 1``. The window is Caffe's: ``kernel_size``,
``stride`` and ``pad`` (one int, or [h, w]), or each as ``_h`` and ``_w`` (``kernel_h``,
``kernel_w``, ...; see :func:`window_settings`, shared with Pooling).

Everything is built from two moves along the kernel taps (i, j): :func:`gather` copies the
input pixel each output position sees through one tap into a buffer (zero where it sees
padding), and :func:`scatter_add` is its adjoint (Caffe's col2im), used for the data gradient.
Column buffers are laid out (C, kh, kw, ...), so with groups they read as (g, C/g·kh·kw, ...)
and match the weight's (g, K/g, C/g·kh·kw).

Each algorithm is one method that computes any of three products of ``y = conv(x, w)``: ``y``,
the weight gradient ``dw`` (from x and dy) and the data gradient ``dx`` (from dy). The forward
asks for y, the backward for dw and dx; Deconvolution (layers/deconv.py), the adjoint, asks
for dx in its forward and for y and dw in its backward. Fastest first:

- ``im2col`` (layers/im2col.py): the batch's columns, one GEMM per group, built from a
  zero-bordered copy of the input one tap at a time, on the CPU a cache-sized chunk of
  samples at a time; a stride-1 backward gathers dy's columns
  once and takes dx as a convolution of dy with the flipped kernel and dw from the same
  columns, where that costs less than col2im's scatter.
- ``im2col_chunked``: one sample's columns at a time; y's GEMM writes into y[n] directly, the
  weight gradient adds per-sample parts through a weight-sized buffer. A pointwise
  convolution (1x1, stride 1, no pad) uses x itself as its columns, and dx as theirs.
- ``direct``: for each tap and sample, the shifted input (C, Ho·Wo) times that tap's weight
  slice, accumulated through a product buffer; workspace about two feature maps of one sample.
  (Not offered for pointwise convolutions, where ``im2col_chunked`` already needs none.)

- ``depthwise``, offered first where every channel is its own group with one filter
  (MobileNet's 3x3 layers): tap by tap, every channel at once, in one map of workspace.

On a GPU with NVIDIA's cuDNN Frontend (``self.kernels``, set by the Graph; layers/cudnn.py)
float32 convolutions offer cuDNN's engines instead (``cudnn``, ``cudnn_lean``); the three
above remain the fallback where cuDNN refuses a shape.
"""

import math

from . import parallel, winograd
from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .fillers import parse_filler
from .im2col import im2col, workspace_shapes
from .registry import register
from .windows import gather, scatter_add, window_taps


def conv_out_size(n, k, s, p, d=1):
    """Caffe's output size along one axis."""
    return (n + 2 * p - (d * (k - 1) + 1)) // s + 1


def window_keys(window):
    """Caffe's keys for a ``window``'s size, stride and padding: each square (one int, or [h, w])
    or as ``_h`` and ``_w``. The square keys default to None so that :func:`window_settings`
    can tell a key written from one left out, as Caffe's ``has_pad()`` does."""
    keys = {}
    for square, name, doc in (("kernel_size", "kernel", f"{window} height and width"),
                              ("stride", "stride", "step between windows (default 1)"),
                              ("pad", "pad", "padding on each side (default 0)")):
        keys[square] = Key("pair", None, doc=f"{doc}; or {name}_h and {name}_w")
        keys[name + "_h"] = Key("int", None)
        keys[name + "_w"] = Key("int", None)
    return keys


def _pair_setting(layer, square, name):
    """``cfg[square]``, or ``(name_h, name_w)``; None if neither is written. Fails, as Caffe's
    checks do, on half a pair or on both spellings at once."""
    cfg = layer.cfg
    h, w = cfg[name + "_h"], cfg[name + "_w"]
    if h is None and w is None:
        return cfg[square]
    if h is None or w is None:
        have, lack = (f"{name}_h", f"{name}_w") if w is None else (f"{name}_w", f"{name}_h")
        layer.fail(f"{have} needs {lack} too (or write {square}: [h, w])")
    if cfg[square] is not None:
        layer.fail(f"{square} and {name}_h/{name}_w are two spellings of one setting; write "
                   f"either {square}: [{h}, {w}] or {name}_h: {h} and {name}_w: {w}")
    return (h, w)


def window_settings(layer):
    """``(kernel, stride, pad)`` of a layer with :func:`window_keys`, each an (h, w) tuple
    (kernel None when not given; stride 1 and pad 0 by default)."""
    return (_pair_setting(layer, "kernel_size", "kernel"),
            _pair_setting(layer, "stride", "stride") or (1, 1),
            _pair_setting(layer, "pad", "pad") or (0, 0))


@register
class Convolution(Layer):
    """2-D convolution with groups and dilation; Caffe's parameters, flattened."""

    KEYS = {
        "num_output": Key("int", doc="output channels K"),
        **window_keys("kernel"),
        "dilation": Key("pair", (1, 1)),
        "group": Key("int", 1, doc="channel groups; C and K must both divide by it"),
        "bias_term": Key("bool", True),
        "weight_filler": Key("filler", parse_filler("msra")),
        "bias_filler": Key("filler", parse_filler("constant")),
    }
    CHUNK_FLOPS = 4.3e6
    # depthwise against im2col's grouped GEMMs, forward and backward, float32, one thread,
    # MobileNet's 3x3 layers at batch 16 (2026-11-28, the 2-core machine): 1.05x (512 channels,
    # 14x14) to 2.1x (256, 28x28, stride 2); PyTorch's own kernel was 3-9x faster than either
    DEPTHWISE_SPEED = 1.5  # a sample's GEMM work that ``im2col_chunked``'s per-sample costs are worth

    def setup(self, bottom_shapes):
        n, c, h, w = self._check(bottom_shapes)
        k, g = self.cfg["num_output"], self.cfg["group"]
        ho, wo = (conv_out_size((h, w)[a], self.kernel[a], self.stride[a], self.pad[a],
                                self.dilation[a]) for a in (0, 1))
        if ho < 1 or wo < 1:
            extent = [d * (kk - 1) + 1 for kk, d in zip(self.kernel, self.dilation, strict=True)]
            self.fail(f"input {h}x{w} (pad {list(self.pad)}) is smaller than the kernel's extent "
                      f"{extent[0]}x{extent[1]}")
        self._set_geometry((n, c, h, w, k, g, ho, wo))
        self.top_shapes = [(n, k, ho, wo)]
        return list(self.top_shapes)

    def _check(self, bottom_shapes):
        """Check the bottom and the keys, set ``kernel``, ``stride``, ``pad`` and ``dilation``
        as (h, w) tuples; return the bottom's shape (shared with Deconvolution)."""
        shape = tuple(bottom_shapes[0])
        if len(shape) != 4:
            self.fail(f"expects a 4-D bottom (N, C, H, W), got {shape}")
        c, k, g = shape[1], self.cfg["num_output"], self.cfg["group"]
        kernel, stride, pad = window_settings(self)
        dil = self.cfg["dilation"]
        if kernel is None:
            self.fail("missing kernel_size (or kernel_h and kernel_w)")
        if k < 1 or g < 1:
            self.fail(f"num_output ({k}) and group ({g}) must be >= 1")
        if min(kernel) < 1 or min(stride) < 1 or min(dil) < 1 or min(pad) < 0:
            self.fail(f"kernel_size {list(kernel)}, stride {list(stride)} and dilation "
                      f"{list(dil)} must be >= 1 and pad {list(pad)} >= 0")
        if c % g:
            self.fail(f"{c} input channels are not divisible by group {g}")
        if k % g:
            self.fail(f"num_output {k} is not divisible by group {g}")
        self.kernel, self.stride, self.pad, self.dilation = kernel, stride, pad, dil
        self.bottom_shapes = [shape]
        return shape

    def _set_geometry(self, geometry):
        """``(N, C, H, W, K, g, Ho, Wo)`` of the convolution the kernels compute, and its taps."""
        n, c, h, w, k, g, ho, wo = self.geometry = geometry
        self._taps = window_taps(self.kernel, self.stride, self.pad, self.dilation, (h, w), (ho, wo))
        self._pointwise = self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)

    def param_specs(self):
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.kernel
        specs = [ParamSpec("weight", (k, c // g, kh, kw), self.cfg["weight_filler"],
                           fan_in=c // g * kh * kw, fan_out=k * kh * kw)]
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("bias", (self.cfg["num_output"],), self.cfg["bias_filler"],
                                   fan_in=1, fan_out=1))
        return specs

    def backward_reads(self):
        return (0,), ()

    def grad_over_bottom(self):
        return [0]  # every algorithm takes a sample's dw before it writes that sample's dx

    def _cudnn_key(self):
        return self.geometry, self.kernel, self.stride, self.pad, self.dilation

    def _cudnn_algorithms(self, phase):
        if self.kernels is None or self.dtype != "float32":
            return []
        return self.kernels.conv_algorithms(self._cudnn_key(), phase)

    def algorithms(self, phase):
        outputs = {"y"} if phase == "forward" else {"dw", "dx"}
        return self._cudnn_algorithms(phase) or self._algorithms(outputs)

    def _algorithms(self, outputs):
        """The three algorithms computing ``outputs`` (of 'y', 'dw', 'dx'), with their workspace."""
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.kernel
        dt, p, cg = self.dtype, ho * wo, c // g
        cols = (0,) if self._pointwise else (c * kh * kw, p)  # one sample's columns
        part = [((k, cg * kh * kw), dt)] if "dw" in outputs else []
        direct = [((k, cg), dt), ((c, p), dt)]
        direct += [((k, p), dt)] if "y" in outputs else []
        direct += [((k, cg), dt)] if "dw" in outputs else []
        chunked = self._chunked_speed()
        algos = [Algo("im2col", workspace_bytes(*workspace_shapes(self, outputs)), 1.0),
                 Algo("im2col_chunked", workspace_bytes((cols, dt), *part), chunked)]
        if not self._pointwise:
            algos.append(Algo("direct", workspace_bytes(*direct), chunked * 2 / 3))
        wino = self._winograd_algorithm(outputs)
        if wino is not None:  # in its place by speed: fastest first
            algos.insert(next((i for i, a in enumerate(algos) if a.speed < wino.speed), len(algos)), wino)
        if self._depthwise_ok():
            scratch = [((c, ho, wo), dt)] + ([((c,), dt)] if "dw" in outputs else [])
            algos.insert(0, Algo("depthwise", workspace_bytes(*scratch), self.DEPTHWISE_SPEED))
        return algos

    def _winograd_algorithm(self, outputs):
        """``winograd`` (layers/winograd.py) where it applies: y by F(2x2, 3x3); in the
        backward dw by im2col first, then dx by Winograd in the same workspace (the larger
        of the two); None where Winograd refuses the layer."""
        if outputs not in ({"y"}, {"dw", "dx"}):  # Deconvolution's products: not offered
            return None
        phase = "forward" if "y" in outputs else "backward"
        if winograd.refusal(self, phase) is not None:
            return None
        speed = winograd.speed(self, phase)
        if phase == "forward":
            return Algo("winograd", self._winograd_bytes("x"), speed, host_only=True)
        dw_only = workspace_bytes(*workspace_shapes(self, {"dw", "dx"}))  # im2col's, as declared
        return Algo("winograd", max(dw_only, self._winograd_bytes("dy")), speed, host_only=True)

    def _winograd_bytes(self, source):
        """The workspace of the Winograd convolution of ``source`` ('x': the forward; 'dy':
        the data gradient's)."""
        return workspace_bytes(*winograd.tiling(self, source).workspace_shapes(self.dtype))

    def _depthwise_ok(self):
        """A depthwise convolution (every channel its own group, one filter each: MobileNet's)."""
        n, c, h, w, k, g, ho, wo = self.geometry
        return g == c == k and g > 1 and not self._pointwise

    def _chunked_speed(self):
        """``im2col_chunked``'s speed against ``im2col``: a sample a call, so the smaller a
        sample's GEMMs, the more each call's fixed costs (its gathers, scatters and GEMM set-up)
        weigh. Measured on the 2-core machine (2026-11-27, float32, 3x3 convolutions, forward
        and backward): 0.37-0.56 at 4.7 MFLOP a sample (CIFAR's 8x8 and 16x16 maps), 0.85-0.93
        at 231 MFLOP (56x56, 64 channels); CHUNK_FLOPS fits both. ``direct``, a call per tap
        and sample, is counted at 2/3 of it (measured 0.33-0.41 and 0.46-0.70)."""
        n, c, h, w, k, g, ho, wo = self.geometry
        flops = 2 * k * (c // g) * self.kernel[0] * self.kernel[1] * ho * wo
        return 0.9 * flops / (flops + self.CHUNK_FLOPS)

    def cost(self):
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.kernel
        flops = 2.0 * n * k * ho * wo * (c // g) * kh * kw
        item = self.dtype.itemsize
        # bottom and top bytes (for Deconvolution the geometry's x is the top); the backward
        # reads the bottom and the top gradient and writes the bottom gradient
        x, y = (math.prod(s) * item for s in (self.bottom_shapes[0], self.top_shapes[0]))
        wt = k * (c // g) * kh * kw * item
        return Cost(flops, 2 * flops, float(x + y + wt), float(2 * x + y + 2 * wt))

    # -- kernels -------------------------------------------------------------------------
    def forward(self, ctx, bottoms, tops, params):
        algo = ctx.algo or self.algorithms("forward")[0].name
        if algo.startswith("cudnn"):
            self.kernels.conv_forward(self._cudnn_key(), algo, bottoms[0], params["weight"],
                                      tops[0], ctx.workspace)
        else:
            getattr(self, "_" + algo)(ctx, params["weight"], x=bottoms[0], y=tops[0])
        self._add_bias(ctx.xp, tops[0], params)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        algo = ctx.algo or self.algorithms("backward")[0].name
        if algo.startswith("cudnn"):
            self.kernels.conv_backward(self._cudnn_key(), algo, bottoms[0], params["weight"],
                                       top_grads[0], (bottom_grads[0], param_grads["weight"]), ctx.workspace)
        else:
            getattr(self, "_" + algo)(ctx, params["weight"], x=bottoms[0], dy=top_grads[0],
                                      dw=param_grads["weight"], dx=bottom_grads[0])
        self._bias_grad(ctx.xp, top_grads[0], param_grads)

    def _add_bias(self, xp, top, params):
        if self.cfg["bias_term"]:
            xp.add(top, params["bias"].reshape(1, -1, 1, 1), out=top)

    def _bias_grad(self, xp, dy, param_grads):
        if self.cfg["bias_term"]:
            xp.sum(dy, axis=(0, 2, 3), out=param_grads["bias"])

    def _shapes(self):
        """(N, K, g, K/g, C/g·kh·kw, Ho·Wo): the GEMM dimensions."""
        n, c, h, w, k, g, ho, wo = self.geometry
        kh, kw = self.kernel
        return n, k, g, k // g, c // g * kh * kw, ho * wo

    # Each kernel below writes any of y = conv(x, weight), dw (from x and dy) and dx (from dy);
    # an output not asked for is None, and x is read only for y or dw.

    def _im2col(self, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
        im2col(self, ctx, weight, x=x, dy=dy, y=y, dw=dw, dx=dx)  # layers/im2col.py

    def _im2col_chunked(self, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        c, (kh, kw) = self.geometry[1], self.kernel
        col = None if self._pointwise else ctx.scratch((c, kh, kw) + self.geometry[6:], self.dtype)
        part = None if dw is None else ctx.scratch((g, kg, ckk), self.dtype)
        w3, dw3 = weight.reshape(g, kg, ckk), None if dw is None else dw.reshape(g, kg, ckk)
        for s in range(n):  # a sample's x read before its dx is written: dx may be x's memory
            if col is None:  # pointwise: x's sample is its own columns, dx's its gradient
                cols = None if x is None else x[s].reshape(g, ckk, p)
            else:
                if x is not None:
                    for i, j, out_index, in_index in self._taps:
                        gather(xp, col[:, i, j], x[s], out_index, in_index)
                cols = col.reshape(g, ckk, p)
            if dw is not None:
                parallel.matmul(xp, dy[s].reshape(g, kg, p), cols.transpose(0, 2, 1), part if s else dw3)
                if s:
                    xp.add(dw3, part, out=dw3)
            if y is not None:
                parallel.matmul(xp, w3, cols, y[s].reshape(g, kg, p))
            if dx is not None:
                dcols = dx[s].reshape(g, ckk, p) if col is None else cols
                parallel.matmul(xp, w3.transpose(0, 2, 1), dy[s].reshape(g, kg, p), dcols)
                if col is not None:
                    dx[s].fill(0)
                    for i, j, out_index, in_index in self._taps:
                        scatter_add(xp, dx[s], col[:, i, j], out_index, in_index)

    def _winograd(self, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
        """F(2x2, 3x3) (layers/winograd.py): y; or dw by im2col, then dx as the Winograd
        convolution of dy with the turned filters, in the workspace im2col used."""
        if y is not None:
            plan = winograd.tiling(self, "x")
            winograd.convolve(ctx.xp, plan, _carve(ctx, plan, self.dtype), weight, x, y)
            return
        if dw is not None:
            im2col(self, ctx, weight, x=x, dy=dy, dw=dw)
            ctx.reset_scratch()  # dw is written: dx's Winograd takes the same workspace
        if dx is not None:
            plan = winograd.tiling(self, "dy")
            winograd.convolve(ctx.xp, plan, _carve(ctx, plan, self.dtype), weight, dy, dx, turned=True)

    def _by_tap(self, weight):
        """``weight`` as (g, K/g, C/g, kh, kw): ``[..., i, j]`` is tap (i, j)'s slice, a view."""
        n, c, h, w, k, g, ho, wo = self.geometry
        return weight.reshape((g, k // g, c // g) + self.kernel)

    def _direct(self, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
        xp = ctx.xp
        n, k, g, kg, ckk, p = self._shapes()
        c = self.geometry[1]
        w_tap = ctx.scratch((g, kg, c // g), self.dtype)  # contiguous, for the GEMM
        shifted = ctx.scratch((c,) + self.geometry[6:], self.dtype)  # one sample through one tap
        shifted3 = shifted.reshape(g, c // g, p)
        prod = None if y is None else ctx.scratch((g, kg, p), self.dtype)
        part = None if dw is None else ctx.scratch((g, kg, c // g), self.dtype)
        weight, dw_taps = self._by_tap(weight), None if dw is None else self._by_tap(dw)
        # y and dw, which read x, first; then dx, which may be written over x's memory
        for outs, reads_x in (((y, dw), True), ((dx,), False)):
            if all(out is None for out in outs):
                continue
            for out in outs:
                if out is not None:
                    out.fill(0)
            for i, j, out_index, in_index in self._taps:
                if out_index is None:
                    continue  # this tap sees only padding
                xp.copyto(w_tap, weight[..., i, j])
                for s in range(n):
                    if not reads_x:  # the shifted gradient, scattered back
                        parallel.matmul(xp, w_tap.transpose(0, 2, 1), dy[s].reshape(g, kg, p), shifted3)
                        scatter_add(xp, dx[s], shifted, out_index, in_index)
                        continue
                    gather(xp, shifted, x[s], out_index, in_index)
                    if dw is not None:
                        dw_tap = dw_taps[..., i, j]
                        parallel.matmul(xp, dy[s].reshape(g, kg, p), shifted3.transpose(0, 2, 1), part)
                        xp.add(dw_tap, part, out=dw_tap)
                    if y is not None:
                        ys = y[s].reshape(g, kg, p)
                        parallel.matmul(xp, w_tap, shifted3, prod)
                        xp.add(ys, prod, out=ys)

    def _depthwise(self, ctx, weight, x=None, dy=None, y=None, dw=None, dx=None):
        """A depthwise convolution tap by tap, every channel at once: each tap's shifted input
        (or gradient) times that tap's weight per channel, a sample at a time, in one map of
        workspace; no GEMM, no columns (im2col's grouped GEMMs are a GEMM of one row per
        channel). A sample's dw is taken before its dx is written (dx may be x's memory)."""
        xp = ctx.xp
        n, c = self.geometry[:2]
        prod = ctx.scratch((c,) + self.geometry[6:], self.dtype)
        part = None if dw is None else ctx.scratch((c,), self.dtype)
        taps = [(weight[:, 0, i, j].reshape(c, 1, 1), None if dw is None else dw[:, 0, i, j], o, v)
                for i, j, o, v in self._taps if o is not None]
        for out in (y, dw):
            if out is not None:
                out.fill(0)
        for s in range(n):
            if y is not None:
                for w_tap, _, out_index, in_index in taps:
                    xp.multiply(x[s][in_index], w_tap, out=prod[out_index])
                    ys = y[s][out_index]
                    xp.add(ys, prod[out_index], out=ys)
            if dw is not None:
                for _, dw_tap, out_index, in_index in taps:
                    xp.multiply(x[s][in_index], dy[s][out_index], out=prod[out_index])
                    xp.sum(prod[out_index], axis=(1, 2), out=part)
                    xp.add(dw_tap, part, out=dw_tap)
            if dx is not None:
                dx[s].fill(0)
                for w_tap, _, out_index, in_index in taps:
                    xp.multiply(dy[s][out_index], w_tap, out=prod[out_index])
                    view = dx[s][in_index]
                    xp.add(view, prod[out_index], out=view)


def _carve(ctx, plan, dtype):
    """The scratch arrays of a Winograd ``plan``, carved in its declared order."""
    return [ctx.scratch(shape, dt) for shape, dt in plan.workspace_shapes(dtype)]
