"""Model options are a contract: every field of ViTConfig is declared by each exporter (HOLDS,
REFUSES or UNSTORED in its module of vitkit.checkpoints) and by the in-place CPU path (SUPPORTS
or REFUSES in vitkit.models.inference), unless ViTConfig.NEUTRAL says it changes nothing; and
the declarations are true. A new field fails here until every one of them says what it does."""

import dataclasses

import pytest
import torch

import vitkit
from vitkit import VisionTransformer
from vitkit.checkpoints import formats
from vitkit.checkpoints.common import ROPE_ERA_OPTIONS
from vitkit.models import inference
from vitkit.models.vit import ViTConfig

from peers import logits, max_diff, perturb

FIELDS = [f.name for f in dataclasses.fields(ViTConfig)]
OPTIONS = [name for name in FIELDS if name not in ViTConfig.NEUTRAL]
DEFAULTS = ViTConfig()
# Tiny (a few milliseconds a forward): 32x32 images, 4x4 patches, 2 blocks of width 32.
BASE = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64,
            num_classes=5)
# For each option, overrides of BASE that give it a value other than BASE's and the default's,
# with what that value needs beside it (fc_norm pools by average, ...).
SAMPLES: dict[str, list[dict]] = {
    "img_size": [dict(img_size=(32, 48)), dict(img_size=48)],
    "patch_size": [dict(patch_size=8)],
    "in_chans": [dict(in_chans=1)],
    "num_classes": [dict(num_classes=0), dict(num_classes=3)],
    "embed_dim": [dict(embed_dim=64, mlp_dim=128)],
    "depth": [dict(depth=1)],
    "num_heads": [dict(num_heads=4)],
    "mlp_dim": [dict(mlp_dim=96)],
    "pool": [dict(pool="avg"), dict(pool="avg", class_token=False), dict(pool="map"),
             dict(pool="map", class_token=False)],
    "class_token": [dict(class_token=False, pool="avg"), dict(class_token=False, pool="map")],
    "distilled": [dict(distilled=True)],
    "num_reg_tokens": [dict(num_reg_tokens=2), dict(num_reg_tokens=2, no_embed_class=True)],
    "no_embed_class": [dict(no_embed_class=True)],
    "representation_size": [dict(representation_size=16),
                            dict(representation_size=16, num_classes=0)],
    "fc_norm": [dict(fc_norm=True, pool="avg"), dict(fc_norm=True, pool="avg", class_token=False)],
    "qkv_bias": [dict(qkv_bias=False)],
    "init_values": [dict(init_values=0.3)],
    "pre_norm": [dict(pre_norm=True)],
    "patch_bias": [dict(patch_bias=False)],
    "act": [dict(act="gelu_tanh"), dict(act="quick_gelu")],
    "head_bias": [dict(head_bias=False)],
    "norm_eps": [dict(norm_eps=0.1)],
    "dynamic_img_size": [dict(dynamic_img_size=True)],
    "pos_antialias": [dict(pos_antialias=True, dynamic_img_size=True)],
    "pos_interp": [dict(pos_interp="bilinear", dynamic_img_size=True, pos_antialias=True)],
    "abs_pos": [dict(abs_pos=False, rope="axial"),
                dict(abs_pos=False, rope="dinov3", rope_half=True)],
    "rope": [dict(rope="axial"), dict(rope="dinov3", rope_half=True, abs_pos=False),
             dict(rope="mixed", abs_pos=False, rope_xy=True)],
    "rope_temperature": [dict(rope="axial", rope_temperature=100.0),
                         dict(rope_temperature=50.0)],
    "rope_offset": [dict(rope="axial", rope_offset=1.0)],
    "rope_xy": [dict(rope="axial", rope_xy=True)],
    "rope_half": [dict(rope="dinov3", rope_half=True)],
    "rope_ref_grid": [dict(rope="axial", rope_ref_grid=(4, 4))],
    "mlp": [dict(mlp="glu"), dict(mlp="swiglu")],
    "mlp_norm": [dict(mlp_norm=True), dict(mlp="swiglu", mlp_norm=True)],
    "key_bias": [dict(key_bias=False)],
    "pool_heads": [dict(pool="map", pool_heads=4)],
}
# Each sample is tried on each of these (where the two make a valid config): the layouts hold
# the families' options in combinations only (a Hugging Face DINOv2 or SigLIP is a backbone
# without a head, a CLIP tower has no patch or head bias, ...), and an option held on its own
# can still be dropped in a family's class.
CONTEXTS: dict[str, dict] = {
    "plain": {},
    "dinov2": dict(init_values=0.3, num_classes=0),
    "dinov2-registers": dict(init_values=0.3, num_classes=0, num_reg_tokens=2,
                             no_embed_class=True),
    "clip": dict(pre_norm=True, patch_bias=False, head_bias=False),
    "siglip": dict(pool="map", class_token=False, num_classes=0),
    "dinov3": dict(abs_pos=False, rope="dinov3", rope_half=True, num_reg_tokens=2,
                   init_values=0.3, pool="avg", num_classes=0),
    "dinov3-hf": dict(abs_pos=False, rope="dinov3", rope_half=True, rope_temperature=100.0,
                      num_reg_tokens=2, init_values=0.3, num_classes=0),
    "pe": dict(rope="axial", rope_xy=True, rope_offset=1.0, pre_norm=True, patch_bias=False,
               pool="map", pool_heads=4),
}
# Where each export is written: the form that holds what HOLDS says (timm's hub-style folder;
# a bare timm state dict keeps the weights only)
DEST = {"vitkit": "m.safetensors", "timm": "timm", "hf": "hf", "torchvision": "m.pth",
        "jax": "m.npz"}
