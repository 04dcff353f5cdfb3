"""The serving loop: an event-driven core over replicas (one engine each) behind a router.

Events sit in one heap keyed ``(time_s, kind, sequence number)``: at equal times arrivals come
before step ends (so a step ending when a request arrives schedules it), and among equals the
order they were pushed: a run is deterministic. An idle replica with work starts a step at
once every event of that instant is handled: its scheduler picks the batch, the step model times it, and the step ends after that
time plus the host overhead of a step; then its tokens are emitted (all at the step's end).

Routers (``ROUTERS``), each breaking ties by the lowest replica index: ``round-robin``;
``least-outstanding`` (fewest waiting + running requests); ``kv-load`` (lowest share of KV
blocks held, then least outstanding); ``prefix-affinity`` (most prompt blocks in the
replica's prefix cache, then least outstanding).

A request an engine can never serve (longer than its KV cache or ``max_model_len``, or a
prompt over the budget of a policy that does not chunk) is refused on arrival, with the reason.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

from .kv import BLOCK_TOKENS, KVCache
from .scheduler import BatchEntry, SchedulerConfig, Seq, make_scheduler

_ARRIVE, _STEP, _HANDOFF = 0, 1, 2


@dataclass(frozen=True)
class EngineConfig:
    """One engine (replica): its policy, KV blocks, and the host's time per step."""

    kv_blocks: int
    scheduler: str = "vllm"
    limits: SchedulerConfig = field(default_factory=SchedulerConfig)
    block_tokens: int = BLOCK_TOKENS
    prefix_caching: bool = True
    host_overhead_ns: float = 0.0

    def __post_init__(self):
        if self.host_overhead_ns < 0:
            raise ValueError(f"engine: host_overhead_ns must be >= 0, got {self.host_overhead_ns}")


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request; times in s from the run's start."""

    id: int
    replica: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    status: str
    reason: str = ""
    first_scheduled_s: float | None = None
    token_s: tuple = ()
    preemptions: int = 0
    cached_tokens: int = 0
    prefill_replica: int | None = None
    kv_transfer_s: tuple = ()


@dataclass(frozen=True)
class StepRecord:
    """One iteration of one replica: its batch's shape and the books when it was scheduled."""

    replica: int
    start_s: float
    end_s: float
    seqs: int
    new_tokens: int
    prefill_seqs: int
    kv_used_blocks: int
    waiting: int
    running: int


class Replica:
    def __init__(self, index: int, config: EngineConfig):
        self.index = index
        self.kv = KVCache(config.kv_blocks, config.block_tokens, config.prefix_caching)
        self.scheduler = make_scheduler(config.scheduler, config.limits, self.kv)
        self.batch: list = []
        self.busy = False


class Router:
    """Picks a replica for each arriving request (``name`` in ``ROUTERS``)."""

    def __init__(self, name: str):
        if name not in ROUTERS:
            raise ValueError(f"router: unknown '{name}' ({', '.join(ROUTERS)})")
        self.name, self._next = name, 0

    def pick(self, replicas: list, request) -> Replica:
        if self.name == "round-robin":
            self._next += 1
            return replicas[(self._next - 1) % len(replicas)]
        return min(replicas, key=lambda r: (*ROUTERS[self.name](r, request), r.index))


ROUTERS = {
    "round-robin": None,
    "least-outstanding": lambda r, req: (r.scheduler.outstanding,),
    "kv-load": lambda r, req: (r.kv.used / r.kv.capacity, r.scheduler.outstanding),
    "prefix-affinity": lambda r, req: (-len(r.kv.cached_prefix(req, req.input_tokens)), r.scheduler.outstanding),
}


@dataclass(frozen=True)
class Disaggregation:
    """Prefill/decode disaggregation: replicas ``0 .. prefill - 1`` compute prompts only (a
    request leaves them with its first token), the others decode. A request's KV cache
    (``kv_bytes_per_token`` x its prompt) then moves to a decode replica over one of ``links``
    links between the pools, each taking one transfer at a time (first come, first served),
    timed by ``transfer``: any object with ``transfer_ns(nbytes)`` and ``describe()``."""

    prefill: int
    transfer: object
    kv_bytes_per_token: int
    links: int = 1

    def __post_init__(self):
        for name in ("prefill", "kv_bytes_per_token", "links"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"disaggregation: {name} must be a positive integer, got {getattr(self, name)!r}")


def entries(batch: list) -> tuple:
    """The step model's view of a batch: per request, new tokens, context, prefill or decode."""
    return tuple(BatchEntry(s.request.id, n, s.computed, not (s.generated and n == 1)) for s, n in batch)


