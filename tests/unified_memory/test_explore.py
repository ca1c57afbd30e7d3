"""Notebook 02's experiment helpers: traces have their shape, summaries agree with a hand count."""
import numpy as np
import pytest

from labkit.unified_memory import explore as ux

from ..refusals import assert_refused

from .reference import lru_by_hand


@pytest.mark.parametrize("seed", range(5))
def test_replay_summary_is_lru(seed):
    rng = np.random.default_rng(seed)
    trace = rng.integers(0, 20, 300).tolist()
    assert ux.replay_summary(trace, 7) == lru_by_hand(trace, 7)


def test_synthetic_traces():
    assert ux.synthetic_trace("sequential", 5, 12).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    assert ux.synthetic_trace("strided", 6, 6, stride=2).tolist() == [0, 2, 4, 1, 3, 5]
    hot = ux.synthetic_trace("hot", 1000, 10_000)
    assert 0.85 < np.mean(hot < 100) < 0.95
    r = ux.synthetic_trace("random", 50, 1000, seed=3)
    assert r.min() >= 0 and r.max() < 50 and np.array_equal(r, ux.synthetic_trace("random", 50, 1000, seed=3))


def test_oversubscription_cliff_and_link_share():
    trace = np.arange(64)
    rows = ux.oversubscription(trace, 64, [0.5, 1.0], 4096, tokens=2)
    assert rows[0]["faults"] == 64 and rows[1]["faults"] == 0  # LRU on a sweep: all or nothing
    # a growing trace: token 1 reads pages 0..59, token 2 pages 0..61; device of 62 pages: only the two new
    # pages fault in token 2; device of 31: every access of token 2 faults (LRU on a sweep)
    grow = [np.arange(60), np.arange(62)]
    rows = ux.oversubscription(grow, 64, [62 / 64, 31 / 64], 4096)
    assert [r["faults"] for r in rows] == [2, 62] and rows[0]["fault_rate"] == pytest.approx(2 / 62)
    um = ux.replay(trace, 64, 16, repeat=2)
    share = ux.link_share(um)
    assert share["transfer_s"] + share["latency_s"] + share["device_s"] == pytest.approx(share["time_s"])
    assert share["latency_s"] == pytest.approx(128 * um.config.fault_latency)


def test_replay_steps_by_hand():
    # 4 frames, tokens read pages 0..3, 0..5, 0..5: token 2 hits 0..3 and faults on 4, 5; token 3 is an
    # LRU sweep larger than the device: all 6 fault, each evicting a page
    um, rows = ux.replay_steps([np.arange(4), np.arange(6), np.arange(6)], 8, 4, fault_latency=1e-5,
                               link_bandwidth=4096 / 1e-6, device_bandwidth=1e30)
    assert [(r["accesses"], r["faults"]) for r in rows] == [(4, 4), (6, 2), (6, 6)]
    # token 3: 6 pages in, 6 out (the device was full): 12 us of transfer, 60 us of latency
    assert rows[2]["transfer_s"] == pytest.approx(12e-6) and rows[2]["latency_s"] == pytest.approx(60e-6)
    assert rows[2]["time_s"] == pytest.approx(72e-6) and rows[2]["link_busy"] == pytest.approx(12 / 72)
    assert rows[1]["GB_moved"] == pytest.approx(4 * 4096 / 1e9) and um.stats.faults == 12


def test_distinct_pages():
    rng = np.random.default_rng(1)
    pages = rng.integers(0, 500, 2000)
    assert ux.distinct_pages(pages) == len(set(pages.tolist())) and ux.distinct_pages([]) == 0
    with pytest.raises(ValueError, match="page numbers >= 0"):
        ux.distinct_pages([3, -1])


def test_static_explorer(capsys):
    rows = ux.explorer(n_pages=64, length=500, static=True)
    assert len(rows) == 8 and "capacity_pct" in capsys.readouterr().out
    assert all(r["hits"] + r["faults"] == 500 for r in rows)


def test_fault_batches_cut_the_latency_share():
    # a sweep of 64 pages through 16 frames, twice: every access faults; batches of 256 pay one latency
    # per run of faults, i.e. one for the whole replay
    one = ux.link_share(ux.replay(np.arange(64), 64, 16, repeat=2))
    batched = ux.link_share(ux.replay(np.arange(64), 64, 16, repeat=2, fault_batch=256))
    assert batched["transfer_s"] == pytest.approx(one["transfer_s"])
    assert one["latency_s"] == pytest.approx(128 * 30e-6) and batched["latency_s"] == pytest.approx(30e-6)
    assert batched["link_utilization"] > 0.5 > 0.02 > one["link_utilization"]  # 39 us of transfer per 30 us


