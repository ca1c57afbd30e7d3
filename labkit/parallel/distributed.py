"""Real ranks: a pool of N spawned processes joined in one torch.distributed gloo group, kept up across
notebook cells (notebook 04 runs every multi-process section through it; tests share one per module).

    pool = Pool(2)                       # spawns 2 processes (~3.5 s), gloo over loopback, free port
    pool.run(worker, a, b)               # worker(rank, world, a, b) on every rank -> [result0, result1]
    pool.close()                         # or `with Pool(2) as pool:`; shared_pool(2) keeps one per size

Rules it keeps: the port comes from a TCPStore the parent opens on port 0 (the kernel picks a free one, no
race); every collective has the group's timeout (`timeout` seconds); each worker runs 1 torch thread (2
cores here); a rank that raises ends the whole group at once (the other ranks, maybe blocked in a
collective, are killed) and `run` raises RankError naming the rank and its exception; a rank that dies or
a task that overruns raises too. The next `run` starts a fresh group. Worker functions must be importable
module-level functions (spawned children cannot import a notebook cell's functions): labkit's own.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .._checks import check_int, check_positive, check_positive_int, fail

CORES = os.cpu_count() or 1
MAX_WORLD = 4 * CORES
"""The most ranks this course starts on this machine: 4 per CPU core (8 on the course's 2 cores). Each rank is
a process with its own torch (~300 MB) running one thread; past a few per core they only queue for the
cores and every collective waits on the slowest."""


class RankError(RuntimeError):
    """A rank raised (or died): `rank`, the exception's type name and message, and the rank's traceback."""

    def __init__(self, rank: int, kind: str, message: str, trace: str = ""):
        super().__init__(f"rank {rank} failed with {kind}: {message}")
        self.rank, self.kind, self.message, self.trace = rank, kind, message, trace


def check_world(world: int, name: str = "world") -> int:
    """A world size this machine can run: an int in [1, MAX_WORLD] (refused under `name` otherwise)."""
    check_int(name, world)
    if not 1 <= world <= MAX_WORLD:
        fail(name, world, f"an int in [1, {MAX_WORLD}]: this machine runs at most 4 ranks per CPU core "
             f"({CORES} cores), each a process with its own torch (~300 MB)")
    return world


def check_worker(fn: Callable) -> Callable:
    """`fn` if a spawned process can import it (a module-level function of an importable module)."""
    if not callable(fn):
        fail("fn", fn, "a function fn(rank, world, *args)", TypeError)
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in (None, "__main__", "__mp_main__") or "<" in name or "." in name:
        fail("fn", fn, "a module-level function of an importable module (such as labkit.parallel's workers); "
             "spawned processes cannot import functions defined in a notebook cell or nested in another",
             TypeError)
    return fn


def _worker(rank: int, world: int, port: int, timeout: float, threads: int, inbox, outbox) -> None:
    """One rank's loop: join the group, then run tasks until told to stop (None)."""
    torch.set_num_threads(threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        span = timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=span)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=span)
        dist.barrier()
        outbox.put(("ready", rank, 0, b""))
    except BaseException as e:  # noqa: BLE001 (report anything to the parent)
        outbox.put(("error", rank, 0, pickle.dumps((type(e).__name__, str(e), traceback.format_exc()))))
        return
    parent = os.getppid()
    while True:
        try:
            task = inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the parent died (even by SIGKILL): no rank outlives it
                return
            continue
        except KeyboardInterrupt:  # the kernel was interrupted or shut down: leave quietly
            return
        if task is None:
            break
        task_id, payload = task
        try:
            fn, args = pickle.loads(payload)
            outbox.put(("ok", rank, task_id, pickle.dumps(fn(rank, world, *args))))
        except BaseException as e:  # noqa: BLE001
            outbox.put(("error", rank, task_id, pickle.dumps((type(e).__name__, str(e), traceback.format_exc()))))
    dist.destroy_process_group()


