"""Notebook 07's pictures, tables and drivers: the release's shards as a map of its tensors, each rank's bytes
for a tensor-parallel degree (a widget with a static fallback), the fragmentation replays as an address-space
timeline, /health watched while the service starts, and time-to-first-token bars. Each plot has a function
returning the plain data it draws, for the notebook's asserts.

    shard map     model-00001-of-00004  [emb   |wq|wk|..      ]   one bar per file, one segment per tensor,
                  model-00002-of-00004  [w_up  |w_down |...   ]   coloured by its tensor-parallel style
    replay        address ^  [##tmp##]  [w0][w1]      <- a temporary freed leaves a hole
                          +-------------------------> allocator call
"""

from __future__ import annotations

import base64
import io
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Mapping

from PIL import Image

from .._checks import check_bool, check_positive, check_positive_int, check_type, fail
from ..course import Timing, display
from ..serving import SamplingParams
from .arena import LoadReplay
from .loading import as_release, rank_tensors, slice_bytes
from .plan import parallel_options

STYLE_COLOURS = {"vocab": "C4", "column": "C0", "row": "C1", "replicated": "C2", "encoder": "0.6"}
KIND_COLOURS = {"temporary": "0.75", "weight": "C0", "kv_cache": "C2", "activations": "C1"}


# --- 1. the release -------------------------------------------------------------------------------------------

def shard_segments(release) -> list[dict]:
    """Every stored tensor in file order: {"file", "name", "start" (byte offset of its data in the file),
    "nbytes", "style" (labkit.day0.tp_plan)}. `release`: a folder or a Release."""
    release = as_release(release)
    items = sorted(release.tensors.items(), key=lambda kv: (kv[1].file, kv[1].start))
    return [{"file": t.file, "name": n, "start": t.start, "nbytes": t.nbytes, "style": release.plan[n]}
            for n, t in items]


def shard_rows(release) -> list[dict]:
    """One row per shard file: its tensors, its bytes, and how many of them each tensor-parallel style has."""
    segments = shard_segments(release)
    rows = []
    for file in dict.fromkeys(s["file"] for s in segments):
        mine = [s for s in segments if s["file"] == file]
        styles = {style: sum(s["style"] == style for s in mine) for style in STYLE_COLOURS}
        rows.append({"file": file, "tensors": len(mine), "bytes": sum(s["nbytes"] for s in mine), **styles})
    return rows