def test_bad_input_is_named():
    for call, error, word in ((lambda: ux.synthetic_trace("zigzag", 5, 5), ValueError, "kind"),
                              (lambda: ux.synthetic_trace("random", 5.0, 5), TypeError, "n_pages"),
                              (lambda: ux.synthetic_trace("random", 5, 0), ValueError, "length"),
                              (lambda: ux.replay(np.arange(4), 4, 0), ValueError, "device_pages"),
                              (lambda: ux.replay(np.arange(4), 4, 2, repeat=0), ValueError, "repeat"),
                              (lambda: ux.replay(np.arange(5), 4, 2), ValueError, "live allocation"),
                              (lambda: ux.replay_summary([], 2), ValueError, "trace"),
                              (lambda: ux.oversubscription(np.arange(4), 4, [0.5], 4096, tokens=0), ValueError,
                               "tokens"),
                              (lambda: ux.oversubscription(np.arange(4), 4, [-0.5], 4096), ValueError, "fractions"),
                              (lambda: ux.fresh_pool(4, 2, page_size=4096.0), TypeError, "page_size")):
        with pytest.raises(error, match=word):
            call()






def test_ngl_table():
    curves = {"a": [{"time_s": 1.0, "transfer_share": 0.5}, {"time_s": 0.002, "transfer_share": 0.25}],
              "b": [{"time_s": 3.0, "transfer_share": 0.9}, {"time_s": 0.001, "transfer_share": 0.0}]}
    assert ux.ngl_table(curves, [1], share_of="b") == [{"-ngl": 1, "a ms": 2.0, "b ms": 1.0, "b transfer %": 0.0}]
    with pytest.raises(ValueError, match="share_of"):
        ux.ngl_table(curves, [0], share_of="c")


def test_the_widget_shows_whole_labels():
    pytest.importorskip("ipywidgets")
    widget = ux.explorer(n_pages=64, length=100)
    controls = [c for c in widget.children if hasattr(c, "description") and c.description]
    assert len(controls) == 4 and all(c.style.description_width == "initial" for c in controls)
    assert controls[0].description.startswith("device capacity")


def test_the_paging_settings_make_pools():
    for settings in ux.PAGING_SETTINGS.values():
        um, _ = ux.fresh_pool(8, 4, **settings)
        assert um.stats.accesses == 0


def test_empty_or_ill_typed_experiments_are_refused_by_name():
    nan = float("nan")
    assert_refused(lambda: ux.oversubscription([], 8, [0.5], 4096), ValueError, "pages", [], "non-empty page array")
    assert_refused(lambda: ux.oversubscription(np.arange(8), 8, [-0.5], 4096), ValueError, "fractions[0]", -0.5,
                   "a positive finite number")
    assert_refused(lambda: ux.oversubscription(np.arange(8), 8, [0.5, nan], 4096), ValueError, "fractions[1]", nan,
                   "a positive finite number")
    assert_refused(lambda: ux.oversubscription(np.arange(8), 8, [], 4096), ValueError, "fractions", [], "non-empty")
    assert_refused(lambda: ux.oversubscription(np.arange(8), 8, 0.5, 4096), TypeError, "fractions", 0.5, "a list")
    assert_refused(lambda: ux.replay_summary([], 2), ValueError, "trace", [], "a non-empty list of page numbers")
    assert_refused(lambda: ux.synthetic_trace("strided", 8, 10, stride=0), ValueError, "stride", 0, "a positive int")
    assert_refused(lambda: ux.synthetic_trace("random", 8, 10, seed=-1), ValueError, "seed", -1, "a non-negative int")
    assert_refused(lambda: ux.synthetic_trace("random", 8, 10, seed=1.5), TypeError, "seed", 1.5, "a non-negative")
    assert_refused(lambda: ux.replay_steps(5, 4, 2), TypeError, "steps", 5, "a list of per-token page arrays")
    assert_refused(lambda: ux.link_share(None), TypeError, "um", None, "a UnifiedMemory")
    assert_refused(lambda: ux.explorer(static="yes"), TypeError, "static", "yes", "True or False")
    assert ux.oversubscription(np.arange(8), 8, [0.5], 4096)[0]["faults"] == 8  # LRU on a sweep: all miss
