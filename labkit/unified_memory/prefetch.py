"""Prefetchers: which pages a fault brings along with the faulted one (notebook 02, section 3).

    sequential  the next `prefetch_pages` pages of the allocation
    density     the tree-based rule of CUDA Unified Memory's driver (density_node), inside the page's 2 MiB
                block, which never holds two allocations

Both take only pages that are on the host when the fault happens, skip the faulted page, and stop at
device_pages - 1 pages so that one fault never needs more frames than the device has. Compiled with the
paging loop (see jit.py); density_node is the checked, callable face of the density rule.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_int, check_number, check_positive_int, fail
from .jit import jit
from .state import DENSITY, DEVICE, HOST, SEQUENTIAL, TIER, new_pages


@jit
def density_range(pages, block_start, block_end, page, threshold, leaf, counts):
    """[start, end): the pages the density rule takes for a fault on `page`, whose block spans pages
    [block_start, block_end) (cut at the allocation's end). Resident: pages[page, TIER] == DEVICE.
    `counts`: scratch space for block_end - block_start + 1 int64."""
    n_pages = block_end - block_start
    counts[0] = 0                                   # counts[j]: resident pages among the block's first j
    for offset in range(n_pages):
        counts[offset + 1] = counts[offset] + (1 if pages[block_start + offset, TIER] == DEVICE else 0)
    fault = page - block_start                      # offsets in the block from here on
    start = fault - fault % leaf                    # the whole leaf around the faulted page
    end = min(start + leaf, n_pages)
    size = 2 * leaf
    while size < 2 * max(n_pages, leaf):            # each node above it, up to the root
        node_start = fault - fault % size
        node_end = min(node_start + size, n_pages)  # a node cut by the allocation's end counts its pages inside
        resident_outside = counts[start] - counts[node_start] + counts[node_end] - counts[end]
        if resident_outside + (end - start) > threshold * (node_end - node_start):
            start, end = node_start, node_end       # dense enough: take the node whole
        size *= 2
    return block_start + start, block_start + end


@jit(inline=True)
def prefetch_candidates(page, pages, block_end, rules, limit, counts, out):
    """Write the pages a fault on `page` prefetches into out[:count], ascending; return count. They are on
    the host now, differ from `page`, and number at most `limit`."""
    block = page // rules.block_pages
    allocation_end = block_end[block]
    if rules.prefetch == SEQUENTIAL:
        first, end = page + 1, min(page + 1 + rules.prefetch_pages, allocation_end)
    elif rules.prefetch == DENSITY:
        block_start = block * rules.block_pages
        first, end = density_range(pages, block_start, min(block_start + rules.block_pages, allocation_end),
                                   page, rules.density_threshold, rules.leaf_pages, counts)
    else:
        return 0
    count = 0
    for candidate in range(first, end):
        if count == limit:
            break
        if candidate != page and pages[candidate, TIER] == HOST:
            out[count] = candidate
            count += 1
    return count


def density_node(resident, i: int, threshold: float = 0.5, leaf: int = 16) -> tuple[int, int]:
    """Tree-based density prefetch inside one 2 MiB block, after CUDA Unified Memory's driver (described by
    Ganguly et al., ISCA 2019): the block is a binary tree of aligned nodes of leaf, 2 leaf, 4 leaf ...
    pages. A fault takes the whole leaf around page `i`; then, going up to the root, each node is taken
    whole when more than `threshold` of its pages are resident or already taken. A node cut by the end of
    the allocation (len(resident) < the block) counts only its pages inside: it is taken when more than
    threshold * (its pages inside) are resident or taken. Returns the taken range as [start, end) page
    offsets. `resident`: one bool per page of the block (len <= the block). Notebook 02's exercise 2.

        leaf 2:  [x x | x . | . . | . .]  fault at 3: leaf [2,4); node [0,4) 4/4 > 0.5: take it;
                 node [0,8) 4/8 is not > 0.5 -> returns (0, 4): page 3 moves (0..2 are there already)
    """
    resident = np.asarray(resident)
    if resident.ndim != 1 or len(resident) == 0:
        raise ValueError(f"resident must be a non-empty 1-D array of bools, got shape {resident.shape}")
    if resident.dtype != bool and not (np.issubdtype(resident.dtype, np.integer) and np.isin(resident, (0, 1)).all()):
        fail("resident", resident.tolist()[:8], "one bool (or 0/1) per page of the block",
             ValueError if np.issubdtype(resident.dtype, np.integer) else TypeError)
    n = len(resident)
    check_int("i", i, 0, n - 1)
    threshold = check_number("threshold", threshold, 0.0, 1.0, high_open=True)
    leaf = check_positive_int("leaf", leaf, unit="pages")
    block = new_pages(n)
    block[:, TIER] = np.where(resident.astype(bool), DEVICE, HOST)
    start, end = density_range(block, 0, n, int(i), threshold, leaf, np.empty(n + 1, np.int64))
    return int(start), int(end)
