"""CPU kernels on every core: a range split into chunks run on a thread pool.

Each chunk is plain NumPy on a slice, and NumPy releases the GIL for the duration of a ufunc,
a copy or a GEMM on large arrays, so the chunks really run side by side. The chunks write
disjoint slices of arrays they are given: no temporaries, nothing allocated beyond the pool's
bookkeeping. On a GPU (or with one thread) a kernel runs whole, inline.

GEMMs run on this pool too (:func:`matmul`, and the convolutions' chunks in layers/im2col.py),
with BLAS held to one thread per call while the Runtime runs an iteration
(:func:`numpy_settings`): OpenBLAS's own threads spin for a while after each call, and on a
machine with as many threads as cores that spinning took the cores from the memory-bound
kernels after every GEMM (measured: a copy split over two threads took 1.47 ms right after a
GEMM against 0.51 ms without one; the two-thread iteration's copies and BatchNorm passes ran
slower than on one thread).

The number of threads is that of the CPUs this process may use, or ``SN_THREADS``, else
``OMP_NUM_THREADS``, when set; :func:`set_threads` changes it (tools/bench_cpu.py does, to
compare at one and two threads).

The kernels run with NumPy's ufunc buffer at :data:`BUFSIZE` elements rather than its default
8192 (:func:`numpy_settings`, which the Runtime holds for an iteration; the pool's threads keep
it for their life): with the default, a per-channel operation on (N, C, 1024) maps, such as
``x * w[:, None]``, goes through NumPy's buffers and takes twice as long (232 us against 124 us
on 1 M float32; other sizes measured no slower). The buffer only stages copies, so no value
changes.
"""

import contextlib
import math
import os
import threading

import numpy

# NumPy's ufunc buffer size in the kernels, in elements (see the module docstring)
BUFSIZE = 1024
# Below this many elements per chunk a split costs more than it saves. Handing a chunk to a
# sleeping thread and waiting for it costs some tens of microseconds (20-75 us measured on the
# 2-core development machine, a virtual machine whose idle vCPU must be woken), and a pass over
# a few MB that sits in the shared L3 cache is not faster on two cores than on one: on 1 M
# float32 elements a copy took 108 us whole against 124 us split in two, a product 117 against
# 131, np.exp 534 against 380; on 4 M elements all three ran 1.9x faster split. Splitting the
# memory-bound layers of CIFAR ResNet-20 (maps of at most 1 M elements) at 64 K elements per
# chunk made its 2-thread iteration slower than one thread's for every such layer (BatchNorm's
# forward 10.0 -> 15.5 ms); at 1 M per chunk the iteration took 314 against 367-396 ms.
MIN_CHUNK = 1 << 20
# A GEMM's flops (multiply-adds) that cost about as long as one element of a memory-bound pass,
# to weigh a GEMM's chunks against MIN_CHUNK: a GEMM splits from about 16 M multiply-adds
# (some 0.4 ms on one core), LeNet's fully connected layer (26 M) among them
GEMM_FLOPS_PER_ELEMENT = 8


