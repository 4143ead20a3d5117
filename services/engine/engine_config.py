"""``EngineConfig``: the one typed configuration of an engine, validated when built."""

import math
from dataclasses import dataclass

from services.engine.model.backends import KERNEL_BACKENDS, default_kernels
from services.engine.parallel.layout import ParallelLayout

DEVICES = ("cpu", "cuda")
PREFETCH_POLICIES = ("best_effort", "wait", "timeout_ms")  # services/engine/prefetch_gate.py
PARALLEL_DEGREES = ("tp", "dcp", "pp", "pcp", "ep")
MAX_DRAFT_TOKENS = 16
SPEC_POLICIES = ("adaptive", "fixed")  # services/engine/speculative/spec_policy.py
KDA_ROLLBACKS = ("auto", "states", "replay")  # services/engine/model/spec_split.py


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs a model.

    Attributes:
        model: checkpoint folder.
        device: ``cpu`` or ``cuda`` (``cuda:N`` accepted).
        dtype: compute dtype name (``float32``, ``bfloat16``, ``float16``); None takes the checkpoint's.
        block_size: tokens per packed block of a rank's pool (with ``dcp > 1`` one block id covers
            ``dcp * block_size`` positions of a context, ``block_tokens``).
        num_blocks: blocks in the pool (of every rank); None sizes it to hold ``max_num_seqs`` contexts
            of ``max_model_len`` tokens.
        max_num_seqs: requests running at once (also the number of KDA state slots).
        max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
        max_model_len: longest prompt + generation a request may reach.
        batch_invariant: bitwise-reproducible numerics whatever the batch (DESIGN.md section 4).
        enable_prefix_caching: reuse cached blocks (and KDA snapshots) across requests.
        snapshot_stride: take a KDA state snapshot every this many blocks.
        num_snapshots: KDA snapshots kept for the prefix cache; None means ``max_num_seqs``.
        kv_format: ``auto`` (model dtype) or ``fp8`` (packed FP8 latents and index keys) block storage.
        kernels: the op families' backend, ``reference`` or ``triton``; None takes the default
            (``triton`` on CUDA, ``reference`` on the CPU and in batch-invariant mode). With
            ``batch_invariant`` it picks the invariant numerics' kernels instead: the torch ops
            (``reference``) or the fixed-tiling Triton kernels (``triton``, opt-in: no backward yet).
        cuda_graphs: replay CUDA graphs for pure-decode steps and the draft model's one-token forwards
            (CUDA only; a no-op on the CPU).
        adapters: ``NAME=FOLDER`` LoRA adapters (PEFT format, ``docs/adapters.md``) to load at start.
        host_cache_gib: the host-memory tier (HiCache, ``docs/hicache.md``) this engine owns in its
            process, in GiB of host memory split between KV pages and KDA snapshot pages; 0 turns the
            tier off (unless ``host_cache_address`` names a separate one).
        host_cache_address: ``HOST:PORT`` of a node's ``baton cache`` tier to use instead of one in
            this process ("" for none).
        host_cache_kda_fraction: the share of ``host_cache_gib`` given to KDA snapshots (the rest holds
            KV blocks).
        redis_l3_gib: a Redis L3 below this engine's own tier (``host_cache_gib``), GiB for the whole
            cluster; 0: none. The URL is the worker's ``redis_url`` (``EngineCore(redis_url=...)``). A
            node tier (``host_cache_address``) has its own (``baton cache --redis-l3-gib``).
        prefetch_policy: when a request waiting for its prefix to come from the L3 into the host tier may
            be admitted (``docs/hicache.md``, "Prefetch"): ``best_effort`` (whenever the scheduler would),
            ``wait`` (once the prefetch is over), ``timeout_ms`` (that, or ``prefetch_timeout_ms`` after
            its arrival).
        prefetch_timeout_ms: the ``timeout_ms`` policy's longest wait.
        tp, dcp, pp, pcp, ep: the parallel degrees (``services/engine/parallel/layout.py``): tensor,
            decode-context, pipeline and prefill-context parallel ranks (their product is the number
            of processes the engine runs as), and expert parallelism over ranks of one stage.
        draft_model: checkpoint folder of a draft model for speculative decoding ("" for none).
        num_draft_tokens: tokens the draft proposes per verify step (1 to 16; 0 with no draft model).
        spec_policy: ``adaptive`` (``speculative/spec_policy.py``: each step drafts the ``k`` up to
            ``num_draft_tokens`` that this engine measured to give the most tokens per second, 0 where
            speculation loses) or ``fixed`` (every step drafts ``num_draft_tokens``).
        tenant_cache_reserve_blocks: prefix-cache blocks each tenant keeps against other tenants' load
            (``cache/block_pool.py``: another tenant's allocation never evicts a tenant's cached blocks
            below this many; the engine's own host tier keeps as many pages a tenant; 0: none).
        kda_rollback: how a verify step can undo rejected drafts in the KDA state: ``states`` keeps the
            state after every draft in a slot of its own (``kernels/kda/token_slots.py``; every verify
            chunk is then ``1 + k`` tokens, which decode CUDA graphs replay), ``replay`` keeps one
            checkpoint after the tail and runs the accepted drafts again in the next step (the
            batch-invariant numerics' CF-BI rows need it); ``auto`` is ``replay`` with
            ``batch_invariant``, else ``states`` (``rollback``).
    """

    model: str
    device: str = "cpu"
    dtype: str | None = None
    block_size: int = 16
    num_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    batch_invariant: bool = False
    enable_prefix_caching: bool = True
    snapshot_stride: int = 1
    num_snapshots: int | None = None
    kv_format: str = "auto"
    kernels: str | None = None
    cuda_graphs: bool = True
    adapters: tuple[str, ...] = ()
    host_cache_gib: float = 0.0
    host_cache_address: str = ""
    host_cache_kda_fraction: float = 0.25
    redis_l3_gib: float = 0.0
    prefetch_policy: str = "best_effort"
    prefetch_timeout_ms: int = 500
    tp: int = 1
    dcp: int = 1
    pp: int = 1
    pcp: int = 1
    ep: int = 1
    draft_model: str = ""
    num_draft_tokens: int = 0
    spec_policy: str = "adaptive"
    kda_rollback: str = "auto"
    tenant_cache_reserve_blocks: int = 0

    def __post_init__(self):
        self.adapter_folders()  # raises naming ``adapters``
        if self.kv_format not in ("auto", "fp8"):
            raise ValueError(f"kv_format: {self.kv_format!r} is not supported (auto, fp8)")
        if self.kernels is not None and self.kernels not in KERNEL_BACKENDS:
            raise ValueError(f"kernels: {self.kernels!r} is not supported ({', '.join(KERNEL_BACKENDS)})")
        if self.device.split(":")[0] not in DEVICES:
            raise ValueError(f"device: {self.device!r} is not supported (cpu, cuda, cuda:N)")
        if self.dtype is not None and self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: {self.dtype!r} is not supported (float32, bfloat16, float16)")
        for name in (
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "snapshot_stride",
            *PARALLEL_DEGREES,
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if (self.tp * self.dcp) % self.ep:
            raise ValueError(
                f"ep: {self.ep} must divide tp x dcp = {self.tp * self.dcp} (expert parallelism spans ranks "
                "that hold the same tokens); pick a divisor"
            )
        reserve = self.tenant_cache_reserve_blocks
        if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
            raise ValueError(f"tenant_cache_reserve_blocks: must be an integer >= 0, got {reserve!r}")
        for name in ("num_blocks", "num_snapshots"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        self._check_host_cache()
        self._check_speculation()

    def _check_speculation(self) -> None:
        if self.spec_policy not in SPEC_POLICIES:
            raise ValueError(
                f"spec_policy: {self.spec_policy!r} is not supported ({', '.join(SPEC_POLICIES)})"
            )
        if self.kda_rollback not in KDA_ROLLBACKS:
            raise ValueError(
                f"kda_rollback: {self.kda_rollback!r} is not supported ({', '.join(KDA_ROLLBACKS)})"
            )
        if self.kda_rollback == "states" and self.batch_invariant:
            raise ValueError(
                "kda_rollback: states keeps per-token states on the default numerics' recurrent kernel; "
                "--batch-invariant's CF-BI rows need --kda-rollback replay (or auto)"
            )
        k = self.num_draft_tokens
        if not isinstance(k, int) or isinstance(k, bool):
            raise ValueError(f"num_draft_tokens: must be an integer, got {k!r}")
        if not self.draft_model:
            if k:
                raise ValueError(
                    f"num_draft_tokens: {k} drafts need a draft model; give --draft-model DIR or set "
                    "--num-draft-tokens 0"
                )
            return
        if not 1 <= k <= MAX_DRAFT_TOKENS:
            raise ValueError(
                f"num_draft_tokens: --draft-model needs --num-draft-tokens between 1 and {MAX_DRAFT_TOKENS} "
                f"(1-7 is the measured range), got {k}"
            )
        if self.world_size > 1:
            raise ValueError(
                f"draft_model: speculative decoding is not supported yet on a parallel engine "
                f"({self.world_size} ranks); drop --draft-model (and --num-draft-tokens) or run one rank"
            )

    def _check_host_cache(self) -> None:
        gib, fraction = self.host_cache_gib, self.host_cache_kda_fraction
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not math.isfinite(gib) or gib < 0:
            raise ValueError(f"host_cache_gib: must be a finite number >= 0 (0: no tier), got {gib!r}")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ValueError(f"host_cache_kda_fraction: must be in (0, 1), got {fraction!r}")
        self._check_l3()
        if not self.host_cache:
            return
        if gib > 0 and self.host_cache_address:
            raise ValueError(
                f"host_cache_address: {self.host_cache_address!r} names a separate tier, so --host-cache-gib "
                "(a tier in this process) must stay 0; give one of them"
            )
        if not self.enable_prefix_caching:
            raise ValueError(
                "host_cache_gib: the host tier is keyed by the prefix cache's block hashes; turn prefix "
                "caching on (--prefix-caching) or set --host-cache-gib 0"
            )
        if self.world_size > 1:
            raise ValueError(
                f"host_cache_gib: a host tier is not supported yet on a parallel engine ({self.world_size} "
                "ranks); set --host-cache-gib 0 (and no --host-cache-address) or run one rank"
            )

    def _check_l3(self) -> None:
        l3 = self.redis_l3_gib
        if isinstance(l3, bool) or not isinstance(l3, (int, float)) or not math.isfinite(l3) or l3 < 0:
            raise ValueError(f"redis_l3_gib: must be a finite number >= 0 (0: no L3), got {l3!r}")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"prefetch_policy: {self.prefetch_policy!r} is not one of {', '.join(PREFETCH_POLICIES)}"
            )
        timeout = self.prefetch_timeout_ms
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
            raise ValueError(f"prefetch_timeout_ms: must be an integer >= 0, got {timeout!r}")
        if l3 > 0 and self.host_cache_address:
            raise ValueError(
                f"redis_l3_gib: the node's tier at host_cache_address {self.host_cache_address!r} has its "
                "own L3 (baton cache --redis-l3-gib); set --redis-l3-gib 0 here"
            )
        if l3 > 0 and self.host_cache_gib == 0:
            raise ValueError(
                "redis_l3_gib: an L3 sits below a host tier: give --host-cache-gib too, or set 0"
            )

    @property
    def host_cache(self) -> bool:
        """Whether the engine uses a host tier (its own, or a ``baton cache`` at ``host_cache_address``)."""
        return self.host_cache_gib > 0 or bool(self.host_cache_address)

    def adapter_folders(self) -> dict[str, str]:
        """``adapters`` as ``{name: folder}``.

        Raises:
            ValueError: an entry that is not ``NAME=FOLDER``, or a name given twice (naming ``adapters``).
        """
        folders: dict[str, str] = {}
        for entry in self.adapters:
            name, sep, folder = entry.partition("=")
            if not sep or not name.strip() or not folder.strip():
                raise ValueError(f"adapters: {entry!r} is not NAME=FOLDER")
            if name.strip() in folders:
                raise ValueError(f"adapters: {name.strip()!r} is given twice")
            folders[name.strip()] = folder.strip()
        return folders

    @property
    def kernel_backend(self) -> str:
        """The backend the engine runs: ``kernels``, or the device's default."""
        return self.kernels or default_kernels(self.device, self.batch_invariant)

    @property
    def rollback(self) -> str:
        """``kda_rollback`` resolved: ``states`` or ``replay``."""
        if self.kda_rollback != "auto":
            return self.kda_rollback
        return "replay" if self.batch_invariant else "states"

    @property
    def layout(self) -> ParallelLayout:
        """The parallel degrees as a ``ParallelLayout`` (rank order, groups, validation)."""
        return ParallelLayout(tp=self.tp, dcp=self.dcp, pp=self.pp, pcp=self.pcp, ep=self.ep)

    @property
    def world_size(self) -> int:
        """Processes (ranks) the engine runs as: ``tp * dcp * pcp * pp`` (``ep`` regroups them)."""
        return self.layout.world_size

    @property
    def block_tokens(self) -> int:
        """Positions of a context one block id covers: ``dcp * block_size`` (each DCP rank stores
        ``block_size`` of them in its own pool's block of that id, ``parallel/dcp_shard.py``)."""
        return self.dcp * self.block_size

    @property
    def blocks_per_sequence(self) -> int:
        return -(-self.max_model_len // self.block_tokens)

    @property
    def pool_blocks(self) -> int:
        return self.num_blocks or self.blocks_per_sequence * self.max_num_seqs
