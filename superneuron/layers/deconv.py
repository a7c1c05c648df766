"""Deconvolution (Caffe's ``Deconvolution``): the adjoint of Convolution, with its keys.

Shapes: bottom (N, C, H, W), weight (C, K/g, kh, kw) as Caffe stores it, bias (K,), top
(N, K, Ho, Wo) with ``Ho = s(H-1) + d(kh-1) + 1 - 2p``. The layer is the convolution whose
bottom is our top and whose top is our bottom, run backwards: that convolution's geometry is
this layer's ``geometry`` and its weight is ours, so the kernels of layers/conv.py serve as
they are. Our forward is its data gradient (dx from dy = our bottom), our backward its forward
(our bottom gradient is y = conv(our top gradient)) and its weight gradient from the same
columns. The three algorithms (``im2col``, ``im2col_chunked``, ``direct``) declare the
workspace of exactly those products.

No cuDNN path: on a GPU the same kernels run through CuPy (``self.kernels`` is ignored).
"""

from .conv import Convolution
from .registry import register


@register
class Deconvolution(Convolution):
    """Transposed convolution (Caffe's Deconvolution): Convolution's keys, the adjoint map."""

    def setup(self, bottom_shapes):
        n, c, h, w = self._check(bottom_shapes)
        k, g = self.cfg["num_output"], self.cfg["group"]
        ho, wo = (self.stride[a] * ((h, w)[a] - 1) + self.dilation[a] * (self.kernel[a] - 1) + 1
                  - 2 * self.pad[a] for a in (0, 1))
        if ho < 1 or wo < 1:
            self.fail(f"pad {list(self.pad)} leaves no output ({ho}x{wo}) for input {h}x{w}, "
                      f"kernel {list(self.kernel)}, stride {list(self.stride)} and dilation "
                      f"{list(self.dilation)}")
        self._set_geometry((n, k, ho, wo, c, g, h, w))  # the convolution from our top to our bottom
        self.top_shapes = [(n, k, ho, wo)]
        return list(self.top_shapes)

    def grad_over_bottom(self):
        return []  # its backward's y (the bottom gradient) is written beside dw, which reads the bottom

    def algorithms(self, phase):
        return self._algorithms({"dx"} if phase == "forward" else {"y", "dw"})

    def forward(self, ctx, bottoms, tops, params):
        algo = ctx.algo or self.algorithms("forward")[0].name
        getattr(self, "_" + algo)(ctx, params["weight"], dy=bottoms[0], dx=tops[0])
        self._add_bias(ctx.xp, tops[0], params)

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        algo = ctx.algo or self.algorithms("backward")[0].name
        getattr(self, "_" + algo)(ctx, params["weight"], x=top_grads[0], dy=bottoms[0],
                                  y=bottom_grads[0], dw=param_grads["weight"])
        self._bias_grad(ctx.xp, top_grads[0], param_grads)
