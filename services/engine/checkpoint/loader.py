"""Stream a checkpoint folder's safetensors into a freshly built model, tensor by tensor."""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch.overrides import TorchFunctionMode

from services.engine.model.causal_lm import FLOAT32_PARAMETERS, CausalLM
from services.engine.model.config import ModelConfig
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.pipeline import held_by_other_stage, keep_stage, stage_position
from services.engine.parallel.shard import Shard, model_shards

from .tensor_names import NameMapper, Target


class CheckpointError(ValueError):
    """A checkpoint tensor is missing, unexpected, misshapen or written twice; the message names it."""


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a folder: from ``model.safetensors.index.json`` when present."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({model_dir / f for f in weight_map.values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors files")
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in model.safetensors.index.json but missing")
    return files


def load_model(
    model_dir: str | Path,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    parallel: ParallelContext | None = None,
) -> CausalLM:
    """Validate the config, build the model and stream its weights in.

    Args:
        model_dir: a Hugging Face checkpoint folder.
        device: where the parameters live.
        dtype: parameter dtype (default: the config's ``torch_dtype``); a few router and gate
            parameters stay float32 (``FLOAT32_PARAMETERS``).
        parallel: this rank's context: the model holds, and the loader copies, only the rank's shard
            of each sharded tensor (``services.engine.parallel.shard``) and, under PP, only its
            stage's modules (``services.engine.parallel.pipeline``); None is one process.

    Returns:
        The model in eval mode.

    Raises:
        ConfigError: the config is invalid (before anything else is read).
        ValueError: the parallel layout does not fit the model (before any weight is read).
        CheckpointError: a tensor is missing, unexpected, of the wrong shape, or given twice.
    """
    model_dir = Path(model_dir)
    config = load_model_config(model_dir)
    if parallel is not None:
        parallel.layout.validate(config)
    files = checkpoint_files(model_dir)
    dtype = dtype or getattr(torch, config.torch_dtype)
    model = build_empty_model(config, device, dtype, parallel)
    _stream_weights(model, config, files)
    return model.eval()


def build_empty_model(
    config: ModelConfig, device: str, dtype: torch.dtype, parallel: ParallelContext | None = None
) -> CausalLM:
    """Allocate the model's parameters (the rank's shards under ``parallel``), uninitialised, directly in
    their final dtypes (filled by the caller).

    Dtypes are set while the parameters are still on the meta device, so memory is allocated once.
    """
    model = meta_model(config, parallel)
    if parallel is not None and parallel.layout.pp > 1:  # the stage's modules only
        keep_stage(model, *stage_position(parallel, config.num_hidden_layers))
    for name, param in model.named_parameters():
        param.requires_grad_(False)
        param.data = param.data.to(torch.float32 if name.endswith(FLOAT32_PARAMETERS) else dtype)
    # ``to_empty`` without its ``empty_like`` of meta tensors, a Python reference whose first call imports
    # torch's meta registrations and sympy (about 1 s of CPU in each worker and rank process).
    model = model._apply(lambda tensor: torch.empty(tensor.shape, dtype=tensor.dtype, device=device))
    if config.tie_word_embeddings and isinstance(model.lm_head, torch.nn.Linear):
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def meta_model(config: ModelConfig, parallel: ParallelContext | None = None) -> CausalLM:
    """``CausalLM(config, parallel)`` on the meta device (shapes and dtypes, no memory), built without
    running its initialisers (``_SkipInitialisers``)."""
    with torch.device("meta"), _SkipInitialisers():
        return CausalLM(config, parallel)


