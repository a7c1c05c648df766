"""The barrier pass: every copy under way has ended before the iteration's last Update.

A plan waits for each copy where its tensor is next used; one that nothing uses again (an
Offload whose host copy is all that is wanted) may still run when the optimiser starts. A
:func:`steps.Barrier` before the last Update (or at the end, without one) waits for all of
them at once: the iteration ends with no copy under way, whatever the passes before did.
"""

from .steps import COPY, UPDATE, Barrier


def barrier_before_update(schedule):
    """``schedule`` with a Barrier before its last Update (at its end when it has none); the
    schedule itself when it has no copies to wait for."""
    steps = schedule.steps
    if not any(s.kind in COPY for s in steps):
        return schedule
    at = next((i for i in range(len(steps) - 1, -1, -1) if steps[i].kind == UPDATE), len(steps))
    return schedule.replace(steps[:at] + [Barrier()] + steps[at:])
