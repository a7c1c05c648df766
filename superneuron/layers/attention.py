"""MultiHeadAttention: self-attention as one layer whose algorithms trade workspace for time.

For a bottom x of shape (N, T, D) and ``num_heads`` H (head width d = D / H), as
torch.nn.MultiheadAttention computes it::

    q, k, v = split(x W_in^T + b_in)                       each (N, H, T, d)
    P = softmax(q k^T / sqrt(d))                            (N, H, T, T), causal: j > i masked
    y = concat_heads(P v) W_out^T + b_out                   (N, T, D)

Its backward reads only the bottom: what attention needs beyond it (q, k, v, the
probabilities, the heads' outputs) lives in the step's workspace and is recomputed there, so
nothing of size T^2 outlives a step. How much of it is held at once is the algorithm, which
the workspace pass and ``optimal`` choose as they choose convolution's:

- forward ``full``: the probabilities of every query at once (N·H·T² in the workspace);
- forward ``chunked``: a block of ``query_block`` queries at a time (N·H·block·T);
- backward ``full``: the probabilities recomputed whole, then every gradient from them;
- backward ``blocked``: FlashAttention's trade, the probabilities recomputed a block of queries
  at a time, dK and dV summed over the blocks: no T² tensor. Each block's probabilities are
  computed once: the gradient of the heads' outputs (dy W_out) needs no probabilities, so the
  loop over the blocks that makes the gradients also makes the heads' outputs (for dW_out),
  and the blocked backward does full's work, in more, smaller calls.

The heads' outputs, their gradient and the blocked backward's accumulator live in the rows of
q, k, v (N·T·3D), spent from when q, k, v are copied into heads until dx's rows are written:
the workspace holds no N·T·D array besides.

The form that keeps the probabilities from the forward for the backward is the same net
written with the primitive layers (InnerProduct ``axis: 2``, Reshape, Permute, MatMul,
Softmax ``causal``), whose Softmax top the scheduler keeps, offloads or recomputes like any
tensor.

``dropout_ratio`` p drops each probability with probability p in training (the rest scaled by
1/(1-p)), as torch.nn.MultiheadAttention's ``dropout``. The mask is drawn from the step's seed
in blocks of ``query_block`` queries, each block from its own draw, by every algorithm alike
(the full ones draw the same blocks into a staging block): so the forward, the backward that
recomputes it and a recomputed forward all see one mask, and the algorithms agree. It costs a
block of the probabilities' size in the workspace (and a staging block for the full ones).
"""

import math

import numpy as np

from . import parallel
from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .fillers import parse_filler
from .join import shape_str
from .registry import register


