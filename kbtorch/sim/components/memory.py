"""HBM slices and SRAM: a stateless array of per-pseudo-channel availability timestamps.

Address -> channel: burst ``b = addr // burst_bytes`` goes to channel ``b % channels``
(plain low-order interleave, one burst of ``burst_bytes`` per flit). A channel serves one
burst in ``burst_bytes / channel_gbps``; requests queue per channel in arrival order (no
write-buffer reordering, no bank conflicts, no refresh: the spec's simplifications).

A request of many bursts is split into the same trains as the network (``chunk_flits``).
For each train, the bursts that map to one channel are evenly spaced in the train, so each
channel's finish time has a closed form; with ``chunk_flits = 1`` this is burst-exact.

NOTE: a train of many bursts touches many channels (a 1 MiB train all 192 of a Maia 200
HBM): from ``VECTOR_CLASSES`` channel classes on, the same integer arithmetic runs on numpy
arrays of the classes instead of a Python loop (identical results, one step per train).
"""
from __future__ import annotations

from math import gcd

import numpy as np

#: From this many channel classes in a train on, ``read`` and ``write`` use numpy.
VECTOR_CLASSES = 16


class Memory:
    """Channel timestamps of one memory node (an HBM slice or an SRAM)."""

    def __init__(self, node: str, params: dict, flit_bytes: int):
        self.node = node
        self.channels = int(params.get("channels", 1))
        self.burst_bytes = int(params.get("burst_bytes", flit_bytes))
        if self.burst_bytes != flit_bytes:
            raise ValueError(f"{node}: burst_bytes {self.burst_bytes} must equal flit_bytes {flit_bytes}")
        self.burst_ps = max(1, round(self.burst_bytes * 1000 / float(params["channel_gbps"])))
        self.free = [0] * self.channels
        self._vec = None            # the channel free times as numpy (see ``_free_vec``)
        self.bursts = 0
        self.busy_ps = 0
        self._memo: dict = {}

    def _classes(self, addr: int, stride: int, first: int, n: int):
        """(channel, first index in train, count, step) for each channel the train touches;
        from ``VECTOR_CLASSES`` classes on, the same as numpy columns (channel, first, count,
        last index in train)."""
        sb = stride // self.burst_bytes
        base = (addr // self.burst_bytes + first * sb) % self.channels
        key = (base, sb, n)
        out = self._memo.get(key)
        if out is None:
            period = self.channels // gcd(sb, self.channels) if sb else 1
            out = [((base + r * sb) % self.channels, r, (n - r + period - 1) // period, period)
                   for r in range(min(period, n))]
            if len(out) >= VECTOR_CLASSES:
                ch, k, cnt, step = (np.array(c, dtype=np.int64) for c in zip(*out))
                out = (ch, k, cnt, k + (cnt - 1) * step)
            self._memo[key] = out
        return out

    def _free_vec(self):
        """The channel free times as a numpy array (kept as one from the first vector use on)."""
        if self._vec is None:
            self._vec = np.array(self.free, dtype=np.int64)
            self.free = self._vec
        return self._vec

    def read(self, t: int, chain, addr: int, stride: int, first: int, n: int):
        """Serve the n bursts of one train requested at ``t``.

        Returns (head, tail, chain): when the first and the last burst are read out, and the
        attribution of the last."""
        classes = self._classes(addr, stride, first, n)
        if isinstance(classes, tuple):
            return self._read_vec(t, chain, classes, n)
        head = tail = None
        tail_start = t
        for ch, _, cnt, _ in classes:
            start = max(t, int(self.free[ch]))
            fin = start + cnt * self.burst_ps
            self.free[ch] = fin
            if head is None or start + self.burst_ps < head:
                head = start + self.burst_ps
            if tail is None or fin > tail:
                tail, tail_start = fin, start
        self.bursts += n
        self.busy_ps += n * self.burst_ps
        if tail_start > t:
            chain = (self.node, "queue", tail_start - t, chain)
        return head, tail, (self.node, "service", tail - tail_start, chain)

    def _read_vec(self, t: int, chain, classes: tuple, n: int):
        """``read`` on numpy columns (the same arithmetic; the tail is the first largest finish)."""
        ch, _, cnt, _ = classes
        free = self._free_vec()
        start = np.maximum(free[ch], t)
        fin = start + cnt * self.burst_ps
        free[ch] = fin
        i = int(fin.argmax())
        head, tail, tail_start = int(start.min()) + self.burst_ps, int(fin[i]), int(start[i])
        self.bursts += n
        self.busy_ps += n * self.burst_ps
        if tail_start > t:
            chain = (self.node, "queue", tail_start - t, chain)
        return head, tail, (self.node, "service", tail - tail_start, chain)

    def write(self, tr, addr: int, stride: int):
        """Commit an arriving train's bursts; -> (time the last burst is written, chain)."""
        n, head, tail = tr.n, tr.head, tr.tail
        span = tail - head
        classes = self._classes(addr, stride, tr.first, n)
        if isinstance(classes, tuple):
            done = self._write_vec(head, span, n, classes)
        else:
            done = 0
            for ch, k, cnt, step in classes:
                last = k + (cnt - 1) * step
                a_first = head + (span * k // (n - 1) if n > 1 else 0)
                a_last = head + (span * last // (n - 1) if n > 1 else 0)
                fin = max(int(self.free[ch]) + cnt * self.burst_ps, a_first + cnt * self.burst_ps,
                          a_last + self.burst_ps)
                self.free[ch] = fin
                done = max(done, fin)
        self.bursts += n
        self.busy_ps += n * self.burst_ps
        return done, (self.node, "service", done - tail, tr.chain)

    def _write_vec(self, head: int, span: int, n: int, classes: tuple) -> int:
        """``write``'s per-channel finishes on numpy columns; -> the last one."""
        ch, k, cnt, last = classes
        free = self._free_vec()
        bp = self.burst_ps
        a_first = head + span * k // (n - 1)
        a_last = head + span * last // (n - 1)
        fin = np.maximum(np.maximum(free[ch], a_first) + cnt * bp, a_last + bp)
        free[ch] = fin
        return int(fin.max())
