"""labkit.cluster.explore: the arena layouts never overlap two buffers live at once and the no-reuse layout adds up
to the planner's own no_reuse_bytes, the plots draw what their data functions return, the registry's events come
out in time order, the router's cost fit recovers exact costs (and never goes negative), the CPU seconds of this
process agree with os.times(), and the rendezvous table moves only the leaving replica's prefixes (modulo hashing
moves more)."""
import os

import matplotlib
import pytest
import torch

from labkit.cluster import buffers, explore, graph
from labkit.cluster.policies import rendezvous
from labkit.tinylm import TinyLM, TinyLMConfig

from ..refusals import assert_refused

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def captured():
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32))
    decode = graph.capture_decode(model, cached=4)
    found = buffers.liveness(decode.graph_module, decode.inputs)
    return found, buffers.plan_buffers(found)


def overlaps(blocks):
    for i, a in enumerate(blocks):
        for b in blocks[i + 1:]:
            in_time = a["first"] <= b["last"] and b["first"] <= a["last"]
            in_space = a["offset"] < b["offset"] + b["nbytes"] and b["offset"] < a["offset"] + a["nbytes"]
            if in_time and in_space:
                yield a, b


def test_both_layouts_keep_live_buffers_apart(captured):
    found, plan = captured
    no_reuse = explore.no_reuse_offsets(found)
    blocks = explore.arena_blocks(found, no_reuse)
    assert [b["name"] for b in blocks] == [b.name for b in sorted(found, key=lambda b: (b.first, b.name))]
    assert not list(overlaps(blocks)) and not list(overlaps(explore.arena_blocks(found, plan.offsets)))
    end = max(b["offset"] + b["nbytes"] for b in blocks)
    assert plan.no_reuse_bytes >= end > plan.no_reuse_bytes - 64  # the planner's count, the last one unpadded
    assert all(o % 64 == 0 for o in no_reuse.values())
    assert_refused(lambda: explore.arena_blocks(found, {}), ValueError, "offsets", [], "an offset for every buffer")


def test_plot_arena_draws_every_buffer_twice(captured):
    import matplotlib.pyplot as plt
    found, plan = captured
    fig = explore.plot_arena(found, plan)
    assert [len(ax.patches) for ax in fig.axes] == [len(found), len(found)]
    heights = sorted(round(p.get_height() * 1e3) for p in fig.axes[1].patches)
    assert heights == sorted(b.nbytes for b in found)
    plt.close("all")


def test_event_rows_are_the_events_in_time_order_since_t0():
    events = [{"time": 12.5, "kind": "removed", "id": "replica-1", "detail": "no heartbeat for 1.02 s"},
              {"time": 10.0, "kind": "registered", "id": "replica-1", "detail": "tinylm at http://127.0.0.1:1/v1"},
              {"time": 11.0, "kind": "down", "id": "replica-1", "detail": "connection refused"}]
    rows = explore.event_rows(events, t0=9.5)
    assert [(r["t s"], r["event"]) for r in rows] == [(0.5, "registered"), (1.5, "down"), (3.0, "removed")]
    assert rows[2]["detail"] == "no heartbeat for 1.02 s" and explore.event_rows([], 0.0) == []
    long = "RemoteProtocolError: peer closed connection without sending complete message body"
    rows = explore.event_rows([{"time": 1.0, "kind": "down", "id": "replica-2", "detail": long}], 0.0)
    assert rows[0]["detail"] == "RemoteProtocolError: peer closed connection without ..."  # whole words, <= 60
    assert_refused(lambda: explore.event_rows("x", 0.0), TypeError, "events", "x", "a list")


def test_router_cost_recovers_the_costs_of_exact_runs():
    a, b = 1.5e-3, 4e-5
    runs = [(n, c, n * a + c * b) for n, c in ((48, 800), (48, 3000), (24, 1500), (96, 900))]
    got = explore.router_cost(runs)
    assert got == pytest.approx((a, b), rel=1e-9)
    # noise that would make the chunk cost negative: it is 0 and the per-request cost absorbs everything
    got = explore.router_cost([(10, 100, 0.02), (10, 400, 0.019)])
    assert got[1] == 0.0 and got[0] == pytest.approx(0.00195, rel=1e-9)  # 0.039 s over 20 requests
    assert_refused(lambda: explore.router_cost([(1, 2, 0.1)]), ValueError, "runs", [(1, 2, 0.1)], "at least two")