def _default_threads():
    for name in ("SN_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_threads = _default_threads()
_pool = None
_lock = threading.Lock()


def threads():
    """How many threads the memory-bound kernels use."""
    return _threads


def set_threads(n):
    """Use ``n`` threads (at least one) from now on."""
    global _threads, _pool
    with _lock:
        _threads = max(1, int(n))
        if _pool is not None:
            _pool.shutdown()
            _pool = None


class _Workers:
    """``count`` threads that each wait on a lock of their own for a task: a hand-off is a lock
    release and the wait for it a lock acquire (about 15 us on the 2-core machine, against
    about 60 us through a ThreadPoolExecutor's queue and futures, which a kernel split in two
    paid on every call). One caller at a time: :func:`run` takes :attr:`busy` first, and a
    call that finds it taken (a kernel on another thread, or on a worker) runs inline."""

    def __init__(self, count):
        self.busy = threading.Lock()
        self._go = [threading.Lock() for _ in range(count)]
        self._done = [threading.Lock() for _ in range(count)]
        self._tasks = [None] * count
        self._errors = [None] * count
        for go, done in zip(self._go, self._done, strict=True):
            go.acquire()
            done.acquire()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True,
                                          name=f"sn-kernel-{i}") for i in range(count)]
        for t in self._threads:
            t.start()

    def _loop(self, i):
        _kernel_thread_settings()
        while True:
            self._go[i].acquire()
            task = self._tasks[i]
            if task is None:  # shut down
                self._done[i].release()
                return
            try:
                task()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
                self._errors[i] = e
            finally:
                self._tasks[i] = None
                self._done[i].release()

    def start(self, tasks):
        """Hand ``tasks`` (callables, at most one per worker) to the workers."""
        for i, task in enumerate(tasks):
            self._errors[i] = None
            self._tasks[i] = task
            self._go[i].release()

    def wait(self, count):
        """Wait for the first ``count`` workers' tasks; raise the first one's error."""
        for i in range(count):
            self._done[i].acquire()
        for e in self._errors[:count]:
            if e is not None:
                raise e

    def shutdown(self):
        with self.busy:
            self.start([None] * len(self._go))
            for done in self._done:
                done.acquire()


def _workers():
    global _pool
    with _lock:
        if _pool is None:
            _pool = _Workers(_threads - 1)
        return _pool


def _forget_workers():
    """In a forked child the parent's workers do not exist: make new ones on first use."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_workers)


_blas = []  # threadpoolctl's controller of the BLAS libraries, made on first use


def _blas_one_thread():
    """A context in which BLAS (OpenBLAS, MKL) runs its calls on the calling thread alone."""
    if not _blas:
        from threadpoolctl import ThreadpoolController
        _blas.append(ThreadpoolController())
    return _blas[0].limit(limits=1, user_api="blas")


@contextlib.contextmanager
def numpy_settings():
    """NumPy's settings for the kernels while the block runs, in the calling thread (each
    thread has its own, so other threads see no change): its ufunc buffer size, no warnings
    on floating-point errors (a training that goes non-finite is caught and named by the
    trainer, in one line; NumPy's warnings would print around it, and only where a GEMM
    happened to run on the calling thread), and BLAS held to one thread per call, since the
    kernels split their GEMMs over this module's pool instead (see the module docstring)."""
    before = numpy.setbufsize(BUFSIZE)
    try:
        with _blas_one_thread(), numpy.errstate(all="ignore"):
            yield
    finally:
        numpy.setbufsize(before)


def _kernel_thread_settings():
    """The pool threads' NumPy settings, for their life: those of :func:`numpy_settings`."""
    numpy.setbufsize(BUFSIZE)
    numpy.seterr(all="ignore")


