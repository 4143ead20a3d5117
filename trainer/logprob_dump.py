"""The trainer's side of a log-prob dump (``docs/mismatch.md``): served trajectories read from a
``baton generate --out`` dump, and the trainer's recomputed log-probs written as one, path ``trainer``.

```python
served = read_trajectories("served.jsonl")                  # [(id, Trajectory)], adapters included
result = trajectory_logprobs(model, PackedBatch.pack([t for _, t in served]), adapters=...)
write_trainer_dump("trainer.jsonl", result, [i for i, _ in served], model,
                   checkpoint=checkpoint_fingerprint(folder), adapters=...)
# baton mismatch --mode rollout served.jsonl trainer.jsonl
```

The environment is filled as the engine fills it (``services/engine/dump_environment.py``); the trainer has
no paged cache, so ``kv_format`` is null (the rollout mode lets it differ).
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from mismatch import LogprobRecord, read_dump, write_dump
from mismatch.environment import Scalar
from services.engine.adapters.lora_adapter import LoraAdapter
from services.engine.dump_environment import adapters_flag, model_environment
from services.engine.model.causal_lm import CausalLM

from .trainer_forward import TrajectoryLogprobs
from .trajectory import Trajectory


def read_trajectories(path: str | Path) -> list[tuple[str | int, Trajectory]]:
    """The served requests of a dump as ``(id, Trajectory)`` in file order: ``prompt_ids``, the
    generated ``token_ids`` and the ``adapter`` they were served with (``baton generate`` records it).

    Raises:
        mismatch.DumpError: a bad file; ValueError: a record without ``prompt_ids``.
    """
    out = []
    for record in read_dump(path).records:
        if not record.prompt_ids:
            raise ValueError(f"{path}: request {record.request_id!r} has no prompt_ids to recompute from")
        adapter = record.extra.get("adapter", "")
        out.append((record.request_id, Trajectory(record.prompt_ids, record.token_ids, adapter)))
    return out


def trainer_records(result: TrajectoryLogprobs, ids: Sequence[str | int]) -> list[LogprobRecord]:
    """One record per packed trajectory (``ids[i]`` for trajectory ``i``): its generated tokens and
    their log-probs as float32 bits, its prompt, and its adapter when it has one."""
    trajectories = result.batch.trajectories
    if len(ids) != len(trajectories):
        raise ValueError(f"ids: {len(ids)} given for {len(trajectories)} trajectories")
    records = []
    for index, (request_id, trajectory) in enumerate(zip(ids, trajectories, strict=True)):
        values = result.of_generated(index).detach().to("cpu", torch.float32)
        records.append(
            LogprobRecord.from_bits(
                request_id,
                "trainer",
                trajectory.output_ids,
                values.view(torch.int32).tolist(),
                "float32",
                prompt_ids=trajectory.prompt_ids,
                extra={"adapter": trajectory.adapter} if trajectory.adapter else {},
            )
        )
    return records


def write_trainer_dump(
    path: str | Path,
    result: TrajectoryLogprobs,
    ids: Sequence[str | int],
    model: CausalLM,
    *,
    checkpoint: str,
    adapters: Mapping[str, LoraAdapter] | None = None,
    flags: Mapping[str, Scalar] | None = None,
) -> None:
    """Write ``result`` as a dump with path ``trainer``.

    Args:
        path: the file.
        result: ``trajectory_logprobs``'s output.
        ids: each packed trajectory's request id, as the served dump names it.
        model: the model that computed it (device, kernels, numerics and dtype are read from it).
        checkpoint: the base weights' fingerprint (``checkpoint_fingerprint(folder)``: the engine's).
        adapters: the adapters the forward was given (recorded as ``flags.adapters``, ``name@digest``;
            the digest is the folder's, so it names the weights as loaded, not after an update).
        flags: the trainer's other settings (micro-batch, packing, ...).
    """
    all_flags: dict[str, Scalar] = {"adapters": adapters_flag((adapters or {}).values()), **(flags or {})}
    environment = model_environment(model, checkpoint=checkpoint, kv_format=None, flags=all_flags)
    write_dump(path, environment, trainer_records(result, ids))
