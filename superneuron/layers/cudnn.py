"""Convolutions through NVIDIA's cuDNN Frontend (Python module ``cudnn``), on arena memory.

CuPy 14 has no cuDNN, so the GPU's convolutions come from the frontend's graph API: for each
convolution geometry one graph per operation (forward, data gradient, weight gradient), built
once and cached. cuDNN ranks the engine configurations it offers for a graph (heuristics
mode A, then the fallback list); two of them become this layer's algorithms for the workspace
pass (scheduler/workspace.py) to choose between per step:

- ``cudnn``: the best-ranked configuration, whatever workspace it asks for;
- ``cudnn_lean``: the best-ranked one that needs no workspace.

With ``SN_CUDNN_CANDIDATES=N`` (N > 2) the next best-ranked configurations with workspaces of
their own are offered too (``cudnn_2`` ... ``cudnn_{N-1}``), each in a graph of its own: timed
by ``--profile`` (runtime/profile.py, as ``cudnn.benchmark`` times every engine), the fastest
that fits the memory free at each step is chosen, cached per GPU model.

The backward step runs the data and weight gradients one after the other in the same
workspace, so it needs the larger of their two. Kernels read and write the arena through raw
device pointers and run on the cuDNN handle's stream, the CUDA default stream, where CuPy's
kernels run too, so no extra synchronisation is needed (a CUDA graph's capture moves both onto
its own stream for a while: :meth:`Cudnn.use_stream`).

Math mode: float32 in, float32 out and float32 arithmetic; engines that round inputs to TF32
on tensor cores are left out unless ``tf32=True`` (``SN_TF32=1``), so that results agree with
the CPU path and with PyTorch run with ``allow_tf32 = False``. Two more filters, by the
numerical notes cuDNN attaches to each engine (:func:`excluded_notes`), tell the causes of a
gradient error apart (tools/grad_diag.py): ``deterministic`` (``SN_DETERMINISTIC=1``) leaves
out engines whose sums depend on thread timing, and ``exact`` (``SN_CUDNN_EXACT=1``) those
that are not plain float32 sums: FFT, every Winograd tiling, and reduced-precision reductions.
"""

import os

from .base import Algo

# The numerical notes each filter leaves out (names of cudnn.numerical_note; a name this
# frontend lacks is skipped).
TF32_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS")
NONDETERMINISTIC_NOTES = ("NONDETERMINISTIC",)
INEXACT_NOTES = ("FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13",
                 "REDUCED_PRECISION_REDUCTION")


def excluded_notes(notes, tf32=False, deterministic=False, exact=False):
    """The members of ``notes`` (``cudnn.numerical_note``) whose engines are left out: TF32's
    unless ``tf32``, the non-deterministic ones when ``deterministic``, FFT, Winograd and
    reduced-precision reductions when ``exact``."""
    names = (() if tf32 else TF32_NOTES) + (NONDETERMINISTIC_NOTES if deterministic else ()) \
        + (INEXACT_NOTES if exact else ())
    return [getattr(notes, n) for n in names if hasattr(notes, n)]


def _flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def load(tf32=None, deterministic=None, exact=None):
    """A :class:`Cudnn` when the frontend imports and works on this GPU, else None (see
    :func:`probe` for why not)."""
    return probe(tf32, deterministic, exact)[0]


def probe(tf32=None, deterministic=None, exact=None):
    """``(Cudnn, None)`` when the frontend imports and makes a handle on this GPU, else
    ``(None, why)``: one line saying what failed, for the run to report its fallback.
    ``tf32`` (default: ``SN_TF32``) allows TF32 engines; ``deterministic`` (default:
    ``SN_DETERMINISTIC``) leaves out engines whose sums depend on thread timing; ``exact``
    (default: ``SN_CUDNN_EXACT``) leaves out FFT, Winograd and reduced-precision engines."""
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - a missing or broken frontend means "use the fallback"
        return None, f"the cuDNN Frontend does not import ({_one_line(e)})"
    try:
        handle = cudnn.create_handle()
    except Exception as e:  # noqa: BLE001 - e.g. libcudnn missing: the frontend loads it here
        return None, f"the cuDNN Frontend makes no handle ({_one_line(e)})"
    tf32 = _flag("SN_TF32") if tf32 is None else tf32
    deterministic = _flag("SN_DETERMINISTIC") if deterministic is None else deterministic
    exact = _flag("SN_CUDNN_EXACT") if exact is None else exact
    return Cudnn(cudnn, handle, tf32, deterministic, exact), None


def _one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _dense_strides(dims):
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return strides[::-1]


