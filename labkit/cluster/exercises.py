"""Notebook 08's exercises, defined once (the notebook's check cells and tests/cluster/test_exercises.py use them):

    LIVENESS         live_intervals(ops, outputs) -> {tensor: (first, last)}: the op that makes each activation
                     and the last op that needs it, views extending their base's life            (section 1)
    PREFIX_AFFINITY  rendezvous(key, ids) -> the replica id that owns a prompt prefix: highest-random-weight
                     hashing, w = first 8 bytes of blake2b(f"{id}|{key}"), big-endian            (section 3)

An op list is the decode graph with everything but the buffers left out, in program order:

    ops = [("pow", 512, ("x",)),            # (tensor made by the op, its bytes, the tensors it reads)
           ("mean", 4, ("pow",)),
           ("rsqrt", 4, ("mean",)),
           ("mul", 512, ("x", "rsqrt")),
           ("view", 0, ("mul",)),           # 0 bytes: a view of its first input, no storage of its own
           ("mm", 1024, ("view", "w"))]     # "x" and "w" are made by no op: graph inputs / weights, not activations
    outputs = ("mm",)                       # what the graph returns: read by the return, step len(ops)

    live_intervals(ops, outputs) == {"pow": (0, 1), "mean": (1, 2), "rsqrt": (2, 3), "mul": (3, 5), "mm": (5, 6)}

The PREFIX_AFFINITY reference is the router's own labkit.cluster.policies.rendezvous (a wrong owner prints
RENDEZVOUS_HINT, what string the weight hashes, before the [FAIL] line); LIVENESS's is written here
(labkit.cluster.buffers.liveness does the same on a torch.fx graph, where tests/cluster/test_exercises.py checks
they agree), and both are checked against brute-force references in that test file.
"""

from __future__ import annotations

from ..course import Exercise
from ..rng import Rng
from .policies import rendezvous

Op = tuple[str, int, tuple[str, ...]]


# --- LIVENESS -------------------------------------------------------------------------------------------------

def live_intervals(ops: list[Op], outputs: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{name: (first, last)} for every op of `ops` that has storage (nbytes > 0), in op order: first = the index
    of the op that makes it, last = the index of the last op that reads it or a view of it (first when nothing
    does); the graph's return is one more step, len(ops), that reads every tensor of `outputs` (as torch.fx's
    output node does). An op with nbytes == 0 is a view of its first input's storage: reading the view reads its
    base. Names no op makes are graph inputs or weights and get no interval."""
    base = {}                                       # view -> the tensor whose storage it shares
    intervals: dict[str, list[int]] = {}
    for i, (name, nbytes, reads) in enumerate(ops):
        for r in reads:
            r = base.get(r, r)
            if r in intervals:
                intervals[r][1] = i
        if nbytes == 0:
            base[name] = base.get(reads[0], reads[0])
        else:
            intervals[name] = [i, i]
    for out in outputs:
        out = base.get(out, out)
        if out in intervals:
            intervals[out][1] = len(ops)
    return {name: (first, last) for name, (first, last) in intervals.items()}


def random_op_list(rng: Rng) -> tuple[list[Op], tuple[str, ...]]:
    """3-12 ops over two graph inputs ("x", "w"), each reading 1-3 earlier tensors, about one in five a view;
    one or two outputs (the last op's tensor, sometimes an earlier one)."""
    names, ops = ["x", "w"], []
    for i in range(3 + rng.below(10)):
        made = [op[0] for op in ops]
        view = made and rng.below(5) == 0
        reads = (made[rng.below(len(made))],) if view else tuple(
            names[rng.below(len(names))] for _ in range(1 + rng.below(3)))
        ops.append((f"t{i}", 0 if view else 4 * (1 + rng.below(64)), reads))
        names.append(f"t{i}")
    outputs = (ops[-1][0],) + ((ops[rng.below(len(ops))][0],) if rng.below(2) else ())
    return ops, outputs


RMSNORM_OPS = [("pow", 512, ("x",)), ("mean", 4, ("pow",)), ("rsqrt", 4, ("mean",)), ("mul", 512, ("x", "rsqrt")),
               ("view", 0, ("mul",)), ("mm", 1024, ("view", "w"))]

LIVENESS = Exercise("live_intervals", live_intervals, cases=[
    (RMSNORM_OPS, ("mm",)),                                                       # the docstring's example
    ([("a", 8, ("x",)), ("b", 8, ("a",)), ("c", 8, ("a", "b"))], ("c",)),           # a read twice: lives to c
    ([("a", 8, ("x",)), ("v", 0, ("a",)), ("u", 0, ("v",)), ("b", 8, ("x",)), ("c", 8, ("u", "b"))], ("c",)),
    ([("a", 8, ("x",)), ("b", 8, ("x",)), ("c", 8, ("b",))], ("c", "a")),          # an output lives to the end
    ([("a", 8, ("x",)), ("dead", 8, ("a",)), ("c", 8, ("a",))], ("c",)),           # nobody reads dead
    ([("a", 8, ("x",)), ("v", 0, ("a",)), ("b", 8, ("x",))], ("v", "b"))],          # a returned view keeps a
    random_case=random_op_list)


# --- PREFIX_AFFINITY ------------------------------------------------------------------------------------------

def random_rendezvous_case(rng: Rng) -> tuple[str, list[str]]:
    """A prompt prefix of 0-40 characters and 1-8 distinct replica ids (not in order, not contiguous)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz 0123456789=+?"
    key = "".join(alphabet[rng.below(len(alphabet))] for _ in range(rng.below(41)))
    pool = [f"replica-{i}" for i in range(1, 13)]
    ids = []
    for _ in range(1 + rng.below(8)):
        ids.append(pool.pop(rng.below(len(pool))))
    return key, ids


RENDEZVOUS_HINT = ("[hint] each replica's weight for a key hashes one string: the replica's id, then '|', then "
                   "the key, encoded as UTF-8, with hashlib.blake2b at its default size; the weight is the digest's "
                   "first 8 bytes as a big-endian int. Check that string and the rule that picks the owner.")


def same_owner(got, expected) -> bool:
    """The PREFIX_AFFINITY comparison: equal ids; on a difference it prints RENDEZVOUS_HINT (what is hashed), just
    before the check's [FAIL] line names the case."""
    if got == expected:
        return True
    print(RENDEZVOUS_HINT)
    return False


PREFIX_AFFINITY = Exercise("rendezvous", rendezvous, compare=same_owner, cases=[
    ("The cat sat on the mat", ["replica-1", "replica-2", "replica-3"]),
    ("The cat sat on the mat", ["replica-1", "replica-3"]),           # without replica-2
    ("The cat sat on the mat", ["replica-3", "replica-1", "replica-2"]),  # the order of ids does not matter
    ("", ["replica-1", "replica-2"]),
    ("12+7=", ["replica-7"])],                                        # one replica owns everything
    random_case=random_rendezvous_case)
