"""The ViT's configuration: everything that fixes its architecture, and so its state dict's
keys and shapes. Plain Python (no torch), so a checkpoint's config can be read and checked
without importing torch (``vitkit doctor`` answers in under 3 s that way)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

from vitkit.errors import ModelError
from vitkit.util.numbers import check_counts

Pair = int | tuple[int, int]  # a size given as one side (square) or as (height, width)
ACTIVATION_NAMES = ("gelu", "gelu_tanh", "quick_gelu")  # built in models/vit.py: ACTIVATIONS
# The MLP of a block (built in models/vit.py: MLPS): "gelu" Linear -> act -> Linear; "glu" the
# SwiGLU with one packed first layer (timm's GluMlp: fc1 gives [gate | value]); "swiglu" the
# SwiGLU with split first layers (timm's SwiGLU: fc1_g, fc1_x)
MLP_NAMES = ("gelu", "glu", "swiglu")
# Rotary position embeddings (models/rope.py): "" none; "axial" a fixed frequency per channel
# on each axis (EVA-02, Perception Encoder, timm's *_rope ViTs: timm's "cat"); "dinov3" the
# same on coordinates centred and scaled to [-1, 1] (DINOv3); "mixed" learned frequencies that
# mix both axes, per block and head (RoPE-Mixed, Heo et al. 2024)
ROPE_NAMES = ("", "axial", "dinov3", "mixed")


def as_pair(size: Pair) -> tuple[int, int]:
    """Normalise an ``int`` or ``(h, w)`` size (of an image or of a patch grid) to a ``(h, w)``
    tuple of positive ints."""
    if isinstance(size, int):
        size = (size, size)
    h, w = (int(g) for g in size)
    if h <= 0 or w <= 0:
        raise ModelError(f"a size needs positive sides, got {size!r}")
    return h, w


@dataclass
class ViTConfig:
    """Everything that fixes a ViT's architecture (and so its state dict's shapes)."""

    img_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    pool: str = "cls"  # "cls" | "avg" | "map" (attention pooling by a learned query, SigLIP)
    class_token: bool = True
    distilled: bool = False  # DeiT: a distillation token after [CLS] and a second head
    num_reg_tokens: int = 0
    no_embed_class: bool = False  # position table covers the patches only (big_vision, DeiT-3)
    # width of the pre-logits layer (Linear + tanh, module ``pre_logits``) before the head, as
    # timm's and JAX's representation_size; 0: none
    representation_size: int = 0
    fc_norm: bool = False  # avg pooling only: LayerNorm after pooling (timm) instead of before
    qkv_bias: bool = True
    # with qkv_bias: False gives the query and value a bias but not the key (``attn.q_bias``,
    # ``attn.v_bias``: EVA, DINOv3 _qkvb, timm's SBB ViTs)
    key_bias: bool = True
    init_values: float | None = None  # LayerScale: a learned per-channel scale on each branch
    pre_norm: bool = False  # a LayerNorm on the tokens before the blocks (CLIP's ln_pre)
    patch_bias: bool = True  # CLIP's patch embedding has no bias
    act: str = "gelu"  # "gelu" (exact) | "gelu_tanh" | "quick_gelu" (OpenAI CLIP)
    head_bias: bool = True  # CLIP's projection has none
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    dynamic_img_size: bool = False
    pos_antialias: bool = False  # antialias when the table is interpolated (DINOv2 w/ registers)
    # how a table is moved to another grid: "bicubic" (timm, big_vision) or "bilinear" (SigLIP 2's
    # NaFlex, with antialias)
    pos_interp: str = "bicubic"
    abs_pos: bool = True  # a learned position table (False: positions from rotary embeddings only)
    rope: str = ""  # rotary position embeddings on the patch tokens' queries and keys
    rope_temperature: float = 10000.0  # the frequencies' base (100 DINOv3 and RoPE-Axial)
    rope_offset: float = 0.0  # added to each patch coordinate (1 in Perception Encoder)
    rope_xy: bool = False  # coordinates ordered (x, y) in the channels instead of (row, column)
    rope_half: bool = False  # channels rotated as halves (DINOv3) instead of adjacent pairs
    # the grid the coordinates are rescaled to, whatever the input's (EVA-02's ref_feat_shape)
    rope_ref_grid: tuple[int, int] | None = None
    mlp: str = "gelu"  # "gelu" | "glu" | "swiglu" (see MLP_NAMES)
    mlp_norm: bool = False  # a LayerNorm on the MLP's hidden layer (EVA-02's scale_mlp)
    pool_heads: int = 0  # heads of the MAP head; 0: num_heads (Perception Encoder: 8)
    extra: dict = field(default_factory=dict)  # free-form metadata (mean/std, class names)

    # The fields that change neither the weights nor the forward in eval mode: metadata and the
    # training-only regularisers. Every other field is an option that each checkpoint layout
    # (``HOLDS``/``REFUSES`` in each module of vitkit.checkpoints) and the in-place CPU path
    # (``SUPPORTS``/``REFUSES`` in models/inference.py) must declare; tests/test_options_contract.py
    # holds them to it.
    NEUTRAL: ClassVar[frozenset[str]] = frozenset(
        {"extra", "drop_rate", "attn_drop_rate", "drop_path_rate"})

    def __post_init__(self) -> None:
        self.img_size = as_pair(self.img_size)
        if self.pool not in ("cls", "avg", "map"):
            raise ModelError(f"pool must be 'cls', 'avg' or 'map', got {self.pool!r}")
        if self.pos_interp not in ("bicubic", "bilinear"):
            raise ModelError(f"pos_interp must be 'bicubic' or 'bilinear', got "
                             f"{self.pos_interp!r}")
        if self.mlp not in MLP_NAMES:
            raise ModelError(f"mlp must be one of {', '.join(MLP_NAMES)}, got {self.mlp!r}")
        if self.rope not in ROPE_NAMES:
            raise ModelError(f"rope must be '' (none) or one of {', '.join(ROPE_NAMES[1:])}, "
                             f"got {self.rope!r}")
        if self.rope_ref_grid is not None:
            self.rope_ref_grid = as_pair(self.rope_ref_grid)
        if not (self.abs_pos or self.rope):
            raise ModelError("abs_pos=False needs rotary embeddings (rope=...): the model would "
                             "have no position information at all")
        if self.rope == "mixed" and self.rope_half:
            raise ModelError("rope='mixed' rotates adjacent pairs; set rope_half=False")
        if not (self.key_bias or self.qkv_bias):
            raise ModelError("key_bias=False (a query and value bias, no key bias) needs "
                             "qkv_bias=True")
        if self.pool_heads and self.pool != "map":
            raise ModelError("pool_heads applies to pool='map' only")
        if self.pool_heads and self.embed_dim % self.pool_heads:
            raise ModelError(f"embed_dim {self.embed_dim} must be divisible by pool_heads "
                             f"{self.pool_heads}")
        if self.act not in ACTIVATION_NAMES:
            raise ModelError(f"act must be one of {', '.join(ACTIVATION_NAMES)}, got {self.act!r}")
        if self.pool == "cls" and not self.class_token:
            raise ModelError("pool='cls' needs class_token=True; use pool='avg' without one")
        if self.distilled and not (self.class_token and self.pool == "cls"):
            raise ModelError("distilled=True needs the [CLS] token and pool='cls', as in DeiT")
        if self.distilled and self.representation_size:
            raise ModelError("a distilled (DeiT) model has no pre-logits layer; set "
                             "representation_size=0")
        if self.fc_norm and self.pool != "avg":
            raise ModelError("fc_norm=True applies to pool='avg' only")
        check_counts(((name, getattr(self, name)) for name in (
            "num_classes", "representation_size", "num_reg_tokens", "pool_heads")),
            least=0, cli=False, error=ModelError)
        check_counts(((name, getattr(self, name)) for name in (
            "patch_size", "embed_dim", "depth", "num_heads", "mlp_dim", "in_chans")),
            cli=False, error=ModelError)
        if self.embed_dim % self.num_heads:
            raise ModelError(
                f"embed_dim {self.embed_dim} must be divisible by num_heads {self.num_heads}"
            )
        if self.rope and self.embed_dim // self.num_heads % 4:
            raise ModelError(f"rotary embeddings need a head width divisible by 4 (two axes, "
                             f"pairs of channels); embed_dim {self.embed_dim} over "
                             f"{self.num_heads} heads gives {self.embed_dim // self.num_heads}")
        gh, gw = patch_grid(self.img_size, self.patch_size)  # sizes the patches do not tile
        if gh * gw > MAX_PATCHES:
            gb = gh * gw * self.embed_dim * 4 / 2**30
            raise ModelError(
                f"a {self.img_size[0]}x{self.img_size[1]} image in {self.patch_size}-pixel "
                f"patches is {gh * gw:,} patches; vitkit builds ViTs of up to {MAX_PATCHES:,} "
                f"(its position table alone would take {gb:,.1f} GB, and attention over it "
                "far more). Use a smaller image size or a larger patch size")

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.distilled) + self.num_reg_tokens

    @property
    def readout_rows(self) -> tuple[int, ...] | None:
        """The token rows the head reads: (0,) [CLS], (0, 1) with DeiT's distillation token,
        None for average or attention pooling (every token feeds the head)."""
        if self.pool in ("avg", "map"):
            return None
        return (0, 1) if self.distilled else (0,)

    @property
    def num_pos_prefix(self) -> int:
        """Prefix tokens that have a row in the position table."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    @property
    def grid_size(self) -> tuple[int, int]:
        return patch_grid(self.img_size, self.patch_size)

    def to_dict(self) -> dict:
        return asdict(self)


# The most patches a model may have: 512 x 512 (8192 x 8192 pixels at patch 16). Beyond it the
# position table and one attention map take gigabytes before the first image is seen.
MAX_PATCHES = 512 * 512


def patch_grid(img_size: Pair, patch_size: int) -> tuple[int, int]:
    """(H, W) -> (H/P, W/P); raises ``ValueError`` when a side is not divisible by P."""
    h, w = as_pair(img_size)
    if h % patch_size or w % patch_size:
        raise ModelError(
            f"image size {h}x{w} is not divisible by patch size {patch_size}: the last "
            f"{h % patch_size} rows / {w % patch_size} columns would be dropped. Resize or crop "
            f"the image to a multiple of {patch_size} (e.g. "
            f"{h // patch_size * patch_size}x{w // patch_size * patch_size})."
        )
    return h // patch_size, w // patch_size


