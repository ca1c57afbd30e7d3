"""Notebook 05's exercises: each reference passes its own check, wrong answers fail it, a stub gets the
reference, and the notebook's solutions (written out here independently, as a learner would) pass."""
import re

import pytest
import torch

from labkit.kv_cache import block_hash, exercises as ex
from labkit.rng import Rng

def blocks_needed(n_tokens, block_size):
    return (n_tokens + block_size - 1) // block_size


def hash_chain(tokens, block_size):
    out, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        out.append(parent)
    return out


def gather(pool, block_table, length, block_size):
    rows = [pool[:, block_table[p // block_size] * block_size + p % block_size] for p in range(length)]
    return torch.stack(rows, dim=1)


def test_the_notebook_solutions_and_the_references_pass(capsys):
    for fn, exercise in [(blocks_needed, ex.BLOCKS_NEEDED), (hash_chain, ex.HASH_CHAIN), (gather, ex.PAGED_GATHER)]:
        assert exercise.check(fn) is fn
        copy_of_reference = lambda *a, e=exercise: e.reference(*a)  # noqa: E731
        assert exercise.check(copy_of_reference) is copy_of_reference
    assert capsys.readouterr().out.count("[PASS]") == 6


def unchained(tokens, block_size):  # every block hashed on its own: the classic mistake
    return [block_hash(None, tokens[s:s + block_size]) for s in range(0, len(tokens) - block_size + 1, block_size)]


@pytest.mark.parametrize("fn, exercise", [
    (lambda n, bs: n // bs, ex.BLOCKS_NEEDED),                                       # floor instead of ceil
    (lambda n, bs: n // bs + 1, ex.BLOCKS_NEEDED),                                   # one too many when exact
    (unchained, ex.HASH_CHAIN),
    (lambda t, bs: hash_chain(t + [0] * (-len(t) % bs), bs), ex.HASH_CHAIN),         # hashes the partial block
    (lambda pool, table, n, bs: pool[:, :n], ex.PAGED_GATHER),                       # ignores the table
    (lambda pool, table, n, bs: gather(pool, sorted(table), n, bs), ex.PAGED_GATHER),  # blocks in id order
], ids=["floor", "plus one", "unchained", "partial block", "no table", "sorted table"])
def test_common_mistakes_fail_and_a_stub_is_todo(fn, exercise, capsys):
    def stub(*args):
        raise NotImplementedError
    for learner, verdict in ((fn, "[FAIL]"), (stub, "[TODO]")):  # either way the notebook goes on with the reference
        assert exercise.check(learner) is exercise.reference
        assert capsys.readouterr().out.startswith(verdict)


def test_random_cases_are_valid_inputs():
    rng = Rng(3)
    for _ in range(30):
        pool, table, length, bs = ex.random_gather_case(rng)
        assert pool.shape[1] % bs == 0 and (len(table) - 1) * bs < length <= len(table) * bs
        assert len(set(table)) == len(table) and max(table) < pool.shape[1] // bs


def test_a_gather_fail_line_is_enough_to_redo_the_case(capsys):
    def wrong_on_one_head(pool, table, n, bs):  # passes the fixed case (2 heads), fails a random one
        return gather(pool, table, n, bs) + (pool.shape[0] == 1)
    assert ex.PAGED_GATHER.check(wrong_on_one_head) is ex.PAGED_GATHER.reference
    line = capsys.readouterr().out
    m = re.match(r"\[FAIL\] \w+\(tensor\(shape \[(\d+), (\d+), (\d+)\], float32\), (\[[\d, ]*\]), (\d+), (\d+)\) "
                 r"returned .* at index \((\d+), (\d+), (\d+)\): ([\d.]+), expected ([\d.]+)", line)
    assert m, line
    heads, slots, dim, table, length, bs, *where, got, expected = m.groups()
    pool = ex.index_pool(int(heads), int(slots), int(dim))
    redone = ex.PAGED_GATHER.reference(pool, eval(table), int(length), int(bs))
    assert redone[tuple(map(int, where))].item() == float(expected) == float(got) - 1
    with pytest.raises(ValueError, match="slots must be"):
        ex.index_pool(2, 0, 4)
