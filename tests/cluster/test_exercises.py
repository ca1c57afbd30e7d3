"""Notebook 08's exercises: each reference passes its own check, common mistakes fail it, a stub gets the
reference, the notebook's solutions (written out here independently, as a learner would) pass, and each reference
agrees with an independent one: a brute-force walk over every op for the liveness intervals, and the buffer
planner's own liveness (which follows storages while it runs the graph) on a real torch.fx graph built from the
op list, hashlib and a sort for rendezvous, whose owners move only when
their replica leaves (hypothesis)."""
import hashlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.cluster import buffers, exercises as ex
from labkit.rng import Rng


def live_intervals(ops, outputs):
    root = {}
    spans = {}
    for i, (name, nbytes, reads) in enumerate(ops):
        for r in reads:
            if root.get(r, r) in spans:
                spans[root.get(r, r)][1] = i
        if nbytes:
            spans[name] = [i, i]
        else:
            root[name] = root.get(reads[0], reads[0])
    for o in outputs:
        if root.get(o, o) in spans:
            spans[root.get(o, o)][1] = len(ops)
    return {k: tuple(v) for k, v in spans.items()}


def rendezvous(key, ids):
    def score(i):
        return int.from_bytes(hashlib.blake2b(f"{i}|{key}".encode()).digest()[:8], "big"), i
    return max(ids, key=score)


def _score(a, b, order="big"):
    return int.from_bytes(hashlib.blake2b(f"{a}|{b}".encode()).digest()[:8], order)


EXERCISES = [(live_intervals, ex.LIVENESS), (rendezvous, ex.PREFIX_AFFINITY)]


@pytest.mark.parametrize("fn, exercise", EXERCISES, ids=lambda v: getattr(v, "name", ""))
def test_the_notebook_solution_and_the_reference_pass(fn, exercise, capsys):
    learner = lambda *a: exercise.reference(*a)  # noqa: E731 (the reference, as a learner's own function)
    assert exercise.check(fn) is fn and exercise.check(learner) is learner
    assert capsys.readouterr().out.count("[PASS]") == 2


def _no_views(ops, outputs):  # a view counted as a buffer of its own, not extending its base
    return {n: v for n, v in live_intervals([(a, b or 1, r) for a, b, r in ops], outputs).items()}


def _outputs_die(ops, outputs):  # the graph's outputs freed after their last read, like every other tensor
    return live_intervals(ops, ())


def _first_read(ops, outputs):  # last = the first op that reads it
    out = live_intervals(ops, outputs)
    for name, (first, last) in out.items():
        readers = [i for i, (_, _, reads) in enumerate(ops) if name in reads]
        out[name] = (first, readers[0] if readers and name not in outputs else last)
    return out


def _inputs_too(ops, outputs):  # graph inputs and weights given intervals too
    out = live_intervals(ops, outputs)
    return {"x": (0, len(ops) - 1), **out}


@pytest.mark.parametrize("fn, exercise", [
    (_no_views, ex.LIVENESS), (_outputs_die, ex.LIVENESS), (_first_read, ex.LIVENESS), (_inputs_too, ex.LIVENESS),
    (lambda k, ids: min(ids, key=lambda i: (_score(i, k), i)), ex.PREFIX_AFFINITY),                 # lowest wins
    (lambda k, ids: max(ids, key=lambda i: (_score(i, k, "little"), i)), ex.PREFIX_AFFINITY),       # little-endian
    (lambda k, ids: max(ids, key=lambda i: (_score(k, i), i)), ex.PREFIX_AFFINITY),                 # key first
    (lambda k, ids: ids[_score("", k) % len(ids)], ex.PREFIX_AFFINITY),                             # modulo-ish
    (lambda k, ids: sorted(ids)[0], ex.PREFIX_AFFINITY),
], ids=["views as buffers", "outputs die", "first read", "inputs too", "lowest weight", "little-endian",
        "key before id", "modulo hashing", "always the first"])
def test_common_mistakes_fail(fn, exercise, capsys):
    assert exercise.check(fn) is exercise.reference  # the notebook goes on with the reference
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("[FAIL]")
    assert lines[:-1] == ([ex.RENDEZVOUS_HINT] if exercise is ex.PREFIX_AFFINITY else [])  # what is hashed


def test_the_rendezvous_hint_says_what_is_hashed_but_not_the_rule():
    hint = ex.RENDEZVOUS_HINT
    assert "'|'" in hint and "blake2b" in hint and "big-endian" in hint
    assert not any(word in hint for word in ("max", "highest", "largest", "min", "lowest"))


def test_a_stub_is_todo(capsys):
    def stub(*args):
        raise NotImplementedError("exercise: write this part")
    for _, exercise in EXERCISES:  # the student version's cells: the notebook goes on with the reference
        assert exercise.check(stub) is exercise.reference
        assert capsys.readouterr().out.startswith("[TODO]")


# --- the references against independent ones ---------------------------------------------------------------

