"""labkit.day0.explore: the shard map matches the files' own headers (safetensors' safe_open), each rank's bytes
are what load_rank reads and within 1/TP + replicated, the replay blocks never overlap in address and time,
/health is watched from "not listening" through 503 to 200 on a real HTTP server, and the plots draw what
their data functions return."""
import http.server
import threading
from pathlib import Path

import matplotlib
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from labkit.course import Timing
from labkit.day0 import TinyVLM, explore, footprint, plan_arena, replay_naive_load, replay_planned, small_config
from labkit.day0.loading import load_rank, placed_sizes
from labkit.day0.multimodal import decode_image_url
from labkit.day0.release import read_release, write_release

from ..refusals import assert_refused

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    model = TinyVLM(small_config())
    out = tmp_path_factory.mktemp("explore") / "tinyvlm"
    write_release(model.state_dict(), model.config, out, max_shard_size="20KB")
    return out


def test_shard_segments_are_the_files_tensors_in_order(folder):
    segments = explore.shard_segments(folder)
    release = read_release(folder)
    for file in release.files:
        with safe_open(str(Path(folder) / file), "pt") as f:
            names = set(f.keys())
            mine = [s for s in segments if s["file"] == file]
            assert {s["name"] for s in mine} == names
            for s in mine:
                t = f.get_tensor(s["name"])
                assert s["nbytes"] == t.numel() * t.element_size()
        starts = [s["start"] for s in mine]
        assert starts == sorted(starts) and all(a["start"] + a["nbytes"] <= b["start"] for a, b in zip(mine, mine[1:]))
    rows = explore.shard_rows(folder)
    assert [r["file"] for r in rows] == release.files
    assert sum(r["bytes"] for r in rows) == release.total_size
    assert all(r["tensors"] == sum(r[s] for s in explore.STYLE_COLOURS) for r in rows)


@pytest.mark.parametrize("tp", [1, 2])
def test_rank_bytes_are_what_load_rank_reads_and_within_the_bound(folder, tp):
    rows = explore.rank_bytes(folder, tp)
    assert [r["rank"] for r in rows] == list(range(tp))
    release = read_release(folder)
    decoder = sum(t.nbytes for n, t in release.tensors.items() if release.plan[n] != "encoder")
    for r in rows:
        tensors, stats = load_rank(folder, r["rank"], tp)
        assert r["bytes read"] == stats.bytes_read == sum(t.numel() * t.element_size() for t in tensors.values())
        assert r["tensors"] == len(tensors) and r["files"] == stats.files_opened
        assert r["bytes read"] <= r["1/TP + replicated"]
    assert sum(r["bytes read"] for r in rows) == decoder + (tp - 1) * rows[0]["replicated"]


def test_tp_picture_and_the_static_explorer(folder, capsys):
    assert explore.tp_picture(folder, 2).startswith("TP=2: per rank: 2 heads")
    assert "does not split" in explore.tp_picture(folder, 3) and "n_heads=4" in explore.tp_picture(folder, 3)
    assert explore.tp_explorer(folder, max_tp=4, static=True) is None
    out = capsys.readouterr().out
    assert [f"TP={tp}:" in out for tp in range(1, 5)] == [True] * 4 and "TP=5" not in out
    assert_refused(lambda: explore.tp_explorer(folder, static="yes"), TypeError, "static", "yes", "True or False")


def test_the_widget_explorer_shows_a_degree(folder, capsys):
    pytest.importorskip("ipywidgets")
    widget = explore.tp_explorer(folder, max_tp=4)
    pick, _ = widget.children
    assert "TP=2:" in capsys.readouterr().out  # outside a kernel an Output widget prints to stdout
    pick.value = 4
    assert "TP=4: does not split" in capsys.readouterr().out


def replays(folder):
    release = read_release(folder)
    order = [n for n, t in sorted(release.tensors.items(), key=lambda kv: (kv[1].file, kv[1].start))
             if release.plan[n] != "encoder"]
    kept = placed_sizes(folder, 0, 2, torch.bfloat16)
    stored = {n: release.tensors[n].nbytes for n in order}
    f = footprint(release.config, tp=2)  # the rank's KV cache and activations, as notebook 07 plans them
    plan = plan_arena({n: kept[n] for n in order}, f["kv_cache"], f["activations"])
    naive = replay_naive_load(stored, f["kv_cache"], plan.total, f["activations"], loaded={n: kept[n] for n in order})
    assert naive.fragmented  # the case the figure is for
    return naive, replay_planned(plan)