def chunks(length, work, parts=None):
    """``parts`` (default: the thread count, fewer where chunks would be under MIN_CHUNK
    elements of ``work`` each) ``(start, stop)`` ranges splitting ``range(length)``.
    ``work``: elements of memory traffic per unit of ``length``."""
    parts = min(parts or _threads, max(1, length * work // MIN_CHUNK), length) or 1
    step, extra = divmod(length, parts)
    out, start = [], 0
    for k in range(parts):
        stop = start + step + (k < extra)
        out.append((start, stop))
        start = stop
    return out


def run(kernel, length, work=1, xp=None):
    """Call ``kernel(start, stop)`` over chunks of ``range(length)``, one per thread, and wait
    for all; the calling thread takes the first. ``work``: elements per unit of ``length``
    (to decide whether splitting pays). Inline, whole, where ``xp`` is not NumPy (a GPU)."""
    if xp is not None and getattr(xp, "__name__", "numpy") != "numpy":
        kernel(0, length)
        return
    spans = chunks(length, work)
    if len(spans) == 1:
        kernel(0, length)
        return
    workers = _workers()
    if not workers.busy.acquire(blocking=False):  # a split inside a split, or another caller
        kernel(0, length)
        return
    try:
        workers.start([lambda a=a, b=b: kernel(a, b) for a, b in spans[1:]])
        try:
            kernel(*spans[0])
        finally:
            workers.wait(len(spans) - 1)
    finally:
        workers.busy.release()


# A constant row for NumPy's binary loops, which run 2-3x faster over two contiguous operands
# than over an operand broadcast from a scalar (measured: ``np.maximum(x, 0)`` on 1 M float32
# 361 us, against rows of 16384 elements of ``x`` with a zero row 120 us; a per-channel sum
# as dot products with a row of ones 62 us, against ``sum(axis=(0, 2))`` 168 us)
_constants = {}


def constant(value, length, dtype):
    """A read-only NumPy vector of ``length`` elements all ``value``, made once (a few such
    rows are all a net needs: one per length, value and dtype its layers ask for)."""
    key = (value, int(length), str(dtype))
    row = _constants.get(key)
    if row is None:
        row = numpy.full(int(length), value, dtype)
        row.flags.writeable = False
        row = _constants.setdefault(key, row)
    return row


# Elements per row of :func:`max_zero`'s zero row (64 KiB of float32, made once)
ROW = 1 << 14
# A slice that a second pass over it still finds in a core's cache (L2: 1 MiB a core here): a
# layer that ends with a ReLU in its own pass (Layer.fuses_relu) takes its output so many bytes
# at a time (ResNet's Scale at 32x256x56x56: 11.2 ms against 21.7 ms for Scale, then ReLU)
CACHE_BYTES = 1 << 20


def max_zero(x, y):
    """``y = max(x, 0)`` on the CPU (NaN kept), flat ``x`` and ``y`` taken as rows against a row
    of zeros: NumPy's maximum runs about twice as fast over two contiguous operands as
    against the scalar 0 (see :func:`constant`); the same values either way."""
    if x.ndim != 1:
        numpy.maximum(x, 0, out=y)
        return
    zero, body = constant(0, ROW, x.dtype), x.size - x.size % ROW
    if body:
        numpy.maximum(x[:body].reshape(-1, ROW), zero, out=y[:body].reshape(-1, ROW))
    if body < x.size:
        numpy.maximum(x[body:], zero[:x.size - body], out=y[body:])


def copyto(xp, dst, src):
    """``xp.copyto(dst, src)`` split along axis 0 of both (arrays of one shape, any strides)."""
    run(lambda a, b: xp.copyto(dst[a:b], src[a:b]), dst.shape[0], dst[:1].size, xp)


def matmul(xp, a, b, out):
    """``xp.matmul(a, b, out=out)`` split over the threads: by ``out``'s columns (and ``b``'s),
    or by its rows (and ``a``'s) where it has more rows than columns. ``a``, ``b`` and ``out``
    are stacks of matrices of one stack shape (or plain matrices); each chunk's GEMM reads
    strided views, which BLAS takes as they are (a leading dimension), so nothing is copied.
    The products equal the whole call's to float32 rounding, not bit for bit (OpenBLAS's
    order of summation depends on the shapes it is given, as on its own thread count)."""
    rows, cols = out.shape[-2:]
    flops = rows * cols * a.shape[-1] * (math.prod(out.shape[:-2]) or 1)
    if cols >= rows:
        kernel = lambda i, j: xp.matmul(a, b[..., i:j], out=out[..., i:j])  # noqa: E731
        length = cols
    else:
        kernel = lambda i, j: xp.matmul(a[..., i:j, :], b, out=out[..., i:j, :])  # noqa: E731
        length = rows
    run(kernel, length, max(1, flops // (length * GEMM_FLOPS_PER_ELEMENT)), xp)


def elementwise(kernel, arrays, xp=None):
    """``kernel(*flat_slices)`` over one slice per thread of the flattened ``arrays`` (one
    size, each C-contiguous; otherwise one call on the arrays as given)."""
    if (xp is not None and getattr(xp, "__name__", "numpy") != "numpy") or not all(
            a.flags.c_contiguous for a in arrays):
        kernel(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]
    run(lambda a, b: kernel(*(f[a:b] for f in flat)), flat[0].size)
