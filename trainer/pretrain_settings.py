"""``PretrainSettings``: one training run's typed settings, its flags (``baton train`` and
``python -m trainer.pretrain``), validation naming the flag, and which settings a resumed run must keep."""

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from services.engine.checkpoint.presets import preset_config

DEFAULT_CORPUS = "tools.demo_model.corpus"  # the demo corpus (issue 17): train_documents / heldout_documents
# Settings a resumed run may change: they steer this run and its output, not what the model learns.
RESUMABLE_CHANGES = ("out", "max_minutes", "stop_after", "device", "eval_every", "max_shard_mib")


@dataclass(frozen=True)
class PretrainSettings:
    """A pretraining or distillation run (``docs/training.md``); every field is the flag of its name."""

    out: Path
    tokenizer: Path | None = None
    corpus: str = DEFAULT_CORPUS
    family: str = "k3"
    preset: str = "demo"
    distill_from: Path | None = None
    seq_len: int = 256
    batch_size: int = 32
    steps: int = 1200
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    clip: float = 1.0
    balance_rate: float = 1e-3
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 32
    max_minutes: float = 9.0
    stop_after: int = 0
    max_shard_mib: float = 16.0
    device: str = "cpu"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the flag of the first bad setting and what to give instead."""
        preset_config(self.family, self.preset)  # names --family / --preset
        positive = ("seq_len", "batch_size", "steps", "eval_every", "eval_windows")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{_flag(name)}: must be at least 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise ValueError(f"--seq-len: a window needs at least 2 tokens, got {self.seq_len}")
        for name in ("lr", "max_minutes", "max_shard_mib", "clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{_flag(name)}: must be positive, got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--min-lr-ratio: must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("weight_decay", "warmup", "stop_after", "balance_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"{_flag(name)}: must not be negative, got {getattr(self, name)}")
        if self.warmup >= self.steps:
            raise ValueError(f"--warmup: {self.warmup} steps leave none of --steps {self.steps} to decay")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"--device: cpu or cuda (cuda:N), got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device: {self.device} asked for, but torch sees no CUDA device here")
        if self.distill_from is None and self.tokenizer is None:
            raise ValueError("--tokenizer: required (a tokenizer folder) unless --distill-from gives one")
        if self.distill_from is not None and not (self.distill_from / "config.json").is_file():
            raise ValueError(
                f"--distill-from: {self.distill_from} is not a checkpoint folder (no config.json)"
            )
        if self.tokenizer is not None and not (self.tokenizer / "tokenizer.json").is_file():
            raise ValueError(f"--tokenizer: {self.tokenizer} has no tokenizer.json")

    def check_resumable(self, stored: dict) -> None:
        """Refuse to continue a run in ``out`` that was started with different settings (naming the flag)."""
        current = self.as_dict()
        for name, value in stored.items():
            if name not in RESUMABLE_CHANGES and current.get(name) != value:
                raise ValueError(
                    f"{_flag(name)}: the run in {self.out} was started with {value!r}, got "
                    f"{current.get(name)!r}; give the same value to continue it, or a new --out"
                )

    def as_dict(self) -> dict:
        """The settings as plain values (paths as strings), as stored in the training state."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_pretrain_flags(parser: argparse.ArgumentParser) -> None:
    """Declare one flag per ``PretrainSettings`` field (defaults from the dataclass)."""
    defaults = PretrainSettings(out=Path("."))
    parser.add_argument("--out", required=True, type=Path, help="run folder: state, checkpoint, loss curve")
    helps = {
        "tokenizer": "tokenizer folder (tokenizer.json ...); default with --distill-from: the target's",
        "corpus": "Python module with train_documents() and heldout_documents() yielding str",
        "family": "model family of the preset",
        "preset": "size preset (services/engine/checkpoint/presets.py): demo, draft, tiny, ...",
        "distill_from": "train a draft on KL(target || draft) over this checkpoint's logits",
        "seq_len": "tokens per training window",
        "batch_size": "windows per optimizer step",
        "steps": "total optimizer steps of the run (over all resumptions)",
        "lr": "peak AdamW learning rate",
        "min_lr_ratio": "the cosine's final learning rate as a fraction of --lr",
        "warmup": "linear warm-up steps",
        "weight_decay": "AdamW weight decay (matrices only)",
        "clip": "gradient norm clip",
        "balance_rate": "MoE router selection-bias step per optimizer step against expert load, 0: off",
        "seed": "initial weights and window order",
        "eval_every": "steps between held-out evaluations (and loss-curve points)",
        "eval_windows": "held-out windows evaluated",
        "max_minutes": "stop after this many minutes (state saved; run again to continue)",
        "stop_after": "stop after this many steps of this run, 0 for no limit (state saved)",
        "max_shard_mib": "largest safetensors shard written, MiB",
        "device": "cpu or cuda",
    }
    for field in dataclasses.fields(PretrainSettings):
        if field.name == "out":
            continue
        default = getattr(defaults, field.name)
        kind = Path if field.name in ("tokenizer", "distill_from") else type(default)
        parser.add_argument(
            _flag(field.name), type=kind, default=default, help=f"{helps[field.name]} (default {default})"
        )


def settings_from_args(args: argparse.Namespace) -> PretrainSettings:
    """The parsed flags as validated settings."""
    names = [field.name for field in dataclasses.fields(PretrainSettings)]
    settings = PretrainSettings(**{name: getattr(args, name) for name in names})
    settings.validate()
    return settings