LOAD_KEYWORDS = {"num_heads", "act"}  # what load_model can be told (UNSTORED)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Models this small gain nothing from threads, and lose much on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def declared(module) -> dict[str, list[str]]:
    """field -> the names of the sets of ``module`` that declare it."""
    sets = {"HOLDS": module.HOLDS, "REFUSES": module.REFUSES,
            "UNSTORED": getattr(module, "UNSTORED", frozenset())}
    return {f: [name for name, s in sets.items() if f in s] for f in FIELDS}


def config(sample: dict) -> ViTConfig:
    return ViTConfig(**{**BASE, **sample})


def model_of(sample: dict) -> VisionTransformer:
    return perturb(VisionTransformer(config(sample)), scale=0.1)


def variants(field: str) -> list[dict]:
    """Every sample of ``field`` in every context where it makes a valid config."""
    out = []
    for context in CONTEXTS.values():
        for sample in SAMPLES[field]:
            try:
                config({**context, **sample})
            except ValueError:
                continue
            out.append({**context, **sample})
    return out


# ------------------------------------------------------------------------ every field declared
@pytest.mark.parametrize("fmt", formats.EXPORTS)
def test_every_exporter_declares_every_option(fmt):
    module = formats.get(fmt)
    path = f"src/vitkit/checkpoints/{module.__name__.rsplit('.', 1)[-1]}.py"
    assert hasattr(module, "HOLDS") and hasattr(module, "REFUSES"), (
        f"{path} writes models: declare HOLDS and REFUSES (see checkpoints/formats.py)")
    assert fmt in DEST, f"add where a {fmt} export is written to DEST in {__file__}"
    for field, where in declared(module).items():
        if field in ViTConfig.NEUTRAL:
            assert not where, f"{field} is in ViTConfig.NEUTRAL: take it out of {where} in {path}"
        else:
            assert len(where) == 1, (
                f"ViTConfig.{field} is declared by {where or 'none'} of {path}: put it in exactly "
                "one of HOLDS (written whatever its value), REFUSES (refusals() refuses every "
                "value but the default) or UNSTORED (told to load_model), or in "
                "ViTConfig.NEUTRAL if it changes neither the weights nor the forward")
    stale = (module.HOLDS | module.REFUSES | getattr(module, "UNSTORED", frozenset())) - {*FIELDS}
    assert not stale, f"{path} declares {sorted(stale)}, which ViTConfig does not have"
    assert getattr(module, "UNSTORED", frozenset()) <= LOAD_KEYWORDS


def test_the_fast_path_declares_every_option():
    path = "src/vitkit/models/inference.py"
    for field in FIELDS:
        where = [name for name, s in (("SUPPORTS", inference.SUPPORTS),
                                      ("REFUSES", inference.REFUSES),
                                      ("ViTConfig.NEUTRAL", ViTConfig.NEUTRAL)) if field in s]
        assert len(where) == 1, (
            f"ViTConfig.{field} is declared by {where or 'none'} of SUPPORTS and REFUSES in "
            f"{path} and ViTConfig.NEUTRAL: put it in exactly one (SUPPORTS once the in-place "
            "arithmetic computes it as the standard one does)")
    assert (inference.SUPPORTS | inference.REFUSES) <= {*FIELDS}


