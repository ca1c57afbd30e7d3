"""Page migration and eviction: how pages move between device and host (notebook 02; the rules are in
labkit/unified_memory.py's docstring). UnifiedMemory inherits these methods; they share its arrays:

    tier[page]      FREE (-1), HOST (0) or DEVICE (1)
    frames[f]       the page in device frame f (-1: free); frame[page] the reverse
    last_use[page]  LRU key (tick of the last access or load);  loaded[page]  FIFO key (load number)
    ref[page]       clock reference bit;  _protect: pages with loaded >= _protect came in with this fault

Victims for LRU and FIFO come from a lazily rebuilt queue of the smallest keys (one O(n) pass per many
evictions); clock sweeps the frames in numpy windows. Runs of consecutive faults without prefetch are
handled in one batch (`_fault_run` for LRU/FIFO, `_clock_run` for clock), and so are sweeps with sequential
prefetch (`_sequential_run`): that is what makes an oversubscribed sweep replay fast.
"""

from __future__ import annotations

import numpy as np

FREE, HOST, DEVICE = -1, 0, 1


class Migration:
    @staticmethod
    def _distinct_prefix(run: np.ndarray) -> np.ndarray:
        """The longest prefix of `run` without a repeated page."""
        order = np.argsort(run, kind="stable")
        again = order[1:][run[order[1:]] == run[order[:-1]]]
        return run[:int(again.min())] if len(again) else run

    def _load_run(self, run: np.ndarray) -> int:
        """Bring `run` (distinct host pages, accessed in this order with ticks tick + 1, tick + 2, ...) to the
        device: the lowest free frames first, then the frames of the smallest-key pages resident before the
        run (LRU or FIFO). Returns how many free frames were used."""
        r = len(run)
        nf = min(r, self.n_free)
        frames = self._pop_free(nf)
        self._protect = self.seq
        victims = self._min_key_victims(r - nf) if r > nf else np.zeros(0, np.int64)
        frames = np.concatenate([frames, self.frame[victims]])
        self.tier[victims] = HOST
        self.tier[run] = DEVICE
        self.frames[frames], self.frame[run] = run, frames
        self.last_use[run] = np.arange(self.tick + 1, self.tick + r + 1)
        self.loaded[run] = np.arange(self.seq, self.seq + r)
        self.ref[run] = True
        self.seq, self.tick = self.seq + r, self.tick + r
        self.n_device += nf
        self.n_host -= nf
        return nf

    def _fault_run(self, run: np.ndarray) -> None:
        """Consecutive faults on distinct pages (no prefetch, LRU or FIFO, len(run) <= device_pages), in
        one go: fault i evicts the i-th smallest key among the pages resident before the run, exactly as
        one fault at a time would (the run's own pages get larger keys)."""
        r, s, ps = len(run), self.stats, self.page_size
        nf = self._load_run(run)
        busy = np.where(np.arange(r) < nf, 1, 2) * ps / self.link_bandwidth
        starts = s.time_s + np.arange(r) * self.fault_latency + np.concatenate([[0.0], np.cumsum(busy)[:-1]])
        self.fault_times.extend(starts.tolist())
        self.fault_busy.extend(busy.tolist())
        s.faults += r
        s.migrations += r
        s.evictions += r - nf
        s.bytes_moved += (2 * r - nf) * ps
        s.time_s = float(starts[-1] + self.fault_latency + busy[-1])

    def _clock_run(self, run: np.ndarray) -> None:
        """Consecutive faults on distinct pages (no prefetch, clock, no free frame, len(run) <= device_pages),
        in one go. Seen from the hand, the frames split into F0 (ref bit 0) and F1 (ref bit 1), in circle
        order. The hand's first turn evicts F0 and clears F1; its second turn evicts F1 (now clear) and
        clears the new pages in F0. With at most device_pages faults there is no third turn, so every victim
        is a page resident before the run, exactly as one fault at a time would pick them."""
        n, r, s, ps = self.device_pages, len(run), self.stats, self.page_size
        idx = (self.hand + np.arange(n)) % n                 # frames in the hand's order
        ref0 = ~self.ref[self.frames[idx]]
        f0, f1 = np.flatnonzero(ref0), np.flatnonzero(~ref0)  # positions on the circle
        pos = np.concatenate([f0, f1])[:r]                  # victim i's position
        last, second = int(pos[-1]), r > len(f0)
        vframes = idx[pos]
        victims = self.frames[vframes].copy()
        cleared = idx[~ref0] if second else idx[:last + 1][~ref0[:last + 1]]
        self.ref[self.frames[cleared]] = False               # F1 frames the hand passed
        self.tier[victims] = HOST
        self.tier[run] = DEVICE
        self.frames[vframes], self.frame[run] = run, vframes
        self.last_use[run] = np.arange(self.tick + 1, self.tick + r + 1)
        self.loaded[run] = np.arange(self.seq, self.seq + r)
        self.ref[run] = True
        if second:  # the second turn passed the new pages of F0 up to the last victim
            self.ref[self.frames[idx[f0[f0 <= last]]]] = False
        self.hand = (int(idx[last]) + 1) % n
        self.seq, self.tick = self.seq + r, self.tick + r
        busy = np.full(r, 2 * ps / self.link_bandwidth)
        starts = s.time_s + np.arange(r) * (self.fault_latency + busy[0])
        self.fault_times.extend(starts.tolist())
        self.fault_busy.extend(busy.tolist())
        s.faults += r
        s.migrations += r
        s.evictions += r
        s.bytes_moved += 2 * r * ps
        s.time_s = float(starts[-1] + self.fault_latency + busy[-1])

    def _sequential_run(self, run: np.ndarray, t_hit: float) -> int:
        """Sequential prefetch (LRU or FIFO) over consecutive pages that are all on the host, in one go.
        Faults land on every (prefetch_pages + 1)-th page; each loads its page and the next prefetch_pages,
        which the following accesses then hit. Victims are the smallest keys among the pages resident
        before the run, in order, exactly as one fault at a time would pick them (the run's own pages get
        larger keys). Handles whole groups only; returns how many accesses it consumed (0: not applicable,
        the caller takes the one-fault path)."""
        g, s, ps = self.prefetch_pages + 1, self.stats, self.page_size
        if g > self.device_pages or len(run) < 2 * g:
            return 0
        steps = np.diff(run) != 1
        if steps.any():  # keep the consecutive prefix
            run = run[:int(np.argmax(steps)) + 1]
        heads = run[:len(run) // g * g:g]
        same_allocation = self.alloc_end[heads] > heads + g - 1  # a group never crosses an allocation's end
        n_groups = len(heads) if same_allocation.all() else int(np.argmin(same_allocation))
        n_groups = min(n_groups, (self.n_free + self.n_device) // g)  # victims: pages resident before the run
        if n_groups < 2:
            return 0
        pages = run[:n_groups * g]
        n = len(pages)
        nf = self._load_run(pages)  # last_use: the fault's tick, then each hit's
        evicted = np.maximum(np.minimum(np.arange(1, n_groups + 1) * g - nf, g), 0)  # victims of each fault
        busy = (g + evicted) * ps / self.link_bandwidth
        step = self.fault_latency + busy + (g - 1) * t_hit  # a fault, then the group's hits
        starts = s.time_s + np.concatenate([[0.0], np.cumsum(step)[:-1]])
        self.fault_times.extend(starts.tolist())
        self.fault_busy.extend(busy.tolist())
        s.faults += n_groups
        s.hits += n - n_groups
        s.migrations += n
        s.evictions += n - nf
        s.bytes_moved += int((g + evicted).sum()) * ps
        s.time_s = float(starts[-1] + step[-1])
        return n

    def _load_one(self, p: int) -> None:
        """One faulted page to the device (scalar code: most faults move a single page)."""
        if not self.n_free and self.eviction == "clock":
            self.stats.evictions += len(self._evict(1, np.array([p])))
            self.stats.migrations += 1
            return
        if self.n_free:
            f = int(self._pop_free(1)[0])
            self.n_device += 1
            self.n_host -= 1
        else:
            v = int(self._min_key_victims(1)[0])
            f = int(self.frame[v])
            self.tier[v] = HOST
            self.stats.evictions += 1
        self.tier[p], self.frames[f], self.frame[p] = DEVICE, p, f
        self.last_use[p], self.loaded[p], self.ref[p] = self.tick, self.seq, True
        self.seq += 1
        self.stats.migrations += 1

    def _load(self, pages: np.ndarray, count: bool = True) -> None:
        """Move `pages` (ascending, not on the device) to the device, evicting victims where it is full."""
        if not len(pages):
            return
        n_free = min(len(pages), self.n_free)
        if n_free:
            self._place(pages[:n_free], self._pop_free(n_free))
        rest = pages[n_free:]
        if len(rest):
            victims = self._evict(len(rest), rest) if self.eviction == "clock" else self._min_key_victims(len(rest))
            if self.eviction != "clock":
                self._place(rest, self.frame[victims].copy(), victims)
            self.stats.evictions += len(victims)
        if count:
            self.stats.migrations += len(pages)

    def _pop_free(self, k: int) -> np.ndarray:
        """The k lowest free device frames, now taken."""
        out, got, pos = [], 0, self._free_hint
        while got < k:
            chunk = max(4 * (k - got), 1024)
            found = np.flatnonzero(self.frame_free[pos:pos + chunk])[:k - got] + pos
            out.append(found)
            got += len(found)
            pos += chunk
        frames = np.concatenate(out) if out else np.zeros(0, np.int64)
        self.frame_free[frames] = False
        self.n_free -= k
        if k:
            self._free_hint = int(frames[-1]) + 1
        return frames

    def _place(self, pages, frames, victims=None) -> None:
        if victims is not None:
            self.tier[victims] = HOST
        was_host = int((self.tier[pages] == HOST).sum())
        self.n_host += (0 if victims is None else len(victims)) - was_host
        self.n_device += len(pages) - (0 if victims is None else len(victims))
        self.tier[pages] = DEVICE
        self.frames[frames] = pages
        self.frame[pages] = frames
        self.last_use[pages] = self.tick
        self.loaded[pages] = np.arange(self.seq, self.seq + len(pages))
        self.seq += len(pages)
        self.ref[pages] = True

    def _min_key_victims(self, k: int) -> np.ndarray:
        """LRU / FIFO: the k smallest keys among unprotected device pages, from a lazily rebuilt queue.
        The queue holds the smallest keys at build time; keys only grow, so a queued page whose key is
        unchanged is still smaller than every page outside the queue."""
        key = self.last_use if self.eviction == "lru" else self.loaded
        out, got = [], 0
        while got < k:
            if self._qpos >= len(self._queue):
                self._build_queue(key, k)
                if out:  # pages picked before the rebuild are still on the device: not twice
                    keep = ~np.isin(self._queue, np.concatenate(out))
                    self._queue, self._queue_keys = self._queue[keep], self._queue_keys[keep]
            end = self._qpos + max(64, 2 * (k - got))
            q, qk = self._queue[self._qpos:end], self._queue_keys[self._qpos:end]
            ok = (self.tier[q] == DEVICE) & (key[q] == qk) & (self.loaded[q] < self._protect)
            take = np.flatnonzero(ok)[:k - got]
            out.append(q[take])
            got += len(take)
            self._qpos += int(take[-1]) + 1 if got == k else len(q)
        return np.concatenate(out)

    def _build_queue(self, key: np.ndarray, need: int) -> None:
        res = np.flatnonzero(self.tier[:self.next_page] == DEVICE)
        res = res[self.loaded[res] < self._protect]
        if not len(res):
            raise RuntimeError("no page can be evicted")  # unreachable: prefetch is capped below capacity
        keys = key[res]
        m = min(len(res), max(2 * need, 256, len(res) // 8))  # need >= pages still wanted + picked
        kth = np.partition(keys, m - 1)[m - 1]
        sel = res[keys <= kth]
        sel = sel[np.lexsort((sel, key[sel]))]
        self._queue, self._queue_keys, self._qpos = sel, key[sel].copy(), 0

    def _evict(self, k: int, new_pages: np.ndarray) -> np.ndarray:
        """Clock (second chance): sweep from the hand, clearing ref bits, skipping pages loaded by this
        fault; each victim's frame takes the next new page at once."""
        n, out, placed = self.device_pages, [], 0
        while placed < k:
            idx = (self.hand + np.arange(min(n, max(64, 2 * (k - placed))))) % n
            pg = self.frames[idx]
            eligible = self.loaded[pg] < self._protect
            cand = np.flatnonzero(eligible & ~self.ref[pg])[:k - placed]
            last = int(cand[-1]) if len(cand) == k - placed else len(idx) - 1
            passed = pg[:last + 1]
            self.ref[passed[eligible[:last + 1]]] = False
            self.hand = int(idx[last] + 1) % n
            if len(cand):
                victims = pg[cand]
                self._place(new_pages[placed:placed + len(cand)], idx[cand], victims)
                out.append(victims)
                placed += len(cand)
        return np.concatenate(out)
