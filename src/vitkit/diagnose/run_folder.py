"""What a run folder says, in vitkit's terms, whichever program wrote it: the config, the
metrics per epoch, the trainer's resolved plan (``run.json``), what trained (``params.json``)
and how the run ended (``result.json``). Only these structured files are read: ``train.log``
is prose for people, and rewording it changes no diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vitkit.recipe import DEFAULT_BATCH_SIZE, RunPlan, plan_run, scaled_lr


@dataclass
class Run:
    """What a run folder says."""

    folder: Path | None
    config: dict
    metrics: list[dict] = field(default_factory=list)
    plan: dict | None = None  # the trainer's resolved numbers (run.json, a RunPlan) if known
    result: dict | None = None  # how the run ended (result.json) if it says
    params: dict | None = None  # what trained (params.json: total, trainable) if it says
    source: str = "vitkit"  # the program that wrote the folder: "vitkit", "timm", "hf"
    classes_known: int | None = None  # the class count where another program's folder says it
    unknown: frozenset = frozenset()  # what the folder cannot say ("optimizer", "init")
    non_finite: list = field(default_factory=list)  # non-finite values outside the losses
    notes: list = field(default_factory=list)  # assumptions made in reading the folder

    @property
    def train_images(self) -> int | None:
        return int(self.plan["train_images"]) if self.plan else None

    @property
    def classes(self) -> int | None:
        if self.classes_known:
            return self.classes_known
        return int(self.plan["classes"]) if self.plan else None

    @property
    def vitkit_plan(self) -> RunPlan | None:
        """The run's resolved numbers: the trainer's own (``run.json``), else computed from a
        vitkit config by :func:`vitkit.recipe.plan_run` (one process assumed)."""
        if self.plan:
            return RunPlan(**self.plan)
        if self.source != "vitkit" or "recipe" not in self.config or \
                self.train_images is None:
            return None  # a foreign config: its lr is the lr itself, its schedule unknown
        try:
            return plan_run(self.config, self.train_images, self.classes or 0)
        except (TypeError, ValueError):
            return None

    @property
    def effective_lr(self) -> float | None:
        """The peak learning rate: vitkit's lr is per 512 images, scaled by the global batch
        (processes and accumulation steps included; one process when ``run.json`` does not
        say); another program's is the lr itself."""
        plan = self.vitkit_plan
        if plan is not None:
            return plan.lr
        lr = self.config.get("lr")
        try:
            lr = float(lr) if lr is not None else None
            if lr is not None and self.source == "vitkit" and "recipe" in self.config:
                # a vitkit config without its run.json: scaled by its batch, one process
                lr = scaled_lr(lr, int(self.config.get("batch_size", DEFAULT_BATCH_SIZE)), 1,
                               int(self.config.get("accum_steps", 1) or 1))
            return lr
        except (TypeError, ValueError):
            return None

    @property
    def trains_part(self) -> str | None:
        """How much of the model trains, in words, where the run trains only part of it
        (``--freeze``, ``--lora-rank``; its share from ``params.json`` where written), e.g.
        ``"0.23% of the parameters (--freeze backbone)"``; None for a full run."""
        freeze = str(self.config.get("freeze") or "")
        try:
            rank = int(self.config.get("lora_rank") or 0)
        except (TypeError, ValueError):  # a hand-edited config: read as no LoRA
            rank = 0
        if not freeze and not rank:
            return None
        how = f"LoRA rank {rank}" if rank else f"--freeze {freeze}"
        share = self.params.get("fraction") if self.params else None
        return (f"{share:.2%} of the parameters ({how})" if isinstance(share, float)
                else f"part of the parameters ({how})")

    @property
    def world(self) -> int | None:
        """Processes that trained the run, where its plan says it."""
        return int(self.plan.get("world", 1)) if self.plan else None

    @property
    def steps(self) -> int | None:
        """Optimizer steps the run has taken: its metrics' ``step`` column, else its epochs
        times the steps of an epoch where the plan knows them."""
        rows = [r for r in self.metrics if r.get("step") is not None]
        if rows:
            return int(rows[-1]["step"])
        epochs = self.metrics[-1].get("epoch") if self.metrics else None
        plan = self.vitkit_plan
        if epochs is not None and plan is not None:
            return int(epochs * plan.steps_per_epoch)
        return None
