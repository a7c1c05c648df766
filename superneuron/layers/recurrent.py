"""Caffe's recurrent layers, ``LSTM`` and ``RNN``, over a whole sequence in one layer.

Bottoms as Caffe's RecurrentLayer: ``x`` (T, N, ...) (T time steps of N streams; the axes after
the second are the D input features), ``cont`` (T, N), the sequence continuation markers (0
where a stream starts a new sequence at t: its hidden state is reset), and optionally a static
input (N, ...) seen at every step. Top: (T, N, num_output). Parameters in Caffe's order, so
that a ``.caffemodel`` loads blob by blob:

- LSTM: ``W_xc`` (4H, D), ``b_c`` (4H), [``W_xc_static`` (4H, S)], ``W_hc`` (4H, H); gates in
  Caffe's order i, f, o, g: ``c_t = cont_t f_t c_{t-1} + i_t g_t``, ``h_t = o_t tanh(c_t)``, the
  gates from ``W_xc x_t + b_c + W_hc (cont_t h_{t-1})``.
- RNN: ``W_xh`` (H, D), ``b_h`` (H), [``W_xh_static`` (H, S)], ``W_hh`` (H, H), ``W_ho`` (H, H),
  ``b_o`` (H): ``h_t = tanh(W_xh x_t + b_h + W_hh (cont_t h_{t-1}))``, ``o_t = tanh(W_ho h_t + b_o)``.

Caffe unrolls the recurrence into a net of its own; here the layer runs the time loop itself.
What the scheduler sees is the same trade: the forward keeps only the top, and the backward
runs the recurrence again in its workspace (every step's gates and cell, T·N·5H values for an
LSTM) before going back through time, so a stash of the sequence costs the top alone. Each
time step writes its own slice, in the same order on every run, so every policy gives the same
bits. The markers are never differentiated (Caffe cannot backpropagate to them either).
"""

import numpy as np

from .base import Algo, Cost, Key, Layer, ParamSpec, workspace_bytes
from .fillers import parse_filler
from .registry import register


def _sigmoid(xp, x, out):
    """1 / (1 + exp(-x)) into ``out`` (x may be out)."""
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    out += 1
    xp.reciprocal(out, out=out)
    return out


