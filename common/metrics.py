"""Prometheus metrics (``baton_*``) and the ``/metrics`` endpoint every Baton process serves.

Names follow Prometheus conventions (base units, ``_seconds``, ``_bytes``, ``_total``); labels stay
bounded: no request ids, no prompts. Each process builds one ``Metrics`` on its own registry.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# The SLO targets (RouterConfig.slo_ttft_s = 2, slo_tpot_s = 0.1) must be bucket boundaries: the
# alerts in deploy/prometheus count bad requests as count - bucket{le=target}.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60, 120)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """Every ``baton_*`` metric; each process updates the ones its role owns.

    Args:
        role: ``router``, ``prefill``, ``decode`` or ``cache`` (the ``role`` label of the worker gauges).
    """

    def __init__(self, role: str):
        self.role = role
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "baton_time_to_first_token_seconds",
            "Request arrival to first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "baton_time_per_output_token_seconds",
            "(E2E - TTFT) / (output tokens - 1)",
            buckets=_TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "baton_inter_token_latency_seconds",
            "Gap between streamed tokens",
            buckets=_TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "baton_e2e_request_latency_seconds",
            "Request arrival to last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "baton_request_queue_time_seconds",
            "Waiting before work starts: router, for an admission seat; worker, arrival to first step",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "baton_requests_total", "Finished requests by outcome", ["status"], registry=r
        )
        self.prompt_tokens = Counter(
            "baton_prompt_tokens_total", "Prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter("baton_generation_tokens_total", "Generated tokens", registry=r)
        self.cached_tokens = Counter(
            "baton_cached_prompt_tokens_total", "Prompt tokens served from a prefix cache", registry=r
        )
        self.transfer_bytes = Counter(
            "baton_transfer_bytes_total", "State handed from prefill to decode", ["backend"], registry=r
        )
        self.handoff_refused = Counter(
            "baton_handoff_refused_total",
            "Handoffs a decode worker did not decode (rows not the prefill's): prefilled here instead",
            ["reason"],
            registry=r,
        )
        self.handoff_checks = Counter(
            "baton_handoff_checks_total",
            "Handoffs whose rows a decode worker hashed against the prefill worker's checksum",
            registry=r,
        )
        self.handoff_check_seconds = Counter(
            "baton_handoff_check_seconds_total",
            "Time a decode worker spent hashing handoffs before decoding them",
            registry=r,
        )
        self.handoff_draft_bytes = Counter(
            "baton_handoff_draft_bytes_total",
            "Of the state handed from prefill to decode, the draft model's rows (speculative decoding)",
            ["backend"],
            registry=r,
        )
        self.transfer_seconds = Counter(
            "baton_transfer_seconds_total", "Time spent in handoff writes", ["backend"], registry=r
        )
        self.handoff_decode_held_tokens = Counter(
            "baton_handoff_decode_held_tokens_total",
            "Prompt tokens a handoff did not send: the decode worker held their blocks (its own hit)",
            registry=r,
        )
        self.transfer_failures = Counter(
            "baton_transfer_failures_total", "Handoffs that failed", ["backend"], registry=r
        )
        self.handoff_fallbacks = Counter(
            "baton_handoff_fallbacks_total",
            "Requests re-prefilled after a failed prefill or handoff, by where they went",
            ["target"],
            registry=r,
        )
        self.local_prefills = Counter(
            "baton_local_prefills_total",
            "Requests the decode worker prefilled itself, by reason",
            ["reason"],
            registry=r,
        )
        self.migrations = Counter(
            "baton_migrations_total",
            "Requests whose decode stream was lost mid-stream, by what happened to them",
            ["outcome"],
            registry=r,
        )
        self.reservations_freed = Counter(
            "baton_reservations_freed_total",
            "Decode reservations freed before any Decode call took them over, by why",
            ["reason"],
            registry=r,
        )
        self.worker_up = Gauge(
            "baton_worker_up",
            "Whether the router can reach a worker (1) or not (0)",
            ["role", "worker"],
            registry=r,
        )
        self.blocks_used = Gauge("baton_kv_blocks_used", "Packed blocks in use", ["role"], registry=r)
        self.blocks_capacity = Gauge(
            "baton_kv_blocks_capacity", "Packed blocks in the pool", ["role"], registry=r
        )
        self.slots_used = Gauge("baton_kda_slots_used", "KDA state slots in use", ["role"], registry=r)
        self.slots_capacity = Gauge(
            "baton_kda_slots_capacity", "KDA state slots in the pool", ["role"], registry=r
        )
        self.engine_info = Gauge(
            "baton_engine_info",
            "1, labelled with how the worker's engine runs: kernel backend and decode CUDA graphs",
            ["role", "kernels", "cuda_graphs"],
            registry=r,
        )
        self.running = Gauge("baton_requests_running", "Requests running or reserved", ["role"], registry=r)
        self.waiting = Gauge("baton_requests_waiting", "Requests queued", ["role"], registry=r)
        self.slo_met = Counter(
            "baton_requests_slo_met_total",
            "Finished requests that met both the TTFT and the TPOT target (goodput)",
            registry=r,
        )
        self.router_queued = Gauge(
            "baton_router_queued_requests", "Requests waiting for an admission seat", registry=r
        )
        self.router_queued_limit = Gauge(
            "baton_router_queued_requests_limit", "Most requests that may wait (max_queued)", registry=r
        )
        self.router_inflight = Gauge(
            "baton_router_inflight_requests", "Requests holding an admission seat", registry=r
        )
        self.router_inflight_limit = Gauge(
            "baton_router_inflight_requests_limit", "Admission seats (max_running)", registry=r
        )
        self.hicache_redis_up = Gauge(
            "baton_hicache_redis_up",
            "1 while Redis (HiCache's cluster index and L3) answers, 0 while it does not",
            ["role"],
            registry=r,
        )
        self._init_host_tier_metrics()
        self._init_l3_metrics()
        self._init_worker_cache_metrics()
        self._init_spec_metrics()
        self._init_auth_metrics()

    def _init_host_tier_metrics(self) -> None:
        """The ``baton_hicache_*`` metrics of the node's host tier (``baton cache``), by ``kind``."""
        r = self.registry
        self.hicache_pages_used = Gauge(
            "baton_hicache_pages_used", "Host tier pages in use", ["kind"], registry=r
        )
        self.hicache_pages_capacity = Gauge(
            "baton_hicache_pages_capacity", "Host tier pages", ["kind"], registry=r
        )
        self.hicache_hits = Counter(
            "baton_hicache_hits_total",
            "Host tier hits: KV blocks found by match; KDA matches with a usable snapshot",
            ["kind"],
            registry=r,
        )
        self.hicache_misses = Counter(
            "baton_hicache_misses_total",
            "Host tier misses: KV blocks not found by match; KDA matches without a usable snapshot",
            ["kind"],
            registry=r,
        )
        self.hicache_evictions = Counter(
            "baton_hicache_evictions_total", "Host tier pages evicted for room", ["kind"], registry=r
        )
        self.hicache_checksum_failures = Counter(
            "baton_hicache_checksum_failures_total",
            "Host tier pages dropped because their checksum failed on read",
            ["kind"],
            registry=r,
        )
        self.hicache_bytes = Counter(
            "baton_hicache_bytes_total",
            "Page bytes committed into (in) and leased out of (out) the host tier",
            ["kind", "direction"],
            registry=r,
        )
        self._hicache_seen: dict[tuple[str, str], int] = {}  # (kind, field) -> the total last observed

    def observe_host_tier(self, stats: dict) -> None:
        """Refresh the ``baton_hicache_*`` metrics from ``HostTier.stats()`` (kind -> ``KindStats``,
        whose counters only grow)."""
        for kind, kind_stats in stats.items():
            self.hicache_pages_used.labels(kind).set(kind_stats.pages_used)
            self.hicache_pages_capacity.labels(kind).set(kind_stats.pages_total)
            for field, counter, labels in (
                ("hits", self.hicache_hits, (kind,)),
                ("misses", self.hicache_misses, (kind,)),
                ("evictions", self.hicache_evictions, (kind,)),
                ("checksum_failures", self.hicache_checksum_failures, (kind,)),
                ("bytes_in", self.hicache_bytes, (kind, "in")),
                ("bytes_out", self.hicache_bytes, (kind, "out")),
            ):
                total = getattr(kind_stats, field)
                counter.labels(*labels).inc(total - self._hicache_seen.get((kind, field), 0))
                self._hicache_seen[(kind, field)] = total

    def _init_l3_metrics(self) -> None:
        """HiCache's Redis L3 below the host tier (``baton cache``, or a worker's own tier) and the
        workers' prefetch from it (``docs/hicache.md``, "L3 (Redis)" and "Prefetch")."""
        r = self.registry
        self.hicache_l3_hits = Counter(
            "baton_hicache_l3_hits_total",
            "L3 hits of prefetches: KV pages found; KDA prefetches that found a deeper snapshot",
            ["kind"],
            registry=r,
        )
        self.hicache_l3_misses = Counter(
            "baton_hicache_l3_misses_total",
            "L3 misses of prefetches: KV pages not found; KDA prefetches that found no deeper snapshot",
            ["kind"],
            registry=r,
        )
        self.hicache_l3_bytes = Counter(
            "baton_hicache_l3_bytes_total",
            "Page bytes read from the L3 into the host tier (read), written back to it on eviction (write)",
            ["kind", "direction"],
            registry=r,
        )
        self.hicache_l3_writeback_dropped = Counter(
            "baton_hicache_l3_writeback_dropped_total",
            "Evicted pages not written to the L3 (write-back queue full, checksum changed, Redis down)",
            ["kind"],
            registry=r,
        )
        self.hicache_prefetches = Counter(
            "baton_hicache_prefetches_total",
            "Worker prefetches from the L3: started; at admission completed, timed_out (the timeout_ms "
            "policy let the request go first) or not_waited (best_effort, unfinished)",
            ["outcome"],
            registry=r,
        )
        self.hicache_prefetch_wait = Histogram(
            "baton_hicache_prefetch_wait_seconds",
            "Arrival to the moment the prefetch policy let a request be admitted",
            ["policy"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._l3_seen: dict[tuple[str, str], int] = {}

    def observe_l3(self, stats: dict) -> None:
        """Refresh the ``baton_hicache_l3_*`` counters from ``TierL3.stats()`` (kind -> ``L3KindStats``,
        whose counters only grow)."""
        for kind, kind_stats in stats.items():
            for field, counter, labels in (
                ("hits", self.hicache_l3_hits, (kind,)),
                ("misses", self.hicache_l3_misses, (kind,)),
                ("bytes_read", self.hicache_l3_bytes, (kind, "read")),
                ("bytes_written", self.hicache_l3_bytes, (kind, "write")),
                ("dropped", self.hicache_l3_writeback_dropped, (kind,)),
            ):
                total = getattr(kind_stats, field)
                counter.labels(*labels).inc(total - self._l3_seen.get((kind, field), 0))
                self._l3_seen[(kind, field)] = total

    def observe_prefetches(self, outcomes) -> None:
        """Count prefetch outcomes (``PrefetchOutcome``s: ``policy``, ``outcome``, ``wait_s``; ``wait_s``
        None for ``started``)."""
        for outcome in outcomes:
            self.hicache_prefetches.labels(outcome.outcome).inc()
            if outcome.wait_s is not None:
                self.hicache_prefetch_wait.labels(outcome.policy).observe(outcome.wait_s)

    def _init_worker_cache_metrics(self) -> None:
        """A worker's prefix cache: where hits came from, and its traffic with its host tier."""
        r = self.registry
        self.prefix_hit_tokens = Counter(
            "baton_prefix_cache_hit_tokens_total",
            "Prompt tokens of admitted requests whose cached KV or KDA state came from a cache tier",
            ["tier", "kind"],
            registry=r,
        )
        self.prefix_evictions = Counter(
            "baton_prefix_cache_evictions_total",
            "Cached device blocks reused for other requests (evicted from the device prefix cache)",
            registry=r,
        )
        self.hicache_moved_bytes = Counter(
            "baton_hicache_moved_bytes_total",
            "Page bytes a worker moved to its host tier and from it to the device",
            ["kind", "direction"],
            registry=r,
        )
        self.hicache_offloads = Counter(
            "baton_hicache_offloads_total",
            "Cached device blocks copied to the host tier as the device pool reused them",
            registry=r,
        )
        self.hicache_saves_skipped = Counter(
            "baton_hicache_saves_skipped_total",
            "Pages a worker did not save because the host tier had no room (every page leased)",
            ["kind"],
            registry=r,
        )
        self.hicache_load_fallbacks = Counter(
            "baton_hicache_load_fallbacks_total",
            "Loads from the host tier given up for recomputing, by why",
            ["reason"],
            registry=r,
        )
        self.hicache_tier_up = Gauge(
            "baton_hicache_tier_up",
            "1 while the worker's host tier answers, 0 while it does not",
            ["role"],
            registry=r,
        )
        self.hicache_tier_reconnects = Counter(
            "baton_hicache_tier_reconnects_total",
            "Times the worker attached to its host tier again (after an outage, or to a restarted tier)",
            registry=r,
        )
        self._cache_seen: dict[tuple, int] = {}  # (metric, labels) -> the total last observed

    def observe_prefix_cache(self, counts, events) -> None:
        """Refresh the worker's prefix-cache metrics from an engine pass: ``counts`` (a ``CacheCounts``
        of totals; with a tier in the worker's process, that tier's ``baton_hicache_*`` too) and the
        pass's prefix-cache ``events`` (``CacheEvent``s; evictions counted)."""
        self.prefix_evictions.inc(sum(1 for event in events if not event.inserted))
        totals = [(self.prefix_hit_tokens, labels, n) for labels, n in counts.hit_tokens.items()]
        if counts.host_tier:  # a tier in this worker's process: nobody else exports it
            self.observe_host_tier(counts.host_tier)
        if counts.tier_up is not None:  # the rest exists only with a tier
            self.hicache_tier_up.labels(self.role).set(int(counts.tier_up))
            totals += [(self.hicache_moved_bytes, labels, n) for labels, n in counts.moved_bytes.items()]
            totals += [(self.hicache_saves_skipped, (kind,), n) for kind, n in counts.saves_skipped.items()]
            totals += [(self.hicache_load_fallbacks, (why,), n) for why, n in counts.load_fallbacks.items()]
            totals += [(self.hicache_offloads, (), counts.offloads)]
            totals += [(self.hicache_tier_reconnects, (), counts.tier_reconnects)]
        _grow(totals, self._cache_seen)

    def _init_auth_metrics(self) -> None:
        """The router's public-API authentication (``--auth-token-file``)."""
        r = self.registry
        self.auth_refused = Counter(
            "baton_auth_refused_total",
            "Public calls refused: missing, malformed or invalid token; tenant (token bound to another)",
            ["reason"],
            registry=r,
        )
        self.router_rate_limited = Counter(
            "baton_router_rate_limited_total",
            "Generate requests refused because their tenant was over --tenant-rate-limit (HTTP 429)",
            registry=r,
        )
        self.auth_reload_failures = Counter(
            "baton_auth_token_file_reload_failures_total",
            "Changed --auth-token-file that failed to load (the previous tokens stay)",
            registry=r,
        )
        self.tls_reload_failures = Counter(
            "baton_tls_reload_failures_total",
            "Changed --tls-cert / --tls-key / --tls-client-ca files that failed to load (the previous stay)",
            registry=r,
        )

    def _init_spec_metrics(self) -> None:
        """Speculative decoding on a worker whose engine drafts (its ``SpecCounts``)."""
        r = self.registry
        self.spec_accepted_length = Counter(
            "baton_spec_accepted_length_total",
            "Verify steps of one request by how many of its drafts the target accepted (length 0..k)",
            ["length"],
            registry=r,
        )
        self.spec_drafted_tokens = Counter(
            "baton_spec_drafted_tokens_total",
            "Drafted tokens the target verified, by draft position (0-based)",
            ["position"],
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "baton_spec_accepted_tokens_total",
            "Drafted tokens the target accepted, by draft position (0-based)",
            ["position"],
            registry=r,
        )
        self.spec_draft_seconds = Counter(
            "baton_spec_draft_seconds_total", "Wall time the draft proposer took to draft", registry=r
        )
        self.spec_target_seconds = Counter(
            "baton_spec_target_seconds_total", "Wall time the target's steps took", registry=r
        )
        self.spec_draft_tokens = Gauge(
            "baton_spec_draft_tokens",
            "Tokens drafted per request in the last step with requests to draft for (0: a plain step; "
            "--spec-policy adaptive chooses it)",
            registry=r,
        )
        self.spec_steps = Counter(
            "baton_spec_steps_total",
            "Steps with requests to draft for, by tokens drafted per request (draft_tokens 0: plain steps "
            "the policy chose)",
            ["draft_tokens"],
            registry=r,
        )
        self._spec_seen: dict[tuple, float] = {}  # (metric, labels) -> the total last observed

    def observe_spec(self, counts) -> None:
        """Refresh the ``baton_spec_*`` counters from an engine pass's ``SpecCounts`` (totals since the
        engine started); None (an engine that drafts nothing) changes nothing."""
        if counts is None:
            return
        totals = [(self.spec_accepted_length, (str(n),), t) for n, t in enumerate(counts.accepted_lengths)]
        totals += [(self.spec_drafted_tokens, (str(i),), t) for i, t in enumerate(counts.drafted_by_position)]
        totals += [
            (self.spec_accepted_tokens, (str(i),), t) for i, t in enumerate(counts.accepted_by_position)
        ]
        totals += [(self.spec_draft_seconds, (), counts.draft_seconds)]
        totals += [(self.spec_target_seconds, (), counts.target_seconds)]
        totals += [(self.spec_steps, (str(k),), t) for k, t in enumerate(counts.steps_by_draft_tokens)]
        _grow(totals, self._spec_seen)
        self.spec_draft_tokens.set(counts.draft_tokens)

    def redis_health(self, up: bool) -> None:
        """``baton_hicache_redis_up`` for this process's role (a ``RedisLink``'s ``on_health``)."""
        self.hicache_redis_up.labels(self.role).set(int(up))

    def record_engine(self, info) -> None:
        """Set ``baton_engine_info`` from an engine's resolved configuration (an ``EngineInfo``, once,
        at start)."""
        graphs = "on" if info.cuda_graphs else "off"
        self.engine_info.labels(self.role, info.kernels, graphs).set(1)

    def observe_load(self, load) -> None:
        """Refresh the pool and queue gauges from a ``WorkerLoad`` (the engine's, once per pass)."""
        self.blocks_used.labels(self.role).set(load.used_blocks)
        self.blocks_capacity.labels(self.role).set(load.total_blocks)
        self.slots_used.labels(self.role).set(load.used_slots)
        self.slots_capacity.labels(self.role).set(load.total_slots)
        self.running.labels(self.role).set(load.running)
        self.waiting.labels(self.role).set(load.waiting)

    def observe_queue_times(self, seconds: tuple[float, ...]) -> None:
        """Record the queue times of the requests an engine pass started."""
        for value in seconds:
            self.queue_time.observe(value)

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0 picks a free port); returns the bound port."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port


def _grow(totals: list[tuple], seen: dict[tuple, float]) -> None:
    """Raise each ``(counter, labels, total)`` by how far ``total`` grew since the last call (``seen``:
    ``(counter, labels) -> total``, updated): the engine reports totals, Prometheus counters grow."""
    for counter, labels, total in totals:
        child = counter.labels(*labels) if labels else counter
        key = (counter, labels)
        child.inc(total - seen.get(key, 0))
        seen[key] = total