def plot_shards(release):
    """The shard map: one horizontal bar per file, one segment per tensor (its width its bytes), coloured by
    its tensor-parallel style. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    segments = shard_segments(release)
    files = list(dict.fromkeys(s["file"] for s in segments))
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(files)))
    for s in segments:
        y = files.index(s["file"])
        ax.barh(y, s["nbytes"] / 1e3, left=s["start"] / 1e3, color=STYLE_COLOURS[s["style"]], edgecolor="white",
                linewidth=0.4)
    ax.set_yticks(range(len(files)), files, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("byte offset in the file (KB)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in STYLE_COLOURS.items()], fontsize=7, ncol=5,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def rank_bytes(release, tp: int) -> list[dict]:
    """One row per rank of `tp`, from the headers alone (no tensor data read): the tensors and files it
    reads, the bytes it reads, of which replicated (norms: every rank reads all of them), and the bound
    "1/TP + replicated" = (split decoder bytes) / tp + replicated bytes. The encoder is read by the engine."""
    release = as_release(release)
    rows = []
    for rank in range(check_positive_int("tp", tp)):
        wanted = rank_tensors(release, rank, tp)
        split = replicated = read = 0
        for name, (_, spec) in wanted.items():
            info = release.tensors[name]
            read += slice_bytes(info.shape, spec, info.torch_dtype.itemsize)
            if release.plan[name] == "replicated":
                replicated += info.nbytes
            else:
                split += info.nbytes
        rows.append({"rank": rank, "tensors": len(wanted), "files": len({f for f, _ in wanted.values()}),
                     "bytes read": read, "replicated": replicated, "1/TP + replicated": split // tp + replicated})
    return rows


def tp_picture(release, tp: int) -> str:
    """What each rank of `tp` reads (rank_bytes as a table, in MB), or why the decoder does not split."""
    release = as_release(release)
    row = next((r for r in parallel_options(release.config, max(8, tp)) if r["tp"] == tp), None)
    if row is None or not row["works"]:
        return f"TP={tp}: does not split the decoder: tp {row['why'] if row else 'must be positive'}"
    table = [{"rank": r["rank"], "tensors": r["tensors"], "files": r["files"], "read MB": r["bytes read"] / 1e6,
              "replicated MB": r["replicated"] / 1e6, "bound MB": r["1/TP + replicated"] / 1e6}
             for r in rank_bytes(release, tp)]
    return f"TP={tp}: {row['why']}\n" + display.table(table, digits=3)


def tp_explorer(release, max_tp: int = 8, static: bool = False):
    """A dropdown of tensor-parallel degrees 1..max_tp showing tp_picture; static=True (or without ipywidgets)
    prints it for every degree instead. Returns the widget, or None when static."""
    check_bool("static", static)
    release = as_release(release)
    degrees = list(range(1, check_positive_int("max_tp", max_tp) + 1))
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            static = True
    if static:
        for tp in degrees:
            print(tp_picture(release, tp) + "\n")
        return None
    out = widgets.Output()
    pick = widgets.Dropdown(options=degrees, value=min(2, max_tp), description="TP degree")

    def show(change=None):
        out.clear_output(wait=True)
        with out:
            print(tp_picture(release, pick.value))
    pick.observe(show, names="value")
    show()
    return widgets.VBox([pick, out])


# --- 4. fragmentation -----------------------------------------------------------------------------------------

def _kind(name: str) -> str:
    if name.endswith(" (read)"):
        return "temporary"
    return name if name in ("kv_cache", "activations") else "weight"


def replay_blocks(replay: LoadReplay) -> list[dict]:
    """Every allocation of a replay as a block of the address space over time: {"name", "kind" ("temporary",
    "weight", "kv_cache", "activations"), "offset", "size", "start" (allocator call that made it), "end" (the
    call that freed it, or the number of calls: still live)}; plus {"kind": "failed", ...} for a failed one
    (offset -1, start = end = its call)."""
    check_type("replay", replay, LoadReplay, "a labkit.day0.LoadReplay")
    live: dict[int, dict] = {}
    blocks = []
    for e in replay.events:
        if e.op == "alloc":
            live[e.offset] = {"name": e.name, "kind": _kind(e.name), "offset": e.offset, "size": e.size,
                              "start": e.step, "end": len(replay.events)}
            blocks.append(live[e.offset])
        elif e.op == "free":
            live.pop(e.offset)["end"] = e.step
        else:
            blocks.append({"name": e.name, "kind": "failed", "offset": -1, "size": e.size, "start": e.step,
                           "end": e.step})
    return blocks


def plot_replays(replays: list[LoadReplay]):
    """One panel per replay: each allocation a rectangle spanning the allocator calls it lived through, at its
    addresses (KB); a failed allocation is a red line at its call, labelled with its size, the free bytes and
    the largest hole. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    if not isinstance(replays, (list, tuple)) or not replays:
        fail("replays", replays, "a non-empty list of LoadReplay")
    fig, axes = plt.subplots(1, len(replays), figsize=(4.2 * len(replays), 3.4), squeeze=False)
    for ax, replay in zip(axes[0], replays):
        right = len(replay.events) + 4  # blocks still live at the end reach the right edge
        for b in replay_blocks(replay):
            if b["kind"] == "failed":
                ax.axvline(b["start"], color="red", lw=1, ls="--")
                ax.text(b["start"], replay.capacity / 1e3 * 0.98, f"{b['name']}: {b['size'] / 1e3:.0f} KB fails\n"
                        f"{replay.free_bytes / 1e3:.0f} KB free, largest hole {replay.largest_hole / 1e3:.0f} KB",
                        color="red", fontsize=7, ha="right", va="top")
                continue
            end = right if b["end"] == len(replay.events) else b["end"]
            ax.add_patch(Rectangle((b["start"], b["offset"] / 1e3), max(end - b["start"], 0.6), b["size"] / 1e3,
                                   facecolor=KIND_COLOURS[b["kind"]], edgecolor="white", linewidth=0.3))
        ax.set_xlim(0, right)
        ax.grid(False)
        ax.set_ylim(0, replay.capacity / 1e3)
        verdict = "fits" if replay.fits else f"fails at {replay.failed}"
        ax.set_title(f"{replay.layout}: {len(replay.events)} calls, {verdict}", fontsize=9)
        ax.set_xlabel("allocator call")
    axes[0, 0].set_ylabel(f"address (KB of {replays[0].capacity / 1e3:.0f})")
    axes[0, -1].legend(handles=[Patch(color=c, label=k) for k, c in KIND_COLOURS.items()], fontsize=7,
                       loc="lower right")
    fig.tight_layout()
    return fig


