"""A training run's loss curve: one CSV row per evaluation (appended across resumed runs) and its PNG."""

import csv
from dataclasses import astuple, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation.

    Attributes:
        step: optimizer steps taken.
        tokens: training tokens seen.
        lr: the learning rate of the last step.
        train_loss: mean training objective over the steps since the previous point (nats; the
            cross-entropy, or KL(target || draft) when distilling).
        heldout_loss: the same objective on the fixed held-out windows.
        heldout_nll: next-token cross-entropy on the held-out windows (nats per token).
    """

    step: int
    tokens: int
    lr: float
    train_loss: float
    heldout_loss: float
    heldout_nll: float


COLUMNS = tuple(field.name for field in fields(CurvePoint))


def append_point(path: Path, point: CurvePoint) -> None:
    """Append ``point`` to the CSV at ``path`` (header written when the file is new)."""
    new = not path.is_file()
    with path.open("a", newline="") as file:
        writer = csv.writer(file)
        if new:
            writer.writerow(COLUMNS)
        writer.writerow(astuple(point))


def read_points(path: Path) -> list[CurvePoint]:
    """The CSV's points, in file order (empty when the file does not exist)."""
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    return [CurvePoint(int(r["step"]), int(r["tokens"]), *(float(r[c]) for c in COLUMNS[2:])) for r in rows]


def plot_curve(points: list[CurvePoint], png: Path, title: str) -> None:
    """Train and held-out loss against training tokens, plus held-out cross-entropy when it differs
    from the objective (distillation), written to ``png``."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the training machine
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    tokens = [p.tokens for p in points]
    axes.plot(tokens, [p.train_loss for p in points], label="train", marker=".")
    axes.plot(tokens, [p.heldout_loss for p in points], label="held-out", marker=".")
    if any(p.heldout_nll != p.heldout_loss for p in points):
        axes.plot(tokens, [p.heldout_nll for p in points], label="held-out cross-entropy", marker=".")
    axes.set_xlabel("training tokens")
    axes.set_ylabel("loss (nats per token)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)
    plt.close(figure)
