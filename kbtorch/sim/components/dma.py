"""DMA engines: move bytes between memories (HBM slice, SRAM, TCM) over the graph.

A DMA whose data does not start in the engine's own TCM first sends a one-flit read
request from the engine to the data's source; the source then streams the data (an HBM or
SRAM source through its channels) along the routed path to the destination, where an HBM or
SRAM destination commits it through its channels. A TCM is reached through its PE's DMA
ports: data leaves a TCM through the PE's DMA write engine and enters one through the DMA
read engine. The command completes when the last byte is committed at the destination (no
acknowledgement traffic is modeled).
"""
from __future__ import annotations

from ..multicast import Branch, Leaf, check, tree
from ..network import arrive


def data_path(machine, src: str, dst: str) -> tuple:
    """Full node path of DMA data from memory ``src`` to memory ``dst``: a TCM is left
    through its PE's DMA write engine and entered through its DMA read engine."""
    g = machine.graph

    def port(tcm: str, role: str) -> str:
        return machine.pes[g.nodes[tcm]["pe"]].node(role)

    start = port(src, "dma_wr") if g.nodes[src]["kind"] == "tcm" else src
    end = port(dst, "dma_rd") if g.nodes[dst]["kind"] == "tcm" else dst
    prefix = (src,) if start != src else ()
    suffix = (dst,) if end != dst else ()
    if start == end:
        # NOTE: a copy inside one memory (two regions of a die-wide HBM) leaves it and comes
        # back through its nearest router.
        turn = next(v for v in g.successors(start) if g.nodes[v]["transit"])
        return prefix + machine.route(start, turn) + machine.route(turn, end)[1:] + suffix
    return prefix + machine.route(start, end) + suffix


def data_paths(machine, src: str, dst: str) -> tuple:
    """``((path, weight), ...)``: the full node paths DMA data from ``src`` to ``dst`` is
    sprayed over under the machine's routing policy (one, ``data_path``, when single-path)."""
    one = data_path(machine, src, dst)
    if not machine.multipath:
        return ((one, 1.0),)
    g = machine.graph
    start = one[1] if g.nodes[src]["kind"] == "tcm" else src
    end = one[-2] if g.nodes[dst]["kind"] == "tcm" else dst
    if start == end:
        return ((one, 1.0),)
    prefix = (src,) if start != src else ()
    suffix = (dst,) if end != dst else ()
    return tuple((prefix + p + suffix, w) for p, w in machine.paths(start, end))