class _Op:
    """One convolution operation: per algorithm name, a built graph whose selected plan is
    that algorithm's, its tensors in operand order and its workspace bytes. (One graph per
    plan: the frontend runs and sizes some plans as "the graph's selected one", so a graph is
    never asked to run any other.)"""

    def __init__(self, plans):
        self.plans = plans   # name → (graph, tensors, workspace bytes)

    def workspace(self, name):
        return self.plans.get(name, self.plans["cudnn"])[2]

    def run(self, lib, name, arrays, workspace):
        # a candidate another operation of the step has and this one lacks: its best plan
        graph, tensors, ws = self.plans.get(name, self.plans["cudnn"])
        pack = {t: a.data.ptr for t, a in zip(tensors, arrays, strict=True)}
        graph.execute(pack, workspace.data.ptr if ws else None, handle=lib.handle)


class Cudnn:
    """The cuDNN Frontend on the current device: convolution graphs cached by geometry."""

    def __init__(self, cudnn, handle, tf32, deterministic, exact=False, candidates=None):
        self.cudnn, self.handle, self.tf32, self.deterministic = cudnn, handle, tf32, deterministic
        self.exact = exact
        if candidates is None:
            candidates = int(os.environ.get("SN_CUDNN_CANDIDATES", "2") or 2)
        self.candidates = max(2, candidates)  # configurations offered per operation, cudnn_lean included
        self._ops = {}   # (op, geometry) → _Op, or None where cuDNN refuses it

    def use_stream(self, ptr):
        """Run this handle's kernels on the CUDA stream at ``ptr`` from now on (0: the default
        stream, where they run unless told; runtime/graphs.py moves them onto the stream it
        captures a training iteration on, and back)."""
        self.cudnn.set_stream(handle=self.handle, stream=ptr)

    def describe(self):
        """``'cuDNN 9.19.0 through the cuDNN Frontend 1.32.0'`` (what versions it can tell)."""
        try:
            v = int(self.cudnn.backend_version())
            backend = f"cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 90000 else f"cuDNN {v}"
        except Exception:  # noqa: BLE001 - the version is a courtesy, not a requirement
            backend = "cuDNN"
        frontend = getattr(self.cudnn, "__version__", None)
        only = [what for what, on in (("deterministic", self.deterministic),
                                      ("no FFT or Winograd", self.exact), ("TF32", self.tf32)) if on]
        return (f"{backend} through the cuDNN Frontend" + (f" {frontend}" if frontend else "")
                + (f" ({', '.join(only)} engines)" if only else ""))

    # -- building ----------------------------------------------------------------------------
    def _tensor(self, g, name, dims):
        return g.tensor(name=name, dim=list(dims), stride=_dense_strides(dims),
                        data_type=self.cudnn.data_type.FLOAT)

    def _graph(self, op, key):
        """A planned graph of ``op`` for convolution geometry ``key`` and its operand tensors;
        None where cuDNN has no engine for it."""
        (n, c, h, w, k, g, ho, wo), (kh, kw), stride, pad, dil = key
        x, wt, y = (n, c, h, w), (k, c // g, kh, kw), (n, k, ho, wo)
        f = self.cudnn.data_type.FLOAT
        conv = dict(padding=list(pad), stride=list(stride), dilation=list(dil), compute_data_type=f)
        gr = self.cudnn.pygraph(io_data_type=f, intermediate_data_type=f, compute_data_type=f,
                                handle=self.handle)
        if op == "fprop":
            a, b = self._tensor(gr, "x", x), self._tensor(gr, "w", wt)
            out, dims = gr.conv_fprop(image=a, weight=b, **conv), y
        elif op == "dgrad":
            a, b = self._tensor(gr, "dy", y), self._tensor(gr, "w", wt)
            out, dims = gr.conv_dgrad(loss=a, filter=b, **conv), x
        else:
            a, b = self._tensor(gr, "x", x), self._tensor(gr, "dy", y)
            out, dims = gr.conv_wgrad(image=a, loss=b, **conv), wt
        out.set_output(True).set_data_type(f).set_dim(list(dims)).set_stride(_dense_strides(dims))
        try:
            gr.validate()
            gr.build_operation_graph()
            gr.create_execution_plans([self.cudnn.heur_mode.A, self.cudnn.heur_mode.FALLBACK])
            left_out = excluded_notes(self.cudnn.numerical_note, self.tf32, self.deterministic, self.exact)
            if left_out:
                gr.deselect_numeric_notes(left_out)
            gr.check_support()
        except Exception:  # noqa: BLE001 - cuDNN refusing a graph is an answer, not an error
            return None
        return gr, (a, b, out)

    @staticmethod
    def _select(gr, index):
        """Build plan ``index`` of ``gr`` and select it; its workspace bytes, or None if it
        does not build."""
        try:
            gr.build_plan_at_index(index)
            return int(gr.get_workspace_size())
        except Exception:  # noqa: BLE001 - this configuration does not build here
            return None

    def _build(self, op, key):
        """The best-ranked plan of ``op`` for ``key`` and the best-ranked one needing no
        workspace, each selected in its own graph; None if cuDNN has no plan."""
        first = self._graph(op, key)
        if first is None:
            return None
        gr, tensors = first
        fast = lean = None
        for index in range(gr.get_execution_plan_count()):
            ws = self._select(gr, index)
            if ws is None:
                continue
            fast = fast or (index, ws)
            if ws == 0:
                lean = (index, 0)
                break
        if fast is None:
            return None
        if lean is None or lean == fast:
            self._select(gr, fast[0])  # the walk left another plan selected
            return _Op({"cudnn": (gr, tensors, fast[1]), "cudnn_lean": (gr, tensors, fast[1])})
        again = self._graph(op, key)  # the walk ended on the lean plan: gr keeps it
        if again is None or self._select(again[0], fast[0]) != fast[1]:
            return _Op({"cudnn": (gr, tensors, 0), "cudnn_lean": (gr, tensors, 0)})
        return _Op({"cudnn": (again[0], again[1], fast[1]), "cudnn_lean": (gr, tensors, 0)})

    def _build_candidates(self, op, key):
        """Like :meth:`_build`, with up to ``candidates - 1`` best-ranked configurations of
        distinct workspaces (``cudnn``, ``cudnn_2``, ...) besides ``cudnn_lean``, each selected
        in a graph of its own; None if cuDNN has no plan."""
        first = self._graph(op, key)
        if first is None:
            return None
        gr, _ = first
        picks, lean = [], None
        for index in range(gr.get_execution_plan_count()):
            ws = self._select(gr, index)
            if ws is None:
                continue
            if ws == 0 and lean is None:
                lean = index
            if len(picks) < self.candidates - 1 and all(w != ws for _, w in picks):
                picks.append((index, ws))
            if lean is not None and len(picks) == self.candidates - 1:
                break
        plans = {}
        for k, (index, ws) in enumerate(picks + ([] if lean is None else [(lean, 0)])):
            name = "cudnn" if k == 0 else "cudnn_lean" if k == len(picks) else f"cudnn_{k + 1}"
            built = self._graph(op, key)
            if built is not None and self._select(built[0], index) == ws:
                plans[name] = (built[0], built[1], ws)
        if "cudnn" not in plans:
            return None
        plans.setdefault("cudnn_lean", plans["cudnn"])
        return _Op(plans)

    def op(self, op, key):
        """The cached graph of ``op`` (``'fprop'``, ``'dgrad'``, ``'wgrad'``) for ``key``."""
        if (op, key) not in self._ops:
            build = self._build if self.candidates <= 2 else self._build_candidates
            self._ops[op, key] = build(op, key)
        return self._ops[op, key]

    # -- what the layer asks ---------------------------------------------------------------
    def conv_algorithms(self, key, phase):
        """The cuDNN algorithms of a convolution's ``phase``, fastest first; [] if unsupported."""
        ops = ["fprop"] if phase == "forward" else ["dgrad", "wgrad"]
        built = [self.op(o, key) for o in ops]
        if any(b is None for b in built):
            return []
        algos = []
        more = [(f"cudnn_{k}", 0.95 ** (k - 1)) for k in range(2, self.candidates)]  # cuDNN's rank order
        for name, speed in [("cudnn", 1.0)] + more + [("cudnn_lean", 0.7)]:
            if name not in ("cudnn", "cudnn_lean") and not any(name in b.plans for b in built):
                continue
            ws = max(b.workspace(name) for b in built)
            if not any(a.workspace == ws for a in algos):  # the same plan twice is no choice
                algos.append(Algo(name, ws, speed))
        return algos

    def conv_forward(self, key, algo, x, weight, y, workspace):
        self.op("fprop", key).run(self, algo, (x, weight, y), workspace)

    def conv_backward(self, key, algo, x, weight, dy, grads, workspace):
        """dw, and dx unless it is None, of ``grads = (dx, dw)``."""
        dx, dw = grads
        self.op("wgrad", key).run(self, algo, (x, dy, dw), workspace)
        if dx is not None:
            self.op("dgrad", key).run(self, algo, (dy, weight, dx), workspace)
