"""Notebook 00's exercise: the reference passes its own check, and a wrong answer fails it."""
from labkit.tinylm import exercises


def test_each_reference_passes_its_own_check(capsys):
    for ex in exercises.EXERCISES:
        mine = lambda *args, ex=ex: ex.reference(*args)  # noqa: E731  a copy, not the reference itself
        assert ex.check(mine) is mine
        assert capsys.readouterr().out.startswith("[PASS]")


def test_forgetting_the_untied_head_fails():
    def wrong(cfg):
        counts = dict(exercises.param_counts(cfg))
        if not cfg.tie_embeddings:
            counts["embedding"] //= 2
            counts["total"] = sum(v for k, v in counts.items() if k != "total")
        return counts
    assert exercises.COUNT_PARAMS.check(wrong) is exercises.COUNT_PARAMS.reference
