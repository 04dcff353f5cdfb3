"""HBM slices and SRAM: a stateless array of per-pseudo-channel availability timestamps.

Address -> channel: burst ``b = addr // burst_bytes`` goes to channel ``b % channels``
(plain low-order interleave, one burst of ``burst_bytes`` per flit). A channel serves one
burst in ``burst_bytes / channel_gbps``; requests queue per channel in arrival order (no
write-buffer reordering, no bank conflicts, no refresh: the spec's simplifications).

A request of many bursts is split into the same trains as the network (``chunk_flits``).
For each train, the bursts that map to one channel are evenly spaced in the train, so each
channel's finish time has a closed form; with ``chunk_flits = 1`` this is burst-exact.
"""
from __future__ import annotations

from math import gcd


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
        self.bursts = 0
        self.busy_ps = 0
        self._memo: dict = {}

    def _classes(self, addr: int, stride: int, first: int, n: int):
        """(channel, first index in train, count, step) for each channel the train touches."""
        sb = stride // self.burst_bytes
        base = (addr // self.burst_bytes + first * sb) % self.channels
        key = (base, sb, n)
        out = self._memo.get(key)
        if out is None:
            period = self.channels // gcd(sb, self.channels) if sb else 1
            out = self._memo[key] = [((base + r * sb) % self.channels, r, (n - r + period - 1) // period, period)
                                     for r in range(min(period, n))]
        return out

    def read(self, t: int, chain, addr: int, stride: int, first: int, n: int):
        """Serve the n bursts of one train requested at ``t``.

        Returns (head, tail, chain): when the first and the last burst are read out, and the
        attribution of the last."""
        head = tail = None
        tail_start = t
        for ch, _, cnt, _ in self._classes(addr, stride, first, n):
            start = max(t, self.free[ch])
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

    def write(self, tr, addr: int, stride: int):
        """Commit an arriving train's bursts; -> (time the last burst is written, chain)."""
        n, head, tail = tr.n, tr.head, tr.tail
        span = tail - head
        done = 0
        for ch, k, cnt, step in self._classes(addr, stride, tr.first, n):
            last = k + (cnt - 1) * step
            a_first = head + (span * k // (n - 1) if n > 1 else 0)
            a_last = head + (span * last // (n - 1) if n > 1 else 0)
            fin = max(self.free[ch] + cnt * self.burst_ps, a_first + cnt * self.burst_ps, a_last + self.burst_ps)
            self.free[ch] = fin
            done = max(done, fin)
        self.bursts += n
        self.busy_ps += n * self.burst_ps
        return done, (self.node, "service", done - tail, tr.chain)
