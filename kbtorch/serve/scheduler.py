"""Batch schedulers of one engine: which requests run in the next iteration, with how many tokens.

One contract (:class:`Scheduler`): ``add`` a request, ``schedule`` a batch, ``complete`` it
when the step ends. One class per policy, by name in ``SCHEDULERS``:

- ``vllm``: vLLM v1's scheduler. A token budget (``max_num_batched_tokens``) and
  ``max_num_seqs``; the running requests first, in the order they were admitted, each taking
  what it still has to compute (a decode: one token; a prefill: the rest of its prompt, cut
  to the budget: chunked prefill); then the waiting ones, first come first served, with the
  blocks of their prompt that the prefix cache holds. A running request whose blocks cannot
  be allocated preempts the newest running one (by recompute: its blocks are freed and it
  waits again at the head of the queue); no new request is admitted in a step that preempted.
- ``sarathi``: Sarathi-Serve's stall-free batching: a fixed chunk (``chunk_tokens``) is the
  budget of every iteration; the decodes go first, then the running prefills' chunks, then new
  prefills.
- ``orca``: iteration-level scheduling without chunking: a prompt is computed whole in one
  iteration (it must fit the budget) and a request reserves the KV blocks of its whole length
  (prompt + output) when it is admitted, so it is never preempted.
- ``static``: static batching: when the engine is empty, up to ``max_num_seqs`` waiting requests
  (their prompts within the budget) form a batch, whose blocks are reserved whole; it runs until
  its last request finishes, and only then is the next batch formed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .kv import KVCache


@dataclass(frozen=True)
class SchedulerConfig:
    """``long_prefill_tokens``: vLLM's ``long_prefill_token_threshold`` (0: no cap on a chunk
    but the budget); ``chunk_tokens``: Sarathi's chunk; ``max_model_len``: prompt + output cap."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    chunk_tokens: int = 512
    long_prefill_tokens: int = 0
    max_model_len: int | None = None

    def __post_init__(self):
        for name in ("max_num_batched_tokens", "max_num_seqs", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"scheduler: {name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class BatchEntry:
    """One request's share of an iteration: ``context_tokens`` already in its KV cache before
    the step, ``new_tokens`` computed in it; ``prefill`` unless it is one decode token."""

    rid: int
    new_tokens: int
    context_tokens: int
    prefill: bool


class Seq:
    """A request's state inside an engine (mutable: the loop's own book)."""

    __slots__ = ("request", "computed", "generated", "token_s", "first_scheduled_s", "preemptions",
                 "cached_tokens", "replica", "ready")

    def __init__(self, request, replica: int):
        self.request, self.replica = request, replica
        self.computed = self.generated = self.preemptions = self.cached_tokens = 0
        #: tokens whose KV arrived with the request (a decode pool's, from its prefill pool): lost on preemption
        self.ready = 0
        self.token_s: list = []
        self.first_scheduled_s = None

    @property
    def tokens(self) -> int:
        return self.request.input_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.request.output_tokens


class Scheduler:
    """The contract; subclasses set the policy (``name``, ``chunked``, ``reserve_whole``)."""

    name = ""
    chunked = True
    reserve_whole = False

    def __init__(self, config: SchedulerConfig, kv: KVCache):
        self.config, self.kv = config, kv
        self.waiting: deque = deque()
        self.running: list = []
        self.budget = config.max_num_batched_tokens

    def refusal(self, request) -> str | None:
        """Why this engine can never serve ``request`` (None: it can)."""
        total = request.input_tokens + request.output_tokens
        if self.config.max_model_len is not None and total > self.config.max_model_len:
            return f"prompt + output of {total} tokens exceed max_model_len {self.config.max_model_len}"
        if self.kv.blocks_for(total) > self.kv.capacity:
            return (f"its {total} tokens need {self.kv.blocks_for(total)} KV blocks; the replica holds "
                    f"{self.kv.capacity}")
        if not self.chunked and request.input_tokens > self.budget:
            return (f"prompt of {request.input_tokens} tokens exceeds the token budget of {self.budget} "
                    f"and {self.name} does not chunk prefills")
        return None

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def schedule(self, now_s: float) -> list:
        """[(seq, new tokens)] of the next iteration (empty: nothing can run)."""
        raise NotImplementedError

    def complete(self, batch: list, now_s: float) -> list:
        """The step of ``batch`` ended at ``now_s``: count its tokens, emit the tokens of the
        requests that computed all they had -> the requests that finished (their blocks freed)."""
        finished = []
        for seq, n in batch:
            seq.computed += n
            self.kv.cache(seq.request, seq.computed)
            if seq.computed == seq.tokens:
                seq.generated += 1
                seq.token_s.append(now_s)
                if seq.done:
                    finished.append(seq)
        for seq in finished:
            self.running.remove(seq)
            self.kv.free(seq.request.id)
        return finished

    def _allocate(self, seq: Seq, n: int, prefix: list = ()) -> bool:
        whole = seq.request.input_tokens + seq.request.output_tokens
        return self.kv.allocate(seq.request, whole if self.reserve_whole else seq.computed + n, prefix)

    def _share(self, seq: Seq, budget: int) -> int:
        """Tokens ``seq`` takes of ``budget`` (0: none)."""
        left = seq.tokens - seq.computed
        if left > 1 and self.config.long_prefill_tokens:
            left = min(left, self.config.long_prefill_tokens)
        if not self.chunked and left > budget:
            return 0
        return min(left, budget)

    def _admit(self, batch: list, budget: int, now_s: float) -> int:
        """Admit waiting requests in order while the budget, ``max_num_seqs`` and the blocks
        allow -> the budget left."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            prefix = self.kv.cached_prefix(seq.request, seq.tokens) if seq.computed == 0 and not seq.ready else []
            computed = seq.ready or len(prefix) * self.kv.block_tokens
            seq.computed = computed
            n = self._share(seq, budget)
            if n == 0 or not self._allocate(seq, n, prefix):
                seq.computed = 0
                break
            if not seq.ready:
                seq.cached_tokens = max(seq.cached_tokens, computed)
            self.waiting.popleft()
            self.running.append(seq)
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s
            batch.append((seq, n))
            budget -= n
        return budget

    def _preempt(self, spare: set) -> Seq:
        """Preempt the newest running request not in this step's batch (``spare``: their ids) by
        recompute: its blocks freed, back at the head of the queue."""
        i = next(i for i in range(len(self.running) - 1, -1, -1) if id(self.running[i]) not in spare)
        victim = self.running.pop(i)
        self.kv.free(victim.request.id)
        victim.computed = victim.ready = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _run_running(self, order: list, batch: list, budget: int) -> tuple:
        """Schedule running requests in ``order``, preempting on a KV shortage -> (budget, preempted?)."""
        taken, gone = set(), set()
        for seq in order:
            if budget <= 0:
                break
            n = 0 if id(seq) in gone else self._share(seq, budget)
            if n == 0:
                continue
            while not self._allocate(seq, n):
                gone.add(id(self._preempt(taken)))
                if id(seq) in gone:
                    break
            else:
                batch.append((seq, n))
                taken.add(id(seq))
                budget -= n
        return budget, bool(gone)


class VllmScheduler(Scheduler):
    name = "vllm"

    def schedule(self, now_s: float) -> list:
        batch: list = []
        budget, preempted = self._run_running(list(self.running), batch, self.budget)
        if not preempted:
            self._admit(batch, budget, now_s)
        return batch


class SarathiScheduler(Scheduler):
    name = "sarathi"

    def __init__(self, config: SchedulerConfig, kv: KVCache):
        super().__init__(config, kv)
        self.budget = config.chunk_tokens

    def schedule(self, now_s: float) -> list:
        batch: list = []
        decodes = [s for s in self.running if s.tokens - s.computed == 1]
        order = decodes + [s for s in self.running if s.tokens - s.computed > 1]
        budget, preempted = self._run_running(order, batch, self.budget)
        if not preempted:
            self._admit(batch, budget, now_s)
        return batch


class OrcaScheduler(Scheduler):
    name = "orca"
    chunked = False
    reserve_whole = True

    def schedule(self, now_s: float) -> list:
        batch: list = []
        budget, _ = self._run_running(list(self.running), batch, self.budget)
        self._admit(batch, budget, now_s)
        return batch


class StaticScheduler(Scheduler):
    name = "static"
    chunked = False
    reserve_whole = True

    def schedule(self, now_s: float) -> list:
        batch: list = []
        if self.running:
            self._run_running(list(self.running), batch, self.budget)
        else:
            self._admit(batch, self.budget, now_s)
        return batch


SCHEDULERS = {cls.name: cls for cls in (VllmScheduler, SarathiScheduler, OrcaScheduler, StaticScheduler)}


def make_scheduler(name: str, config: SchedulerConfig, kv: KVCache) -> Scheduler:
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler: unknown policy '{name}' ({', '.join(SCHEDULERS)})")
    return SCHEDULERS[name](config, kv)
