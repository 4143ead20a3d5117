"""Pretrain a model from a preset, or distill a draft from a trained target: ``baton train`` /
``python -m trainer.pretrain`` (``docs/training.md``).

A run segment continues the state in ``--out`` (or starts one), trains until ``--steps`` are done,
``--max-minutes`` would be passed by a next step as long as the longest so far (an evaluation
included), or ``--stop-after`` steps of this segment, then
writes the state, the checkpoint (``OUT/checkpoint``) and the loss curve (``OUT/loss.csv``,
``OUT/loss.png``). Running the same command again continues where it stopped; on one device with
deterministic ops the parameters are those of an uninterrupted run.

Layout of ``--out``::

    train_state.pt       parameters (float32), AdamW state, step, data position, RNG, settings, config
    train_tokens.pt      the encoded training stream (reused while the tokenizer is the same)
    heldout_tokens.pt    the encoded held-out stream
    loss.csv, loss.png   the loss curve
    checkpoint/          config.json, bf16 safetensors shards, tokenizer files: what Baton serves
"""

import argparse
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common.tokenizer import Tokenizer
from services.engine.checkpoint.loader import build_empty_model, load_model
from services.engine.checkpoint.presets import preset_config
from services.engine.checkpoint.random_init import init_random_weights
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config_loader import load_model_config

from .expert_balance import ExpertBalance
from .hub_export import export_checkpoint
from .loss_curve import CurvePoint, append_point, plot_curve, read_points
from .lr_schedule import learning_rate
from .pretrain_settings import PretrainSettings, add_pretrain_flags, settings_from_args
from .token_windows import TokenWindows, cached_stream
from .train_state import Progress, load_state, save_state, stored_settings
from .window_kernels import use_window_kernels
from .window_loss import distillation_loss, language_model_loss, next_token_targets, window_logits

ADAM_BETAS = (0.9, 0.95)


@dataclass(frozen=True)
class SegmentResult:
    """What one run segment did.

    Attributes:
        progress: where the run stands now.
        finished: every ``--steps`` step is done.
        steps_run: steps taken by this segment.
        seconds_per_step: mean wall time of this segment's steps (0 when none ran).
        checkpoint: the written checkpoint folder.
    """

    progress: Progress
    finished: bool
    steps_run: int
    seconds_per_step: float
    checkpoint: Path