class Pool:
    """`world` gloo ranks in spawned processes, started on first use and kept until close()."""

    def __init__(self, world: int, timeout: float = 20.0, threads: int = 1, start_timeout: float = 120.0):
        self.world = check_world(world)
        self.timeout = check_positive("timeout", timeout, unit="seconds")
        self.threads = check_positive_int("threads", threads)
        self.start_timeout = check_positive("start_timeout", start_timeout, unit="seconds")
        self._procs: list = []
        self._task = 0
        self.start_seconds = 0.0
        """seconds the last start took (spawn + import torch + init_process_group)"""

    @property
    def running(self) -> bool:
        return bool(self._procs)

    def start(self) -> "Pool":
        """Spawn the ranks and wait until they have all joined the group (no-op when running)."""
        if self.running:
            return self
        t0 = time.perf_counter()
        ctx = mp.get_context("spawn")
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.timeout))
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world)]
        self._procs = [ctx.Process(target=_worker, daemon=True, name=f"labkit-rank-{r}",
                                   args=(r, self.world, self._store.port, self.timeout, self.threads,
                                         self._inboxes[r], self._outbox)) for r in range(self.world)]
        for p in self._procs:
            p.start()
        self._collect(0, self.start_timeout, "start")
        self.start_seconds = time.perf_counter() - t0
        return self

    def run(self, fn: Callable, *args: Any, timeout: float | None = None) -> list:
        """fn(rank, world, *args) on every rank; the results in rank order. Raises RankError (naming the
        rank and its exception) when a rank fails, TimeoutError when ranks overrun `timeout` seconds
        (default 3x the collective timeout); either way the group is ended and the next run restarts it."""
        check_worker(fn)
        limit = 3 * self.timeout if timeout is None else check_positive("timeout", timeout, unit="seconds")
        payload = pickle.dumps((fn, args))  # fail here, before any rank starts, if args cannot travel
        self.start()
        self._task += 1
        for inbox in self._inboxes:
            inbox.put((self._task, payload))
        return self._collect(self._task, limit, fn.__qualname__)

    def _collect(self, task: int, limit: float, what: str) -> list:
        results: dict[int, Any] = {}
        deadline = time.monotonic() + limit
        while len(results) < self.world:
            try:
                kind, rank, tid, data = self._outbox.get(timeout=0.05)
            except queue.Empty:
                dead = self._dead()
                if dead:
                    self._raise(RankError(dead.rank, "exit", dead.message + f" during {what}" + (
                        " (a script that starts a Pool must do so under `if __name__ == '__main__':`, spawned "
                        "ranks import the script)" if what == "start" else "")))
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.world)) - set(results))
                    self.close()
                    raise TimeoutError(f"ranks {missing} did not finish {what} within {limit:g} s; the group "
                                       f"was ended")
                continue
            if tid != task:
                continue  # left over from an earlier task
            if kind == "error":
                error = RankError(rank, *pickle.loads(data))
                self._raise(self._dead(grace=0.5) or error)
            results[rank] = pickle.loads(data) if data else None
        return [results[r] for r in range(self.world)]

    def _dead(self, grace: float = 0.0) -> RankError | None:
        """A RankError for the first rank whose process has ended (waiting up to `grace` seconds for one:
        when a rank dies, the others' connection errors often arrive first)."""
        deadline = time.monotonic() + grace
        while True:
            for r, p in enumerate(self._procs):
                if not p.is_alive():
                    return RankError(r, "exit", f"the process ended with exit code {p.exitcode}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def _raise(self, error: Exception) -> None:
        self.close()
        raise error

    def close(self) -> None:
        """End the group: stop idle ranks politely, kill the rest."""
        procs, self._procs = self._procs, []
        for p, inbox in zip(procs, self._inboxes if procs else []):
            if p.is_alive():
                inbox.put(None)
        for p in procs:
            p.join(timeout=1.0)
            if p.is_alive():
                p.kill()
                p.join()
        if procs:
            for q in [self._outbox, *self._inboxes]:
                q.close()
                q.cancel_join_thread()
            del self._store

    def __enter__(self) -> "Pool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Pool(world={self.world}, {'running' if self.running else 'stopped'})"


_SHARED: dict[int, Pool] = {}


def shared_pool(world: int) -> Pool:
    """One running Pool per world size for the whole session (a notebook's cells share it)."""
    world = check_world(world)
    if world not in _SHARED:
        _SHARED[world] = Pool(world)
    return _SHARED[world].start()


@atexit.register
def close_shared() -> None:
    """Stop every shared pool (runs at interpreter exit)."""
    for p in _SHARED.values():
        p.close()
