"""torchvision CNNs as baselines and distillation teachers, with a small-image stem.

On small inputs (32x32 digits, CIFAR) a ResNet's 7x7/2 stem and max-pool throw away most of
the image, so for ``img_size <= 64`` the stem becomes a 3x3/1 convolution without the pool
(the usual CIFAR variant). The config travels with the weights like a ViT's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from torch import nn

CNNS = ("resnet18", "resnet34", "resnet50")


@dataclass
class CNNConfig:
    arch: str = "resnet18"
    num_classes: int = 10
    img_size: int = 32
    family: str = "cnn"
    extra: dict = field(default_factory=dict)

    @property
    def small_input(self) -> bool:
        return self.img_size <= 64

    def to_dict(self) -> dict:
        return asdict(self)


def is_cnn(name: str) -> bool:
    return name in CNNS


class CNN(nn.Module):
    """A torchvision ResNet: (B, 3, H, W) -> (B, num_classes)."""

    def __init__(self, config: CNNConfig | None = None, **kwargs) -> None:
        super().__init__()
        cfg = config or CNNConfig(**kwargs)
        if cfg.arch not in CNNS:
            raise ValueError(f"unknown CNN {cfg.arch!r}; choose one of {', '.join(CNNS)}")
        self.cfg = cfg
        try:
            import torchvision  # the train extra: CNN baselines and teachers only
        except ImportError as err:
            raise ImportError("CNNs need torchvision: pip install 'vitkit[train]'") from err
        net = getattr(torchvision.models, cfg.arch)(weights=None, num_classes=cfg.num_classes)
        if cfg.small_input:
            net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        self.net = net

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    def reset_classifier(self, num_classes: int) -> None:
        self.cfg.num_classes = num_classes
        self.net.fc = nn.Linear(self.net.fc.in_features, num_classes)

    def forward(self, x):
        return self.net(x)


def create_cnn(name: str, num_classes: int, img_size: int) -> CNN:
    return CNN(CNNConfig(arch=name, num_classes=num_classes, img_size=img_size))
