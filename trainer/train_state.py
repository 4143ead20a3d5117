"""A run's resumable state in ``--out``: parameters (float32), optimizer, step, data position, RNG, the
settings it was started with and the model config, written atomically after each run segment."""

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

STATE_FILE = "train_state.pt"


@dataclass
class Progress:
    """Where a run stands.

    Attributes:
        step: optimizer steps taken.
        windows_seen: training windows consumed (the data position: ``TokenWindows`` order index).
        loss_sum: training objective summed over the steps since the last loss-curve point.
        loss_steps: how many steps ``loss_sum`` holds.
    """

    step: int = 0
    windows_seen: int = 0
    loss_sum: float = 0.0
    loss_steps: int = 0


def save_state(
    out: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    progress: Progress,
    settings: dict,
    raw_config: dict,
) -> Path:
    """Write the state to ``out / STATE_FILE`` (through a temporary file, so a kill leaves the old one)."""
    path = out / STATE_FILE
    partial = path.with_suffix(".partial")
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "progress": asdict(progress),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "settings": settings,
        "config": raw_config,
    }
    torch.save(state, partial)
    partial.replace(path)
    return path


def stored_settings(out: Path) -> tuple[dict, dict] | None:
    """``(settings, config)`` of the run in ``out``, or None when it holds no state."""
    path = out / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["settings"], state["config"]


def load_state(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Progress:
    """Restore parameters, optimizer and RNG from ``out``'s state into ``model`` and ``optimizer``."""
    device = next(model.parameters()).device
    state = torch.load(out / STATE_FILE, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng_cpu"].cpu())
    if state["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])
    return Progress(**state["progress"])
