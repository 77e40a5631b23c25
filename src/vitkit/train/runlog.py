"""What a run leaves behind for people: train.log, metrics.csv, TensorBoard events and
curves.png, all written by the main process only."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from vitkit.util.files import atomic_write
from vitkit.viz.plot import save, subplots

log = logging.getLogger("vitkit")


class RunLog:
    def __init__(self, run_dir: Path, enabled: bool = True, resume: bool = False) -> None:
        self.run_dir, self.enabled = Path(run_dir), enabled
        self._file = None
        self._tb = None
        if enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.run_dir / "train.log", "a" if resume else "w")  # noqa: SIM115

    def line(self, message: str) -> None:
        """A line on the ``vitkit`` logger and in train.log."""
        if not self.enabled:
            return
        log.info(message)
        self._file.write(message + "\n")
        self._file.flush()

    def epoch(self, row: dict, history: list[dict]) -> None:
        """Log one epoch: a line, the whole metrics.csv, TensorBoard scalars, curves.png."""
        if not self.enabled:
            return
        ema = f", EMA top-1 {row['ema_top1']:.4f}" if "ema_top1" in row else ""
        scores = (f", top-1 {row['val_top1']:.4f}, top-5 {row['val_top5']:.4f}{ema}"
                  if row["val_top1"] == row["val_top1"]  # NaN: a masked autoencoder's run
                  else " (the hidden patches' reconstruction)")
        self.line(f"epoch {row['epoch']}: train loss {row['train_loss']:.4f}, val loss "
                  f"{row['val_loss']:.4f}{scores} ({row['seconds']:.1f} s, "
                  f"{row['images_per_s']:.0f} img/s)")
        write_csv(self.run_dir / "metrics.csv", history)
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir))
        for key, value in row.items():
            if key not in ("epoch", "step"):
                self._tb.add_scalar(key, value, row["epoch"])
        self._tb.flush()
        plot_curves(history, self.run_dir / "curves.png")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)


def plot_curves(history: list[dict], path: Path) -> None:
    """Loss (train, val) and accuracy (top-1, top-5, EMA) against epochs."""
    epochs = [r["epoch"] for r in history]
    fig, (ax_l, ax_a) = subplots(1, 2, figsize=(9, 3.4))
    ax_l.plot(epochs, [r["train_loss"] for r in history], marker="o", label="train")
    ax_l.plot(epochs, [r["val_loss"] for r in history], marker="o", label="val")
    ax_l.set_xlabel("epoch")
    ax_l.set_ylabel("loss")
    ax_l.legend()
    for key, label in (("val_top1", "top-1"), ("val_top5", "top-5"), ("ema_top1", "EMA top-1")):
        if key in history[0]:
            ax_a.plot(epochs, [r[key] for r in history], marker="o", label=label)
    ax_a.set_xlabel("epoch")
    ax_a.set_ylabel("validation accuracy")
    ax_a.set_ylim(0, 1.02)
    ax_a.legend()
    fig.tight_layout()
    save(fig, path)
