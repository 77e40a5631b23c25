"""Stopping and resuming a run without surprises.

- ``check_resumable`` / ``load_state``: a run folder and a ``state.pt`` that really are a vitkit
  run's, or a message that says what was found instead.
- ``check_state``: the saved state against the run's ``config.yaml``: an option edited since
  the state was saved is refused with the list of what changed, except the ones that do not
  change the run (:data:`SAFE_TO_CHANGE`).
- ``Progress``: the last step done, written about once a second (``.progress``), so a resume
  says how many steps since the last saved state it does again.
- ``InterruptGuard``: the first Ctrl-C asks the trainer to save its state after the current
  step and stop; a second one stops at once.
- ``leftover``: what a planned run should do with a folder an earlier attempt left: resume it
  when it holds a state saved with the same config, otherwise remove it.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import torch

from vitkit.errors import CheckpointError, ConfigError
from vitkit.train import config as config_io

# options that may differ between the saved state and config.yaml: where and how the run
# computes, not what it computes
SAFE_TO_CHANGE = frozenset({"workers", "device", "compile", "eval_every", "checkpoint_every",
                            "data_root", "download", "out", "name", "grad_checkpointing"})
# what vitkit's state.pt holds, and the type of each
STATE_KEYS = {"model": dict, "optimizer": dict, "rng": torch.Tensor, "config": dict,
              "step": int, "epoch": int, "step_in_epoch": int, "history": list}


def check_resumable(run_dir: Path) -> None:
    """A clear error unless ``run_dir`` is a run folder with its config and a state."""
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run folder" if not run_dir.exists() else
                          f"--resume {run_dir} is a file; give the run folder that holds "
                          "config.yaml and state.pt")
    missing = [n for n in ("config.yaml", "state.pt") if not (run_dir / n).is_file()]
    if missing:
        raise ConfigError(f"nothing to resume in {run_dir}: no {' or '.join(missing)} (the run "
                          "saved no checkpoint yet); start it again without --resume")


def leftover(folder: Path, cfg: config_io.TrainConfig) -> Path | None:
    """``folder`` when an earlier attempt at the run ``cfg`` left it resumable (its state saved,
    its ``config.yaml`` equal to ``cfg``): ``train(None, resume=folder)`` then continues where it
    stopped, early-stopping state included. Any other leftover (no state yet, another config, an
    unreadable config) is removed and None returned: the run starts again from scratch."""
    if not folder.exists():
        return None
    try:
        check_resumable(folder)
        same = config_io.load(folder / "config.yaml") == cfg
    except (ConfigError, OSError, ValueError):
        same = False
    if same:
        return folder
    shutil.rmtree(folder)
    return None


def _rescue(path: Path) -> str:
    last = path.parent / "last.safetensors"
    return (f" {last} is intact: continue from its weights with --init {last} (a new run, fresh "
            "optimiser and schedule)." if last.exists() else "")


def load_state(path: Path) -> dict:
    """``state.pt``, read without executing anything, and checked to be vitkit's."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a damaged archive
        raise CheckpointError(f"{path} is damaged and cannot be resumed ({type(err).__name__}: "
                              f"{str(err)[:200]}).{_rescue(path)}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a vitkit training "
                              f"state; it may come from another program.{_rescue(path)}")
    wrong = [k for k, kind in STATE_KEYS.items() if not isinstance(state.get(k), kind)]
    if wrong:
        raise CheckpointError(f"{path} is not a vitkit training state (missing or wrong: "
                              f"{', '.join(wrong)}); it may come from another program or "
                              f"another version.{_rescue(path)}")
    return state


def check_state(state: dict, config: dict, run_dir: Path) -> None:
    """Refuse to resume when ``config.yaml`` (``config``) differs from the configuration the
    state was saved with in anything but :data:`SAFE_TO_CHANGE`."""
    saved = state["config"]
    changed = [f"{k} {saved[k]!r} -> {config[k]!r}" for k in config
               if k in saved and saved[k] != config[k] and k not in SAFE_TO_CHANGE]
    if changed:
        raise ConfigError(
            f"{run_dir}/config.yaml was edited after the run saved its state: "
            f"{'; '.join(changed)}. A resume continues the run exactly as it was: put those "
            f"back, or start a new run with the new settings from its weights (--init "
            f"{run_dir}/last.safetensors). Safe to change: {', '.join(sorted(SAFE_TO_CHANGE))}")


def load_model_state(model: torch.nn.Module, state: dict, path: Path) -> None:
    """The saved weights into ``model``, or a message naming what does not fit."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise CheckpointError(f"{path} does not fit the model of config.yaml: "
                              f"{str(err).splitlines()[0][:300]}") from err


class Progress:
    """The last step done, in ``.progress`` of the run folder (about once a second)."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.path = run_dir / ".progress"
        self.enabled = enabled
        self.written = 0.0

    def step(self, step: int) -> None:
        now = time.monotonic()
        if self.enabled and now - self.written >= 1.0:
            self.path.write_text(f"{step}\n")
            self.written = now

    def last(self) -> int | None:
        try:
            return int(self.path.read_text())
        except (OSError, ValueError):
            return None


class InterruptGuard:
    """While active (in the main thread), the first SIGINT sets :attr:`asked`; the trainer
    saves its state after the step and stops. A second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.asked = False
        self._previous = None

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
