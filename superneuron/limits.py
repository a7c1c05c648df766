"""Every limit superneuron puts on what a user gives it, in one place.

Each is far above anything a real network, solver or run needs and far below what would make
a tool hang, exhaust memory or overflow: past one, the tools stop before any work with one line
that names the limit (``... is over the limit of 200 000 layers (MAX_LAYERS)``), the file, line
and layer where there is one, and exit with status 2. Change them here; nothing else hard-codes
them. :mod:`superneuron.files` reads and writes files within them.
"""

# -- files -----------------------------------------------------------------------------------

MAX_NET_FILE_BYTES = 4 << 20
"""Largest network (or prototxt) file read: a Caffe prototxt of ResNet-1001 (about 4 700 layers)
is about 1 MiB, and PyYAML reads a MiB in seconds."""

MAX_SOLVER_FILE_BYTES = 1 << 20
"""Largest solver file read: a solver is a dozen keys."""

MAX_YAML_NODES = 1_000_000
"""Most YAML nodes a file (or a ``--set`` value) may stand for once its aliases (``*name``) are
expanded: a file within MAX_NET_FILE_BYTES has far fewer; nine nested aliases of nine items
each (an "alias bomb") would be 387 million."""

# -- the spec language ------------------------------------------------------------------------

MAX_LAYERS = 200_000
"""Most layers a network file may expand to (repeats and templates included): the ImageNet
ResNet of depth 15 002 has 65 022; one repeat of more, or a repeat whose first round shows that
it would exceed it, stops at once."""

MAX_REPEAT_ROUNDS = 1_000_000
"""Most rounds all of a network file's repeats may make together, nested ones counted in full
(a repeat of 100 over a repeat of 100 is 10 100 rounds), whether or not a round emits a layer:
a repeat of 100 000 over a repeat of 100 000 over no layers is ten billion empty rounds, hours
of work for nothing. A round takes about 2 microseconds; the deepest nets here make a few
thousand (ResNet-15002: 15 009). The outer repeat stops at once when its first round
shows that all of its rounds would exceed it."""

MAX_SPEC_INT = 2**31 - 1
"""Largest integer (in size) a layer key takes (``num_output``, ``pad``, ``kernel_size``, input
dimensions...): Caffe's int32/uint32 fields."""

MAX_TENSOR_BYTES = 1 << 40
"""Largest tensor (activation, gradient or parameter) a network may have: 1 TiB, more than any
device holds."""

MAX_WINDOW_TAPS = 1 << 16
"""Most taps (kernel height x width) of one convolution or pooling window, global pooling
included (a 256x256 map): their offsets are worked out when the net is built."""

MAX_BATCH = 1 << 20
"""Largest batch (``--batch``, ``batch_size``): 1 048 576 samples."""

MAX_EXPR_CHARS = 4096
"""Longest ``${...}`` expression, in characters (the longest in nets/ has about 200)."""

MAX_EXPR_DEPTH = 64
"""Deepest nesting of an expression's syntax tree (operators, calls, brackets)."""

MAX_EXPR_SIZE = 1_000_000
"""Largest value an expression may make: items of a list, tuple or dict, counted through
nested ones, and characters of a string (``'a' * 10**12``, ``[[0]] * 10**6``, ``range(10**9)``)."""

MAX_INT_BITS = 4096
"""Largest integer an expression may make, in bits (``9 ** 4096 ** 4096``): about 1233 digits."""

MAX_NESTING = 32
"""Deepest nesting of templates within templates; deeper is surely a template that uses itself."""

MAX_PROBLEMS = 100
"""Most problems printed for one file: the rest are counted (``... and 19 900 more problems``)."""

# -- the command line -------------------------------------------------------------------------

MAX_SIZE_BYTES = 1 << 50
"""Largest ``--memory``, ``--host-memory`` or ``--workspace-limit``: 1 PiB."""

MAX_ITER_SIZE = 1 << 16
"""Largest ``iter_size`` (``--iter-size``): batches whose gradients one iteration accumulates.
Caffe's examples use 2 to 32; past 65 536 an iteration is more likely a typo than a plan.
"""

MAX_SEED = 2**32 - 1
"""Largest ``--seed``: seeds are 0 .. 2**32 - 1, what NumPy's legacy seeding takes (NumPy refuses
negative ones)."""

MAX_DATA_SIDE = 1 << 16
"""Largest ``size`` or ``crop`` of a data source and ``sn-depth --size``: 65 536 pixels."""

MAX_SEARCH_DEPTH = 30_000
"""Largest ``sn-depth --max-depth``: a ResNet of depth 30 000 has about 140 000 layers (within
MAX_LAYERS), and plans that deep take minutes each."""

TIMELINE_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")
"""File extensions ``sn-plan --timeline`` writes (matplotlib's formats)."""


def over(what, value, limit, name, unit=""):
    """The text of an error for ``value`` over ``limit``: ``"what 10000000 is over the limit of
    1 048 576 (MAX_BATCH)"``."""
    if isinstance(value, int) and abs(value) >= 10**30:  # str() of a huge int is slow, or refused
        value = f"of about 10**{int(abs(value).bit_length() * 0.30103)}"
    return f"{what} {_spaced(value)}{unit} is over the limit of {_spaced(limit)}{unit} ({name})"


def _spaced(n):
    return f"{n:,}".replace(",", " ") if isinstance(n, int) and not isinstance(n, bool) else str(n)


def host_memory_bytes():
    """The most memory this process could take, in bytes: the machine's physical memory, or less
    where an address-space limit (``ulimit -v``) leaves less; None where the system does not say.
    Data held in memory, and the arena on the CPU, must fit in it."""
    import os
    try:
        import resource
    except ImportError:  # not a POSIX system
        resource = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = None
    soft = resource.RLIM_INFINITY if resource is None else resource.getrlimit(resource.RLIMIT_AS)[0]
    if resource is not None and soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/status") as f:
                used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        except (OSError, StopIteration, ValueError):
            used = 0
        total = soft - used if total is None else min(total, soft - used)
    return total
