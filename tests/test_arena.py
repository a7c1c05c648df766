"""The arena's allocator: best fit, coalescing, the top, the budget, views."""

import numpy as np
from one_line import raises_one_line

from superneuron.backend import Backend
from superneuron.runtime.arena import ALIGN, Arena, OutOfMemory, aligned


def test_sizes_are_aligned():
    assert aligned(0) == 0 and aligned(1) == ALIGN and aligned(ALIGN) == ALIGN and aligned(ALIGN + 1) == 2 * ALIGN


def test_best_fit_picks_the_smallest_hole_that_holds():
    a = Arena()
    for name, n in [("a", 4), ("x", 1), ("b", 2), ("y", 1), ("c", 8)]:
        a.alloc(name, n * ALIGN)
    a.free("a")   # hole of 4 at 0
    a.free("b")   # hole of 2 at 5
    assert a.alloc("d", 2 * ALIGN) == 5 * ALIGN  # the 2-hole, not the 4-hole
    assert a.alloc("e", 3 * ALIGN) == 0
    assert a.high_water == 16 * ALIGN


def test_free_neighbours_coalesce_and_the_top_comes_down():
    a = Arena()
    for name in "abc":
        a.alloc(name, ALIGN)
    a.free("a")
    a.free("b")
    assert a.free_blocks == [(0, 2 * ALIGN)]
    assert a.alloc("big", 2 * ALIGN) == 0
    a.free("c")
    assert a.top == 2 * ALIGN and a.free_blocks == []
    a.free("big")
    assert a.top == 0 and a.live == 0
    assert a.peak_live == 3 * ALIGN and a.high_water == 3 * ALIGN


def test_resident_region_comes_first_and_survives_reset():
    a = Arena()
    a.place_resident("w", 10)
    a.place_resident("g", 10)
    assert a.resident["g"][0] == ALIGN and a.resident_end == 2 * ALIGN
    assert a.alloc("x", 1) == 2 * ALIGN
    a.reset()
    assert a.alloc("y", 1) == 2 * ALIGN and a.peak_bytes == 3 * ALIGN


def test_budget_overflow_names_the_tensor():
    a = Arena(capacity=4 * ALIGN)
    a.alloc("a", 3 * ALIGN)
    with raises_one_line(OutOfMemory, match="'b' needs"):
        a.alloc("b", 2 * ALIGN)


def test_views_share_the_one_buffer():
    a = Arena(capacity=8 * ALIGN, backend=Backend())
    a.place_resident("w", 4 * 6)
    a.alloc("x", 4 * 6)
    w = a.view("w", (2, 3), np.float32)
    x = a.view("x", (6,), np.float32)
    w[...] = 1
    x[...] = 2
    assert np.shares_memory(w, a.buffer) and np.shares_memory(x, a.buffer)
    assert a.buffer[:24].view(np.float32).sum() == 6 and a.buffer[ALIGN:ALIGN + 24].view(np.float32).sum() == 12