def test_plot_policies_and_failover_draw_their_rows():
    import matplotlib.pyplot as plt
    rows = [{"policy": p, "tokens/s": t, "p50 ms": a, "p99 ms": b, "hit rate %": h}
            for p, t, a, b, h in (("round_robin", 100.0, 20.0, 50.0, 30.0),
                                  ("prefix_affinity", 120.0, 15.0, 40.0, 80.0))]
    fig = explore.plot_policies(rows)
    assert [p.get_height() for p in fig.axes[0].patches] == [100.0, 120.0]
    assert [p.get_height() for p in fig.axes[1].patches] == [20.0, 15.0, 50.0, 40.0]
    assert [p.get_height() for p in fig.axes[2].patches] == [30.0, 80.0]
    assert_refused(lambda: explore.plot_policies([{"policy": "x"}]), ValueError, "rows", [{"policy": "x"}],
                   "a non-empty list")
    spans = [{"start": 0.0, "end": 1.0, "status": "answered"}, {"start": 0.5, "end": 0.7, "status": "failed"}]
    fig = explore.plot_failover(spans, {"SIGKILL": 0.6, "down": 0.65, "removed": 0.9})
    drawn = [line for line in fig.axes[0].lines if len(line.get_xdata()) == 2 and line.get_linestyle() == "-"]
    assert sorted(tuple(line.get_xdata()) for line in drawn) == [(0.0, 1.0), (0.5, 0.7)]
    marks = [line.get_xdata()[0] for line in fig.axes[0].lines if line.get_linestyle() == "--"]
    assert marks == [0.6, 0.65, 0.9] and [t.get_text() for t in fig.axes[0].texts] == [" SIGKILL", " down", " removed"]
    plt.close("all")


def test_cpu_seconds_agree_with_os_times():
    before = explore.cpu_seconds(os.getpid())
    sum(i * i for i in range(3_000_000))
    t = os.times()
    after = explore.cpu_seconds(os.getpid())
    assert before < after and abs(after - (t.user + t.system)) < 0.05
    assert explore.cpu_seconds(2**22 + 12345) is None  # above Linux's pid_max default: no such process
    assert_refused(lambda: explore.cpu_seconds(0), ValueError, "pid", 0, "positive")


KEYS = [f"{i:02d} shared prompt prefix" for i in range(40)]


@pytest.mark.parametrize("n, leaving", [(2, 1), (3, 2), (5, 5)])
def test_assignment_moves_only_the_leaving_replicas_keys(n, leaving):
    ids = [f"replica-{i}" for i in range(1, n + 1)]
    gone = ids[leaving - 1]
    rows = explore.assignment_rows(KEYS, ids, gone)
    for key, row in zip(KEYS, rows):
        assert row["rendezvous"] == rendezvous(key, ids)
        assert row["after"] == rendezvous(key, [i for i in ids if i != gone])
        assert (row["moved"] == "yes") == (row["rendezvous"] == gone)
        assert row["modulo"] in ids and row["modulo after"] != gone
    moved_mod = sum(r["modulo moved"] == "yes" for r in rows)
    assert n == 2 or moved_mod > sum(r["moved"] == "yes" for r in rows)  # modulo hashing reshuffles more
    text = explore.assignment_picture(KEYS, n, leaving)
    assert (text.startswith(f"{n} replicas, {gone} leaves: rendezvous moves ")
            and f"modulo hashing moves {moved_mod}" in text)
    assert_refused(lambda: explore.assignment_rows(KEYS, ids, "replica-9"), ValueError, "leaving", "replica-9",
                   "one of")
    assert_refused(lambda: explore.assignment_picture(KEYS, 1, 1), ValueError, "n_replicas", 1, "at least 2")


def test_modulo_owner_is_the_hash_modulo_n():
    import hashlib
    for key in KEYS[:10]:
        h = int.from_bytes(hashlib.blake2b(key.encode()).digest()[:8], "big")
        assert explore.modulo_owner(key, ["a", "b", "c"]) == "abc"[h % 3]
    assert_refused(lambda: explore.modulo_owner("k", []), ValueError, "ids", [], "a non-empty list")