class _SkipInitialisers(TorchFunctionMode):
    """Skips ``torch.nn.init``'s initialisers (the modules' ``reset_parameters``) while a model is built on
    the meta device, where there are no values to initialise. On meta some of them (``normal_``, which
    ``nn.Embedding`` uses) run as Python references whose first call imports ``torch._dynamo``: about
    2.5 s of CPU in every process that loads a model, each worker and each rank.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def _stream_weights(model: CausalLM, config: ModelConfig, files: list[Path]) -> None:
    params = dict(model.named_parameters())
    layers, tied = config.num_hidden_layers, config.tie_word_embeddings
    shards = model_shards(model)
    mapper = NameMapper(config, set(params))
    filled: dict[str, int] = {name: 0 for name in params}
    # Regions written so far: parameter -> expert (None: not per expert) -> [(target, tensor name)].
    written: dict[str, dict[int | None, list[tuple[Target, str]]]] = {name: {} for name in params}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if mapper.is_skipped(name) or held_by_other_stage(name, model.parallel, layers, tied):
                    continue
                target = mapper.resolve(name)
                if target is None:
                    raise CheckpointError(
                        f"{file.name}: unexpected tensor {name!r} (no parameter of this "
                        f"{config.family} model takes it)"
                    )
                _check_not_written(written, target, name, file.name)
                shard = shards.get(target.parameter)
                if shard is None:
                    destination, tensor = (
                        _destination(params[target.parameter], target),
                        handle.get_tensor(name),
                    )
                else:
                    placed = _shard_destination(
                        params[target.parameter], target, shard, handle.get_tensor(name)
                    )
                    if placed is None:  # none of this tensor is the rank's
                        continue
                    destination, tensor = placed
                if tensor.shape != destination.shape:
                    raise CheckpointError(
                        f"{file.name}: tensor {name!r} has shape {list(tensor.shape)}, expected "
                        f"{list(destination.shape)} for {target.describe()}"
                    )
                destination.copy_(tensor)
                filled[target.parameter] += destination.numel()
    missing = [name for name, count in filled.items() if count != params[name].numel()]
    if missing:
        first = missing[0]
        raise CheckpointError(
            f"missing tensor {first!r} ({len(missing)} parameters incomplete: "
            f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})"
        )


def _check_not_written(written: dict, target: Target, name: str, file_name: str) -> None:
    by_expert = written[target.parameter]
    if target.expert is None:
        candidates = [region for regions in by_expert.values() for region in regions]
    else:
        candidates = by_expert.get(target.expert, []) + by_expert.get(None, [])
    for earlier, earlier_name in candidates:
        if target.overlaps(earlier):
            raise CheckpointError(
                f"{file_name}: tensor {name!r} writes {target.describe()}, already filled by {earlier_name!r}"
            )
    by_expert.setdefault(target.expert, []).append((target, name))


def _destination(param: torch.Tensor, target: Target) -> torch.Tensor:
    view = param.data
    if target.expert is not None:
        view = view[target.expert]
    if target.rows is not None:
        view = view[target.rows[0] : target.rows[1]]
    return view


def _shard_destination(
    param: torch.Tensor, target: Target, shard: Shard, tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where the rank's part of checkpoint ``tensor`` (at ``target``, in full coordinates) goes in its
    ``param`` (the rank's ``shard``), and that part; None when the rank holds none of it.

    An expert shard (EP) cuts dim 0 of a fused expert parameter; a TP shard cuts a dim of a plain one,
    where a hub tensor may fill a row range of dim 0 (KDA's q/k/v short convs).
    """
    view = param.data
    if target.expert is not None:  # a per-expert tensor: only an EP shard cuts the expert dim
        local = target.expert - shard.index * view.shape[0]
        if not 0 <= local < view.shape[0]:
            return None
        view = view[local]
        if target.rows is not None:
            view = view[target.rows[0] : target.rows[1]]
        return view, tensor
    if target.rows is None:
        if tensor.dim() <= shard.dim or tensor.shape[shard.dim] % (shard.count * shard.blocks):
            return view, tensor  # not the parameter's shape: the caller's shape check names it
        return view, shard.take(tensor)
    # rows (r0, r1) of dim 0 of the full parameter; the full dim 0 is ``count`` times the rank's.
    r0, r1 = target.rows
    held = shard.full_indices(view.shape[0] * shard.count)
    inside = ((held >= r0) & (held < r1)).nonzero().flatten()
    if inside.numel() == 0:
        return None
    first, last = int(inside[0]), int(inside[-1]) + 1
    return view[first:last], tensor.index_select(0, held[first:last] - r0)
