"""Links and flit trains: the per-edge FIFO model of the spec's latency section.

A message of N flits (``flit_bytes`` each; a partial last flit still occupies a whole flit
slot) travels a path of directed links. It moves as *trains* of up to ``chunk_flits`` flits;
``chunk_flits = 1`` is the flit-exact reference (one event per flit per hop), larger chunks
are the fast mode. A train is known by the time its first flit (``head``) and last flit
(``tail``) reach the input of a link; the flits between are spaced evenly.

Per link (a FIFO with one serial worker), for a train of n flits arriving when the link is
free from ``free_at`` on, with ``ser = flit_bytes / bw``::

    head_out = max(head, free_at) + ser
    tail_out = max(free_at + n*ser, head + n*ser, tail + ser)

which is exact for evenly spaced flits (the finish time of the last flit of a FIFO is
attained at an end of the arrival sequence). Both then add the link's propagation and the
switching overhead of the node entered; a node's overhead is a pipelined latency per flit,
not an occupancy, so the uncontended last-flit time of a message is, in both modes::

    sum(node overheads) + sum(prop_j + ser_j) + (N - 1) * max_j ser_j

Contention is resolved at train granularity: a train that reaches a busy link waits for the
trains ahead of it (FIFO by head arrival, ties by event order). With trains of C flits a
message can finish up to about C flit-times away from the flit-exact interleaving; the
benchmark ``benchmarks/bench_network.py`` measures the error.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import limits
from .calendar import serialise
from .engine import EDGE, NODE
from .multicast import MulticastMechanics


@dataclass(frozen=True)
class TrainPolicy:
    """How a message is cut into trains (see ``Network.chunks``).

    ``chunk_flits``: largest train; ``trains``: about how many trains a long message makes;
    ``long_flits``: from this size on a message is long; ``min_train``: train size of a short
    message; ``tail_flits``: the last train is halved down to this many flits; ``reserve``:
    a train commits every link of its path when it is sent (one event per train, see
    ``Network._reserve``) instead of link by link as it gets there.
    """

    chunk_flits: int
    trains: int = 32
    long_flits: int = 128
    min_train: int = 4
    tail_flits: int = 1
    reserve: bool = False


#: ``flit`` is the reference; ``fast`` the default; ``coarse`` moves a message of up to 4096
#: flits (1 MiB) as one train that reserves its whole path when sent, for runs that move
#: hundreds of GiB (large collectives); its error against ``fast`` is measured by
#: ``benchmarks/bench_collectives.py``.
MODES = {
    "flit": TrainPolicy(1),
    "fast": TrainPolicy(128),
    "coarse": TrainPolicy(4096, trains=1, long_flits=1, min_train=4096, tail_flits=4096, reserve=True),
}


class Link:
    """Run-time state of one directed edge: its committed use (see ``calendar``)."""

    __slots__ = ("key", "kind", "flit_ps", "prop_ps", "ts", "us", "last_corr", "flits")

    def __init__(self, key, kind: str, flit_ps: int, prop_ps: int):
        self.key, self.kind, self.flit_ps, self.prop_ps = key, kind, flit_ps, prop_ps
        self.ts, self.us, self.last_corr, self.flits = [], [], 0, 0


class Hop:
    """The static cost of one hop of a path: the link (serialisation of one flit and
    propagation) and the switching overhead of the node it enters."""

    __slots__ = ("link", "delay", "total", "segs")

    def __init__(self, link: Link, node: str, node_ps: int):
        self.link, self.delay = link, link.prop_ps + node_ps
        self.total = link.flit_ps + self.delay
        self.segs = ((link.key, "link", link.flit_ps + link.prop_ps),) + (((node, "fixed", node_ps),) if node_ps else ())


class Train:
    """Consecutive flits of one message, moving hop by hop (one engine event per hop).

    ``hops``: the hops it crosses (the message's path; a multicast tree's branch ``br``)."""

    __slots__ = ("msg", "hop", "first", "n", "head", "tail", "chain", "hops", "br")

    def __init__(self, msg, first: int, n: int, head: int, tail: int, chain, hops=None, br=None):
        self.msg, self.hop, self.first, self.n = msg, 0, first, n
        self.head, self.tail, self.chain = head, tail, chain
        self.hops, self.br = msg.hops if hops is None else hops, br


class Message:
    """One routed request: its path, flit count, and what happens on arrival and completion.

    ``deliver(train)`` is called when a train reaches the last node and returns the time and
    chain at which that train is committed there; ``on_done(t, chain)`` runs at the time the
    last train is committed. ``on_sent(t, chain)``, if given, runs when the last flit has left
    the first link (the sender is free again).
    """

    __slots__ = ("corr", "path", "hops", "n_flits", "pending", "done_t", "done_chain",
                 "deliver", "on_done", "on_sent", "what", "backlog", "kids", "leaves", "spray")

    def __init__(self, corr, path, hops, n_flits, deliver, on_done, on_sent, what):
        self.corr, self.path, self.hops, self.n_flits = corr, path, hops, n_flits
        self.deliver, self.on_done, self.on_sent, self.what = deliver, on_done, on_sent, what
        self.pending, self.done_t, self.done_chain, self.backlog = 0, -1, None, None
        self.kids, self.leaves, self.spray = None, None, None


class Network(MulticastMechanics):
    """All links of one run, and the train mechanics that move messages across them
    (multicast trees: ``multicast.MulticastMechanics``)."""

    def __init__(self, engine, machine, policy: TrainPolicy):
        if policy.chunk_flits < 1:
            raise ValueError(f"chunk_flits must be at least 1, got {policy.chunk_flits}")
        self.engine, self.machine, self.policy = engine, machine, policy
        self.flit_bytes = machine.flit_bytes
        # NOTE: one event (and calendar entry) per flit and link: a flit-exact run is bounded
        # by $KBTORCH_MAX_FLITS, so that an absurd size is refused instead of filling memory.
        self._flits, self._flit_limit = 0, limits.limit("flits") if policy.chunk_flits == 1 else None
        self._links: dict = {}
        self._paths: dict = {}
        self._chunks: dict = {}
        # NOTE: the per-train callbacks are bound once: a bound method made at every hop
        # cost about 5% of a flit-exact run.
        self._hop_fn, self._arrive_fn = self._hop, self._arrive
        self._start = self._reserve if policy.reserve else self._hop_fn

    def link(self, u: str, v: str) -> Link:
        key = (u, v)
        link = self._links.get(key)
        if link is None:
            e = self.machine.graph.edges[u, v]
            link = self._links[key] = Link(key, e["kind"], e["flit_ps"], e["prop_ps"])
        return link

    def links(self) -> list[Link]:
        return list(self._links.values())

    def release(self) -> None:
        """Drop the run's links, paths and bound callbacks (``Simulator.release``)."""
        self._links.clear()
        self._paths.clear()
        self._chunks.clear()
        self._hop_fn = self._arrive_fn = self._start = None

    def flits(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.flit_bytes))

    def message(self, path: tuple, n_flits: int, deliver, on_done, on_sent=None, what="msg", spray=None) -> Message:
        """A new message on ``path`` (a tuple of node names), stamped with a correlation ID.

        ``spray``: ``((path, weight), ...)`` of two or more paths (weight: bottleneck GB/s): each
        train (a packet) goes on the path where it would arrive first, by the path's head
        latency and the trains this message already put on it at its bottleneck rate
        (earliest-arrival spraying; it does not see other messages unless the machine's
        routing is ``adaptive``; deterministic either way).
        A short message stays on the fastest path; a long one spreads in proportion to the
        bandwidths. Trains may arrive out of order; the message completes when the last one
        is committed. ``path`` is then the first of them."""
        if self._flit_limit is not None:
            self._flits += n_flits
            if self._flits > self._flit_limit:
                limits.check("flits", self._flits, "a flit-exact run (one event per flit)")
        msg = Message(self.engine.new_corr(), path, self._hops(path), n_flits, deliver, on_done, on_sent, what)
        if spray is not None and len(spray) > 1:
            hops = [self._hops(p) for p, _ in spray]
            ser = [self.flit_bytes * 1000 / w for _, w in spray]
            heads = [float(sum(h.total for h in hs)) for hs in hops]
            own = None
            if self.machine.routing.adaptive:
                # NOTE: adaptive: times are absolute, and each path's own links (those not
                # every path crosses) are watched for other messages' committed traffic.
                common = set.intersection(*({h.link for h in hs} for hs in hops))
                own = [[h.link for h in hs if h.link not in common] for hs in hops]
                heads = [self.engine.now + x for x in heads]
            msg.spray = (hops, heads, ser, own)
        return msg

    @staticmethod
    def _pick(msg: Message, n: int):
        """The hops of the next train (``n`` flits) of a sprayed message: the path where it
        would arrive first (``message``); adaptive (``[routing] adaptive``): also not before
        the committed traffic on the path's own links has passed."""
        hops, ends, ser, own = msg.spray
        best, when = 0, None
        for i, end in enumerate(ends):
            if own is not None:
                busy = max((link.ts[-1] for link in own[i] if link.ts), default=0)
                end = busy if busy > end else end
            t = end + n * ser[i]
            if when is None or t < when:
                best, when = i, t
        ends[best] = when
        return hops[best]

    def _hops(self, path: tuple) -> list:
        hops = self._paths.get(path)
        if hops is None:
            g = self.machine.graph
            hops = self._paths[path] = [Hop(self.link(u, v), v, g.nodes[v]["overhead_ps"])
                                        for u, v in zip(path, path[1:])]
        return hops

    def chunks(self, n_flits: int):
        """(first flit, flit count) of each train of a message of ``n_flits``.

        NOTE: a message of at least ``long_flits`` flits moves as about ``trains`` trains (up
        to ``chunk_flits`` flits each), so that its cost in events does not grow with its size;
        a shorter one moves in trains of ``min_train`` flits, since its finish time is more
        sensitive to the train-by-train interleaving of a contended link. The last train is
        halved down to ``tail_flits`` (fast mode: one flit) so that streams sharing a link
        finish as close together as flit by flit. Fast mode's ``long_flits`` is
        ``min_train x trains`` (128), so the train size grows continuously with the message
        (with 512, a 455-flit block moved as 114 trains of 4 flits, 3x the events of a
        512-flit one). 48 such blocks in uniform traffic on AHBM: each message within
        3.0% of flit-exact (mean 0.6%; 512-flit messages 2.5%, 0.4%), the last finish exact.
        """
        got = self._chunks.get(n_flits)
        if got is None:
            got = self._chunks[n_flits] = self._cut(n_flits)
        return got

    def trains(self, msg: Message):
        """(first flit, flit count) of each train of ``msg``: ``chunks``, except that in
        reservation mode a sprayed message makes at least 4 trains per path (of at least 16
        flits), so that its packets spread over its paths as in the fast mode."""
        if msg.spray is None or not self.policy.reserve:
            return self.chunks(msg.n_flits)
        key = (msg.n_flits, len(msg.spray[0]))
        got = self._chunks.get(key)
        if got is None:
            n = msg.n_flits
            c = min(self.policy.chunk_flits, max(16, -(-n // (4 * key[1]))))
            got = self._chunks[key] = [(f, min(c, n - f)) for f in range(0, n, c)]
        return got

    def _cut(self, n_flits: int) -> list:
        pol = self.policy
        c = min(pol.chunk_flits, pol.min_train if n_flits < pol.long_flits else -(-n_flits // pol.trains))
        sizes = []
        rest = n_flits
        while rest > c:
            sizes.append(c)
            rest -= c
        while rest > max(1, pol.tail_flits):
            half = rest // 2
            sizes.append(rest - half)
            rest = half
        if rest:
            sizes.append(rest)
        out, f = [], 0
        for n in sizes:
            out.append((f, n))
            f += n
        return out

    def inject(self, msg: Message, first: int, n: int, head: int, tail: int, chain) -> None:
        """Put a train of ``msg`` at the input of its first link: its first flit arrives at
        ``head``, its last at ``tail`` (attribution ``chain``)."""
        msg.pending += 1
        tr = Train(msg, first, n, head, tail, chain, None if msg.spray is None else self._pick(msg, n))
        self.engine.at(head, self._start, tr, priority=EDGE)

    def send(self, msg: Message, t: int, chain, whole: bool = False) -> None:
        """Inject all of ``msg`` at time ``t``: every flit is ready at the source.

        ``whole``: the path is private to one serial engine (a PE's TCM <-> engine link), so
        nothing can interleave with it and the fast mode moves it as one train (exact).

        NOTE: only the first train is scheduled now; each next one is scheduled (as a node
        event, so before any other train at that instant) when its predecessor has taken the
        first link. The order is the same as scheduling all of them at once, but the event
        queue holds one entry per message instead of one per train.
        """
        self.engine.record(msg.corr, msg.path[0], "inject", t, t, f"{msg.what} {msg.n_flits} flits to {msg.path[-1]}")
        private = whole and self.policy.chunk_flits > 1
        trains = [(0, msg.n_flits)] if private else self.trains(msg)
        if len(trains) == 1 and t == self.engine.now and (self.policy.reserve or (private and len(msg.hops) == 1)):
            # NOTE: nothing can interleave with a train on one private link, and reservation
            # mode commits a path when it is sent: cross it now, without a train event (the
            # same times as the train event would give on a private link).
            msg.pending += 1
            hops = None if msg.spray is None else self._pick(msg, msg.n_flits)
            self._reserve(Train(msg, 0, msg.n_flits, t, t, chain, hops))
            return
        msg.pending += len(trains)
        msg.backlog = (trains, 1, t, chain) if len(trains) > 1 else None
        first, n = trains[0]
        tr = Train(msg, first, n, t, t, chain, None if msg.spray is None else self._pick(msg, n))
        self.engine.at(t, self._start, tr, priority=EDGE)

    def _next_train(self, msg: Message) -> None:
        trains, k, t, chain = msg.backlog
        msg.backlog = (trains, k + 1, t, chain) if k + 1 < len(trains) else None
        first, n = trains[k]
        tr = Train(msg, first, n, t, t, chain, None if msg.spray is None else self._pick(msg, n))
        self.engine.at(self.engine.now, self._start, tr, priority=NODE)

    def _hop(self, tr: Train) -> None:
        """The head of ``tr`` reaches the input of its next link: serialise it there."""
        self._cross(tr)
        if tr.hop + 1 < len(tr.hops):
            tr.hop += 1
            self.engine.at(tr.head, self._hop_fn, tr, priority=EDGE)
            return
        if tr.msg.kids is None:
            self._arrive(tr)
            return
        self._fork(tr)

    def _reserve(self, tr: Train) -> None:
        """Cross every link of the path now, then arrive: at once if the end needs no memory
        (``deliver`` is ``arrive``), else by one event.

        NOTE: in reservation mode the links downstream are committed ahead of time (their
        calendars take the train in the order trains are sent, not the order they reach the
        link), which costs at most one event per train instead of one per hop."""
        hops = len(tr.hops)
        while True:
            self._cross(tr)
            if tr.hop + 1 == hops:
                break
            tr.hop += 1
        if tr.msg.kids is not None:
            if tr.br is not None and tr.br.kids is None:
                leaf = tr.msg.leaves[1][tr.br.leaf]
                if leaf.deliver is not arrive:
                    self.engine.at(tr.head, self._arrive_leaf, tr, priority=EDGE)
                    return
            self._fork(tr)
            return
        if tr.msg.deliver is arrive:
            self._arrive(tr)
            return
        self.engine.at(tr.head, self._arrive_fn, tr, priority=EDGE)

    def _cross(self, tr: Train) -> None:
        """Serialise ``tr`` on link ``tr.hop`` of its path and move it past the node it enters."""
        msg, j = tr.msg, tr.hop
        hop = tr.hops[j]
        link = hop.link
        n, head, tail, chain, ser = tr.n, tr.head, tr.tail, tr.chain, link.flit_ps
        ts = link.ts
        if self.policy.reserve or (ts and ts[-1] > head):
            head_out, tail_out = serialise(link.ts, link.us, head, tail, n, ser,
                                               self.engine.now if self.policy.reserve else None)
            if tail_out > tail + ser:
                cause = "queue" if link.last_corr != msg.corr else "link"
                chain = (link.key, cause, tail_out - tail - ser, chain)
        else:
            head_out, tail_out = head + ser, tail + ser
            if head + n * ser > tail_out:
                chain = (link.key, "link", head + n * ser - tail_out, chain)
                tail_out = head + n * ser
            link.ts, link.us = [head, tail_out], [n * ser / (tail_out - head)]
        link.last_corr = msg.corr
        link.flits += n
        eng = self.engine
        if eng.trace is not None:
            eng.record(msg.corr, link.key, "hop", head, tail_out, f"flits {tr.first}+{n}")
        if j == 0 and tr.br is None:
            if msg.backlog is not None:
                self._next_train(msg)
            elif tr.first + n == msg.n_flits and msg.on_sent is not None:
                eng.at(tail_out, msg.on_sent, tail_out, (link.key, "link", ser, chain))
        tr.head, tr.tail, tr.chain = head_out + hop.delay, tail_out + hop.delay, (hop, "hop", hop.total, chain)

    def _arrive(self, tr: Train) -> None:
        """``tr`` has reached the last node of its path: deliver it there."""
        msg, eng = tr.msg, self.engine
        t, chain = msg.deliver(tr)
        if t > msg.done_t:
            msg.done_t, msg.done_chain = t, chain
        msg.pending -= 1
        if msg.pending == 0:
            eng.record(msg.corr, msg.path[-1], "done", msg.done_t, msg.done_t, msg.what)
            eng.at(msg.done_t, msg.on_done, msg.done_t, msg.done_chain)


def arrive(tr: Train):
    """Default delivery: the train is committed when its last flit arrives."""
    return tr.tail, tr.chain