class _Recurrent(Layer):
    """What LSTM and RNN share: the keys, shapes and parameters' layout; ``GATES`` rows of
    hidden size per input weight (4 for an LSTM, 1 for an RNN)."""

    KEYS = {
        "num_output": Key("int", doc="hidden (and output) size H"),
        "weight_filler": Key("filler", parse_filler("xavier")),
        "bias_filler": Key("filler", parse_filler("constant")),
        "debug_info": Key("bool", False, doc="Caffe's; nothing to show here"),
        "expose_hidden": Key("bool", False, doc="not supported: the initial state is zero"),
    }
    BOTTOMS = (2, 3)
    LABEL_BOTTOMS = (1,)
    GATES = 1

    def setup(self, bottom_shapes):
        x, cont = (tuple(s) for s in bottom_shapes[:2])
        if self.cfg["expose_hidden"]:
            self.fail("expose_hidden is not supported: the hidden state starts at zero in every iteration")
        if len(x) < 3:
            self.fail(f"bottom 0 must be (T, N, ...), got {x}")
        if cont != x[:2]:
            self.fail(f"the continuation markers must be (T, N) = {x[:2]}, got {cont}")
        if self.cfg["num_output"] < 1:
            self.fail(f"num_output must be >= 1, got {self.cfg['num_output']}")
        self.steps, self.streams = x[0], x[1]
        self.features = int(np.prod(x[2:], dtype=np.int64))
        self.static = None
        if len(bottom_shapes) == 3:
            s = tuple(bottom_shapes[2])
            if s[0] != self.streams:
                self.fail(f"the static input must have N = {self.streams} rows, got {s}")
            self.static = int(np.prod(s[1:], dtype=np.int64))
        self.hidden = self.cfg["num_output"]
        self.bottom_shapes = [tuple(s) for s in bottom_shapes]
        self.top_shapes = [(self.steps, self.streams, self.hidden)]
        return list(self.top_shapes)

    def _input_specs(self, w, b):
        rows, h = self.GATES * self.hidden, self.hidden
        fill = self.cfg["weight_filler"]
        specs = [ParamSpec(w, (rows, self.features), fill, fan_in=self.features, fan_out=rows),
                 ParamSpec(b, (rows,), self.cfg["bias_filler"])]
        if self.static is not None:
            specs.append(ParamSpec(w + "_static", (rows, self.static), fill, fan_in=self.static, fan_out=rows))
        return specs, rows, h

    def _static_term(self, xp, bottoms, params, name, scratch):
        """``x_static W_static^T`` (N, rows), or None without a static input."""
        if self.static is None:
            return None
        xp.matmul(bottoms[2].reshape(self.streams, self.static), params[name].T, out=scratch)
        return scratch

    def _inputs(self, bottoms):
        return bottoms[0].reshape(self.steps, self.streams, self.features), bottoms[1]

    def algorithms(self, phase):
        n, h, t = self.streams, self.hidden, self.steps
        return [Algo("default", workspace_bytes(*self._scratch(phase, t, n, h)))]

    def backward_reads(self):
        return tuple(range(len(self.bottoms))), (0,)

    def _products(self, xp, grads, scratch, bottoms, params, gradients, names):
        """The parameter and input gradients from every step's pre-activation gradients
        (``grads``, (T·N, rows)) at once: one product each, written over what they replace.
        ``scratch``: (every step's recurrent input cont_t h_{t-1}, a (N, rows) buffer);
        ``gradients``: (param_grads, bottom_grads)."""
        w, b, w_h, w_s = names
        held, step_sum = scratch
        param_grads, bottom_grads = gradients
        x = self._inputs(bottoms)[0]
        tn = self.steps * self.streams
        xp.matmul(grads.T, x.reshape(tn, self.features), out=param_grads[w])
        xp.sum(grads, axis=0, out=param_grads[b])
        xp.matmul(grads.T, held.reshape(tn, self.hidden), out=param_grads[w_h])
        if bottom_grads[0] is not None:
            xp.matmul(grads, params[w], out=bottom_grads[0].reshape(tn, self.features))
        if self.static is not None:
            xp.sum(grads.reshape(self.steps, self.streams, -1), axis=0, out=step_sum)
            xp.matmul(step_sum.T, bottoms[2].reshape(self.streams, self.static), out=param_grads[w_s])
            if bottom_grads[2] is not None:
                xp.matmul(step_sum, params[w_s], out=bottom_grads[2].reshape(self.streams, self.static))

    def cost(self):
        t, n, h, d = self.steps, self.streams, self.hidden, self.features
        rows, item = self.GATES * h, self.dtype.itemsize
        flops = 2.0 * t * n * rows * (d + h + (self.static or 0))
        moved = float((t * n * (d + h) + rows * (d + h)) * item)
        # the backward runs the forward again, then three products a step
        return Cost(flops, 4 * flops, moved, 3 * moved)


