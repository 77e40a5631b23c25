"""torchvision ResNet state dicts (``conv1``, ``layer1.0...``, ``fc``), so a CNN trained
anywhere with torchvision can be a baseline or a distillation teacher. The architecture comes
from the block counts; a 3x3 first convolution means vitkit's small-image stem."""

from __future__ import annotations

from vitkit.checkpoints.common import Checkpoint, CheckpointError, StateDict
from vitkit.checkpoints.timm import depth_of
from vitkit.data.images import IMAGENET_MEAN, IMAGENET_STD

NAME = "torchvision-resnet"
LABEL = "torchvision ResNet (conv1, layer1..4, fc)"
_ARCHS = {((2, 2, 2, 2), False): "resnet18", ((3, 4, 6, 3), False): "resnet34",
          ((3, 4, 6, 3), True): "resnet50"}


def detect(ckpt: Checkpoint) -> bool:
    return {"conv1.weight", "fc.weight", "layer1.0.conv1.weight"} <= ckpt.state.keys()


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    blocks = tuple(depth_of(state, rf"layer{i}\.(\d+)\.") for i in range(1, 5))
    bottleneck = "layer1.0.conv3.weight" in state
    arch = _ARCHS.get((blocks, bottleneck))
    if arch is None:
        kind = "bottleneck" if bottleneck else "basic"
        raise CheckpointError(f"a ResNet with {kind} blocks {blocks} is not one of "
                              f"{', '.join(_ARCHS.values())}")
    small = state["conv1.weight"].shape[-1] == 3
    kwargs = dict(family="cnn", arch=arch, num_classes=state["fc.weight"].shape[0],
                  img_size=32 if small else 224)
    extra = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
    return {f"net.{k}": v for k, v in state.items()}, kwargs, extra
