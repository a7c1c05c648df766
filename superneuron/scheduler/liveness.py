"""Liveness analysis (SuperNeurons, Wang et al. 2018): each tensor lives from the step that
first uses it to the step that last uses it, instead of all iteration.

One sweep over the steps finds the live intervals of every storage root (a tensor that aliases
another takes no storage of its own; its uses count for its root). The pass then allocates
each root right before an interval starts and frees it right after it ends, so an activation
that no backward reads is gone as soon as the layers after it have run, and a gradient is gone
as soon as the backward below it has consumed it.

A root may live several intervals: a step that writes a root without reading it (a Recompute,
a Prefetch, a workspace's step) makes its old contents dead, so the interval before ends at
its last use and a new one starts there. That is what lets recomputation and offloading free
a tensor between its forward and its backward uses.

What a step uses is :func:`uses`: a forward reads its bottoms and writes its tops (a Split's
tops are views of its bottom: its forward touches nothing); a backward reads the bottoms and
tops its layer's ``backward_reads`` names and its top gradients, and writes its bottom
gradients; an Offload and a Wait read their tensor, a Prefetch writes it. The loss gradient,
which the runtime fills just before the loss layer's backward, is thereby allocated right
before that backward. Resident tensors (parameters, their gradients, optimiser state) are
never scheduled.
"""

from ..graph.tensors import KINDS
from .allocator import aligned
from .steps import KINDS as STEP_KINDS
from .steps import MEMORY, Alloc, Free

# Kinds whose storage the steps manage; parameters, their gradients and the optimiser's state
# only when not resident (parameter offload keeps them on the host and copies them to the device
# for their steps; state offload, state.py, the state around its update).
SCHEDULED = ("data", "grad", "workspace", "encoded", "param", "param_grad", "state", "bucket")
HOST_MASTERED = ("param", "param_grad", "state")  # host-resident, with device copies the steps manage
assert set(SCHEDULED) <= set(KINDS), "scheduled kinds are tensor kinds (graph.KINDS)"


def uses(graph, step):
    """``(reads, writes)``: the tensor names a step reads and writes (its workspace aside), as
    its kind declares them (steps.KINDS). Memory steps and the update (resident tensors only)
    use none."""
    return STEP_KINDS[step.kind].uses(graph, step)


def not_scheduled(schedule):
    """The tensors whose storage no step manages: the device's resident ones, and the host's
    except parameters, their gradients and the optimiser's state (whose device copies, where
    steps use them, the steps manage)."""
    tensors = schedule.tensors
    return set(schedule.resident) | {t for t in schedule.host_resident if tensors[t].kind not in HOST_MASTERED}


_UNSEEN = object()


