"""A paged KV cache, as vLLM's block manager: fixed blocks of ``block_tokens`` positions.

A request holds a list of blocks covering its computed and about-to-be-computed tokens.
With prefix caching, a block once full gets a key (:func:`block_key`: the request's
``hash_ids`` where they cover it, else the request itself) and stays findable after its
request frees it; free blocks wait in one LRU queue and a new allocation takes the least
recently freed first, evicting its key. A freed request's blocks go to the queue's tail in
reverse order (its last blocks are evicted first), as vLLM's ``FreeKVCacheBlockQueue``.
"""
from __future__ import annotations

from collections import OrderedDict

#: vLLM's default block size.
BLOCK_TOKENS = 16


def capacity_blocks(hbm_bytes: int, weight_bytes: int, reserve_bytes: int, kv_bytes_per_token: int,
                    block_tokens: int = BLOCK_TOKENS, override: int | None = None) -> int:
    """Blocks of the KV cache: the HBM left by the weights and an activation reserve, in whole
    blocks of ``block_tokens`` x ``kv_bytes_per_token``; ``override``: that many blocks.
    Zero blocks are refused, naming the figures."""
    if override is not None:
        blocks = override
        why = f"the block-count override is {override}"
    else:
        if kv_bytes_per_token < 1:
            raise ValueError(f"kv cache: kv_bytes_per_token must be positive, got {kv_bytes_per_token}")
        free = hbm_bytes - weight_bytes - reserve_bytes
        blocks = max(0, free) // (block_tokens * kv_bytes_per_token)
        why = (f"HBM {hbm_bytes} B - weights {weight_bytes} B - activation reserve {reserve_bytes} B = {free} B, "
               f"a block of {block_tokens} tokens takes {block_tokens * kv_bytes_per_token} B")
    if blocks < 1:
        raise ValueError(f"kv cache: zero blocks ({why})")
    return int(blocks)


def block_key(request, index: int, block_tokens: int) -> tuple:
    """The prefix-cache key of block ``index`` of ``request``'s tokens: from its ``hash_ids``
    where they cover the block (blocks of two requests with the same id there hold the same
    tokens), else private to the request (found again only by the request itself, after a
    preemption)."""
    end = (index + 1) * block_tokens
    per = request.hash_tokens // block_tokens
    # NOTE: hash blocks that are not a whole number of KV blocks share nothing.
    if per and request.hash_tokens % block_tokens == 0 and end <= min(len(request.hash_ids) * request.hash_tokens,
                                                                      request.input_tokens):
        return ("h", request.hash_ids[index // per], index % per)
    return ("r", request.id, index)


class KVCache:
    """Blocks of one engine: ``allocate`` / ``free`` per request, ``cache`` of full blocks,
    ``cached_prefix`` to find a prompt's blocks already computed."""

    def __init__(self, blocks: int, block_tokens: int = BLOCK_TOKENS, prefix_caching: bool = True):
        if blocks < 1:
            raise ValueError(f"kv cache: zero blocks (got {blocks})")
        if block_tokens < 1:
            raise ValueError(f"kv cache: block_tokens must be positive, got {block_tokens}")
        self.capacity, self.block_tokens, self.prefix_caching = blocks, block_tokens, prefix_caching
        self._ref = [0] * blocks
        self._key: list = [None] * blocks
        self._free: OrderedDict = OrderedDict((b, None) for b in range(blocks))
        self._by_key: dict = {}
        self._held: dict = {}

    @property
    def used(self) -> int:
        """Blocks held by requests (free cached blocks are not used: they can be evicted)."""
        return self.capacity - len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def cached_prefix(self, request, tokens: int) -> list:
        """The blocks holding the leading full blocks of ``request``'s first ``tokens`` tokens
        that are cached (at most ``tokens - 1`` positions: the last one is always computed, as
        vLLM does, to produce its logits)."""
        if not self.prefix_caching:
            return []
        found = []
        for i in range((tokens - 1) // self.block_tokens):
            block = self._by_key.get(block_key(request, i, self.block_tokens))
            if block is None:
                break
            found.append(block)
        return found

    def allocate(self, request, tokens: int, prefix: list = ()) -> bool:
        """Hold blocks for ``request``'s first ``tokens`` tokens, taking the cached ``prefix``
        blocks first (a request holding none yet); False (and nothing changed) if too few are free."""
        held = self._held.setdefault(request.id, [])
        if prefix and held:
            raise ValueError(f"kv cache: request {request.id} already holds blocks")
        new = self.blocks_for(tokens) - len(held) - len(prefix)
        revived = sum(1 for b in prefix if self._ref[b] == 0)
        if new + revived > len(self._free):
            if not held:
                del self._held[request.id]
            return False
        for b in prefix:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
            held.append(b)
        for _ in range(max(0, new)):
            b, _ = self._free.popitem(last=False)
            if self._key[b] is not None:
                del self._by_key[self._key[b]]
                self._key[b] = None
            self._ref[b] = 1
            held.append(b)
        return True

    def cache(self, request, computed_tokens: int) -> None:
        """Give a key to each of ``request``'s full blocks (of its first ``computed_tokens``)."""
        if not self.prefix_caching:
            return
        for i, b in enumerate(self._held.get(request.id, ())[:computed_tokens // self.block_tokens]):
            if self._key[b] is None:
                key = block_key(request, i, self.block_tokens)
                if key not in self._by_key:
                    self._key[b] = key
                    self._by_key[key] = b

    def free(self, rid: int) -> None:
        """Release the request's blocks: a block no request holds joins the free queue's tail."""
        for b in reversed(self._held.pop(rid, [])):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def check(self) -> None:
        """AssertionError unless the books agree (the tests' invariant)."""
        refs = [0] * self.capacity
        for blocks in self._held.values():
            for b in blocks:
                refs[b] += 1
        assert refs == self._ref, "kv cache: reference counts disagree with the held blocks"
        assert all((self._ref[b] == 0) == (b in self._free) for b in range(self.capacity)), "kv cache: free queue"
        assert all(self._key[b] == k for k, b in self._by_key.items()), "kv cache: key index"
