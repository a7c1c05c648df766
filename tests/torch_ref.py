"""A PyTorch interpreter of a superneuron Graph: the same layers, the same weights, autograd.

The oracle for whole-network tests: run a net here and in PyTorch on the same inputs and
compare the loss and every parameter gradient."""

import numpy as np
import torch
import torch.nn.functional as F


def dropout_scale(net, node, iteration=0):
    """Dropout's mask times 1/(1-p) for ``node`` in ``iteration``, built here from what is
    documented, not taken from the layer: the step's seed (runtime/execution.py's step_seed:
    ``((seed * 1_000_003 + iteration) * 65_537 + node index) mod 2**63``), its uniform numbers
    (Context.uniform on the CPU: ``numpy.random.default_rng(seed).random`` in the layer's
    dtype), a unit kept where its number is at least p (so a fraction 1 - p is kept), and the
    kept ones scaled by 1/(1-p) (Caffe's inverted dropout). A layer that draws another mask,
    keeps the wrong units or scales them otherwise differs from PyTorch by whole activations."""
    shape, dtype, p = node.layer.bottom_shapes[0], node.layer.dtype, node.layer.cfg["dropout_ratio"]
    seed = (int(net.seed) * 1_000_003 + int(iteration)) * 65_537 + int(node.index) & (2**63 - 1)
    u = np.random.default_rng(seed).random(shape, dtype=dtype)
    scale = (u >= p).astype(dtype)
    scale *= 1.0 / (1.0 - p)
    return scale


def lrn_within_channel(x, n, alpha, beta):
    """Caffe's LRN WITHIN_CHANNEL as Caffe builds it: x * (1 + alpha * AVE pool of x^2)^-beta,
    the pool n x n, stride 1, padded by (n-1)/2 and counting the padding (so dividing by n^2)."""
    mean = F.avg_pool2d(x * x, n, 1, (n - 1) // 2, count_include_pad=True)
    return x * (1 + alpha * mean) ** -beta


def run_torch(net, feed, dtype=torch.float32):
    """Forward and backward of ``net``'s graph in PyTorch with ``net``'s current parameters.

    Returns ``(loss, {param name: gradient}, {tensor name: value})``."""
    graph = net.graph
    values, params = {}, {}
    for node in graph.nodes:
        for t in node.params.values():
            params[t] = torch.tensor(net.param(t), dtype=dtype,
                                     requires_grad=graph.tensors[t].kind == "param")
    loss = 0.0
    for node in graph.nodes:
        layer, cfg = node.layer, node.layer.cfg
        xs = [values[b] for b in node.bottoms]
        p = {k: params[t] for k, t in node.params.items()}
        kind = layer.type
        if kind in ("Input", "Data"):
            outs = [torch.tensor(np.asarray(feed[t]), dtype=dtype) for t in node.tops]
        elif kind == "Split":
            outs = [xs[0]] * len(node.tops)
        elif kind == "Convolution":
            outs = [F.conv2d(xs[0], p["weight"], p.get("bias"), layer.stride, layer.pad,
                             layer.dilation, cfg["group"])]
        elif kind == "Deconvolution":  # Caffe's weight layout (C, K/g, kh, kw) is torch's here
            outs = [F.conv_transpose2d(xs[0], p["weight"], p.get("bias"), layer.stride, layer.pad,
                                       0, cfg["group"], layer.dilation)]
        elif kind == "Pooling":
            x = xs[0]
            if cfg["global_pooling"]:
                outs = [x.amax((2, 3), keepdim=True) if cfg["pool"] == "MAX" else x.mean((2, 3), keepdim=True)]
            elif cfg["pool"] == "MAX":
                outs = [F.max_pool2d(x, layer.kernel, layer.stride, layer.pad, ceil_mode=cfg["ceil_mode"])]
            else:
                outs = [F.avg_pool2d(x, layer.kernel, layer.stride, layer.pad, ceil_mode=cfg["ceil_mode"],
                                     count_include_pad=True)]
        elif kind == "InnerProduct":
            outs = [F.linear(xs[0].flatten(cfg["axis"]), p["weight"], p.get("bias"))]
        elif kind == "ReLU":
            slope = cfg["negative_slope"]
            outs = [F.leaky_relu(xs[0], slope) if slope else F.relu(xs[0])]
        elif kind == "BatchNorm":
            s = float(params[node.params["scale_factor"]][0])  # Caffe's: statistics are sums / s
            factor = 0.0 if s == 0 else 1.0 / s
            mean, var = params[node.params["mean"]] * factor, params[node.params["variance"]] * factor
            outs = [F.batch_norm(xs[0], mean, var, training=not cfg["use_global_stats"],
                                 momentum=1 - cfg["moving_average_fraction"], eps=cfg["eps"])]
        elif kind == "Scale":
            shape = [1] * xs[0].dim()
            shape[cfg["axis"]] = -1
            y = xs[0] * p["weight"].reshape(shape)
            outs = [y + p["bias"].reshape(shape) if "bias" in p else y]
        elif kind == "Eltwise":
            op = cfg["operation"]
            if op == "SUM":
                coeff = cfg["coeff"] or (1.0,) * len(xs)
                outs = [sum(c * x for c, x in zip(coeff, xs))]
            elif op == "PROD":
                y = xs[0]
                for x in xs[1:]:
                    y = y * x
                outs = [y]
            else:
                outs = [torch.stack(xs).amax(0)]
        elif kind == "Dropout":
            outs = [xs[0] * torch.tensor(dropout_scale(net, node), dtype=dtype)]
        elif kind == "Concat":
            outs = [torch.cat(xs, cfg["axis"])]
        elif kind == "LRN" and cfg["norm_region"] == "WITHIN_CHANNEL":
            outs = [lrn_within_channel(xs[0], cfg["local_size"], cfg["alpha"], cfg["beta"])]
        elif kind == "LRN":
            outs = [F.local_response_norm(xs[0], cfg["local_size"], cfg["alpha"], cfg["beta"], cfg["k"])]
        elif kind == "Softmax":
            outs = [F.softmax(xs[0], cfg["axis"])]
        elif kind == "SoftmaxWithLoss":
            outs = [F.cross_entropy(xs[0], xs[1].long(), ignore_index=-1)]
            loss = loss + node.loss_weight * outs[0]
        elif kind == "Accuracy":
            outs = [torch.zeros(())]
        else:
            raise NotImplementedError(kind)
        for t, v in zip(node.tops, outs):
            values[t] = v
    loss.backward()
    grads = {t: v.grad.numpy() for t, v in params.items() if v.grad is not None}
    return float(loss.detach()), grads, values
