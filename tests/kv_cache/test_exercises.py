"""Notebook 05's exercises: each reference passes its own check, wrong answers fail it, a stub gets the
reference, the notebook's solutions (written out here independently, as a learner would) pass, and NEW_BLOCKS'
reference is what a real BlockManager takes."""
import re

import pytest
import torch

from labkit.kv_cache import BlockManager, block_hash, exercises as ex
from labkit.rng import Rng


def new_blocks(prompt_len, shared, lookahead, block_size):
    reused = min(shared, prompt_len - 1) // block_size
    return -(-(prompt_len + lookahead) // block_size) - reused


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
    for fn, exercise in [(new_blocks, ex.NEW_BLOCKS), (hash_chain, ex.HASH_CHAIN), (gather, ex.PAGED_GATHER)]:
        assert exercise.check(fn) is fn
        copy_of_reference = lambda *a, e=exercise: e.reference(*a)  # noqa: E731
        assert exercise.check(copy_of_reference) is copy_of_reference
    assert capsys.readouterr().out.count("[PASS]") == 6


def unchained(tokens, block_size):  # every block hashed on its own: the classic mistake
    return [block_hash(None, tokens[s:s + block_size]) for s in range(0, len(tokens) - block_size + 1, block_size)]


@pytest.mark.parametrize("fn, exercise", [
    (lambda n, s, la, bs: -(-n // bs), ex.NEW_BLOCKS),                               # the prompt alone
    (lambda n, s, la, bs: -(-(n + la) // bs) - s // bs, ex.NEW_BLOCKS),              # shares the last block
    (lambda n, s, la, bs: -(-(n + la - s) // bs), ex.NEW_BLOCKS),                    # shares part of a block
    (lambda n, s, la, bs: -(-n // bs) - min(s, n - 1) // bs + -(-la // bs), ex.NEW_BLOCKS),  # lookahead apart
    (unchained, ex.HASH_CHAIN),
    (lambda t, bs: hash_chain(t + [0] * (-len(t) % bs), bs), ex.HASH_CHAIN),         # hashes the partial block
    (lambda pool, table, n, bs: pool[:, :n], ex.PAGED_GATHER),                       # ignores the table
    (lambda pool, table, n, bs: gather(pool, sorted(table), n, bs), ex.PAGED_GATHER),  # blocks in id order
], ids=["prompt alone", "last block shared", "partial block shared",
        "lookahead in its own blocks", "unchained", "partial block", "no table", "sorted table"])
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


def manager_new_blocks(prompt_len, shared, lookahead, block_size):
    """Blocks a real BlockManager takes from its free list: a first prompt that agrees with the new one on exactly
    `shared` tokens is computed and freed (its full blocks stay cached), then the new prompt is allocated and
    `lookahead` slots appended."""
    prompt = [1 + i % 200 for i in range(prompt_len)]
    bm = BlockManager(4 * (prompt_len + lookahead) // block_size + 8, block_size, vocab_size=256)
    first = prompt[:shared] + [0]  # token 0 never occurs in `prompt`: the prompts part at position `shared`
    bm.allocate("first", first)
    bm.mark_computed("first", len(first))
    bm.free("first")
    free = bm.num_free_blocks
    bm.allocate("new", prompt)
    for _ in range(lookahead):
        bm.append("new", 7)
    return free - bm.num_free_blocks


def test_new_blocks_is_what_the_block_manager_takes():
    rng = Rng(6)
    cases = list(ex.NEW_BLOCKS.cases) + [ex.random_new_blocks_case(rng) for _ in range(300)]
    for case in cases:
        assert ex.new_blocks(*case) == manager_new_blocks(*case), case


@pytest.mark.parametrize("args, error, match", [
    ((0, 0, 0, 16), ValueError, "prompt_len must be"), ((8, 9, 0, 16), ValueError, "shared must be"),
    ((8, 0, -1, 16), ValueError, "lookahead must be"), ((8, 0, 0, 12), ValueError, "block_size must be"),
    ((8.0, 0, 0, 16), TypeError, "prompt_len must be")])
def test_new_blocks_refuses_bad_input_by_name(args, error, match):
    with pytest.raises(error, match=match):
        ex.new_blocks(*args)
