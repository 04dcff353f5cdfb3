"""Attention decomposition: which PE computes which rows against which keys, in which tiles.

Shapes: q ``[B, Hq, Lq, D]``, k and v ``[B, Hkv, Lk, D]``, ``G = Hq / Hkv`` query heads per
kv head (grouped-query attention). An *item* is one (batch, kv head) pair, a range of query
positions and a range of keys: its ``G x positions`` rows (every query head of the kv group,
packed, so K/V are read once for all of them) attend to its keys. Keys are cut into tiles
of ``bc`` (the last may be shorter) and tiles into *chunks* of ``chunk`` tiles: one online
softmax step of the kernel (a PE's first chunks grow and its last ones shrink, see
``chunk_sizes``). A chunk is one or two *runs* of equal tiles.

- **Prefill** (``prefill_plan``): one item per (batch, kv head, block of ``br`` query
  positions); with ``is_causal`` (torch's top-left mask: query i sees keys j <= i) a block's
  keys end at its last position + 1, so fully masked tiles are never visited and only the
  tiles that hold the diagonal are partial. Items go to PEs by longest-processing-time
  greedy (largest first, to the least loaded PE; ties to the lower rank): on the causal
  triangle this pairs long blocks with short ones.
- **Decode** (``decode_plan``): each (batch, kv head) gets a group of ``split`` PEs; PE
  ``r`` of a group takes the ``r``-th contiguous chunk of Lk and produces a partial (row max,
  row sum, unnormalised output, fp32). Partials are merged in two levels (``Tree``): the
  group is cut into ``b`` teams of ``a`` consecutive ranks (``a`` the largest divisor of
  ``split`` up to ``fan``, e.g. the 8 PEs of a CUBE) and the output columns into ``a``
  slices; member ``i`` of every team merges slice ``i`` of its team's partials (a
  reduce-scatter: each member sends every other member its slice), then member ``i`` of
  team 0 merges the ``b`` teams' slice ``i``, normalises it and writes it (the output's
  columns end up spread over team 0). Each level moves ``1/a`` of a partial per member.

Deploy assumption (as the GEMM's): each PE's HBM slice holds, per item, its Q rows followed
by the K/V rows it reads (packed ``[keys, 2, D]``: a key's K row then its V row), so an
item's first read brings its Q and first chunk in one transfer and every chunk is one
contiguous read (K/V rows shared by two items of a PE are stored twice: HBM capacity, not
bandwidth); the slice also receives the items' outputs. Getting the data there belongs to
the collectives.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from .contract import DTYPES

#: Grouped dealing (identical groups) is kept if its busiest PE has at most this much more work.
GROUPED_SLACK = 1.02


@dataclass(frozen=True)
class AttentionShape:
    """The problem: sizes, mask and element type."""

    b: int
    hq: int
    hkv: int
    lq: int
    lk: int
    d: int
    causal: bool = False
    dtype: str = "f16"

    @property
    def group(self) -> int:
        return self.hq // self.hkv

    @property
    def eb(self) -> int:
        return DTYPES[self.dtype].bytes

    def visible(self, pos: int) -> int:
        """Keys query position ``pos`` attends to (a prefix of the keys)."""
        return min(self.lk, pos + 1) if self.causal else self.lk

    @property
    def scores(self) -> int:
        """Unmasked scores (query, key pairs) of one query head."""
        if not self.causal:
            return self.lq * self.lk
        full = min(self.lq, self.lk)
        return full * (full + 1) // 2 + (self.lq - full) * self.lk


@dataclass(frozen=True)
class AttentionTiling:
    """``br`` query positions per prefill block (rows = G x br), ``bc`` keys per tile,
    ``chunk`` tiles per softmax step, ``tail`` keys of a PE's last chunk and ``shrink`` the
    ratio of the chunks before it (see ``chunk_sizes``); decode: ``split`` PEs per (batch,
    kv head), at most ``fan`` per team of the merge (see ``Tree``), and ``turns``: PEs that
    share an HBM controller take turns on it (see ``decode_plan``). NOTE: the defaults are
    tiling choices, not hardware."""

    br: int
    bc: int
    chunk: int = 4
    tail: int = 64
    shrink: int = 2
    split: int = 1
    fan: int = 8
    turns: bool = False

    def __post_init__(self):
        for name in ("br", "bc", "chunk", "tail", "shrink", "split", "fan"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"attention tiling: {name}={getattr(self, name)!r} must be a positive int")

    def describe(self) -> str:
        text = f"br {self.br}, bc {self.bc}, chunk {self.chunk}"
        if self.split > 1:
            text += f", split {self.split}, fan {self.fan}" + (", turns" if self.turns else "")
        return text


@dataclass(frozen=True)
class Item:
    """Batch ``b``, kv head ``h``, query positions ``[q0, q1)``, keys ``[k0, k1)``."""

    b: int
    h: int
    q0: int
    q1: int
    k0: int
    k1: int

    @property
    def positions(self) -> int:
        return self.q1 - self.q0


@dataclass(frozen=True)
class Chunk:
    """One softmax step of item ``item`` (its index on the PE): keys from ``k0`` in ``runs``
    of ``(tiles, keys per tile)``; ``masked`` if some of its keys lie past a row's position."""

    item: int
    k0: int
    runs: tuple
    first: bool
    last: bool
    masked: bool

    @property
    def keys(self) -> int:
        return sum(n * keys for n, keys in self.runs)