# --- 5. start-up ----------------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HealthWatch:
    """Polls http://127.0.0.1:`port`/health every `interval` s on a thread, from before the service exists until
    it answers 200 (or `timeout` s pass): `polls` holds (seconds since start, HTTP status or None for "nothing
    listens yet"). Use it in a `with` block around the start of the service."""

    def __init__(self, port: int, interval: float = 0.05, timeout: float = 120.0):
        self.url = f"http://127.0.0.1:{check_positive_int('port', port)}/health"
        self.interval = check_positive("interval", interval, unit="s")
        self.timeout = check_positive("timeout", timeout, unit="s")
        self.polls: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.timeout:
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            except (urllib.error.URLError, OSError):
                code = None
            self.polls.append((time.monotonic() - t0, code))
            if code == 200:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> "HealthWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the thread (until it saw 200, or `timeout` s), then end it."""
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join()

    @property
    def ready_s(self) -> float | None:
        """Seconds from the start to the first 200 (None if none came)."""
        return next((t for t, code in self.polls if code == 200), None)


def health_phases(polls: list[tuple[float, int | None]]) -> list[dict]:
    """The polls grouped into runs of the same answer: {"answer" ("not listening", "503", "200"), "from s",
    "to s", "polls"}."""
    rows: list[dict] = []
    for t, code in polls:
        answer = "not listening" if code is None else str(code)
        if rows and rows[-1]["answer"] == answer:
            rows[-1]["to s"], rows[-1]["polls"] = t, rows[-1]["polls"] + 1
        else:
            rows.append({"answer": answer, "from s": t, "to s": t, "polls": 1})
    return rows


# --- 6. requests ----------------------------------------------------------------------------------------------

def data_url(image: Image.Image, fmt: str = "PNG") -> str:
    """`image` as a base64 data: URL (what an OpenAI client sends in an image_url part)."""
    check_type("image", image, Image.Image, "a PIL image")
    buf = io.BytesIO()
    image.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image_message(image: Image.Image | None, question: str) -> list[dict]:
    """One user message: an image_url part (when `image` is given), then a text part."""
    parts = [] if image is None else [{"type": "image_url", "image_url": {"url": data_url(image)}}]
    return [{"role": "user", "content": parts + [{"type": "text", "text": check_type("question", question, str)}]}]


def plot_ttft(timings: Mapping[str, Timing]):
    """Bars: the median time to first token of each kind of request (ms), a line from its fastest to its
    slowest repeat. Returns the figure."""
    import matplotlib.pyplot as plt

    check_type("timings", timings, Mapping, "a dict of name -> Timing")
    names = list(timings)
    med = [1e3 * timings[n].median for n in names]
    low = [m - 1e3 * timings[n].best for m, n in zip(med, names)]
    high = [1e3 * max(timings[n].times) - m for m, n in zip(med, names)]
    fig, ax = plt.subplots(figsize=(5, 2.8))
    ax.bar(names, med, yerr=[low, high], color=[f"C{i}" for i in range(len(names))], capsize=4)
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(f"median of {len(timings[names[0]].times)} repeats in turns", fontsize=9)
    fig.tight_layout()
    return fig


def engine_answer(engine, processor, tokenizer, messages: list[dict], max_tokens: int = 8) -> tuple[str, str]:
    """Run one chat request through an in-process engine (labkit.day0.serve.build_engine's triple), greedy,
    to completion: (its reply up to the first newline, as the service's chat stops there; its request id)."""
    prompt = processor.chat(messages)
    rid = engine.add_request(prompt.token_ids, SamplingParams(max_tokens=check_positive_int("max_tokens", max_tokens),
                                                              temperature=0), mm=prompt.mm)
    engine.run_until_done()
    return tokenizer.decode(engine.get(rid).output).split("\n")[0], rid
