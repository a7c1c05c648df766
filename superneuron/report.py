"""Formatting of figures for people: sizes, rates, tables (the CLIs print what this returns)."""

import os

from .errors import SNError
from .files import write_bytes
from .limits import TIMELINE_FORMATS
from .scheduler.liveness import Roots
from .scheduler.optimal import PARAMS_NAME, STATE_NAME
from .scheduler.params import updates_on_host
from .scheduler.simulate import working_set
from .scheduler.steps import ALLREDUCE, BACKWARD, FORWARD, first_backward
from .scheduler.timeline import COMPUTE_STREAM, D2H, EXPOSED, H2D, NETWORK, STALL
from .sizes import human_bytes, parse_size  # noqa: F401  (report's users format sizes too)


def human_seconds(seconds):
    """``0.0123`` → ``'12 ms'``, ``75`` → ``'1 min 15 s'``, ``7300`` → ``'2 h 1 min'``."""
    seconds = float(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def table(rows, headers):
    """A plain-text table with aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- plans (sn-plan) ------------------------------------------------------------------------

def ratio(a, b):
    """``a / b`` as ``'1.27'`` (``'-'`` when b is 0)."""
    return f"{a / b:.2f}" if b else "-"


def plan_summary(info):
    """The lines sn-plan prints for the figures in ``info`` (see cli/plan.py's ``figures``)."""
    arenas = ", ".join(f"{k} {human_bytes(v)} (x{ratio(v, info['peak_bytes'])})"
                       for k, v in info["arenas"].items())
    k = info.get("iter_size", 1)
    rounds = f" x iter_size {k} (the steps run once per batch, the update once)" if k > 1 else ""
    accum = ""
    if k > 1:
        accum = (f"; the gradients' accumulators {human_bytes(info['accumulator_bytes'])}"
                 if info["accumulator_bytes"] else
                 f"; the gradients' accumulators on the host, {human_bytes(info['host_accumulator_bytes'])}")
    lines = [
        f"net {info['net']}, batch {info['batch']}{rounds}, policy {info['policy']}, "
        f"placement {info['placement']}: {info['steps']} steps",
        f"peak          {human_bytes(info['peak_bytes'])} at {info['peak_step']}",
        f"resident      {human_bytes(info['resident_bytes'])} (parameters, their gradients, state{accum})",
        f"lower bound   {human_bytes(info['lower_bound_bytes'])}, each step on its smallest-workspace "
        f"algorithm (peak / lower bound {ratio(info['peak_bytes'], info['lower_bound_bytes'])})",
        f"chosen bound  {human_bytes(info['chosen_bound_bytes'])}, each step on the algorithm chosen, "
        f"the lower bound printed before (peak / it {ratio(info['peak_bytes'], info['chosen_bound_bytes'])})",
        f"arena         {human_bytes(info['arena_bytes'])} after {info['placement']} placement "
        f"(arena / peak: {arenas})",
    ]
    budget = info["budget_bytes"]
    if budget is None:
        lines.append("budget        none given (--memory)")
    elif info["fits"]:
        lines.append(f"budget        {human_bytes(budget)}: fits, "
                     f"{human_bytes(budget - info['arena_bytes'])} to spare")
    else:
        lines.append(f"budget        {human_bytes(budget)}: does not fit")
        lines.append(overflow_line(info["overflow"], info["peak_bytes"], info["peak_step"], budget))
    return "\n".join(lines)


def host_resident_words(schedule):
    """What a training plan keeps on the host between the steps that use it, a few words (``''``
    for nothing): under parameter offload the parameters, their gradients and the optimiser's
    state; under state offload (scheduler/state.py) how many states and parameters."""
    tensors = schedule.tensors
    kinds = [tensors[t].kind for t in schedule.host_resident]
    if updates_on_host(schedule):
        return "parameters, gradients and optimiser state on the host, updated there"
    state, params = kinds.count("state"), kinds.count("param")
    if not state and not params:
        return ""
    what = [f"{n} optimiser state{'s' if n > 1 else ''}" for n in [state] if n]
    what += [f"{n} parameter{'s' if n > 1 else ''}" for n in [params] if n]
    return " and ".join(what) + " on the host, copied in for their steps"


def overflow_line(over, peak_bytes, peak_step, budget):
    """The line that says why a plan does not fit ``budget``: what it needs, where the budget
    is first exceeded, and, apart from it, the peak and its step (simulate.overflow_at's dict)."""
    return (f"needs {human_bytes(over['needs_bytes'])}: the budget is first exceeded at {over['step']} "
            f"({human_bytes(over['bytes_at_step'])} there), the peak is {human_bytes(peak_bytes)} at "
            f"{peak_step}; budget {human_bytes(budget)} ({human_bytes(over['needs_bytes'] - budget)} over)")


def rejected_line(rejected):
    """The note of ``--profile`` on the algorithms its float64 check rejected (runtime/profile.py's
    ``Profile.rejected``), or None when it rejected none."""
    if not rejected:
        return None
    each = ", ".join(f"{layer} {algo} {phase} ({error:.1e} > {tolerance:.1e})"
                     for layer, algo, phase, error, tolerance in rejected)
    return f"rejected      {len(rejected)} algorithm{'s' if len(rejected) != 1 else ''} beyond float32 " \
           f"rounding of float64 (relative error > tolerance), left out of the plan unless a layer has " \
           f"no other: {each}"


def min_memory_line(info):
    """The line of ``sn-plan --min-memory``."""
    need = info["min_memory_bytes"]
    if "min_memory_floor_bytes" in info:  # optimal, auto: the solver's plans may fit under a heuristic's
        floor = info["min_memory_floor_bytes"]
        under = "" if floor is None else (f"; the solver's may fit under it, none under {human_bytes(floor)} "
                                          f"({floor} bytes: its programs have no answer there)")
        return (f"min memory    {human_bytes(need)} ({need} bytes): the smallest --memory under which a "
                f"heuristic's plan fits{under}")
    return (f"min memory    {human_bytes(need)} ({need} bytes): the smallest --memory under which "
            f"this policy's plan fits (at {need - 1} bytes it does not)")


def encoded_summary(encoded, listed=8):
    """The lines on the stashes a plan keeps encoded (cli/plan.py's ``encoded_figures``): how
    many of each codec, the bytes stashed across the turn beside liveness's, and the first
    ``listed`` encoded tensors."""
    tensors = encoded["tensors"]
    counts = {}
    for t in tensors:
        counts[t["codec"]] = counts.get(t["codec"], 0) + 1
    saved = encoded["liveness_stash_bytes"] - encoded["stash_bytes"]
    lines = [f"encoded       {len(tensors)} stashes ({', '.join(f'{c} {n}' for c, n in counts.items())}): "
             f"{human_bytes(encoded['stash_bytes'])} kept across the forward/backward turn, liveness "
             f"{human_bytes(encoded['liveness_stash_bytes'])} (saves {human_bytes(saved)})"]
    for t in tensors[:listed]:
        lines.append(f"              {t['name']}: {human_bytes(t['bytes'])} for {t['stands_for']}")
    if len(tensors) > listed:
        lines.append(f"              ... and {len(tensors) - listed} more (--steps lists the steps that write them)")
    return "\n".join(lines)


def time_summary(info):
    """The lines on host memory and estimated time sn-plan prints (cli/plan.py's figures)."""
    lines = []
    if info["host_bytes"]:
        line = (f"host          {human_bytes(info['host_bytes'])} at most offloaded, "
                f"{human_bytes(info['copied_bytes'])} copied per iteration")
        if info["host_memory_bytes"] is not None:
            line += (f"; --host-memory {human_bytes(info['host_memory_bytes'])}: "
                     + ("fits" if info["host_fits"] else "does not fit"))
        lines.append(line)
    ms = 1e3
    lines.append(f"est. time     {info['est_seconds'] * ms:.3f} ms per iteration ({info['cost_model']}): "
                 f"recompute {info['est_recompute_seconds'] * ms:.3f} ms, stalls on copies "
                 f"{info['est_stall_seconds'] * ms:.3f} ms; "
                 f"x{info['est_seconds'] / max(info['est_liveness_seconds'], 1e-12):.3f} of liveness")
    return "\n".join(lines)


def data_parallel_summary(dp):
    """sn-plan's lines on a data-parallel plan (cli/plan.py's ``data_parallel`` figures): the
    buckets, the communication overlapped and exposed, and the estimated scaling efficiency."""
    ms = 1e3
    rows = [(b["bucket"], b["gradients"], human_bytes(b["bytes"]), b["after"], f"{b['seconds'] * ms:.3f}",
             f"{b['exposed_seconds'] * ms:.3f}") for b in dp["buckets"]]
    total = dp["communication_seconds"]
    lines = [
        f"ranks         {dp['ranks']}, link {dp['link_bytes_per_s'] / 1e9:g} GB/s, latency "
        f"{dp['link_latency_s'] * 1e6:g} us: {len(rows)} bucket{'s' if len(rows) != 1 else ''}, ring all-reduce "
        f"{total * ms:.3f} ms per iteration, {dp['overlapped_seconds'] * ms:.3f} ms overlapped with the "
        f"backward, {dp['exposed_seconds'] * ms:.3f} ms exposed",
        f"scaling       one rank {dp['one_rank_seconds'] * ms:.3f} ms per iteration; "
        f"{dp['ranks']} ranks at the same batch each: efficiency {100 * dp['scaling_efficiency']:.1f} % "
        f"({dp['ranks'] * dp['scaling_efficiency']:.2f}x the images per second)",
        table(rows, ["bucket", "grads", "bytes", "starts after", "all-reduce ms", "exposed ms"]),
    ]
    if dp.get("sync_bn"):
        sync = dp["sync_bn"]
        lines.insert(1, f"sync BN       {sync['allreduces']} all-reduces of {human_bytes(sync['bytes'])} in all, "
                        f"{sync['seconds'] * ms:.3f} ms, none overlapped (counted above)")
    return "\n".join(lines)


def layers_table(schedule, plan):
    """Per layer: forward and backward working sets, the bytes live on the device while each
    runs (resident included), and for a layer written in place (``top == bottom``) whether it
    shares its bottom's memory or keeps that value for a backward (and how many bytes); for a
    convolution whose backward writes its bottom's gradient over its bottom, that."""
    roots, at = Roots(schedule), {}
    for i, step in enumerate(schedule.steps):
        if step.kind in (FORWARD, BACKWARD):
            at[step.kind, step.node] = (working_set(schedule, step, roots),
                                          plan.resident_bytes + plan.live[i])
    rows = []
    for node in schedule.graph.nodes:
        f, b = at.get((FORWARD, node.index)), at.get((BACKWARD, node.index))
        cells = [node.name, node.layer.type]
        for k in (0, 1):
            cells += [human_bytes(x[k]) if x else "-" for x in (f, b)]
        over = [b for b in node.layer.grad_over_bottom() if node.bottom_grads[b] in schedule.tensors
                and roots(node.bottom_grads[b]) == roots(node.bottoms[b])]
        if node.inplace:
            cells.append("yes")
        elif over:
            cells.append("its bottom's gradient")  # written over the bottom by its backward: inplace.py
        elif node.kept:
            kept = human_bytes(schedule.graph.tensors[node.bottoms[0]].nbytes)
            cells.append(f"no, {kept}: {node.kept}")
        else:
            cells.append("")
        rows.append(cells)
    return table(rows, ["layer", "type", "fwd working set", "bwd working set", "live at fwd",
                        "live at bwd", "in place"])


def steps_table(schedule, plan):
    """Every step with the device bytes live after it (resident included)."""
    graph = schedule.graph
    rows = [(i, step.describe(graph), human_bytes(plan.resident_bytes + plan.live[i]))
            for i, step in enumerate(schedule.steps)]
    return table(rows, ["#", "step", "live after"])


def write_timeline(path, schedule, plan, budget=None):
    """A PNG of the device bytes live over the steps, with the lower bound, the arena after
    placement and the budget as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gib = 2.0 ** 30
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    ax.plot(range(len(plan.live)), [(plan.resident_bytes + x) / gib for x in plan.live],
            lw=1, color="tab:blue", label="live")
    ax.axhline(plan.resident_bytes / gib, color="tab:gray", lw=1, ls=":", label="resident")
    ax.axhline(plan.lower_bound_bytes / gib, color="tab:green", lw=1, ls="--", label="lower bound")
    ax.axhline(plan.arena_bytes / gib, color="tab:orange", lw=1, ls="-.", label="arena")
    if budget is not None:
        ax.axhline(budget / gib, color="tab:red", lw=1.5, label="budget")
    turn = first_backward(schedule.steps)
    if turn is not None:
        ax.axvline(turn, color="black", lw=0.5, alpha=0.4)
    ax.set_xlabel("step")
    ax.set_ylabel("GiB on the device")
    ax.set_title(f"{schedule.graph.name}: policy {schedule.policy}, peak "
                 f"{human_bytes(plan.peak_bytes)}")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower center", fontsize="small", ncol=5)
    fig.tight_layout()
    import io
    image = io.BytesIO()  # drawn first, then written: a write that fails is an SNError naming it
    fig.savefig(image, format=timeline_format(path))
    plt.close(fig)
    write_bytes(path, image.getvalue(), "timeline")


def timeline_format(path):
    """The image format of ``path`` from its extension, one of TIMELINE_FORMATS (PNG without one);
    SNError otherwise (checked before planning, so a typo costs nothing)."""
    ext = os.path.splitext(str(path))[1].lower().lstrip(".") or "png"  # /dev/stdout: a PNG
    if ext not in TIMELINE_FORMATS:
        raise SNError(f"{path}: the timeline is written as .png, or .{', .'.join(TIMELINE_FORMATS[1:])}; "
                      f"not '.{ext}'")
    return ext


def trace_events(schedule, plan, model):
    """The schedule as Chrome/Perfetto trace events, timed by ``model`` (the cost.CostModel of
    the plan's device: its :meth:`timeline`): one track per stream, each step a span
    (``ph: X``): compute steps on the compute track, Offloads on the device→host track,
    Prefetches on the host→device track, and a ``stall`` span on the compute track wherever a
    Wait holds it for a copy; data-parallel all-reduces on a track of their own, and an
    ``exposed`` span wherever a WaitReduce holds the compute track; and a counter (``ph: C``)
    of the device bytes live."""
    graph, steps = schedule.graph, schedule.steps
    tids = {COMPUTE_STREAM: 0, STALL: 0, EXPOSED: 0, D2H: 1, H2D: 2, NETWORK: 3}
    marked = {STALL: "stall", EXPOSED: "exposed"}  # spans on the compute track that wait
    events = [{"name": "process_name", "ph": "M", "pid": 0,
               "args": {"name": f"{graph.name} ({schedule.policy}, {model.device.name})"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": stream}}
               for stream, tid in tids.items() if stream not in marked
               and (stream != NETWORK or any(s.kind == ALLREDUCE for s in steps))]  # a track of its own when used
    timeline, last = model.timeline(schedule), None
    for i, stream, start, end in timeline.spans:
        ts = round(start * 1e6, 3)
        if stream == COMPUTE_STREAM:
            live = plan.resident_bytes + plan.live[i]  # after the Allocs just before this step
            if live != last:
                events.append({"name": "device bytes", "ph": "C", "pid": 0, "ts": ts, "args": {"live": live}})
                last = live
        step = steps[i]
        args = {"step": i}
        if step.workspace:
            args["workspace"] = human_bytes(schedule.tensors[step.workspace].nbytes)
        if step.tensor:
            args["bytes"] = human_bytes(schedule.tensors[step.tensor].nbytes)
        name = step.describe(graph)
        events.append({"name": f"{marked[stream]}: {name}" if stream in marked else name,
                       "cat": stream if stream in marked else step.kind, "ph": "X", "pid": 0,
                       "tid": tids[stream], "ts": ts, "dur": round(max((end - start) * 1e6, 0.001), 3),
                       "args": args})
    if plan.live:
        events.append({"name": "device bytes", "ph": "C", "pid": 0, "ts": round(timeline.seconds * 1e6, 3),
                       "args": {"live": plan.resident_bytes + plan.live[-1]}})
    return events


def write_trace(path, schedule, plan, model):
    """Write :func:`trace_events` as a trace file that chrome://tracing and Perfetto open."""
    import json
    text = json.dumps({"traceEvents": trace_events(schedule, plan, model), "displayTimeUnit": "ms"})
    write_bytes(path, text.encode(), "trace")


def optimal_line(info):
    """The line sn-plan prints for the optimal and auto policies (the pass's memo, optimal.py):
    which plan won, the others' estimates, and what the solver proved."""
    ms = 1e3
    others = ", ".join(f"{k} {v * ms:.2f} ms" if v is not None else f"{k} does not fit"
                       for k, v in info["candidates"].items())
    others += "".join(f", {k} none faster" for k in info.get("bounded", {}))  # ended by its cutoff
    line = f"optimal       {info['winner']}'s plan won ({info['seconds'] * ms:.2f} ms)"
    if info.get("update_in_backward"):
        line += ", each parameter updated right after its backward (no gradient resident)"
    if info.get("proven"):
        return line + f": {info['proven']}"
    if info.get("state_offloaded") and info["winner"] in (STATE_NAME, PARAMS_NAME):
        what = "optimiser state" + (" and parameters" if info["winner"] == PARAMS_NAME else "")
        line += f", {human_bytes(info['state_offloaded'])} of {what} on the host"
    line += f"; candidates: {others}"
    solver = info.get("solver")
    if solver:
        gap = "-" if solver.get("gap") is None else f"{solver['gap'] * 100:.2f} %"
        bound = "-" if solver.get("dual_bound") is None else f"{solver['dual_bound'] * ms:.2f} ms"
        status = (solver.get("status") or "not run").split(" (")[0].rstrip(".")
        line += (f"; solver: {status}, gap {gap}, bound {bound} (its own model), {solver['rounds']} "
                 f"round(s), {solver.get('seconds', 0.0):.2f} s")
    return line


def tradeoff_table(figures):
    """The table of ``sn-plan --tradeoff`` (tradeoff.tradeoff's dict): per budget, each
    policy's estimated time and its ratio to liveness's (``-``: does not fit)."""
    base = figures["liveness_seconds"]
    policies = list(figures["rows"][0]["policies"]) if figures["rows"] else []
    rows = []
    for row in figures["rows"]:
        cells = [f"{v * 1e3:.2f} ms (x{v / base:.2f})" if v is not None else "-" for v in row["policies"].values()]
        rows.append([human_bytes(row["budget_bytes"]), row["label"], *cells])
    text = (f"estimated time per iteration against the budget (liveness: {human_bytes(figures['liveness_bytes'])}, "
            f"{base * 1e3:.2f} ms; lower bound {human_bytes(figures['lower_bound_bytes'])} with the parameters and "
            f"the optimiser's state resident)\n"
            + table(rows, ["budget", "", *policies]))
    monet = figures.get("monet")
    if monet:
        points = ", ".join(f"{p['fraction']:.2f} x{1 + p['overhead']:.3f}" for p in monet["points"])
        text += (f"\nMONeT, published ({monet['net']}, measured; memory as a fraction of PyTorch's peak, "
                 f"time against PyTorch's): {points}")
    return text


def write_tradeoff(path, table):
    """A PNG of each policy's estimated time against the budget (tradeoff.tradeoff's dict);
    SNError when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise SNError("--tradeoff draws with matplotlib, which is not installed: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gib = 2.0 ** 30
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    policies = list(table["rows"][0]["policies"]) if table["rows"] else []
    for policy in policies:
        points = sorted((r["budget_bytes"] / gib, r["policies"][policy] * 1e3) for r in table["rows"]
                        if r["policies"][policy] is not None)
        if points:
            ax.plot(*zip(*points), marker="o", label=policy)
    ax.axhline(table["liveness_seconds"] * 1e3, color="tab:gray", lw=1, ls=":", label="liveness, no budget")
    ax.axvline(table["lower_bound_bytes"] / gib, color="tab:red", lw=1, ls=":",
               label="lower bound, parameters and state resident")
    if table.get("monet"):  # placed as if PyTorch's peak and time were liveness's
        monet = table["monet"]
        ax.scatter([p["fraction"] * table["liveness_bytes"] / gib for p in monet["points"]],
                   [(1 + p["overhead"]) * table["liveness_seconds"] * 1e3 for p in monet["points"]],
                   marker="x", color="black", label=f"MONeT, published ({monet['net']})")
    ax.set_xlabel("budget (GiB)")
    ax.set_ylabel("estimated ms per iteration")
    ax.set_title("time against memory")
    ax.legend(fontsize="small")
    fig.tight_layout()
    import io
    image = io.BytesIO()
    fig.savefig(image, format=timeline_format(path))
    plt.close(fig)
    write_bytes(path, image.getvalue(), "tradeoff")