@dataclass(frozen=True)
class Tree:
    """A decode PE's place in its group's merge: ``teams`` teams of ``size`` members, this PE
    is member ``member`` of team ``team``; ``pes`` are the group's PEs by rank."""

    size: int
    teams: int
    team: int
    member: int
    pes: tuple

    def columns(self, d: int, i: int | None = None) -> tuple[int, int]:
        """Output columns of slice ``i`` (default: this member's)."""
        return split(d, self.size, self.member if i is None else i)


@dataclass(frozen=True)
class Work:
    """One PE's share: its items and their chunks in order; for a decode split its ``tree``
    and, when it shares an HBM controller with the next rank, ``lead`` (that PE: this one
    reads first, in one chunk, and tells it when its data has landed) or ``follows``."""

    pe: int
    items: tuple
    chunks: tuple
    tree: Tree | None = None
    lead: int | None = None
    follows: bool = False


def split(total: int, parts: int, i: int) -> tuple[int, int]:
    """The ``i``-th of ``parts`` balanced ranges of ``range(total)``."""
    base, extra = divmod(total, parts)
    lo = i * base + min(i, extra)
    return lo, lo + base + (1 if i < extra else 0)


def chunk_sizes(keys: int, tiling: AttentionTiling, up: bool, down: bool) -> list[int]:
    """Keys per chunk of an item of ``keys`` keys: full chunks of ``bc x chunk`` keys; ``up``
    (a prefill PE's first item) starts with one tile and grows by a tile per chunk, so the
    first read is short and each next read hides under the previous chunk's compute;
    ``down`` (a PE's last item) ends with chunks shrinking by ``shrink`` down to ``tail``
    keys, so little work is left once the last read has landed (the pipeline's drain)."""
    full = tiling.bc * tiling.chunk
    tail: list[int] = []
    size = min(tiling.tail, full)
    while down and size < full and sum(tail) + size <= keys // 2:
        tail.insert(0, size)
        size *= tiling.shrink
    sizes, rest, size = [], keys - sum(tail), tiling.bc if up else full
    while rest > 0:
        sizes.append(min(size, rest))
        rest -= sizes[-1]
        size = min(full, size + tiling.bc)
    if tail and len(sizes) > 1 and sizes[-1] < tail[0]:
        tail[0] += sizes.pop()              # no short chunk before the shrinking ones
    return sizes + tail


def chunks_of(item: Item, index: int, tiling: AttentionTiling, shape: AttentionShape, up: bool = False,
              down: bool = False, whole: bool = False) -> list[Chunk]:
    """The chunks of ``item`` (its index on the PE is ``index``); see ``chunk_sizes``;
    ``whole``: one chunk."""
    out, k = [], item.k0
    for size in [item.k1 - item.k0] if whole else chunk_sizes(item.k1 - item.k0, tiling, up, down):
        end = k + size
        full, rest = divmod(size, tiling.bc)
        runs = tuple(r for r in ((full, tiling.bc), (1, rest)) if r[0] and r[1])
        masked = shape.causal and end > item.q0 + 1
        out.append(Chunk(index, k, runs, k == item.k0, end == item.k1, masked))
        k = end
    return out


def _work(pe: int, items: list, tiling, shape, tree: Tree | None = None, lead: int | None = None,
          follows: bool = False) -> Work:
    chunks = [c for i, it in enumerate(items)
              for c in chunks_of(it, i, tiling, shape, up=i == 0 and tree is None, down=i == len(items) - 1,
                                 whole=lead is not None)]
    return Work(pe, tuple(items), tuple(chunks), tree, lead, follows)


