"""Formatting of figures for people: sizes, rates, tables (the CLIs print what this returns)."""

import re

from .errors import SNError

_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3,
          "GB": 1000**3, "T": 1000**4, "TB": 1000**4, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}


def human_bytes(nbytes):
    """``1288490188`` → ``'1.2 GiB'``."""
    nbytes = int(nbytes)
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= div:
            return f"{nbytes / div:.1f} {unit}"
    return f"{nbytes} B"


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


def parse_size(text):
    """``'12GiB'``, ``'500MB'``, ``'1.5 GiB'``, ``'4096'`` → bytes; SNError when malformed."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise SNError(f"bad size '{text}'; use e.g. 12GiB, 500MB or 4096")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


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
    lines = [
        f"net {info['net']}, batch {info['batch']}, policy {info['policy']}, "
        f"placement {info['placement']}: {info['steps']} steps",
        f"peak          {human_bytes(info['peak_bytes'])} at {info['peak_step']}",
        f"resident      {human_bytes(info['resident_bytes'])} (parameters, their gradients, state)",
        f"lower bound   {human_bytes(info['lower_bound_bytes'])} "
        f"(peak / lower bound {ratio(info['peak_bytes'], info['lower_bound_bytes'])})",
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
        over = info["overflow"]
        lines.append(f"budget        {human_bytes(budget)}: does not fit")
        lines.append(f"needs {human_bytes(over['needs_bytes'])} at {over['step']}; "
                     f"budget {human_bytes(budget)} ({human_bytes(over['needs_bytes'] - budget)} over)")
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


def layers_table(schedule, plan):
    """Per layer: forward and backward working sets, the bytes live on the device while each
    runs (resident included), and for a layer written in place (``top == bottom``) whether it
    shares its bottom's memory or keeps that value for a backward (and how many bytes)."""
    from .scheduler.liveness import Roots
    from .scheduler.simulate import working_set
    roots, at = Roots(schedule), {}
    for i, step in enumerate(schedule.steps):
        if step.kind in ("forward", "backward"):
            at[step.kind, step.target] = (working_set(schedule, step, roots),
                                          plan.resident_bytes + plan.live[i])
    rows = []
    for node in schedule.graph.nodes:
        f, b = at.get(("forward", node.index)), at.get(("backward", node.index))
        cells = [node.name, node.layer.type]
        for k in (0, 1):
            cells += [human_bytes(x[k]) if x else "-" for x in (f, b)]
        if node.inplace:
            cells.append("yes")
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
    turn = next((i for i, s in enumerate(schedule.steps) if s.kind == "backward"), None)
    if turn is not None:
        ax.axvline(turn, color="black", lw=0.5, alpha=0.4)
    ax.set_xlabel("step")
    ax.set_ylabel("GiB on the device")
    ax.set_title(f"{schedule.graph.name}: policy {schedule.policy}, peak "
                 f"{human_bytes(plan.peak_bytes)}")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower center", fontsize="small", ncol=5)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def trace_events(schedule, plan):
    """The schedule as Chrome/Perfetto trace events: one span (``ph: X``) per compute step on
    a compute track, timed by the Simulator's estimates, and a counter (``ph: C``) of the
    bytes live."""
    from .scheduler.simulate import step_seconds
    graph = schedule.graph
    events = [{"name": "process_name", "ph": "M", "pid": 0,
               "args": {"name": f"{graph.name} ({schedule.policy})"}},
              {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "compute"}}]
    now, last = 0.0, None
    for i, step in enumerate(schedule.steps):
        if step.kind in ("alloc", "free"):
            continue
        live = plan.resident_bytes + plan.live[i]  # after the Allocs just before this step
        if live != last:
            events.append({"name": "device bytes", "ph": "C", "pid": 0, "ts": round(now, 3),
                           "args": {"live": live}})
            last = live
        dur = max(step_seconds(schedule, step) * 1e6, 0.001)
        args = {"step": i}
        if step.workspace:
            args["workspace"] = human_bytes(schedule.tensors[step.workspace].nbytes)
        events.append({"name": step.describe(graph), "cat": step.kind, "ph": "X", "pid": 0,
                       "tid": 0, "ts": round(now, 3), "dur": round(dur, 3), "args": args})
        now += dur
    if plan.live:
        events.append({"name": "device bytes", "ph": "C", "pid": 0, "ts": round(now, 3),
                       "args": {"live": plan.resident_bytes + plan.live[-1]}})
    return events


def write_trace(path, schedule, plan):
    """Write :func:`trace_events` as a trace file that chrome://tracing and Perfetto open."""
    import json
    with open(path, "w") as f:
        json.dump({"traceEvents": trace_events(schedule, plan), "displayTimeUnit": "ms"}, f)