def test_replay_blocks_never_overlap_and_follow_the_events(folder):
    for replay in replays(folder):
        blocks = explore.replay_blocks(replay)
        placed = [b for b in blocks if b["kind"] != "failed"]
        assert len(placed) == sum(e.op == "alloc" for e in replay.events)
        assert [b for b in blocks if b["kind"] == "failed"] == ([] if replay.fits else [
            {"name": replay.failed, "kind": "failed", "offset": -1, "size": replay.failed_size,
             "start": len(replay.events) - 1, "end": len(replay.events) - 1}])
        for i, a in enumerate(placed):
            assert 0 <= a["offset"] and a["offset"] + a["size"] <= replay.capacity and a["start"] < a["end"]
            for b in placed[i + 1:]:
                in_time = a["start"] < b["end"] and b["start"] < a["end"]
                in_space = a["offset"] < b["offset"] + b["size"] and b["offset"] < a["offset"] + a["size"]
                assert not (in_time and in_space), (a, b)
        kinds = {b["kind"] for b in placed}
        assert kinds <= set(explore.KIND_COLOURS) and "weight" in kinds


def test_plots_draw_their_data(folder):
    import matplotlib.pyplot as plt
    fig = explore.plot_shards(folder)
    assert len(fig.axes[0].patches) == len(explore.shard_segments(folder))
    naive, planned = replays(folder)
    fig2 = explore.plot_replays([naive, planned])
    assert [len(ax.patches) for ax in fig2.axes[:2]] == [
        sum(b["kind"] != "failed" for b in explore.replay_blocks(r)) for r in (naive, planned)]
    fig3 = explore.plot_ttft({"text": Timing((0.01, 0.02, 0.03)), "image": Timing((0.02, 0.03, 0.05))})
    assert [round(p.get_height(), 6) for p in fig3.axes[0].patches] == [20.0, 30.0]
    plt.close("all")
    assert_refused(lambda: explore.plot_replays([]), ValueError, "replays", [], "non-empty")


class Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        code = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_health_watch_sees_not_listening_then_503_then_200():
    port = explore.free_port()
    Health.answers = [503, 503, 503, 200]
    with explore.HealthWatch(port, interval=0.02, timeout=20) as watch:
        threading.Event().wait(0.15)  # nothing listens yet
        server = http.server.HTTPServer(("127.0.0.1", port), Health)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    server.shutdown()
    server.server_close()
    phases = explore.health_phases(watch.polls)
    assert [p["answer"] for p in phases] == ["not listening", "503", "200"]
    assert phases[1]["polls"] == 3 and phases[2]["polls"] == 1
    assert watch.ready_s == phases[2]["from s"] and sum(p["polls"] for p in phases) == len(watch.polls)
    assert all(p["from s"] <= p["to s"] for p in phases)


def test_health_phases_group_runs():
    polls = [(0.0, None), (0.1, None), (0.2, 503), (0.3, 200)]
    assert explore.health_phases(polls) == [
        {"answer": "not listening", "from s": 0.0, "to s": 0.1, "polls": 2},
        {"answer": "503", "from s": 0.2, "to s": 0.2, "polls": 1},
        {"answer": "200", "from s": 0.3, "to s": 0.3, "polls": 1}]
    assert explore.health_phases([]) == []


def test_data_url_round_trips_through_the_service_s_decoder():
    image = Image.new("RGB", (32, 32), (200, 30, 40))
    image.putpixel((3, 4), (1, 2, 3))
    for fmt in ("PNG", "BMP"):
        url = explore.data_url(image, fmt)
        assert url.startswith(f"data:image/{fmt.lower()};base64,")
        assert decode_image_url(url).tobytes() == image.tobytes()
    message = explore.image_message(image, "colour=")
    assert [p["type"] for p in message[0]["content"]] == ["image_url", "text"]
    assert explore.image_message(None, "12+7=")[0]["content"] == [{"type": "text", "text": "12+7="}]
    assert_refused(lambda: explore.data_url("x.png"), TypeError, "image", "x.png", "a PIL image")