def run_segment(settings: PretrainSettings) -> SegmentResult:
    """Train (or distill) until done or stopped; see the module docstring.

    Raises:
        ValueError: a bad setting, corpus or tokenizer, or settings that differ from those the run in
            ``--out`` was started with, each naming the flag.
    """
    settings.validate()
    started = time.monotonic()
    if settings.device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")  # TF32 GEMMs: float32 parameters at tensor-core speed
    settings.out.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = settings.tokenizer or settings.distill_from
    stored = stored_settings(settings.out)
    if stored is not None:
        settings.check_resumable(stored[0])
    corpus = _corpus(settings.corpus)
    train = TokenWindows(
        cached_stream(settings.out / "train_tokens.pt", corpus.train_documents(), tokenizer_dir),
        settings.seq_len,
        settings.seed,
        "--corpus (train_documents)",
    )
    heldout = TokenWindows(
        cached_stream(settings.out / "heldout_tokens.pt", corpus.heldout_documents(), tokenizer_dir),
        settings.seq_len,
        settings.seed,
        "--corpus (heldout_documents)",
    ).first(settings.eval_windows)
    raw_config = stored[1] if stored else _model_config(settings, Tokenizer.from_pretrained(tokenizer_dir))
    model = _initial_model(raw_config, settings)
    optimizer = _optimizer(model, settings)
    balance = ExpertBalance(model, settings.balance_rate)
    progress = load_state(settings.out, model, optimizer) if stored else Progress()
    target = _target(settings)
    objective = _objective(model, target)

    steps_run, step_seconds, longest = 0, 0.0, 0.0  # longest: a step with its evaluation
    while progress.step < settings.steps and not (settings.stop_after and steps_run >= settings.stop_after):
        if time.monotonic() - started + longest > settings.max_minutes * 60:
            break
        step_started = time.monotonic()
        rate = learning_rate(
            progress.step, settings.lr, settings.warmup, settings.steps, settings.min_lr_ratio
        )
        for group in optimizer.param_groups:
            group["lr"] = rate
        windows = train.batch(progress.windows_seen, settings.batch_size).to(settings.device)
        loss = objective(windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        balance.step()
        progress.step += 1
        progress.windows_seen += settings.batch_size
        progress.loss_sum += float(loss.detach())
        progress.loss_steps += 1
        steps_run += 1
        step_seconds += time.monotonic() - step_started
        if progress.step % settings.eval_every == 0 or progress.step == settings.steps:
            _record_point(settings, model, target, heldout, progress, rate, step_seconds / steps_run)
        longest = max(longest, time.monotonic() - step_started)

    save_state(settings.out, model, optimizer, progress, settings.as_dict(), raw_config)
    checkpoint = settings.out / "checkpoint"
    export_checkpoint(model, raw_config, tokenizer_dir, checkpoint, int(settings.max_shard_mib * 2**20))
    points = read_points(settings.out / "loss.csv")
    if points:
        kind = "distillation KL(target || draft)" if target is not None else "next-token cross-entropy"
        plot_curve(points, settings.out / "loss.png", f"{settings.family} {settings.preset}: {kind}")
    return SegmentResult(
        progress,
        progress.step >= settings.steps,
        steps_run,
        step_seconds / steps_run if steps_run else 0.0,
        checkpoint,
    )


def _corpus(name: str):
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise ValueError(f"--corpus: cannot import module {name!r} ({error})") from error
    for function in ("train_documents", "heldout_documents"):
        if not callable(getattr(module, function, None)):
            raise ValueError(f"--corpus: module {name!r} has no {function}() yielding documents")
    return module


def _model_config(settings: PretrainSettings, tokenizer: Tokenizer) -> dict:
    """The preset's config with the tokenizer's vocabulary and special token ids (and the target's
    vocabulary checked when distilling)."""
    config = preset_config(settings.family, settings.preset)
    config["vocab_size"] = tokenizer.vocab_size
    config["bos_token_id"] = tokenizer.bos_token_id
    config["eos_token_id"] = tokenizer.eos_token_ids
    config["pad_token_id"] = tokenizer.eos_token_ids[0]
    if settings.distill_from is not None:
        target_vocab = load_model_config(settings.distill_from).vocab_size
        if target_vocab != tokenizer.vocab_size:
            raise ValueError(
                f"--distill-from: the target's vocabulary ({target_vocab}) is not the tokenizer's "
                f"({tokenizer.vocab_size}); the draft must share the target's tokenizer"
            )
    return config


def _initial_model(raw_config: dict, settings: PretrainSettings) -> CausalLM:
    """The preset's model with seeded initial weights, float32, default numerics, gradients on."""
    model = build_empty_model(load_model_config(raw_config), "cpu", torch.float32)
    init_random_weights(model, settings.seed)
    model = model.to(settings.device).requires_grad_(True)
    model.set_kernels("reference")  # the reference backends built for the device the model is on
    return _fastest_backends(model, settings.device)


def _optimizer(model: CausalLM, settings: PretrainSettings) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices only (not norms, biases, KDA's gate vectors)."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": matrices, "weight_decay": settings.weight_decay},
        {"params": vectors, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=ADAM_BETAS)


def _target(settings: PretrainSettings) -> CausalLM | None:
    """The distillation target (float32, default numerics, no gradients), or None when pretraining."""
    if settings.distill_from is None:
        return None
    target = load_model(settings.distill_from, device=settings.device, dtype=torch.float32)
    target.set_kernels("reference")
    return _fastest_backends(target, settings.device)


def _fastest_backends(model: CausalLM, device: str) -> CausalLM:
    """The window backends on a GPU, where the per-sequence loops are bound by kernel launches; the
    per-sequence reference on the CPU, where it measured about 30 % faster (``docs/training.md``: its
    smaller chunked-KDA intermediates stay in cache). Both compute the same loss to float32 rounding."""
    return use_window_kernels(model) if device.startswith("cuda") else model


def _objective(model: CausalLM, target: CausalLM | None):
    """The loss of a ``[B, T]`` batch of windows: cross-entropy, or KL to the target's logits."""
    if target is None:
        return lambda windows: language_model_loss(model, windows)

    def distill(windows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            wanted = window_logits(target, windows)
        return distillation_loss(window_logits(model, windows), wanted)

    return distill


@torch.no_grad()
def _record_point(settings, model, target, heldout, progress: Progress, rate: float, step_s: float) -> None:
    """Evaluate the held-out windows, append a loss-curve point, reset the training-loss mean."""
    objective_sum = nll_sum = 0.0
    heldout = heldout.to(settings.device)
    for start in range(0, heldout.shape[0], settings.batch_size):
        windows = heldout[start : start + settings.batch_size]
        logits = window_logits(model, windows).float()
        nll = torch.nn.functional.cross_entropy(logits, next_token_targets(windows))
        objective = nll if target is None else distillation_loss(logits, window_logits(target, windows))
        nll_sum += float(nll) * windows.shape[0]
        objective_sum += float(objective) * windows.shape[0]
    count = heldout.shape[0]
    train_loss = progress.loss_sum / progress.loss_steps
    point = CurvePoint(
        progress.step,
        progress.windows_seen * settings.seq_len,
        rate,
        train_loss,
        objective_sum / count,
        nll_sum / count,
    )
    append_point(settings.out / "loss.csv", point)
    progress.loss_sum, progress.loss_steps = 0.0, 0
    tokens_per_s = settings.batch_size * settings.seq_len / step_s
    print(
        f"step {point.step}/{settings.steps}: train {train_loss:.4f}, held-out {point.heldout_loss:.4f} "
        f"(cross-entropy {point.heldout_nll:.4f}), lr {rate:.2e}, {step_s:.2f} s/step, "
        f"{tokens_per_s:.0f} tokens/s",
        flush=True,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run one segment from parsed flags; print where the run stands. Exit status 0."""
    settings = settings_from_args(args)
    result = run_segment(settings)
    state = "finished" if result.finished else "stopped (run the same command again to continue)"
    print(
        f"step {result.progress.step}/{settings.steps} {state}; this run: {result.steps_run} steps, "
        f"{result.seconds_per_step:.2f} s/step; checkpoint: {result.checkpoint}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.pretrain``: the same flags as ``baton train``; bad flags exit 2 naming the flag."""
    parser = argparse.ArgumentParser(prog="python -m trainer.pretrain", description=__doc__.split("\n\n")[0])
    add_pretrain_flags(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