@register
class LSTM(_Recurrent):
    """Caffe's LSTM layer (see the module docstring)."""

    GATES = 4

    def param_specs(self):
        specs, rows, h = self._input_specs("W_xc", "b_c")
        return specs + [ParamSpec("W_hc", (rows, h), self.cfg["weight_filler"], fan_in=h, fan_out=rows)]

    def _scratch(self, phase, t, n, h):
        dt = self.dtype
        step = [((n, 4 * h), dt), ((n, 4 * h), dt), ((n, h), dt)]  # static term, work, held
        if phase == "forward":  # and one step's gates, the cell before and after
            return step + [((n, 4 * h), dt), ((n, h), dt), ((n, h), dt)]
        # and every step's gates (then their gradients) and cells (then cont_t h_{t-1}), d_pre, dh, dc
        return step + [((t, n, 4 * h), dt), ((t, n, h), dt), ((n, 4 * h), dt), ((n, h), dt), ((n, h), dt)]

    def _run(self, xp, bottoms, h_top, params, step, keep):
        """The recurrence, with ``step`` = (static, work, held) buffers: with ``keep`` = (gates
        (N, 4H), cell, cell) the forward into ``h_top`` (the two cells in turn); with ``keep`` =
        (gates (T, N, 4H), cells (T, N, H)) those of every step, reading h_{t-1} from ``h_top``,
        the forward's top (the same values), without writing it."""
        h = self.hidden
        x, cont = self._inputs(bottoms)
        static_buf, work, held = step
        forward = len(keep) == 3
        if forward:
            gates, c_a, c_b = keep
        static = self._static_term(xp, bottoms, params, "W_xc_static", static_buf)
        for t in range(self.steps):
            if forward:
                c_prev, c = (c_a, c_b) if t % 2 else (c_b, c_a)
            else:
                gates, c = keep[0][t], keep[1][t]
                c_prev = keep[1][t - 1] if t else None
            xp.matmul(x[t], params["W_xc"].T, out=gates)
            gates += params["b_c"]
            if static is not None:
                gates += static
            if t > 0:
                xp.multiply(h_top[t - 1], cont[t][:, None], out=held)
                xp.matmul(held, params["W_hc"].T, out=work)
                gates += work
            _sigmoid(xp, gates[:, :3 * h], gates[:, :3 * h])
            xp.tanh(gates[:, 3 * h:], out=gates[:, 3 * h:])
            if t > 0:
                xp.multiply(c_prev, cont[t][:, None], out=c)
                c *= gates[:, h:2 * h]
            else:
                c.fill(0)
            xp.multiply(gates[:, :h], gates[:, 3 * h:], out=held)
            c += held
            if forward:
                xp.tanh(c, out=h_top[t])
                h_top[t] *= gates[:, 2 * h:3 * h]

    def forward(self, ctx, bottoms, tops, params):
        bufs = [ctx.scratch(s, d) for s, d in self._scratch("forward", 0, self.streams, self.hidden)]
        self._run(ctx.xp, bottoms, tops[0], params, bufs[:3], bufs[3:])

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, n, h, steps = ctx.xp, self.streams, self.hidden, self.steps
        bufs = [ctx.scratch(s, d) for s, d in self._scratch("backward", steps, n, h)]
        (_, work, held), (gates_all, cells, d_pre, dh, dc) = bufs[:3], bufs[3:]
        top = tops[0]
        self._run(xp, bottoms, top, params, bufs[:3], (gates_all, cells))
        x, cont = self._inputs(bottoms)
        dh.fill(0)
        dc.fill(0)
        for t in range(steps - 1, -1, -1):
            gates = gates_all[t]
            i, f, o, g = gates[:, :h], gates[:, h:2 * h], gates[:, 2 * h:3 * h], gates[:, 3 * h:]
            dh += top_grads[0][t]
            tanh_c = work[:, :h]
            xp.tanh(cells[t], out=tanh_c)
            xp.multiply(dh, tanh_c, out=d_pre[:, 2 * h:3 * h])   # d o
            xp.multiply(tanh_c, tanh_c, out=held)
            xp.subtract(1, held, out=held)
            held *= o
            held *= dh
            dc += held                                          # d c_t
            xp.multiply(dc, g, out=d_pre[:, :h])                # d i
            xp.multiply(dc, i, out=d_pre[:, 3 * h:])            # d g
            if t > 0:
                xp.multiply(cells[t - 1], cont[t][:, None], out=held)
                xp.multiply(dc, held, out=d_pre[:, h:2 * h])    # d f
                dc *= f
                dc *= cont[t][:, None]                          # d c_{t-1}
            else:
                d_pre[:, h:2 * h].fill(0)
            # through the activations: sigmoid' = s (1 - s), tanh' = 1 - g^2
            xp.subtract(1, gates[:, :3 * h], out=work[:, :3 * h])
            work[:, :3 * h] *= gates[:, :3 * h]
            xp.multiply(g, g, out=work[:, 3 * h:])
            xp.subtract(1, work[:, 3 * h:], out=work[:, 3 * h:])
            d_pre *= work
            gates[...] = d_pre        # this step's gates are spent: keep their gradient there
            if t > 0:                 # and cell t: keep the recurrent input cont_t h_{t-1} there
                xp.multiply(top[t - 1], cont[t][:, None], out=cells[t])
                xp.matmul(d_pre, params["W_hc"], out=dh)
                dh *= cont[t][:, None]
            else:
                cells[0].fill(0)
        grads = gates_all.reshape(steps * n, 4 * h)
        self._products(xp, grads, (cells, d_pre), bottoms, params, (param_grads, bottom_grads),
                       ("W_xc", "b_c", "W_hc", "W_xc_static"))


