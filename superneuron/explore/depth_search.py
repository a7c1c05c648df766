"""The search for one policy's deepest fitting member of a family of nets (depth.py's
``deepest`` runs one per policy, side by side): a generator that asks for plans by their
number of blocks and narrows to adjacent depths, one that fits and one that does not,
assuming fitting is monotone in the blocks. It knows plans only as ``blocks``, ``fits`` and
``need_bytes``, so it is tested without planning anything (tests/test_depth.py).
"""

MIN_BLOCKS = 16          # depth 50: stages [3, 8, 2, 3]


def search(budget, max_blocks, min_blocks=MIN_BLOCKS, guess=None):
    """The search for one policy, as a generator: it yields the number of blocks it wants
    planned, is sent back that plan (anything with ``blocks``, ``fits`` and ``need_bytes``, which
    is within ``budget`` where it fits and grows with the blocks),
    and returns ``(best, over, at_cap, probes)``: the deepest fitting plan (None when
    ``min_blocks`` does not fit), the shallowest plan found not to fit (None at the cap), and
    whether ``best`` is the cap. ``guess``: blocks to plan first, and then their neighbour; it
    changes how many plans the search makes, not its answer. Assumes fitting is monotone in
    the number of blocks."""
    probes = 0
    lo = prev = hi = above = None
    if guess is not None:
        g = min(max(guess, min_blocks), max_blocks)
        p = yield g
        probes += 1
        if p.fits and g == max_blocks:
            return p, None, True, probes
        if p.fits:
            q = yield g + 1
            probes += 1
            if not q.fits:
                return p, q, False, probes
            prev, lo = p, q
        elif g == min_blocks:
            return None, p, False, probes
        else:
            q = yield g - 1
            probes += 1
            if q.fits:
                return q, p, False, probes
            if q.blocks == min_blocks:
                return None, q, False, probes
            above, hi = p, q
    if lo is None:
        lo = yield min_blocks
        probes += 1
        if not lo.fits:
            return None, lo, False, probes
    misses = 0
    while hi is None:               # grow an upper bound
        if lo.blocks >= max_blocks:
            return lo, None, True, probes
        n = 2 * lo.blocks
        if prev is not None and lo.need_bytes > prev.need_bytes:
            # just past where the line through the last two plans meets the budget, but each
            # time the line fell short (its guess fit) at least twice as far on as the last
            least = lo.blocks + max(1, (lo.blocks << misses) // 16)
            n = min(max(int(_crossing(prev, lo, budget)) + 1, least), 16 * lo.blocks)
        p = yield min(n, max_blocks)
        probes += 1
        if p.fits:
            if prev is not None:
                misses += 1
            prev, lo = lo, p
        else:
            hi = p
    ends, bisect = True, False       # ``above``: the nearest misfit past hi
    while hi.blocks - lo.blocks > 1:  # narrow to adjacent depths
        width = hi.blocks - lo.blocks
        n, line = (lo.blocks + hi.blocks) // 2, None
        if not bisect and above is not None and above.need_bytes > hi.need_bytes:
            line = "misfits"
            n = int(_crossing(hi, above, budget))
        elif not bisect and ends and hi.need_bytes > lo.need_bytes:
            line = "ends"
            n = int(_crossing(lo, hi, budget))
        p = yield min(max(n, lo.blocks + 1), hi.blocks - 1)
        probes += 1
        if p.fits:
            lo = p
        else:
            above, hi = hi, p
        # a guess that fails to halve the interval is followed by a bisection; the line through
        # the ends is given up for good then, as plans that hug the budget (offloading makes
        # them) leave it flat, but not the misfits' line, which such plans do not flatten
        bisect = line is not None and hi.blocks - lo.blocks > width // 2
        ends = ends and not (bisect and line == "ends")
    return lo, hi, False, probes


def _crossing(a, b, budget):
    """Blocks where the line through plans ``a`` and ``b`` (blocks, need bytes) meets ``budget``."""
    slope = (b.need_bytes - a.need_bytes) / (b.blocks - a.blocks)
    return a.blocks + (budget - a.need_bytes) / slope
