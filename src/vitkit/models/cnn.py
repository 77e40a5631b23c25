"""torchvision CNNs as baselines and distillation teachers, with a small-image stem.

On small inputs (32x32 digits, CIFAR) a ResNet's 7x7/2 stem and max-pool throw away most of
the image, so for ``img_size <= 64`` the stem becomes a 3x3/1 convolution without the pool
(the usual CIFAR variant). The config travels with the weights like a ViT's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from torch import nn

from vitkit.errors import ModelError

CNNS = ("resnet18", "resnet34", "resnet50", "resnet18_w16", "resnet18_w24", "resnet18_w32")
# ResNet-18 at a narrower base width (16 or 32 channels instead of 64): a CNN of about a small
# ViT's compute, so a study can tell capacity from inductive bias (FLOPs scale with width^2).
NARROW = {"resnet18_w16": 16, "resnet18_w24": 24, "resnet18_w32": 32}


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


def is_cnn(what) -> bool:
    """Whether ``what`` is one of vitkit's CNNs rather than a ViT. The one test for it: ``what``
    is a model name (``"resnet18"``), a config (a ``CNNConfig``, a ``ViTConfig``, or a config
    mapping with a ``family`` key), or a model (``model.cfg``)."""
    if isinstance(what, str):
        return what in CNNS
    if isinstance(what, dict):
        return what.get("family") == "cnn"
    cfg = getattr(what, "cfg", what)
    return getattr(cfg, "family", None) == "cnn"


class CNN(nn.Module):
    """A torchvision ResNet: (B, 3, H, W) -> (B, num_classes)."""

    def __init__(self, config: CNNConfig | None = None, **kwargs) -> None:
        super().__init__()
        cfg = config or CNNConfig(**kwargs)
        if cfg.arch not in CNNS:
            raise ModelError(f"unknown CNN {cfg.arch!r}; choose one of {', '.join(CNNS)}")
        self.cfg = cfg
        try:
            import torchvision  # the train extra: CNN baselines and teachers only
        except ImportError as err:
            raise ImportError("CNNs need torchvision, in the train extra: pip install '.[train]' "
                              "from vitkit's folder") from err
        if cfg.arch in NARROW:
            net = _narrow_resnet18(torchvision, NARROW[cfg.arch], cfg.num_classes)
        else:
            net = getattr(torchvision.models, cfg.arch)(weights=None,
                                                        num_classes=cfg.num_classes)
        if cfg.small_input:
            net.conv1 = nn.Conv2d(3, net.conv1.out_channels, kernel_size=3, stride=1, padding=1,
                                  bias=False)
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


def _narrow_resnet18(torchvision, width: int, num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 with every stage ``width / 64`` as wide (channels w, 2w, 4w, 8w):
    the same blocks and initialisation, built by torchvision's own ``_make_layer``."""
    from torchvision.models.resnet import BasicBlock, ResNet

    net = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes)
    net.inplanes = width
    net.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
    net.bn1 = nn.BatchNorm2d(width)
    net.layer1 = net._make_layer(BasicBlock, width, 2)
    net.layer2 = net._make_layer(BasicBlock, 2 * width, 2, stride=2)
    net.layer3 = net._make_layer(BasicBlock, 4 * width, 2, stride=2)
    net.layer4 = net._make_layer(BasicBlock, 8 * width, 2, stride=2)
    net.fc = nn.Linear(8 * width, num_classes)
    for m in net.modules():  # torchvision's initialisation, for the rebuilt layers
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)
    return net


def create_cnn(name: str, num_classes: int, img_size: int) -> CNN:
    return CNN(CNNConfig(arch=name, num_classes=num_classes, img_size=img_size))
