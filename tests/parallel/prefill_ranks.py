"""The rank side of ``test_prefill_parallel.py``: what each of the 4 gloo ranks runs (every layout in
one group) and the one-process references, in a module the spawned ranks import without the test
suite's ``conftest`` (which imports transformers: seconds per rank)."""

import torch
import torch.distributed as dist

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.cache.layout import block_layout, slot_layout, stage_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.loader import load_model
from services.engine.model import build_step_metadata
from services.engine.model.config import LAYER_KDA
from services.engine.parallel.context import ParallelContext, build_parallel_context
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.pcp_cache import PcpMlaLayerCache
from services.engine.parallel.pcp_kda import PcpKda
from services.engine.parallel.pcp_prefill import pcp_forward_step
from services.engine.parallel.pipeline import PipelineStage, chunk_micro_batches

WORLD = 4
FAMILIES = ("kimi_linear", "deepseek_v32", "k3")
MODES = ("default", "invariant")
# chunks[step][seq]: new tokens (0: the sequence sits the step out); the last step is a decode step.
CHUNKS = [[37, 9, 50], [20, 0, 5], [0, 7, 0], [1, 1, 1]]


def token_ids(seed: int = 5) -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (3, 100), generator=gen).tolist()
    used, steps = [0, 0, 0], []
    for counts in CHUNKS:
        steps.append([ids[seq][used[seq] : used[seq] + n] for seq, n in enumerate(counts)])
        used = [u + n for u, n in zip(used, counts, strict=True)]
    return steps


def cache_contents(model, cache: ContiguousCache) -> dict[str, torch.Tensor]:
    """Every layer's cached rows of every sequence (MLA fields up to the longest sequence, KDA slots)."""
    out, length = {}, max(cache.num_tokens)
    for index, layer in enumerate(model.model.layers):
        if layer.is_kda:
            view = cache.kda(index)
            for name in ("recurrent", "conv", "open_k", "open_g", "open_delta", "open_count"):
                if getattr(view, name) is not None:
                    out[f"{index}.{name}"] = getattr(view, name).clone()
        else:
            view = cache.mla(index)
            for name in ("latent", "k_rope", "index_key"):
                if getattr(view, name) is not None:
                    out[f"{index}.{name}"] = getattr(view, name)[:, :length].clone()
    return out


def run_steps(model, context) -> tuple[list[torch.Tensor], list[dict]]:
    """Each step's logits and the cache afterwards; prefill steps through PCP when ``context`` is given."""
    weight = model.lm_head.weight
    invariant, tp = model.numerics.batch_invariant, model.parallel.tp
    cache = ContiguousCache(3, model.config, weight.dtype, weight.device, invariant, tp)
    logits, contents = [], []
    with torch.no_grad():
        for number, pieces in enumerate(token_ids()):
            steps = cache.steps(pieces)
            if context is not None and number < len(CHUNKS) - 1:
                out = pcp_forward_step(model, steps, cache.block_size, cache, context)
            else:
                topk = model.index_topk
                meta = build_step_metadata(steps, cache.block_size, weight.device, index_topk=topk)
                out = model.forward_step(meta, cache)
            cache.advance(pieces)
            logits.append(out.clone())
            contents.append(cache_contents(model, cache))
    return logits, contents


PP_CHUNK = 16
BLOCK = 16


def stage_cache(model, layers: range, invariant: bool) -> PagedModelCache:
    """Pools of ``layers`` only: block 0 padding, then each prompt's blocks; slot ``s`` for prompt ``s``."""
    dtype, device = torch.float32, "cpu"
    blocks_layout = stage_layout(block_layout(model.config, BLOCK, dtype), layers)
    open_rows = FIXED_CHUNK if invariant else 0
    slots_layout = stage_layout(slot_layout(model.config, dtype, open_rows, model.parallel.tp), layers)
    blocks = BlockPool(blocks_layout, BLOCK, 1 + sum(pp_blocks()), device)
    slots = StateSlotPool(slots_layout, len(CHUNKS[0]), device)
    blocks.allocate(1 + sum(pp_blocks()))
    for _ in CHUNKS[0]:
        slots.allocate()
    return PagedModelCache(blocks, slots, model.config, dtype)