def test_every_option_has_samples_that_set_it():
    for field in OPTIONS:
        assert SAMPLES.get(field), (f"ViTConfig.{field}: add models that set it to SAMPLES in "
                                    "tests/test_options_contract.py")
        for sample in SAMPLES[field]:
            cfg = config(sample)
            assert getattr(cfg, field) not in (getattr(DEFAULTS, field),
                                               getattr(config({}), field)), (field, sample)


# -------------------------------------------------------------------- the declarations are true
@pytest.mark.parametrize(("fmt", "field"), [(fmt, field) for fmt in formats.EXPORTS
                                             for field in sorted(formats.get(fmt).REFUSES)])
def test_a_refused_option_is_refused(fmt, field):
    module = formats.get(fmt)
    assert not module.refusals(config({})), fmt
    for sample in variants(field):
        assert module.refusals(config(sample)), (
            f"{fmt} declares {field} in REFUSES, but writes {sample} without a word")


def _bias_is_zero(model, name: str) -> bool:
    bias = getattr(model, name).bias if hasattr(model, name) else None
    return bias is not None and not bias.any()


def _equivalent(field: str, back, model) -> bool:
    """A difference in ``field`` that changes nothing: a bias the layout always has, written as
    zeros; a head bias without a head; position rows for the prefix tokens, written as zeros
    (or none when there is no prefix, or no table)."""
    if field == "head_bias":
        return model.cfg.num_classes == 0 or _bias_is_zero(back, "head")
    if field == "patch_bias":
        return _bias_is_zero(back.patch_embed, "proj")
    if field == "no_embed_class":  # no table at all (rotary embeddings only): nothing differs
        return back.pos_embed is None or not back.pos_embed[:, :back.cfg.num_pos_prefix].any()
    return False


def _held():
    cases = []
    for fmt in formats.EXPORTS:
        module = formats.get(fmt)
        cases += [(fmt, field) for field in sorted(module.HOLDS | getattr(module, "UNSTORED",
                                                                          frozenset()))]
    return cases


@pytest.mark.parametrize(("fmt", "field"), _held())
def test_a_held_option_round_trips(fmt, field, tmp_path):
    module = formats.get(fmt)
    told = getattr(module, "UNSTORED", frozenset())
    written = 0
    for i, sample in enumerate(variants(field)):
        if module.refusals(config(sample)):
            continue  # refused out loud: not this test's business
        model = model_of(sample)
        out = vitkit.export(model, tmp_path / str(i) / DEST[fmt], to=fmt)
        back = vitkit.load_model(out, verbose=False,
                                 **{f: getattr(model.cfg, f) for f in told})
        for f in OPTIONS:
            ours, theirs = getattr(model.cfg, f), getattr(back.cfg, f)
            assert ours == theirs or _equivalent(f, back, model), (
                f"{fmt} declares {field} in HOLDS, but {sample} comes back with {f}={theirs!r} "
                f"instead of {ours!r}")
        x = torch.randn(2, model.cfg.in_chans, *model.cfg.img_size)
        assert max_diff(logits(back, x), logits(model, x)) < 1e-5, (fmt, sample)
        written += 1
    assert written, f"{fmt} declares {field} in HOLDS, but refuses every sample of it"


# ---------------------------------------------------------------------------- the fast path
@pytest.mark.parametrize("field", sorted(inference.SUPPORTS))
def test_the_fast_path_computes_what_it_supports(field):
    ran = 0
    for sample in variants(field):
        if inference.unsupported(config(sample)):
            continue  # a context with an option the fast path leaves to the blocks
        ran += 1
        model = model_of(sample)
        sizes = [model.cfg.img_size] + ([(16, 24)] if model.cfg.dynamic_img_size else [])
        for size in sizes:
            x = torch.randn(2, model.cfg.in_chans, *size)
            with torch.no_grad():
                assert inference.applies(model, x), (sample, inference.unsupported(model.cfg))
                fused = model(x)
                model.inplace_inference = False
                standard = model(x)
                model.inplace_inference = True
            assert max_diff(fused, standard) < 1e-5, (sample, size)
    assert ran, f"no sample of {field} runs on the fast path"