class _Run:
    """The state of one simulation: the heap, the replicas, the records."""

    def __init__(self, workload, step_model, engine: EngineConfig, replicas: int, router: str,
                 pd: Disaggregation | None = None):
        if replicas < 1:
            raise ValueError(f"serve: replicas must be positive, got {replicas}")
        if pd and not pd.prefill < replicas:
            raise ValueError(f"disaggregation: prefill {pd.prefill} of {replicas} replicas leaves no decode replica")
        self.step_model, self.engine, self.pd = step_model, engine, pd
        self.replicas = [Replica(i, engine) for i in range(replicas)]
        self.router = Router(router)
        self.pools = (self.replicas[:pd.prefill], self.replicas[pd.prefill:]) if pd else (self.replicas, [])
        self.decode_router = Router(router)
        self.links = [0.0] * (pd.links if pd else 0)
        self.transfers: list = []
        self.originals: dict = {}    # id -> the request, while its copy is in the prefill pool
        self.handed: dict = {}       # id -> (prefill replica, KV transfer span), once in the decode pool
        self.heap: list = []
        self.pushed = 0
        self.records: dict = {}
        self.steps: list = []
        reqs = list(workload.requests)
        if workload.concurrency:
            first, self.pending = reqs[:workload.concurrency], reqs[workload.concurrency:][::-1]
            reqs = [replace(r, arrival_s=0.0) for r in first]
        else:
            self.pending = []
        for r in reqs:
            self._push(r.arrival_s, _ARRIVE, r)

    def _push(self, t: float, kind: int, what) -> None:
        heapq.heappush(self.heap, (t, kind, self.pushed, what))
        self.pushed += 1

    def _release(self, t: float) -> None:
        """Closed loop: a request left, the next one arrives now."""
        if self.pending:
            self._push(t, _ARRIVE, replace(self.pending.pop(), arrival_s=t))

    def _record(self, seq: Seq, status: str, reason: str = "") -> None:
        r = seq.request
        if r.id in self.records:
            raise RuntimeError(f"serve: request {r.id} ended twice")
        handed = self.handed.get(r.id, (None, ()))
        self.records[r.id] = RequestRecord(r.id, seq.replica, r.arrival_s, r.input_tokens, r.output_tokens, status,
                                           reason, seq.first_scheduled_s, tuple(seq.token_s), seq.preemptions,
                                           seq.cached_tokens, *handed)

    def _arrive(self, t: float, request) -> None:
        rep = self.router.pick(self.pools[0], request)
        seq = Seq(request, rep.index)
        reason = rep.scheduler.refusal(request)
        if not reason and self.pd:
            reason = self.pools[1][0].scheduler.refusal(request)
        if reason:
            self._record(seq, "refused", reason)
            self._release(t)
            return
        if self.pd:
            # NOTE: the prefill pool's copy of the request ends with its first token.
            seq = Seq(replace(request, output_tokens=1), rep.index)
            self.originals[request.id] = request
        rep.scheduler.add(seq)

    def _hand_over(self, t: float, seq: Seq, request) -> None:
        """A prompt is done in the prefill pool: its KV moves to the decode pool over the first free link."""
        nbytes = request.input_tokens * self.pd.kv_bytes_per_token
        link = min(range(len(self.links)), key=lambda i: (self.links[i], i))
        start = max(t, self.links[link])
        end = self.links[link] = start + self.pd.transfer.transfer_ns(nbytes) * 1e-9
        self.transfers.append((link, start, end, nbytes))
        self._push(end, _HANDOFF, (seq, request, (start, end)))

    def _arrive_decode(self, t: float, what: tuple) -> None:
        prefilled, request, span = what
        rep = self.decode_router.pick(self.pools[1], request)
        seq = Seq(request, rep.index)
        seq.generated, seq.token_s, seq.ready = 1, list(prefilled.token_s), request.input_tokens
        seq.first_scheduled_s, seq.preemptions = prefilled.first_scheduled_s, prefilled.preemptions
        seq.cached_tokens = prefilled.cached_tokens
        self.handed[request.id] = (prefilled.replica, span)
        rep.scheduler.add(seq)

    def _start(self, rep: Replica, t: float) -> None:
        if rep.busy or not rep.scheduler.outstanding:
            return
        sched = rep.scheduler
        rep.batch = sched.schedule(t)
        if not rep.batch:
            raise RuntimeError(f"serve: replica {rep.index} has {sched.outstanding} requests and can schedule none")
        batch = entries(rep.batch)
        step_ns = self.step_model.step_ns_of(batch) + self.engine.host_overhead_ns
        end = t + step_ns * 1e-9
        self.steps.append(StepRecord(rep.index, t, end, len(batch), sum(e.new_tokens for e in batch),
                                     sum(e.prefill for e in batch), rep.kv.used, len(sched.waiting), len(sched.running)))
        rep.busy = True
        self._push(end, _STEP, rep.index)

    def _step_end(self, t: float, index: int) -> None:
        rep = self.replicas[index]
        for seq in rep.scheduler.complete(rep.batch, t):
            original = self.originals.pop(seq.request.id, None)
            if original is not None:
                if original.output_tokens > 1:
                    self._hand_over(t, seq, original)
                    continue
                seq.request = original
            self._record(seq, "finished")
            self._release(t)
        rep.batch, rep.busy = [], False

    def run(self) -> tuple:
        while self.heap:
            t, kind, _, what = heapq.heappop(self.heap)
            if kind == _ARRIVE:
                self._arrive(t, what)
            elif kind == _HANDOFF:
                self._arrive_decode(t, what)
            else:
                self._step_end(t, what)
            if not self.heap or self.heap[0][0] > t:
                for rep in self.replicas:
                    self._start(rep, t)
        return tuple(self.records[i] for i in sorted(self.records)), tuple(self.steps), tuple(self.transfers)


def simulate(workload, step_model, engine: EngineConfig, replicas: int = 1, router: str = "round-robin",
             pd: Disaggregation | None = None) -> tuple:
    """Serve ``workload`` -> (request records by id, step records in start order, KV transfers
    (link, start s, end s, bytes) in start order: none without ``pd``)."""
    return _Run(workload, step_model, engine, replicas, router, pd).run()
