"""How many ranks a model runs on, along which dimensions, and which rank sits where.

Rank order (tp fastest, then dcp, then pcp, then pp)::

    rank = tp_rank + tp * (dcp_rank + dcp * (pcp_rank + pcp * pp_rank))

    tp=2, dcp=1, pcp=2, pp=2 (8 ranks):
        stage 0: pcp 0 -> ranks 0 1 | pcp 1 -> ranks 2 3
        stage 1: pcp 0 -> ranks 4 5 | pcp 1 -> ranks 6 7

So one TP group is ``tp`` consecutive ranks, and one pipeline stage is ``tp * dcp * pcp`` consecutive
ranks. Expert parallelism does not add ranks: it regroups the ranks of one stage. ``ep`` consecutive
ranks of a stage form an EP group (``ep_rank = stage_index % ep``); the routed experts are sharded
over them and every EP group of a stage holds a full copy. Because each rank of an EP group computes
its experts for all of the group's tokens, the group must hold the same tokens: ``ep`` divides
``tp * dcp`` (PCP ranks hold different tokens).

Validation (``validate``) runs against the ``ModelConfig`` before any weight is read, and every error
names the flag to change.
"""

from dataclasses import dataclass

from services.engine.model.config import LAYER_KDA, LAYER_MLA, MLP_DENSE, MLP_MOE, ModelConfig

from .dcp_shard import check_dcp_numerics

DIMENSIONS = ("tp", "dcp", "pcp", "pp", "ep")
# In batch-invariant mode a row-parallel product is summed from this many fixed K segments whatever
# the TP degree (``row_parallel.py``), so TP must divide it.
INVARIANT_K_SEGMENTS = 8


@dataclass(frozen=True)
class RankCoordinates:
    """Where one rank sits: its index along each dimension (``ep`` is its index in its EP group)."""

    tp: int
    dcp: int
    pcp: int
    pp: int
    ep: int


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of tensor (``tp``), decode-context (``dcp``), prefill-context (``pcp``), pipeline (``pp``)
    and expert (``ep``) parallelism; every degree 1 is one process.

    Raises:
        ValueError: a degree below 1, or ``ep`` not dividing ``tp * dcp`` (module docstring).
    """

    tp: int = 1
    dcp: int = 1
    pp: int = 1
    pcp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in DIMENSIONS:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} {value}: a parallel degree must be an integer >= 1")
        if (self.tp * self.dcp) % self.ep:
            raise ValueError(
                f"--ep {self.ep}: expert parallelism spans ranks that hold the same tokens, so it must "
                f"divide tp x dcp = {self.tp * self.dcp}; pick --ep among its divisors"
            )

    @property
    def world_size(self) -> int:
        """Number of ranks (processes): ``tp * dcp * pcp * pp``."""
        return self.tp * self.dcp * self.pcp * self.pp

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: ``tp * dcp * pcp``."""
        return self.tp * self.dcp * self.pcp

    @property
    def is_single(self) -> bool:
        return self.world_size == 1

    def coordinates(self, rank: int) -> RankCoordinates:
        """The coordinates of ``rank`` (see the module docstring for the order).

        Raises:
            ValueError: ``rank`` outside ``[0, world_size)``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size}) for {self}")
        stage_index = rank % self.stage_size
        return RankCoordinates(
            tp=rank % self.tp,
            dcp=(rank // self.tp) % self.dcp,
            pcp=(rank // (self.tp * self.dcp)) % self.pcp,
            pp=rank // self.stage_size,
            ep=stage_index % self.ep,
        )

    def rank_of(self, tp: int = 0, dcp: int = 0, pcp: int = 0, pp: int = 0) -> int:
        """The rank at these coordinates (the inverse of ``coordinates`` on tp/dcp/pcp/pp)."""
        return tp + self.tp * (dcp + self.dcp * (pcp + self.pcp * pp))

    def groups(self, dimension: str) -> list[list[int]]:
        """Every group of ``dimension`` (one of ``DIMENSIONS``), each its ranks in increasing order;
        together they partition the ranks. A rank's index inside its group is its coordinate."""
        if dimension == "ep":
            return [list(range(start, start + self.ep)) for start in range(0, self.world_size, self.ep)]
        if dimension not in DIMENSIONS:
            raise ValueError(f"unknown parallel dimension {dimension!r}; one of {', '.join(DIMENSIONS)}")
        by_key: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            coords = self.coordinates(rank)
            key = tuple(getattr(coords, d) for d in ("tp", "dcp", "pcp", "pp") if d != dimension)
            by_key.setdefault(key, []).append(rank)
        return list(by_key.values())

    def validate(self, config: ModelConfig, batch_invariant: bool = False) -> None:
        """Check that this layout can shard ``config``; call before reading any weight.

        TP splits attention heads (MLA and the KDA heads), the dense MLP and the shared experts by
        intermediate size; EP splits the routed experts. In batch-invariant mode TP must also divide
        ``INVARIANT_K_SEGMENTS``, and DCP must be 1 (``check_dcp_numerics``). PP needs at least one layer
        per stage.

        Raises:
            ValueError: naming the flag and what it does not divide.
        """
        # (size TP splits, what it is, the row-parallel product's K it implies)
        splits = []
        if LAYER_MLA in config.layer_types:
            heads = config.num_attention_heads
            splits.append((heads, "attention heads", heads * config.v_head_dim))
        if config.kda is not None and LAYER_KDA in config.layer_types:
            heads = config.kda.num_heads
            splits.append((heads, "KDA heads", heads * config.kda.head_dim))
        if MLP_DENSE in config.mlp_types:
            size = config.intermediate_size
            splits.append((size, "the dense MLP's intermediate size", size))
        moe = config.moe if MLP_MOE in config.mlp_types else None
        if moe is not None and moe.num_shared_experts:
            size = moe.intermediate_size * moe.num_shared_experts
            splits.append((size, "the shared experts' intermediate size", size))
        for size, what, _ in splits:
            if size % self.tp:
                raise ValueError(f"--tp {self.tp}: does not divide {size} {what}; pick a divisor of {size}")
        if batch_invariant:
            if INVARIANT_K_SEGMENTS % self.tp:
                raise ValueError(
                    f"--tp {self.tp}: batch-invariant mode sums row-parallel products over "
                    f"{INVARIANT_K_SEGMENTS} fixed segments, so --tp must divide {INVARIANT_K_SEGMENTS}"
                )
            for _, what, k in splits:
                if k % INVARIANT_K_SEGMENTS:
                    raise ValueError(
                        f"--batch-invariant: the product after {what} has width {k}, not a multiple of "
                        f"{INVARIANT_K_SEGMENTS} segments; this model cannot run batch-invariant"
                    )
        if self.pp > config.num_hidden_layers:
            raise ValueError(
                f"--pp {self.pp}: more pipeline stages than the model's {config.num_hidden_layers} layers; "
                f"use --pp <= {config.num_hidden_layers}"
            )
        if self.ep > 1:
            if moe is None:
                raise ValueError(f"--ep {self.ep}: the model has no MoE layer; use --ep 1")
            if moe.num_experts % self.ep:
                raise ValueError(
                    f"--ep {self.ep}: does not divide {moe.num_experts} routed experts; "
                    f"pick a divisor of {moe.num_experts}"
                )
        check_dcp_numerics(self.dcp, batch_invariant)
