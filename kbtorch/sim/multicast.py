"""Multicast trees: one payload from a source node to a set of destination nodes.

The tree is the union of the unicast routes to the destinations (``paths``, one per
destination, all starting at the source). Routes that share a prefix share its links; where
they part, the node they part at replicates the payload. A node reached by two routes over
different links keeps the link of the first route in destination order (so every node has
one parent and every link of the tree carries the payload once).

The machine says where replication exists: a node at which the routes split must have
``multicast = true`` on its component in the topology file (``Machine.multicast_nodes``). A
tree that would split elsewhere is refused with ``MulticastError`` naming the node, unless
the caller asked for the unicast fallback (one copy per destination, named as such).

``MulticastMechanics`` (a base of ``network.Network``) moves a message down a tree: its
trains cross the trunk once and are copied into every branch where the tree splits.
"""
from __future__ import annotations

from .engine import EDGE


class MulticastError(ValueError):
    """A multicast the machine cannot do (a split at a node without multicast, bad ends)."""


class Branch:
    """A run of the tree without a split: its node ``path`` (first node = the split point it
    leaves, or the source), then either ``kids`` (branches leaving its last node) or a
    ``leaf`` (the index of the destination it ends at)."""

    __slots__ = ("path", "kids", "leaf", "hops")

    def __init__(self, path: tuple, kids: tuple | None, leaf: int | None):
        self.path, self.kids, self.leaf, self.hops = path, kids, leaf, None

    def edges(self):
        yield from zip(self.path, self.path[1:])
        for kid in self.kids or ():
            yield from kid.edges()

    def splits(self):
        """Nodes at which the tree replicates the payload."""
        if self.kids:
            yield self.path[-1]
            for kid in self.kids:
                yield from kid.splits()


def tree(paths: list) -> Branch:
    """The multicast tree of ``paths`` (node tuples from one source to distinct ends)."""
    if not paths:
        raise MulticastError("a multicast needs at least one destination")
    src = paths[0][0]
    ends = [p[-1] for p in paths]
    if len(set(ends)) != len(ends):
        dup = next(e for e in ends if ends.count(e) > 1)
        raise MulticastError(f"multicast from '{src}': destination '{dup}' is named twice")
    parent: dict = {}
    children: dict = {}
    for p in paths:
        if p[0] != src:
            raise MulticastError(f"multicast: routes start at '{src}' and '{p[0]}'")
        for u, v in zip(p, p[1:]):
            if v in parent or v == src:
                continue
            parent[v] = u
            children.setdefault(u, []).append(v)
    leaf_of = {e: i for i, e in enumerate(ends)}
    for e in ends:
        if e in children:
            raise MulticastError(f"multicast from '{src}': destination '{e}' lies on the route to another one")
    if len(children.get(src, ())) > 1:
        raise MulticastError(f"multicast from '{src}': the routes leave it by {len(children[src])} different links "
                             f"(a multicast replicates at a router, not at its source)")

    def walk(start: str) -> Branch:
        path = [start]
        while True:
            kids = children.get(path[-1], [])
            if len(kids) == 1 and path[-1] not in leaf_of:
                path.append(kids[0])
                continue
            break
        last = path[-1]
        if last in leaf_of:
            return Branch(tuple(path), None, leaf_of[last])
        return Branch(tuple(path), tuple(walk_from(last, v) for v in children[last]), None)

    def walk_from(split: str, first: str) -> Branch:
        b = walk(first)
        b.path = (split,) + b.path
        return b

    return walk(src)


def check(machine, root: Branch, what: str) -> None:
    """``MulticastError`` unless every split of ``root`` is at a node with multicast."""
    g = machine.graph
    for node in root.splits():
        if not g.nodes[node]["params"].get("multicast", False):
            raise MulticastError(
                f"{what}: the routes split at '{node}' ({g.nodes[node]['kind']}), which has no multicast on "
                f"topology '{machine.name}' (a machine declares it with multicast = true on the component; "
                f"or ask for the unicast fallback)")


def can_multicast(machine, root: Branch) -> bool:
    g = machine.graph
    return all(g.nodes[n]["params"].get("multicast", False) for n in root.splits())


class Leaf:
    """One destination of a multicast message: how its trains are committed there
    (``deliver``), what runs when all of them are (``on_done``), and its progress."""

    __slots__ = ("node", "deliver", "on_done", "got", "done_t", "done_chain")

    def __init__(self, node: str, deliver, on_done):
        self.node, self.deliver, self.on_done = node, deliver, on_done
        self.got, self.done_t, self.done_chain = 0, -1, None


class MulticastMechanics:
    """The multicast half of ``network.Network`` (which provides ``message``, ``_hops``,
    ``_reserve``, ``_hop_fn``, ``engine`` and ``policy``)."""

    def multicast(self, root, n_flits: int, leaves: list, on_done, on_sent=None, what="multicast") -> "Message":
        """A message down the multicast tree ``root`` (``sim.multicast.Branch``; its trunk is
        the message's path): each train is replicated where the tree splits, so every link of
        the tree carries it once. ``leaves[i]`` (a ``Leaf``) is destination ``i``;
        ``on_done(t, chain)`` runs when every destination has committed every train (the
        latest one's time and chain)."""
        if root.kids is None:
            # NOTE: one destination: a plain message (its leaf's commit, then both callbacks).
            leaf = leaves[0]

            def done(t, chain):
                for fn in (leaf.on_done, on_done):
                    if fn is not None:
                        fn(t, chain)
            return self.message(root.path, n_flits, leaf.deliver, done, on_sent, what)
        msg = self.message(root.path, n_flits, None, on_done, on_sent, what)
        msg.kids, msg.leaves = self._branches(root.kids), [len(leaves), leaves]
        return msg

    def _branches(self, kids):
        for kid in kids:
            kid.hops = self._hops(kid.path)
            if kid.kids:
                self._branches(kid.kids)
        return kids

    def _fork(self, tr: "Train") -> None:
        """``tr`` has crossed a branch of a multicast tree: copy it into the branches that
        leave the node it reached (the node replicates it), or deliver it at a leaf."""
        br = tr.br
        kids = tr.msg.kids if br is None else br.kids
        if kids is None:
            self._arrive_leaf(tr)
            return
        for kid in kids:
            copy = type(tr)(tr.msg, tr.first, tr.n, tr.head, tr.tail, tr.chain, kid.hops, kid)
            if self.policy.reserve:
                self._reserve(copy)
            else:
                self.engine.at(copy.head, self._hop_fn, copy, priority=EDGE)

    def _arrive_leaf(self, tr: "Train") -> None:
        """A train of a multicast reached destination ``tr.br.leaf``: commit it there."""
        msg, eng = tr.msg, self.engine
        leaf = msg.leaves[1][tr.br.leaf]
        t, chain = leaf.deliver(tr)
        if t > leaf.done_t:
            leaf.done_t, leaf.done_chain = t, chain
        leaf.got += 1
        if leaf.got == msg.pending:
            eng.record(msg.corr, leaf.node, "done", leaf.done_t, leaf.done_t, msg.what)
            eng.at(leaf.done_t, self._leaf_done, msg, leaf)

    @staticmethod
    def _leaf_done(msg: "Message", leaf: Leaf) -> None:
        if leaf.on_done is not None:
            leaf.on_done(leaf.done_t, leaf.done_chain)
        if leaf.done_t > msg.done_t:
            msg.done_t, msg.done_chain = leaf.done_t, leaf.done_chain
        msg.leaves[0] -= 1
        if msg.leaves[0] == 0 and msg.on_done is not None:
            msg.on_done(msg.done_t, msg.done_chain)
