"""Serving metrics: hand-computed values from timestamps written out here, vLLM's definitions recomputed
independently with numpy on hypothesis-drawn timestamps, Sequences as records, and bad input."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit.serving.metrics import RequestTimes, percentile, request_metrics, summarize
from labkit.serving.sampling import SamplingParams
from labkit.serving.sequence import Sequence
from tests.refusals import assert_refused

# Times are multiples of 1/8 s, exact in binary, so the hand-computed values below are exact too.
A = RequestTimes("a", 1.0, (1.5, 1.75, 2.0, 2.5), 10)   # TTFT .5, E2EL 1.5, TPOT 1/3, ITL .25 .25 .5
B = RequestTimes("b", 1.25, (2.25,), 4)                  # one token: TTFT 1, E2EL 1, no TPOT, no ITL
C = RequestTimes("c", 2.0, (2.125, 2.375), 6)            # TTFT .125, E2EL .375, TPOT .25, ITL .25


def test_request_metrics_by_hand():
    a, b, c = (request_metrics(r) for r in (A, B, C))
    assert (a.ttft, a.e2el, a.itl, a.num_output_tokens) == (0.5, 1.5, (0.25, 0.25, 0.5), 4)
    assert a.tpot == pytest.approx(1 / 3)
    assert (b.ttft, b.e2el, b.tpot, b.itl) == (1.0, 1.0, None, ())
    assert (c.ttft, c.e2el, c.tpot, c.itl, c.request_id) == (0.125, 0.375, 0.25, (0.25,), "c")


def test_summary_by_hand():
    s = summarize([A, B, C])
    assert (s.completed, s.failed, s.duration) == (3, 0, 1.5)  # first arrival 1.0 .. last token 2.5
    assert (s.total_input_tokens, s.total_output_tokens) == (20, 7)
    assert (s.request_throughput, s.total_token_throughput) == (2.0, 18.0)
    assert s.output_throughput == pytest.approx(7 / 1.5)
    assert s.request_goodput is None
    ttft, tpot, itl, e2el = (s.stats[m] for m in ("ttft", "tpot", "itl", "e2el"))
    assert (ttft.mean, ttft.median) == (pytest.approx(1625 / 3), 500)   # [500, 1000, 125] ms
    assert ttft.percentiles[99] == pytest.approx(990)                   # 500 + 0.98 * (1000 - 500)
    assert ttft.percentiles[90] == pytest.approx(900)
    assert tpot.mean == pytest.approx((1000 / 3 + 250) / 2)             # b has no TPOT: left out
    assert (itl.mean, itl.median) == (312.5, 250)                       # [250, 250, 500, 250]
    assert (e2el.mean, e2el.median) == (pytest.approx(2875 / 3), 1000)  # [1500, 1000, 375]
    assert summarize([A, B, C], start=0.0).duration == 2.5              # vLLM's: from the benchmark's start


def test_goodput_by_hand():
    assert summarize([A, B, C], slo={"ttft": 500, "tpot": 300}).request_goodput == 1 / 1.5  # only c
    assert summarize([A, B, C], slo={"tpot": 1}).request_goodput == 1 / 1.5  # only b: one token counts as 0
    assert summarize([A, B, C], slo={"e2el": 1000}).request_goodput == 2 / 1.5  # b on the boundary meets it
    assert summarize([A, B, C], slo={"ttft": 0}).request_goodput == 0.0


def sequence(rid, arrival, times, reason="length"):
    seq = Sequence(rid, [1, 2, 3], SamplingParams(max_tokens=8), arrival=arrival)
    seq.output, seq.token_times = [7] * len(times), list(times)
    seq.finish(reason)
    return seq


def test_a_sequence_is_a_record_and_failed_requests_are_left_out():
    seq = sequence("s", 1.0, [1.5, 1.75, 2.0, 2.5])
    assert request_metrics(seq) == request_metrics(RequestTimes("s", 1.0, (1.5, 1.75, 2.0, 2.5), 3))
    aborted = sequence("x", 0.0, [9.0], "abort")
    refused = sequence("y", 0.0, [], "refused")
    s = summarize([seq, aborted, refused, C])
    assert (s.completed, s.failed, s.duration, s.total_input_tokens) == (2, 2, 1.5, 9)
    assert [r.request_id for r in s.requests] == ["s", "c"]


def test_tables_have_one_set_of_keys():
    s = summarize([A, B, C], slo={"ttft": 500}, percentiles=(50, 99.9))
    rows = s.table_rows()
    assert [r["metric"] for r in rows] == ["TTFT", "TPOT", "ITL", "E2EL"]
    assert all(set(r) == set(rows[0]) for r in rows) and "p99.9 ms" in rows[0]
    assert s.throughput_rows()[-1]["value"] == s.request_goodput
    d = s.as_dict()
    assert d["p99.9_itl_ms"] == s.stats["itl"].percentiles[99.9] and d["mean_e2el_ms"] == s.stats["e2el"].mean


def test_one_token_requests_only_have_no_tpot_statistics():
    s = summarize([B, RequestTimes("d", 0.0, (0.5,), 1)])
    assert math.isnan(s.stats["tpot"].mean) and math.isnan(s.stats["itl"].percentiles[99])
    assert s.stats["ttft"].mean == 750


times_st = st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=12)  # gaps: first = TTFT
request_st = st.tuples(st.floats(0, 100, allow_nan=False), times_st, st.integers(1, 300))


def record(i, req):
    arrival, gaps, prompt = req
    return RequestTimes(f"r{i}", arrival, tuple(np.cumsum([arrival] + gaps)[1:].tolist()), prompt)


@settings(max_examples=150, deadline=None)
@given(req=request_st)
def test_one_request_invariants(req):
    rec = record(0, req)
    m = request_metrics(rec)
    t = np.array(rec.token_times)
    assert (m.ttft, m.e2el) == (t[0] - rec.arrival, t[-1] - rec.arrival)
    assert list(m.itl) == np.diff(t).tolist() and m.num_output_tokens == len(t)
    if len(t) == 1:
        assert m.tpot is None
    else:
        assert m.tpot * (len(t) - 1) + m.ttft == pytest.approx(m.e2el, rel=1e-9, abs=1e-9)
        assert np.mean(m.itl) == pytest.approx(m.tpot, rel=1e-9, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(reqs=st.lists(request_st, min_size=1, max_size=8),
       slo=st.dictionaries(st.sampled_from(["ttft", "tpot", "e2el"]), st.integers(0, 6000), min_size=1),
       q=st.floats(0, 100))
def test_summary_matches_numpy(reqs, slo, q):
    recs = [record(i, r) for i, r in enumerate(reqs)]
    begin, end = min(r.arrival for r in recs), max(r.token_times[-1] for r in recs)
    if end <= begin:
        return
    s = summarize(recs, slo=slo, percentiles=(q,))
    pooled = {"ttft": [r.token_times[0] - r.arrival for r in recs],
              "tpot": [((r.token_times[-1] - r.arrival) - (r.token_times[0] - r.arrival)) / (len(r.token_times) - 1)
                       for r in recs if len(r.token_times) > 1],
              "itl": [g for r in recs for g in np.diff(r.token_times).tolist()],
              "e2el": [r.token_times[-1] - r.arrival for r in recs]}
    for name, xs in pooled.items():
        got, ms = s.stats[name], np.array(xs) * 1000
        if not xs:
            assert math.isnan(got.mean)
            continue
        for mine, ref in ((got.mean, np.mean(ms)), (got.median, np.median(ms)), (got.std, np.std(ms)),
                          (got.percentiles[q], np.percentile(ms, q))):
            assert mine == pytest.approx(ref, rel=1e-9, abs=1e-6), name
    assert s.duration == end - begin and s.request_throughput == len(recs) / (end - begin)
    assert s.output_throughput == sum(len(r.token_times) for r in recs) / (end - begin)
    tpot = {r.request_id: v for r, v in zip([r for r in recs if len(r.token_times) > 1], pooled["tpot"])}
    good = sum(all(slo[k] / 1000 >= {"ttft": r.token_times[0] - r.arrival, "tpot": tpot.get(r.request_id, 0.0),
                                      "e2el": r.token_times[-1] - r.arrival}[k] for k in slo) for r in recs)
    assert s.request_goodput == good / (end - begin) <= s.request_throughput


@settings(max_examples=150, deadline=None)
@given(xs=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), q=st.floats(0, 100))
def test_percentile_is_numpys_linear(xs, q):
    assert percentile(xs, q) == pytest.approx(np.percentile(xs, q), rel=1e-12, abs=1e-6)


def test_bad_records_are_refused():
    for rec, value, expected in ((RequestTimes("a", 1.0, (), 3), [], "at least one token time"),
                                 (RequestTimes("a", 1.0, (0.5, 2.0), 3), [0.5, 2.0], "no earlier than the arrival"),
                                 (RequestTimes("a", 1.0, (1.5, 2.0, 1.75), 3), [2.0, 1.75], "in order")):
        assert_refused(lambda: request_metrics(rec), ValueError, "record.token_times", value, expected)
        assert_refused(lambda: summarize([C, rec]), ValueError, "records[1].token_times", value, expected)
    assert_refused(lambda: request_metrics(5), TypeError, "record", 5, "an object with arrival, token_times")
    seq = sequence("s", 1.0, [1.5, 1.75])
    seq.output.append(9)
    assert_refused(lambda: request_metrics(seq), ValueError, "record.num_output_tokens", 3, "len(token_times) = 2")
    running = Sequence("r", [1], SamplingParams())
    assert_refused(lambda: summarize([running]), ValueError, "records[0]", running, "a finished request")
    assert_refused(lambda: RequestTimes("", 0.0, (1.0,), 3), TypeError, "request_id", "", "a non-empty str")
    assert_refused(lambda: RequestTimes("a", 0.0, "1.0", 3), TypeError, "token_times", "1.0", "a list of token times")
    assert_refused(lambda: RequestTimes("a", 0.0, (1.0, math.nan), 3), ValueError, "token_times[1]", math.nan, "finite")
    assert_refused(lambda: RequestTimes("a", math.inf, (1.0,), 3), ValueError, "arrival", math.inf, "finite")
    assert_refused(lambda: RequestTimes("a", 0.0, (1.0,), 0), ValueError, "num_prompt_tokens", 0, "a positive int")


def test_bad_summaries_are_refused():
    assert_refused(lambda: summarize([A], slo={"latency": 5}), ValueError, "slo", "latency", "('ttft', 'tpot', 'e2el')")
    assert_refused(lambda: summarize([A], slo={"ttft": -1}), ValueError, "slo['ttft']", -1, ">= 0")
    assert_refused(lambda: summarize([A], slo={"ttft": "5"}), TypeError, "slo['ttft']", "5", "a finite number")
    assert_refused(lambda: summarize([A], slo={}), ValueError, "slo", {}, "at least one of")
    assert_refused(lambda: summarize([A], slo="ttft:5"), TypeError, "slo", "ttft:5", "a dict of milliseconds")
    assert_refused(lambda: summarize([A], percentiles=(101,)), ValueError, "percentiles[0]", 101, "in [0, 100]")
    assert_refused(lambda: summarize([A], start=1.5), ValueError, "start", 1.5, "no later than the first arrival")
    assert_refused(lambda: summarize(A), TypeError, "records", A, "a list of Records")
    assert_refused(lambda: summarize([]), ValueError, "records", "0 records, 0 failed", "at least one completed")
    assert_refused(lambda: summarize([RequestTimes("a", 1.0, (1.0,), 3)]), ValueError, "records",
                   "every token at 1.0 s", "a duration > 0")
    assert_refused(lambda: percentile([], 50), ValueError, "values", [], "at least one number")
    assert_refused(lambda: percentile([1.0], 150), ValueError, "q", 150, "in [0, 100]")