@register
class RNN(_Recurrent):
    """Caffe's RNN layer (see the module docstring)."""

    def param_specs(self):
        specs, rows, h = self._input_specs("W_xh", "b_h")
        fill = self.cfg["weight_filler"]
        return specs + [ParamSpec("W_hh", (h, h), fill, fan_in=h, fan_out=h),
                        ParamSpec("W_ho", (h, h), fill, fan_in=h, fan_out=h),
                        ParamSpec("b_o", (h,), self.cfg["bias_filler"])]

    def _scratch(self, phase, t, n, h):
        dt = self.dtype
        step = [((n, h), dt), ((n, h), dt), ((n, h), dt)]  # static term (then the steps' sum), work, held
        if phase == "forward":  # and the hidden state before and after
            return step + [((n, h), dt), ((n, h), dt)]
        # and every step's hidden state (then cont_t h_{t-1}) and output gradient (then the state's), dh
        return step + [((t, n, h), dt), ((t, n, h), dt), ((n, h), dt)]

    def _run(self, xp, bottoms, top, params, step, hidden):
        """The recurrence, with ``step`` = (static, work, held) buffers: with ``hidden`` = two
        (N, H) buffers, the forward into ``top``; with ``hidden`` (T, N, H), every step's hidden
        state there, the top left as the forward wrote it."""
        x, cont = self._inputs(bottoms)
        static_buf, work, held = step
        forward = isinstance(hidden, tuple)
        if forward:
            h_a, h_b = hidden
        static = self._static_term(xp, bottoms, params, "W_xh_static", static_buf)
        for t in range(self.steps):
            if forward:
                prev, cur = (h_a, h_b) if t % 2 else (h_b, h_a)
            else:
                prev, cur = (hidden[t - 1] if t else None), hidden[t]
            xp.matmul(x[t], params["W_xh"].T, out=cur)
            cur += params["b_h"]
            if static is not None:
                cur += static
            if t > 0:
                xp.multiply(prev, cont[t][:, None], out=held)
                xp.matmul(held, params["W_hh"].T, out=work)
                cur += work
            xp.tanh(cur, out=cur)
            if forward:
                xp.matmul(cur, params["W_ho"].T, out=top[t])
                top[t] += params["b_o"]
                xp.tanh(top[t], out=top[t])

    def forward(self, ctx, bottoms, tops, params):
        bufs = [ctx.scratch(s, d) for s, d in self._scratch("forward", 0, self.streams, self.hidden)]
        self._run(ctx.xp, bottoms, tops[0], params, bufs[:3], tuple(bufs[3:]))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        xp, n, h, steps = ctx.xp, self.streams, self.hidden, self.steps
        bufs = [ctx.scratch(s, d) for s, d in self._scratch("backward", steps, n, h)]
        (step_sum, work, _), (hidden, grads, dh) = bufs[:3], bufs[3:]
        top = tops[0]
        self._run(xp, bottoms, top, params, bufs[:3], hidden)
        x, cont = self._inputs(bottoms)
        tn = steps * n
        xp.multiply(top, top, out=grads)
        xp.subtract(1, grads, out=grads)
        grads *= top_grads[0]                        # through o_t = tanh(.)
        xp.matmul(grads.reshape(tn, h).T, hidden.reshape(tn, h), out=param_grads["W_ho"])
        xp.sum(grads.reshape(tn, h), axis=0, out=param_grads["b_o"])
        dh.fill(0)
        for t in range(steps - 1, -1, -1):
            xp.matmul(grads[t], params["W_ho"], out=work)
            dh += work
            xp.multiply(hidden[t], hidden[t], out=work)
            xp.subtract(1, work, out=work)
            xp.multiply(work, dh, out=grads[t])       # through h_t = tanh(.)
            if t > 0:
                xp.multiply(hidden[t - 1], cont[t][:, None], out=hidden[t])
                xp.matmul(grads[t], params["W_hh"], out=dh)
                dh *= cont[t][:, None]
            else:
                hidden[0].fill(0)
        self._products(xp, grads.reshape(tn, h), (hidden, step_sum), bottoms, params, (param_grads, bottom_grads),
                       ("W_xh", "b_h", "W_hh", "W_xh_static"))