@register
class MultiHeadAttention(Layer):
    """Multi-head self-attention over (N, T, D), with its input and output projections."""

    KEYS = {
        "num_heads": Key("int", doc="heads H; D must be a multiple of H"),
        "causal": Key("bool", False, doc="a query sees only the keys at or before it"),
        "bias_term": Key("bool", True),
        "query_block": Key("int", 128, doc="queries per block of the chunked and blocked algorithms"),
        "dropout_ratio": Key("float", 0.0, doc="dropout of the attention probabilities in training, 0 <= p < 1"),
        "weight_filler": Key("filler", parse_filler("xavier")),
        "bias_filler": Key("filler", parse_filler("constant")),
    }
    CHUNKED_SPEED = 0.95  # the same work as full's, in more, smaller calls
    DROPOUT_SALT = 7919   # the masks' draws, apart from the step's other draws
    enabled = None        # as Dropout's: None drops in training only; load_net(dropout=...) sets it

    def setup(self, bottom_shapes):
        shape, heads = tuple(bottom_shapes[0]), self.cfg["num_heads"]
        if len(shape) != 3:
            self.fail(f"the bottom must be (N, T, D), got {shape_str(shape)}")
        if heads < 1 or shape[2] % heads:
            self.fail(f"num_heads {heads} does not divide the width D = {shape[2]}")
        if self.cfg["query_block"] < 1:
            self.fail(f"query_block must be >= 1, got {self.cfg['query_block']}")
        if not 0.0 <= self.cfg["dropout_ratio"] < 1.0:
            self.fail(f"dropout_ratio must be in [0, 1), got {self.cfg['dropout_ratio']}")
        self.n, self.t, self.d = shape
        self.h, self.dh = heads, shape[2] // heads
        self.block = min(self.t, self.cfg["query_block"])
        return [shape]

    def param_specs(self):
        d, w, b = self.d, self.cfg["weight_filler"], self.cfg["bias_filler"]
        specs = [ParamSpec("in_weight", (3 * d, d), w, fan_in=d, fan_out=3 * d)]
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("in_bias", (3 * d,), b))
        specs.append(ParamSpec("out_weight", (d, d), w, fan_in=d, fan_out=d))
        if self.cfg["bias_term"]:
            specs.append(ParamSpec("out_bias", (d,), b))
        return specs

    def backward_reads(self):
        return (0,), ()

    def grad_inplace(self):
        return [(0, 0)]  # dy is read whole (for dW_out and the heads' gradients) before dx is written

    def grad_over_bottom(self):
        return [0]  # x is read whole (for dW_in) before dx is written

    # -- workspace ---------------------------------------------------------------------------
    def _room(self, phase, block):
        """The scratch arrays of ``phase`` with ``block`` queries at a time, in the order taken."""
        n, t, d, h, dh, dt = self.n, self.t, self.d, self.h, self.dh, self.dtype
        heads = ((3, n, h, t, dh), dt)
        rows = ((n * t, 3 * d), dt)
        probs, stat, mask = ((n, h, block, t), dt), ((n, h, block, 1), dt), ((block, t), np.bool_)
        # the heads' outputs, their gradient and dQ live in the rows of q, k, v (N·T·3D), dead
        # from when q, k, v are copied into heads until the input projection's gradients are
        # written there (:meth:`_in_rows`); the blocked backward's accumulator of dK and dV
        # in the block of probabilities or of their gradient, whichever is free at the time,
        # and dQ moves to the first before the rows are written: so each holds N·H·T·d at least
        if phase == "forward":
            return [rows, heads, probs, stat, mask]
        big = ((n, h, max(block * t, t * dh)), dt)
        return [rows, heads, ((2, n, h, t, dh), dt), big, big, stat, mask]

    def _in_rows(self, rows):
        """The thirds of ``rows`` (N·T·3D), each N·T·D: the room of the heads' outputs and
        their gradients while q, k, v are in ``heads``."""
        flat, third = rows.reshape(-1), self.n * self.t * self.d
        return flat[:third], flat[third:2 * third], flat[2 * third:]

    def _drop_shapes(self, block):
        """What dropout adds, taken after :meth:`_room`'s: the mask of a block of ``block``
        queries, and the staging block of ``query_block`` the full algorithms draw in."""
        if not self.cfg["dropout_ratio"]:
            return []
        n, h, t, dt = self.n, self.h, self.t, self.dtype
        return [((n, h, block, t), dt)] + ([((n * h * self.block * t,), dt)] if block > self.block else [])

    def algorithms(self, phase):
        names = ("full", "chunked") if phase == "forward" else ("full", "blocked")
        speed = self.CHUNKED_SPEED  # the same work as full's, in more, smaller calls
        algos = [Algo(names[0], workspace_bytes(*self._room(phase, self.t), *self._drop_shapes(self.t)))]
        if self.block < self.t:
            algos.append(Algo(names[1], workspace_bytes(*self._room(phase, self.block), *self._drop_shapes(self.block)),
                              speed))
        return algos

    def cost(self):
        n, t, d, item = self.n, self.t, self.d, self.dtype.itemsize
        proj = 2.0 * n * t * d * 4 * d
        attend = 4.0 * n * t * t * d + 5.0 * n * self.h * t * t
        fwd_bytes = float((2 * n * t * d + 4 * d * d) * item + 3 * n * self.h * t * t * item)
        # the backward runs the forward again, then about twice its work
        return Cost(proj + attend, 3 * (proj + attend), fwd_bytes, 3 * fwd_bytes)

    # -- kernels -----------------------------------------------------------------------------
    def _project(self, ctx, x, params, rows, heads):
        """``heads`` = q, k, v (3, N, H, T, d) from x; q scaled by 1/sqrt(d)."""
        xp = ctx.xp
        parallel.matmul(xp, x.reshape(self.n * self.t, self.d), params["in_weight"].T, rows)
        if self.cfg["bias_term"]:
            rows += params["in_bias"]
        xp.copyto(heads, rows.reshape(self.n, self.t, 3, self.h, self.dh).transpose(2, 0, 3, 1, 4))
        heads[0] *= 1.0 / math.sqrt(self.dh)

    def _probs(self, xp, heads, a, b, probs, stat, mask):
        """The probabilities of queries ``a:b``, into ``probs[:, :, :b - a]`` (returned)."""
        p, st = probs[:, :, :b - a], stat[:, :, :b - a]
        xp.matmul(heads[0][:, :, a:b], heads[1].swapaxes(-1, -2), out=p)
        if self.cfg["causal"]:
            m = mask[:b - a]
            xp.greater(xp.arange(self.t)[None, :], xp.arange(a, b)[:, None], out=m)
            xp.copyto(p, -np.inf, where=m)
        xp.max(p, axis=-1, keepdims=True, out=st)
        p -= st  # shifted so that exp cannot overflow
        xp.exp(p, out=p)
        xp.sum(p, axis=-1, keepdims=True, out=st)
        p /= st
        return p

    def _blocks(self, block):
        return [(a, min(a + block, self.t)) for a in range(0, self.t, block)]

    def _dropping(self, ctx):
        return self.draws(ctx.train)

    def draws(self, train):
        return bool(self.cfg["dropout_ratio"]) and (train if self.enabled is None else self.enabled)

    def _drop_room(self, ctx, block):
        """The dropout mask's block and the staging block, when this step drops."""
        if not self._dropping(ctx):
            return None, None
        room = [ctx.scratch(s, dt) for s, dt in self._drop_shapes(block)]
        return room[0], (room[1] if len(room) > 1 else None)

    def _keep(self, ctx, a, b, keep, stage):
        """The scaled dropout mask of queries ``a:b`` (1/(1-p) kept, 0 dropped), drawn a block
        of ``query_block`` queries at a time from the step's seed: the same for every algorithm."""
        xp, p, n, h, t = ctx.xp, self.cfg["dropout_ratio"], self.n, self.h, self.t
        whole = keep.reshape(-1)[:n * h * (b - a) * t].reshape(n, h, b - a, t)  # contiguous
        out = keep[:, :, :b - a] if stage is not None else whole
        for i in range(a, b, self.block):
            j = min(i + self.block, t)
            flat = (stage if stage is not None else keep).reshape(-1)[:n * h * (j - i) * t].reshape(n, h, j - i, t)
            ctx.uniform(flat, salt=self.DROPOUT_SALT + i)  # contiguous, as a generator fills it
            if stage is not None:
                xp.copyto(out[:, :, i - a:j - a], flat)
        xp.greater_equal(out, p, out=out)  # compared in place: 1.0 keep, 0.0 drop
        out *= 1.0 / (1.0 - p)
        return out

    def forward(self, ctx, bottoms, tops, params):
        xp, n, t, d = ctx.xp, self.n, self.t, self.d
        block = self.block if ctx.algo == "chunked" else t
        rows, heads, probs, stat, mask = (ctx.scratch(s, dt) for s, dt in self._room("forward", block))
        keep, stage = self._drop_room(ctx, block)
        self._project(ctx, bottoms[0], params, rows, heads)
        crow, ctxh, _ = self._in_rows(rows)  # q, k, v's rows are spent
        crow, ctxh = crow.reshape(n * t, d), ctxh.reshape(n, self.h, t, self.dh)
        for a, b in self._blocks(block):
            p = self._probs(xp, heads, a, b, probs, stat, mask)
            if keep is not None:
                p *= self._keep(ctx, a, b, keep, stage)
            xp.matmul(p, heads[2], out=ctxh[:, :, a:b])
        xp.copyto(crow.reshape(n, t, self.h, self.dh), ctxh.transpose(0, 2, 1, 3))
        y = tops[0].reshape(n * t, d)
        parallel.matmul(xp, crow, params["out_weight"].T, y)
        if self.cfg["bias_term"]:
            y += params["out_bias"]

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, n, t, d, h, dh = ctx.xp, self.n, self.t, self.d, self.h, self.dh
        block = self.block if ctx.algo == "blocked" else t
        room = [ctx.scratch(s, dt) for s, dt in self._room("backward", block)]
        rows, heads, dkv, big, dbig, stat, mask = room
        probs, dprobs = (a[..., :block * t].reshape(n, h, block, t) for a in (big, dbig))
        keep, stage = self._drop_room(ctx, block)
        x = bottoms[0].reshape(n * t, d)
        dy = top_grads[0].reshape(n * t, d)
        pg = param_grads
        # q, k, v again; then d(heads' outputs) = dy W_out, before the heads' outputs are
        # rebuilt (for dW_out), block by block, in the loop that needs the probabilities anyway
        self._project(ctx, bottoms[0], params, rows, heads)
        first, second, third = self._in_rows(rows)  # q, k, v's rows are spent until dx's
        crow, ctxh = first.reshape(n * t, d), first.reshape(n, h, t, dh)   # the heads' outputs
        drow, dctxh = second.reshape(n * t, d), second.reshape(n, h, t, dh)  # their gradient
        parallel.matmul(xp, dy, params["out_weight"], crow)
        xp.copyto(dctxh, crow.reshape(n, t, h, dh).transpose(0, 2, 1, 3))
        # attention, block by block: O = U V (U = P, or P * mask with dropout), dV = U^T dO,
        # dS = P (dP - rowsum(P dP)), dQ = dS K, dK = dS^T Q; with dropout, dS = U dP - P rowsum(U dP)
        dq, (dk, dv) = third.reshape(n, h, t, dh), dkv
        # the accumulators of dK and dV, while the probabilities' gradient, and then the
        # probabilities, are spent (blocked)
        acc_k, acc_v = (a[..., :t * dh].reshape(n, h, t, dh) for a in (big, dbig))
        blocked = block < t
        if blocked:
            dk[...] = 0
            dv[...] = 0
        for a, b in self._blocks(block):
            p = self._probs(xp, heads, a, b, probs, stat, mask)
            u = p
            if keep is not None:
                u = self._keep(ctx, a, b, keep, stage)
                u *= p
            xp.matmul(u, heads[2], out=ctxh[:, :, a:b])
            do = dctxh[:, :, a:b]
            if not blocked:
                xp.matmul(u.swapaxes(-1, -2), do, out=dv)
            else:
                xp.matmul(u.swapaxes(-1, -2), do, out=acc_v)
                dv += acc_v
            dp, st = dprobs[:, :, :b - a], stat[:, :, :b - a]
            xp.matmul(do, heads[2].swapaxes(-1, -2), out=dp)
            xp.matmul(u[..., None, :], dp[..., :, None], out=st[..., None])
            if keep is None:
                dp -= st
                dp *= p
            else:
                dp *= u
                p *= st
                dp -= p
            xp.matmul(dp, heads[1], out=dq[:, :, a:b])
            if not blocked:
                xp.matmul(dp.swapaxes(-1, -2), heads[0][:, :, a:b], out=dk)
            else:
                xp.matmul(dp.swapaxes(-1, -2), heads[0][:, :, a:b], out=acc_k)
                dk += acc_k
        # the output projection's parameters, from the heads' outputs as rows (over dO's room)
        xp.copyto(drow.reshape(n, t, h, dh), ctxh.transpose(0, 2, 1, 3))
        parallel.matmul(xp, dy.T, drow, pg["out_weight"])
        if self.cfg["bias_term"]:
            xp.sum(dy, axis=0, out=pg["out_bias"])
        dq *= 1.0 / math.sqrt(dh)
        # the input projection, from dQ, dK, dV as rows (dQ moved out of the rows first)
        xp.copyto(acc_k, dq)
        grads = rows.reshape(n, t, 3, h, dh)
        for i, g in enumerate((acc_k, dk, dv)):
            xp.copyto(grads[:, :, i], g.transpose(0, 2, 1, 3))
        parallel.matmul(xp, rows.T, x, pg["in_weight"])
        if self.cfg["bias_term"]:
            xp.sum(rows, axis=0, out=pg["in_bias"])
        if bottom_grads[0] is not None:
            parallel.matmul(xp, rows, params["in_weight"], bottom_grads[0].reshape(n * t, d))