def prefill_items(shape: AttentionShape, br: int) -> list[Item]:
    """One item per (batch, kv head, block of ``br`` positions), in that order."""
    out = []
    for b in range(shape.b):
        for h in range(shape.hkv):
            for q0 in range(0, shape.lq, br):
                q1 = min(shape.lq, q0 + br)
                out.append(Item(b, h, q0, q1, 0, shape.visible(q1 - 1)))
    return out


def assign(costs: list[float], pes: int) -> list[list[int]]:
    """Longest-processing-time greedy: item indices per PE rank, largest items first."""
    heap = [(0.0, r) for r in range(pes)]
    out: list[list[int]] = [[] for _ in range(pes)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(heap)
        out[r].append(i)
        heapq.heappush(heap, (load + costs[i], r))
    return out


def prefill_plan(shape: AttentionShape, tiling: AttentionTiling, pes: list) -> list[Work]:
    """The work of every PE that gets some (in group order).

    With at most as many (batch, kv head) pairs as PEs, each pair gets its own group of
    ``len(pes) // pairs`` consecutive PEs and its blocks are dealt inside the group, the
    same way for every pair (so groups run identical programs: see ``sim.symmetry``),
    unless dealing all blocks over all PEs balances clearly better."""
    items = prefill_items(shape, tiling.br)
    # NOTE: cost = rows x keys (the GEMM work) plus one tile of keys per item (its fixed costs)
    costs = [it.positions * (it.k1 - it.k0 + tiling.bc) for it in items]
    shares = assign(costs, min(len(pes), len(items)))
    pairs = shape.b * shape.hkv
    if pairs <= len(pes):
        per, n = len(pes) // pairs, len(items) // pairs      # items run pair by pair, same costs in each
        one = assign(costs[:n], min(per, n))
        if _busiest(one, costs) <= GROUPED_SLACK * _busiest(shares, costs):
            return [_work(pes[g * per + r], [items[g * n + i] for i in share], tiling, shape)
                    for g in range(pairs) for r, share in enumerate(one)]
    return [_work(pes[r], [items[i] for i in share], tiling, shape) for r, share in enumerate(shares) if share]


def _busiest(shares: list, costs: list) -> float:
    return max(sum(costs[i] for i in share) for share in shares)


def team_size(split_: int, fan: int, d: int) -> int:
    """Members per team: the largest divisor of ``split_`` up to ``fan`` and ``d``."""
    return max(a for a in range(1, min(split_, fan, d) + 1) if split_ % a == 0)


def decode_plan(shape: AttentionShape, tiling: AttentionTiling, pes: list,
                controller: dict | None = None) -> list[Work]:
    """Split-KV decode: ``tiling.split`` PEs per (batch, kv head); with one PE per pair the
    pairs are dealt round-robin and each PE's items run one after the other.

    With ``tiling.turns`` and ``controller`` (PE -> its HBM controller), ranks 2j and 2j + 1
    of a group on one controller take turns on it: 2j reads its keys in one transfer at the
    controller's full bandwidth while 2j + 1 waits, then 2j + 1 reads in shrinking chunks
    while 2j computes. NOTE: the controller link is the bottleneck either way; one long
    transfer instead of several short ones costs the simulation fewer events, but 2j + 1
    then computes as fast as its data arrives and its drain is longer (see the benchmark)."""
    pairs = [(b, h) for b in range(shape.b) for h in range(shape.hkv)]
    n = tiling.split
    if n == 1:
        shares: list = [[] for _ in range(min(len(pes), len(pairs)))]
        for i, (b, h) in enumerate(pairs):
            shares[i % len(shares)].append(Item(b, h, 0, shape.lq, 0, shape.lk))
        return [_work(pes[r], share, tiling, shape) for r, share in enumerate(shares)]
    if n * len(pairs) > len(pes):
        raise ValueError(f"attention: split={n} PEs for each of {len(pairs)} (batch, kv head) pairs needs "
                         f"{n * len(pairs)} PEs, the group has {len(pes)}")
    if n > shape.lk:
        raise ValueError(f"attention: split={n} is more than the {shape.lk} keys")
    a = team_size(n, tiling.fan, shape.d)
    works = []
    for g, (b, h) in enumerate(pairs):
        group = tuple(pes[g * n:(g + 1) * n])
        for r, pe in enumerate(group):
            k0, k1 = split(shape.lk, n, r)
            mate = group[r ^ 1] if r ^ 1 < n else None
            turn = tiling.turns and controller is not None and mate is not None and controller[pe] == controller[mate]
            works.append(_work(pe, [Item(b, h, 0, shape.lq, k0, k1)], tiling, shape,
                               Tree(a, n // a, r // a, r % a, group), mate if turn and r % 2 == 0 else None,
                               turn and r % 2 == 1))
    return works