def test_the_static_explorer_and_the_widget(capsys):
    assert explore.rendezvous_explorer(KEYS[:6], static=True) is None
    out = capsys.readouterr().out
    assert [f"3 replicas, replica-{i} leaves" in out for i in (1, 2, 3)] == [True] * 3
    assert_refused(lambda: explore.rendezvous_explorer(KEYS, static="no"), TypeError, "static", "no", "True or False")
    pytest.importorskip("ipywidgets")
    widget = explore.rendezvous_explorer(KEYS[:6], max_replicas=4)
    replicas, leaves = widget.children[:2]
    assert (replicas.value, leaves.value, replicas.max) == (3, 2, 4)
    widget.update()
    assert "3 replicas, replica-2 leaves" in capsys.readouterr().out
    replicas.value = 4
    assert "4 replicas, replica-2 leaves" in capsys.readouterr().out
    leaves.value = 4
    assert "4 replicas, replica-4 leaves" in capsys.readouterr().out
    replicas.value = 2
    assert "2 replicas, replica-2 leaves" in capsys.readouterr().out  # the leaving one clamped to the last


def test_refusals():
    assert_refused(lambda: explore.no_reuse_offsets([], alignment=0), ValueError, "alignment", 0, "positive")
    assert_refused(lambda: explore.plot_failover("x", {}), TypeError, "spans", "x", "a list")
    assert_refused(lambda: explore.plot_failover([], 1.0), TypeError, "marks", 1.0, "a dict")


def policy_rows(tokens, p99, hits):
    return [{"policy": name, "tokens/s": t, "p50 ms": p / 2, "p99 ms": p, "hit rate %": h}
            for name, t, p, h in zip(("round_robin", "least_outstanding", "prefix_affinity"), tokens, p99, hits)]


def test_policy_verdict_compares_hit_rates_and_never_ranks_speed_from_one_run():
    text = explore.policy_verdict(policy_rows((500.0, 520.0, 600.0), (200.0, 190.0, 150.0), (58.6, 56.7, 79.4)))
    lines = text.splitlines()
    assert lines[0] == "prefix-cache hit rate: prefix_affinity 79% against round_robin 59% (+21 points)"
    assert lines[1] == ("tokens/s: round_robin 500, least_outstanding 520, prefix_affinity 600: no ranking, "
                        "unreliable on this run (one run per policy; "
                        "a direction needs 4 runs each that do not overlap)")
    assert lines[2].startswith("ms p99: round_robin 200, least_outstanding 190, prefix_affinity 150: no ranking")
    for tokens in ((300.0, 310.0, 900.0), (900.0, 310.0, 300.0)):  # even 3x from one run each is no ranking
        text = explore.policy_verdict(policy_rows(tokens, (200.0, 190.0, 90.0), (50.0, 50.0, 80.0)))
        assert "better" not in text and "best" not in text and text.count("no ranking") == 2
    rows = policy_rows((1.0,), (1.0,), (1.0,))
    assert_refused(lambda: explore.policy_verdict(rows), ValueError, "rows", rows, "rows for round_robin and at least")


def test_post_returns_the_status_and_json_of_success_and_errors():
    import http.server
    import json
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            code = 201 if body.get("url") else 400
            data = json.dumps({"id": "replica-1"} if code == 201 else {"error": {"param": "url"}}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/replicas"
    try:
        assert explore.post(url, {"url": "http://127.0.0.1:1/v1"}) == (201, {"id": "replica-1"})
        assert explore.post(url, {}) == (400, {"error": {"param": "url"}})
    finally:
        server.shutdown()
        server.server_close()
    assert_refused(lambda: explore.post(url, "x"), TypeError, "body", "x", "a JSON object")


def test_compile_rows_show_every_figure_and_a_dash_where_none_was_measured():
    from labkit.cluster.compiled import CompileReport
    eager_only = CompileReport(prompt_tokens=16, new_tokens=48, repeats=4, compiler=None, reason="no compiler",
                               eager_s=0.1, eager_tokens_per_s=480.0, eager_spread=0.05)
    rows = explore.compile_rows(eager_only)
    assert rows[0]["tokens/s"] == "480" and rows[0]["spread"] == "5%"
    assert all(v == "-" for k, v in rows[1].items() if k != "")
    full = CompileReport(**{**eager_only.__dict__, "compile_s": 47.81, "compiled_tokens_per_s": 600.4,
                            "compiled_spread": 0.03, "kernels": 137, "graphs": 6, "graph_breaks": 5,
                            "max_abs_diff": 1.2e-5})
    assert explore.compile_rows(full)[1] == {"": "torch.compile", "tokens/s": "600", "spread": "3%",
                                             "compile s": "47.8", "kernels": "137", "graphs": "6 (5 breaks)",
                                             "max |logit diff|": "1.2e-05"}