class DmaModel:
    """Path construction and the request/stream/commit steps of DMA commands."""

    def __init__(self, sim):
        self.sim = sim
        self.g = sim.machine.graph
        self._paths: dict = {}

    def data_path(self, src: str, dst: str) -> tuple:
        """Full node path of the data from memory ``src`` to memory ``dst`` (cached)."""
        path = self._paths.get((src, dst))
        if path is None:
            path = self._paths[(src, dst)] = data_path(self.sim.machine, src, dst)
        return path

    def spray(self, src: str, dst: str):
        """The paths of a sprayed transfer from ``src`` to ``dst`` (None when single-path)."""
        key = ("spray", src, dst)
        got = self._paths.get(key)
        if got is None:
            got = self._paths[key] = data_paths(self.sim.machine, src, dst)
        return got if len(got) > 1 else None

    def data_path_route(self, src: str, dst: str) -> tuple:
        """The routed path between two nodes (cached)."""
        key = ("route", src, dst)
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = self.sim.machine.route(src, dst)
        return path

    def check(self, pe, cmd) -> None:
        for loc in (cmd.src, cmd.dst):
            if loc.node not in self.g or self.g.nodes[loc.node]["kind"] not in ("hbm", "sram", "tcm"):
                raise ValueError(f"PE {pe.info.id} {cmd.describe()}: '{loc.node}' is not a memory node")
        if cmd.nbytes <= 0:
            raise ValueError(f"PE {pe.info.id} {cmd.describe()}: DMA of {cmd.nbytes} bytes")
        if cmd.src.node == cmd.dst.node and (self.g.nodes[cmd.src.node]["kind"] == "tcm" or
                                             abs(cmd.src.addr - cmd.dst.addr) < cmd.nbytes):
            raise ValueError(f"PE {pe.info.id} {cmd.describe()}: source and destination overlap in '{cmd.src.node}'")

    def start(self, pe, q, p, now: int, chain) -> None:
        """Execute a ``Dma`` command on engine queue ``q`` of PE model ``pe``."""
        cmd = p.cmd
        self.check(pe, cmd)
        self.transfer(q.node, pe.info.node("tcm"), cmd, now, chain,
                      lambda t, c: pe.complete(q, p, t, c), q.release, cmd.describe())

    def start_multicast(self, pe, q, p, now: int, chain) -> None:
        """Execute a ``Multicast`` command on engine queue ``q`` of PE model ``pe``."""
        cmd = p.cmd
        for loc in (cmd.src,) + cmd.dsts:
            if loc.node not in self.g or self.g.nodes[loc.node]["kind"] not in ("hbm", "sram", "tcm"):
                raise ValueError(f"PE {pe.info.id} {cmd.describe()}: '{loc.node}' is not a memory node")
        if cmd.nbytes <= 0:
            raise ValueError(f"PE {pe.info.id} {cmd.describe()}: multicast of {cmd.nbytes} bytes")
        done = lambda t, c: pe.complete(q, p, t, c)
        tcm, what = pe.info.node("tcm"), cmd.describe()
        if not cmd.unicast:
            self.multicast(q.node, tcm, cmd.src, cmd.dsts, cmd.nbytes, now, chain, [None] * len(cmd.dsts), done,
                           q.release, what, cmd.src_stride)
            return
        # NOTE: the named fallback: one transfer per destination, all from this engine.
        landed = Countdown(len(cmd.dsts), now, chain, done)
        sent = Countdown(len(cmd.dsts), now, chain, q.release)
        for d in cmd.dsts:
            self.transfer(q.node, tcm, _Copy(cmd.src, d, cmd.nbytes, cmd.src_stride), now, chain, landed.tick,
                          sent.tick, what)

    def transfer(self, engine: str, own_tcm: str, move, t: int, chain, on_done, on_sent, what: str) -> None:
        """Move ``move.nbytes`` from ``move.src`` to ``move.dst`` for DMA engine node ``engine``
        (whose PE's TCM is ``own_tcm``), starting at ``t``; ``on_sent(t, chain)`` when the
        engine is free again, ``on_done(t, chain)`` when the data is committed."""
        net = self.sim.network
        path = self.data_path(move.src.node, move.dst.node)
        dst_mem = self.sim.memory(move.dst.node)

        def commit(tr):
            return dst_mem.write(tr, move.dst.addr, move.dst_stride or dst_mem.burst_bytes)

        # NOTE: a TCM takes data at link rate: plain ``arrive`` (the coarse mode then
        # delivers the message when it commits its path, without an arrival event).
        deliver = arrive if dst_mem is None else commit
        own = move.src.node == own_tcm
        spray = self.spray(move.src.node, move.dst.node) if self.sim.machine.multipath else None
        data = net.message(path, net.flits(move.nbytes), deliver, on_done, on_sent if own else None, what=what,
                           spray=spray)
        if own:
            net.send(data, t, chain)
            return
        port = path[1] if self.g.nodes[move.src.node]["kind"] == "tcm" else path[0]
        req = net.message(self.data_path_route(engine, port), 1, arrive,
                          lambda tr, c: self.stream(data, move, tr, c), on_sent, what=f"read request {what}")
        net.send(req, t, chain)

    def tree(self, src: str, dsts: tuple) -> Branch:
        """The multicast tree of DMA data from memory ``src`` to memories ``dsts`` (cached)."""
        key = ("tree", src, dsts)
        root = self._paths.get(key)
        if root is None:
            root = self._paths[key] = tree([self.data_path(src, d) for d in dsts])
        return root

    def multicast(self, engine: str, own_tcm: str, src, dsts: tuple, nbytes: int, t: int, chain, on_leaf, on_done,
                  on_sent, what: str, src_stride: int = 0) -> None:
        """Move ``nbytes`` from ``src`` (a ``Loc``) to every ``Loc`` of ``dsts`` as ONE
        message down the multicast tree (the source is read once, each tree link carries the
        data once); ``on_leaf[i](t, chain)`` when destination ``i`` has committed it,
        ``on_done`` when all have; ``on_sent`` as ``transfer``."""
        net = self.sim.network
        root = self.tree(src.node, tuple(d.node for d in dsts))
        check(self.sim.machine, root, what)
        leaves = []
        for d, fn in zip(dsts, on_leaf):
            mem = self.sim.memory(d.node)
            deliver = arrive if mem is None else (lambda tr, mem=mem, d=d: mem.write(tr, d.addr, mem.burst_bytes))
            leaves.append(Leaf(d.node, deliver, fn))
        own = src.node == own_tcm
        msg = net.multicast(root, net.flits(nbytes), leaves, on_done, on_sent if own else None, what=what)
        if own:
            net.send(msg, t, chain)
            return
        port = root.path[1] if self.g.nodes[src.node]["kind"] == "tcm" else root.path[0]
        read = _Read(src, src_stride)
        req = net.message(self.data_path_route(engine, port), 1, arrive,
                          lambda tr, c: self.stream(msg, read, tr, c), on_sent, what=f"read request {what}")
        net.send(req, t, chain)

    def stream(self, msg, cmd, t: int, chain) -> None:
        """The read request reached the source at ``t``: stream the data out of it."""
        net = self.sim.network
        src_mem = self.sim.memory(cmd.src.node)
        if src_mem is None:
            net.send(msg, t, chain)
            return
        net.engine.record(msg.corr, cmd.src.node, "read", t, t, f"{msg.n_flits} bursts")
        stride = cmd.src_stride or src_mem.burst_bytes
        for first, n in net.trains(msg):
            head, tail, c = src_mem.read(t, chain, cmd.src.addr, stride, first, n)
            net.inject(msg, first, n, head, tail, c)


class _Read:
    """The source end of a multicast, as ``stream`` reads it."""

    __slots__ = ("src", "src_stride")

    def __init__(self, src, src_stride: int):
        self.src, self.src_stride = src, src_stride


class _Copy:
    """One destination's copy of a multicast sent as unicast (the fallback)."""

    __slots__ = ("src", "dst", "nbytes", "src_stride", "dst_stride")

    def __init__(self, src, dst, nbytes: int, src_stride: int):
        self.src, self.dst, self.nbytes, self.src_stride, self.dst_stride = src, dst, nbytes, src_stride, 0


class Countdown:
    """Calls ``then(t, chain)`` with the latest of ``n`` ticks."""

    def __init__(self, n: int, t: int, chain, then):
        self.n, self.t, self.chain, self.then = n, t, chain, then

    def tick(self, t: int, chain) -> None:
        self.n -= 1
        if t >= self.t:
            self.t, self.chain = t, chain
        if self.n == 0:
            self.then(self.t, self.chain)