def brute_force_intervals(ops, outputs):
    """Every op index that touches each storage: a tensor touches the storage it owns or, through any chain of
    views, the storage its base owns; an output touches it at the last op."""
    made = {name: i for i, (name, _, _) in enumerate(ops)}
    kind = {name: nbytes for name, nbytes, _ in ops}
    reads = {name: r for name, _, r in ops}

    def owner(name):
        while name in kind and kind[name] == 0:
            name = reads[name][0]
        return name if name in kind else None

    touched = {name: {made[name]} for name in kind if kind[name]}
    for i, (_, _, r) in enumerate(ops):
        for name in r:
            if owner(name) is not None:
                touched[owner(name)].add(i)
    for name in outputs:
        if owner(name) is not None:
            touched[owner(name)].add(len(ops))
    return {name: (min(t), max(t)) for name, t in touched.items()}


def test_live_intervals_are_a_brute_force_walk():
    rng = Rng(1)
    for _ in range(300):
        ops, outputs = ex.random_op_list(rng)
        got = ex.live_intervals(ops, outputs)
        assert got == brute_force_intervals(ops, outputs)
        assert list(got) == [name for name, nbytes, _ in ops if nbytes]  # op order, storage only


def _make(nbytes, *reads):
    """A new storage of `nbytes` bytes whose values depend on what the op reads."""
    return torch.zeros(nbytes // 4) + sum(float(r.sum()) for r in reads)


def _view(base, *reads):
    return base.view(-1)  # shares its base's storage


def fx_graph(ops, outputs) -> torch.fx.GraphModule:
    """The op list as a real torch.fx graph over inputs x and w: each op a call_function node."""
    g = torch.fx.Graph()
    nodes = {name: g.placeholder(name) for name in ("x", "w")}
    for name, nbytes, reads in ops:
        args = [nodes[r] for r in reads]
        nodes[name] = g.call_function(_view, tuple(args)) if nbytes == 0 else \
            g.call_function(_make, (nbytes, *args))
        nodes[name].name = name
    g.output(tuple(nodes[o] for o in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_live_intervals_are_what_the_buffer_planner_finds_on_a_real_graph():
    """labkit.cluster.buffers.liveness runs the graph and follows storages: the same intervals, its node
    indices shifted by the two placeholders (the output node is step len(ops))."""
    rng = Rng(5)
    for _ in range(40):
        ops, outputs = ex.random_op_list(rng)
        found = buffers.liveness(fx_graph(ops, outputs), (torch.ones(3), torch.ones(2)))
        assert {b.name: (b.first - 2, b.last - 2) for b in found} == ex.live_intervals(ops, outputs)
        assert {b.name: b.nbytes for b in found} == {n: nb for n, nb, _ in ops if nb}


def test_the_fixed_cases_say_what_their_comments_say():
    assert ex.live_intervals(*ex.LIVENESS.cases[0]) == {"pow": (0, 1), "mean": (1, 2), "rsqrt": (2, 3),
                                                        "mul": (3, 5), "mm": (5, 6)}
    assert ex.live_intervals(*ex.LIVENESS.cases[2])["a"] == (0, 4)      # the view of a view keeps a alive
    assert ex.live_intervals(*ex.LIVENESS.cases[5])["a"] == (0, 3)      # returned as a view: to the return
    assert ex.PREFIX_AFFINITY.reference(*ex.PREFIX_AFFINITY.cases[4]) == "replica-7"


def test_rendezvous_is_hashlib_and_a_sort():
    rng = Rng(2)
    for _ in range(200):
        key, ids = ex.random_rendezvous_case(rng)
        scores = sorted((int.from_bytes(hashlib.blake2b(f"{i}|{key}".encode()).digest()[:8], "big"), i) for i in ids)
        assert ex.PREFIX_AFFINITY.reference(key, ids) == scores[-1][1]
        assert ex.PREFIX_AFFINITY.reference(key, list(reversed(ids))) == scores[-1][1]


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.text(max_size=30), min_size=1, max_size=30),
       n=st.integers(2, 8), leaving=st.integers(0, 7))
def test_only_the_leaving_replicas_keys_move(keys, n, leaving):
    ids = [f"replica-{i}" for i in range(1, n + 1)]
    gone = ids[leaving % n]
    rest = [i for i in ids if i != gone]
    for k in keys:
        before, after = ex.PREFIX_AFFINITY.reference(k, ids), ex.PREFIX_AFFINITY.reference(k, rest)
        assert after == before or before == gone


def test_random_cases_are_valid_inputs():
    rng = Rng(3)
    for _ in range(100):
        ops, outputs = ex.random_op_list(rng)
        names = [n for n, _, _ in ops]
        assert len(set(names)) == len(names) and set(outputs) <= set(names)
        for i, (name, nbytes, reads) in enumerate(ops):
            assert reads and set(reads) <= {"x", "w", *names[:i]} and nbytes >= 0
            assert nbytes or (len(reads) == 1 and reads[0] in names[:i])  # a view views a made tensor
        key, ids = ex.random_rendezvous_case(rng)
        assert isinstance(key, str) and 1 <= len(ids) == len(set(ids)) <= 8
