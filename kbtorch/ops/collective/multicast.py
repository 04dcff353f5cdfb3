"""Multicast grouping of the collective kernel's copies (``kernel``), shared with
its alpha-beta model (``analytic``): the copies of one packet that a member sends to
several receivers in one step are ONE multicast command when their tree, from the sender's
HBM to the receivers' HBMs, splits only at multicast routers (a machine with
``multicast_nodes``)."""
from __future__ import annotations

from ...kernel.door import MulticastError, can_multicast, data_path, tree


def multicast_copies(machine, pes: tuple, sends: list, log: set | None = None) -> list:
    """``sends`` ((xfer, blocks, piece, elements), in order) grouped: the copies of the same
    packet from the same member, when the tree from its HBM to the receivers' HBMs splits only
    at multicast routers, form one group (at the place of the first); the rest stay alone.
    ``log`` collects every (member, receivers, one tree?) asked."""
    groups, at = [], {}
    for s in sends:
        x, bs, k0, _ = s
        if x.reduce:
            groups.append([s])
            continue
        key = (x.src, bs, k0)
        if key in at:
            groups[at[key]].append(s)
        else:
            at[key] = len(groups)
            groups.append([s])
    out = []
    for g in groups:
        ok = len(g) == 1 or tree_ok(machine, pes[g[0][0].src], tuple(pes[y.dst] for y, *_ in g))
        if len(g) > 1 and log is not None:
            log.add((g[0][0].src, tuple(y.dst for y, *_ in g), ok))
        if ok:
            out.append(g)
        else:
            out.extend([s] for s in g)
    return out


def tree_ok(machine, src: int, dsts: tuple) -> bool:
    """Whether member PE ``src``'s HBM reaches the HBMs of ``dsts`` by one multicast tree."""
    try:
        root = tree([data_path(machine, machine.pes[src].hbm, machine.pes[d].hbm) for d in dsts])
    except MulticastError:
        return False
    return can_multicast(machine, root)