def test_the_fast_path_leaves_what_it_refuses_to_the_blocks():
    for field in sorted(inference.REFUSES):
        for sample in variants(field):
            model = model_of(sample)
            x = torch.randn(1, model.cfg.in_chans, *model.cfg.img_size)
            with torch.no_grad():
                assert not inference.applies(model, x), sample
            assert field in inference.unsupported(model.cfg), sample
    # a field nobody declared keeps a model off the in-place arithmetic until it is declared
    novel = dataclasses.make_dataclass("Novel", [("novel", int, 0)], bases=(ViTConfig,))
    assert inference.unsupported(novel(novel=1)) == ["novel"]
    assert inference.unsupported(novel()) == []


def test_the_fast_path_runs_the_one_block_forward(monkeypatch):
    """The in-place path is an arithmetic swapped into Block.forward, not a second forward:
    every block of an in-place forward goes through Block.forward and the InPlace steps."""
    from vitkit.models import vit

    seen = {"forward": 0, "residual": 0}
    forward, residual = vit.Block.forward, inference.InPlace.residual

    def counted_forward(self, *args, **kwargs):
        seen["forward"] += 1
        return forward(self, *args, **kwargs)

    def counted_residual(self, *args):
        seen["residual"] += 1
        return residual(self, *args)

    monkeypatch.setattr(vit.Block, "forward", counted_forward)
    monkeypatch.setattr(inference.InPlace, "residual", counted_residual)
    model = model_of(dict(rope="axial", mlp="swiglu", init_values=0.1))
    x = torch.randn(2, 3, *model.cfg.img_size)
    with torch.no_grad():
        assert inference.applies(model, x)
        model(x)
    depth = model.cfg.depth
    assert seen == {"forward": depth, "residual": 2 * depth}


def test_neutral_fields_keep_the_fast_path():
    model = model_of(dict(drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.1))
    model.cfg.extra.update(name="x", mean=[0.5] * 3)
    with torch.no_grad():
        assert inference.applies(model, torch.randn(1, 3, 32, 32))


# ------------------------------------------------ the relevance rules and the ONNX export
@pytest.mark.parametrize("field", OPTIONS)
def test_the_relevance_rules_explain_the_standard_paths_logits(field):
    """The rules swap parts (the attention kernel, backward rules) and never the forward: for
    every option the logits they explain are the standard path's."""
    from vitkit.explain import lrp

    for sample in variants(field):
        model = model_of(sample)
        x = torch.randn(2, model.cfg.in_chans, *model.cfg.img_size)
        _, explained, _, _ = lrp.relevance(model, x, rule="attnlrp")
        assert max_diff(explained, logits(model, x)) < 1e-5, sample


@pytest.mark.parametrize("field", OPTIONS)
def test_the_export_graph_computes_the_standard_path(field):
    """What the ONNX export traces (ExportGraph: the model's own forward with the table always
    interpolated and every row computed) gives the standard path's output, or the export
    refuses by name."""
    from vitkit.deploy.onnx_export import ExportGraph, refusals

    for sample in variants(field):
        model = model_of(sample)
        if refusals(model):
            assert all(isinstance(r, str) and r for r in refusals(model))
            continue
        x = torch.randn(2, model.cfg.in_chans, *model.cfg.img_size)
        with torch.no_grad():
            out, maps = ExportGraph(model, attention=True)(x)
            ref, ref_maps = model(x, return_attn=True)
        assert max_diff(out, ref) < 1e-5, sample
        assert max_diff(maps, torch.stack(list(ref_maps), 1)) < 1e-6, sample


ROPE_ERA = sorted(ROPE_ERA_OPTIONS | {"pos_interp"})


@pytest.mark.parametrize("field", ROPE_ERA)
def test_onnxruntime_runs_the_2025_26_options_at_two_sizes(field, tmp_path):
    """The exported graph, in onnxruntime, for the first sample of each 2025-26 option: the
    rotary tables are computed in the graph, so any size works (a table interpolated as
    vitkit does where the model has one and takes other sizes)."""
    import onnxruntime as ort

    from vitkit.deploy import export_onnx

    sample = variants(field)[0]
    model = model_of({**sample, "dynamic_img_size": True})
    path = export_onnx(model, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for size in [(32, 32), (24, 40)]:
        x = torch.randn(2, model.cfg.in_chans, *size)
        (out,) = session.run(None, {"pixel_values": x.numpy()})
        assert max_diff(torch.from_numpy(out), logits(model, x)) < 1e-4, (sample, size)