def pp_blocks() -> list[int]:
    return [-(-n // BLOCK) for n in CHUNKS[0]]


def pp_micro_batches():
    firsts = [1 + sum(pp_blocks()[:s]) for s in range(len(CHUNKS[0]))]
    tables = [tuple(range(first, first + n)) for first, n in zip(firsts, pp_blocks(), strict=True)]
    return chunk_micro_batches(token_ids()[0], PP_CHUNK, tables, list(range(len(CHUNKS[0]))))


def run_pipeline(model, stage: PipelineStage | None, invariant: bool) -> tuple[list[torch.Tensor], dict]:
    """Every micro-batch's logits (last stage, or one process) and the stage's cache fields by layer."""
    layers = stage.layers if stage is not None else range(len(model.model.layers))
    cache = stage_cache(model, layers, invariant)
    with torch.no_grad():
        if stage is not None:
            logits = stage.prefill(pp_micro_batches(), BLOCK, cache)
        else:
            logits = []
            for steps in pp_micro_batches():
                meta = build_step_metadata(steps, BLOCK, "cpu", index_topk=model.index_topk)
                logits.append(model.forward_step(meta, cache))
    contents = {}
    for index in layers:
        fields = cache.kda(index) if model.config.layer_types[index] == LAYER_KDA else cache.mla(index)
        for name, value in vars(fields).items():
            if isinstance(value, torch.Tensor):
                contents[f"{index}.{name}"] = value.clone()
    return logits, contents


def count_calls(counts: dict) -> None:
    """Count the PCP exchanges' calls into ``counts`` (a rank's run that skipped them shows as 0)."""
    for cls, name in ((PcpKda, "forward"), (PcpKda, "short_conv"), (PcpMlaLayerCache, "write")):
        original = getattr(cls, name)

        def counted(self, *args, _original=original, _key=f"{cls.__name__}.{name}", **kwargs):
            counts[_key] = counts.get(_key, 0) + 1
            return _original(self, *args, **kwargs)

        setattr(cls, name, counted)


def rank_body(rank: int, size: int, checkpoints: dict) -> dict:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pcp4 = build_parallel_context(ParallelLayout(pcp=4))
    pp2_pcp2 = build_parallel_context(ParallelLayout(pcp=2, pp=2))
    tp2_pcp2 = build_parallel_context(ParallelLayout(tp=2, pcp=2))
    pcp2 = ParallelContext(ParallelLayout(pcp=2), rank % 2, pcp_group=pairs[0]) if rank < 2 else None
    pp2 = ParallelContext(ParallelLayout(pp=2), rank % 2, pp_group=pairs[1]) if rank >= 2 else None
    calls: dict[str, int] = {}
    count_calls(calls)
    results = {}

    def record(key, runner, *args):
        calls.clear()
        logits, cache = runner(*args)
        results[key] = {"logits": logits, "cache": cache, "calls": dict(calls)}

    def staged(path, invariant: bool, context: ParallelContext) -> PipelineStage:
        model = load_model(path, dtype=torch.float32, parallel=context)  # the stage's modules only
        model.set_batch_invariant(invariant)
        stage = PipelineStage.build(model, context)
        results[("parameters", path, context.layout)] = sum(p.numel() for p in model.parameters())
        return stage

    for family, path in checkpoints.items():
        model = load_model(path, dtype=torch.float32)
        results[("parameters", path, "full")] = sum(p.numel() for p in model.parameters())
        for mode in MODES:
            invariant = mode == "invariant"
            model.set_batch_invariant(invariant)
            if rank == 0:
                record((family, mode, "pcp1"), run_steps, model, None)
            if rank == 3:
                record((family, mode, "pp1"), run_pipeline, model, None, invariant)
            if pcp2 is not None:
                record((family, mode, "pcp2"), run_steps, model, pcp2)
            else:
                stage = staged(path, invariant, pp2)
                record((family, mode, "pp2"), run_pipeline, stage.model, stage, invariant)
            if family == "k3":
                record((family, mode, "pcp4"), run_steps, model, pcp4)
                stage = staged(path, invariant, pp2_pcp2)
                record((family, mode, "pp2_pcp2"), run_pipeline, stage.model, stage, invariant)
                sharded = load_model(path, dtype=torch.float32, parallel=tp2_pcp2)  # the rank's heads
                sharded.set_batch_invariant(invariant)
                record((family, mode, "tp2_pcp2"), run_steps, sharded, tp2_pcp2)
    return results