class Roots:
    """``name → storage root`` in a schedule's tensors, memoised (a pass asks millions of
    times). ``scheduled(name)`` is the root when the steps manage its storage, else None;
    ``uses(step)`` is :func:`uses` in scheduled roots. One Roots serves every schedule with
    the same graph, tensors and resident sets (the offload pass plans many such)."""

    def __init__(self, schedule, like=None):
        self.graph = schedule.graph
        self.tensors = schedule.tensors
        self.resident = not_scheduled(schedule)
        self.of_lists = (schedule.resident, schedule.host_resident)
        self.memo = {}
        self._scheduled = {}
        self._uses = {}
        self._sizes = {}
        self.touched = {}  # step_roots' memo
        if like is not None and like.graph is self.graph and like.resident == self.resident:
            self._uses = like._uses  # the same answers: see :meth:`derive`

    def serves(self, schedule):
        """Whether this Roots answers for ``schedule``: the same graph, tensors and resident
        lists (the same objects: passes that change them make new ones)."""
        return (self.graph is schedule.graph and self.tensors is schedule.tensors
                and self.of_lists[0] is schedule.resident and self.of_lists[1] is schedule.host_resident)

    @classmethod
    def derive(cls, schedule, parent):
        """Make the Roots that :meth:`of` gives ``schedule``, whose tensors are those of
        ``parent`` (a schedule) with workspaces added, such as the workspace pass makes: what
        steps read and write (never a workspace) has the same roots in both, so that memo is
        shared rather than made again."""
        schedule.roots = roots = cls(schedule, like=cls.of(parent))
        return roots

    @classmethod
    def of(cls, schedule):
        """The Roots of ``schedule``, kept with it (``schedule.roots``) and handed on by
        Schedule.replace to the schedules the passes make from it, so that its memos are made
        once per plan rather than once per pass; made anew where one of them changed what it
        is of (:meth:`serves`). No module keeps it: it goes when the schedules go."""
        roots = schedule.roots
        if roots is None or not roots.serves(schedule):
            roots = schedule.roots = cls(schedule)
        return roots

    def __call__(self, name):
        r = self.memo.get(name)
        if r is None:
            # storage_root's walk, memoising every name on the way: a chain of n in-place
            # layers on one blob is n aliases deep, and walking it whole from each of its
            # names took n**2 steps (20 000 ReLUs: 40 s of sn-plan's 45)
            path, r, tensors, memo = [], name, self.tensors, self.memo
            while True:
                known = memo.get(r)
                if known is not None:
                    r = known
                    break
                info = tensors.get(r)
                if info is None or info.alias is None:
                    break
                path.append(r)
                r = info.alias
            for p in path:
                memo[p] = r
            memo[name] = r
        return r

    def scheduled(self, name):
        r = self._scheduled.get(name, _UNSEEN)
        if r is _UNSEEN:
            r = self(name)
            info = self.tensors.get(r)
            if r in self.resident or info is None or info.kind not in SCHEDULED:
                r = None
            self._scheduled[name] = r
        return r

    def uses(self, step):
        """``(read roots, written roots)`` of a step: the scheduled roots of what :func:`uses`
        names, in its order (repeats kept), the others left out. Memoised per step kind and
        target: the steps of a layer use the same tensors whichever schedule they are in."""
        key = (step.kind, step.node, step.tensor, step.grads, step.encoded, step.fused)
        found = self._uses.get(key)
        if found is None:
            reads, writes = uses(self.graph, step)
            scheduled = self.scheduled
            found = self._uses[key] = (
                tuple(r for r in map(scheduled, reads) if r is not None),
                tuple(r for r in map(scheduled, writes) if r is not None))
        return found

    def size(self, name):
        """The arena bytes of tensor ``name`` (its size, aligned), memoised."""
        size = self._sizes.get(name)
        if size is None:
            size = self._sizes[name] = aligned(self.tensors[name].nbytes)
        return size


def step_roots(schedule, step, roots):
    """The scheduled roots a compute step touches, writes first, each once, workspace last
    (a tuple, memoised in ``roots`` as its uses are: the Runtime asks at every step while a
    copy is on its way)."""
    key = (step.kind, step.node, step.tensor, step.grads, step.workspace, step.encoded, step.fused)
    found = roots.touched.get(key)
    if found is None:
        reads, writes = roots.uses(step)
        out = dict.fromkeys(writes + reads)
        if step.workspace and roots.scheduled(step.workspace):
            out[step.workspace] = True
        found = roots.touched[key] = tuple(out)
    return found


def intervals(schedule, steps, roots):
    """``[(root, start, end)]``: every live interval of every scheduled root in ``steps``
    (indices into ``steps``; memory steps are skipped), in the order they start. A write that
    does not read the root starts a new interval; a workspace lives for its one step."""
    spans, open_ = [], {}
    for i, step in enumerate(steps):
        if step.kind in MEMORY:
            continue
        read_roots, write_roots = roots.uses(step)
        for r in write_roots:
            span = open_.get(r)
            if span is None or (span[1] < i and r not in read_roots):
                open_[r] = span = [r, i, i]
                spans.append(span)
            span[2] = i
        for r in read_roots:
            span = open_.get(r)
            if span is None:
                open_[r] = span = [r, i, i]
                spans.append(span)
            span[2] = i
        if step.workspace and roots.scheduled(step.workspace):
            spans.append([step.workspace, i, i])
    return [tuple(s) for s in spans]


def liveness(schedule, context=None):
    """The pass: the schedule with every scheduled root allocated right before each of its
    live intervals and freed right after it (the input's own Alloc and Free steps are
    dropped). Works on training and test schedules alike; needs nothing of the Context."""
    return allocate_live(schedule, Roots.of(schedule))


def allocate_live(schedule, roots):
    """:func:`liveness` with ``roots``, a Roots of the same tensors to share (the offload pass
    plans many variants of one schedule)."""
    steps = [s for s in schedule.steps if s.kind not in MEMORY]
    starts, ends = {}, {}
    for r, a, b in intervals(schedule, steps, roots):
        starts.setdefault(a, []).append(r)
        ends.setdefault(b, []).append(r)
    out = []
    append = out.append
    for i, step in enumerate(steps):
        if i in starts:
            out += map(Alloc, starts[i])
        append(step)
        if i in ends:
            out += map(Free, ends[i])
    return schedule.replace(out)
