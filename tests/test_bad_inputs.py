"""Every command against a catalogue of bad inputs: exit code 2, no traceback, a message that
names the input, and nothing already written modified or deleted. A new case is one line of
``CASES``. Commands over many inputs (predict, attention) also keep every good input's result.
"""

import errno
import hashlib
import json
import os
import random
import struct
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.cli import main
from vitkit.models.cnn import create_cnn
from vitkit.train import resolve, train

PHOTOS = Path(sklearn.datasets.__file__).parent / "images"


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb for Pillow's check)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workspace of good and bad inputs, built once."""
    w = tmp_path_factory.mktemp("bad-inputs")
    model = vitkit.create_model("vit_nano_patch4_32", num_classes=3)
    model.cfg.extra["class_names"] = ["a", "b", "c"]
    vitkit.save_model(model, w / "vit.safetensors")
    vitkit.save_model(create_cnn("resnet18", 3, 32), w / "cnn.safetensors")
    (w / "good").mkdir()
    for name in ("china.jpg", "flower.jpg"):
        Image.open(PHOTOS / name).resize((64, 43)).save(w / "good" / name)
    (w / "mixed").mkdir()
    for name in ("china.jpg", "flower.jpg"):
        Image.open(PHOTOS / name).resize((64, 43)).save(w / "mixed" / name)
    (w / "mixed" / "bomb.png").write_bytes(_png_claiming(20000, 20000))
    (w / "mixed" / "text.jpg").write_text("not an image")
    (w / "mixed" / os.fsdecode(b"caf\xe9.png")).write_bytes(b"\x89PNG broken")
    (w / "bomb.png").write_bytes(_png_claiming(20000, 20000))
    (w / "empty.pth").write_bytes(b"")
    (w / "random.pth").write_bytes(random.Random(0).randbytes(4096))
    (w / "text.jpg").write_text("not an image")
    (w / "no-weights").mkdir()
    (w / "empty-dir").mkdir()
    (w / "folder.csv").mkdir()
    (w / "a-file").write_text("a file, not a folder")
    np.save(w / "maps.npy", np.zeros(5, dtype=np.float32))
    (w / "bad.yaml").write_text("lr: [unclosed\n")
    (w / "abc.yaml").write_text("batch_size: abc\n")
    (w / "negative.yaml").write_text("epochs: -2\n")
    (w / "unknown.yaml").write_text("learning_rate: 0.1\n")
    (w / "list.yaml").write_text("- lr\n- 0.1\n")
    (w / "nan.yaml").write_text("lr: .nan\n")
    (w / "kept.csv").write_text("image,class1\nearlier,result\n")
    (w / "random.npz").write_bytes(random.Random(1).randbytes(3000))
    (w / "random_maps.npy").write_bytes(random.Random(2).randbytes(3000))
    for split in ("train", "val"):  # an image folder with a JPEG cut short in training
        for c in ("a", "b"):
            (w / "cut-folder" / split / c).mkdir(parents=True)
            for i in range(3):
                Image.open(PHOTOS / "china.jpg").rotate(30 * i).resize((40, 40)).save(
                    w / "cut-folder" / split / c / f"{i}.jpg")
    whole = (w / "cut-folder" / "train" / "a" / "0.jpg").read_bytes()
    (w / "cut-folder" / "train" / "a" / "cut.jpg").write_bytes(whole[: len(whole) * 2 // 3])
    meta = json.loads(safe_open_metadata(w / "vit.safetensors")["vitkit_config"])
    save_file(load_file(w / "vit.safetensors"), w / "newer.safetensors",
              {"format": "pt", "vitkit_config": json.dumps({**meta, "shiny_new_option": 3})})
    vitkit.export(vitkit.create_model("vit_nano_patch4_32", num_classes=3), w / "hf", to="hf")
    (w / "hf-no-width").mkdir()
    for f in (w / "hf").iterdir():
        (w / "hf-no-width" / f.name).write_bytes(f.read_bytes())
    config = json.loads((w / "hf" / "config.json").read_text())
    del config["hidden_size"]
    (w / "hf-no-width" / "config.json").write_text(json.dumps(config))
    (w / "hf-bad-json").mkdir()
    for f in (w / "hf").iterdir():
        (w / "hf-bad-json" / f.name).write_bytes(f.read_bytes())
    (w / "hf-bad-json" / "config.json").write_text('{"hidden_size": 48,\n  oops}')
    (w / "long-rows").mkdir()  # a run folder whose metrics.csv has rows longer than its header
    (w / "long-rows" / "config.yaml").write_text("model: vit_tiny\nlr: 0.001\n")
    (w / "long-rows" / "metrics.csv").write_text("epoch,step,train_loss\n1,10,2.0,5,6\n")
    (w / "idx-cut").mkdir()  # MNIST's IDX files, the images cut short
    (w / "idx-cut" / "train-images-idx3-ubyte").write_bytes(
        struct.pack(">4I", 0x803, 60000, 28, 28) + bytes(100))
    (w / "idx-cut" / "train-labels-idx1-ubyte").write_bytes(
        struct.pack(">2I", 0x801, 60000) + bytes(60000))
    run = train(resolve(dict(data="digits", img_size=16, model="vit_nano_patch4_32",
                             steps=4, batch_size=32, out=str(w / "runs"), name="run",
                             checkpoint_every=2)), progress=False)
    np.save(w / "strings_maps.npy", np.array([["a", "b"], ["c", "d"]]))
    (w / "binary-config").mkdir()  # a run folder whose config.yaml is not text
    (w / "binary-config" / "config.yaml").write_bytes(b"\x89\xff\x00model: vit\xfe")
    (w / "binary-config" / "metrics.csv").write_text("epoch,step,train_loss\n1,10,2.0\n")
    damaged = w / "runs" / "damaged"
    damaged.mkdir()
    for f in ("config.yaml", "last.safetensors", "best.safetensors"):
        (damaged / f).write_bytes((run.run_dir / f).read_bytes())
    state = (run.run_dir / "state.pt").read_bytes()
    (damaged / "state.pt").write_bytes(state[: len(state) // 2])
    return w


def safe_open_metadata(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def _disk_full(monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("vitkit.viz.attention._publish", full)


def _offline(monkeypatch):
    def refuse(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", refuse)


def _read_only(monkeypatch):
    """Folders named 'read-only' cannot be made or written in (as a read-only mount would;
    simulated, since root may write anywhere)."""
    real_mkdir, real_mkstemp = Path.mkdir, tempfile.mkstemp

    def mkdir(self, *args, **kwargs):
        if "read-only" in str(self):
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and "read-only" in str(dir):
            raise PermissionError(errno.EROFS, "Read-only file system", str(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def _no_debian_fashion_mnist(monkeypatch):
    import vitkit.data.idx
    monkeypatch.setattr(vitkit.data.idx, "DEBIAN_FASHION_MNIST", Path("/nonexistent/fashion"))


def _elsewhere(monkeypatch):
    """Run from an empty folder (no runs/demo there)."""
    monkeypatch.chdir(tempfile.mkdtemp())


def _hub_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent/vitkit-hub-cache")


# (command line with {ws} for the workspace, text the message must contain, set-up or None)
CASES = [
    # info / list
    ("info vit_nope", "unknown model 'vit_nope'", None),
    ("info vit_base_patch16_224 --img-size 200", "200x200 is not divisible by patch size 16",
     None),
    ("info vit_base_patch16_224 --img-size 0", "positive sides, got (0, 0)", None),
    ("info vit_base_patch16_224 --img-size -16", "positive sides, got (-16, -16)", None),
    # convert / resize
    ("convert {ws}/missing.pth {ws}/o.safetensors", "missing.pth", None),
    ("convert {ws}/empty.pth {ws}/o.safetensors", "empty.pth", None),
    ("convert {ws}/random.pth {ws}/o.safetensors", "random.pth (4,096 bytes) is not a valid "
     "checkpoint", None),
    ("convert {ws}/text.jpg {ws}/o.safetensors", "text.jpg", None),
    ("convert {ws}/no-weights {ws}/o.safetensors", "no-weights has no weight files", None),
    ("convert {ws}/cnn.safetensors {ws}/o --to timm", "a CNN can be written as vitkit", None),
    ("convert {ws}/cnn.safetensors {ws}/o --to hf", "a CNN can be written as vitkit", None),
    ("convert {ws}/cnn.safetensors {ws}/o.npz --to jax", "a CNN can be written as vitkit",
     None),
    ("convert {ws}/cnn.safetensors {ws}/o.pth --to torchvision",
     "a CNN can be written as vitkit", None),
    ("convert {ws}/vit.safetensors {ws}/o.pth", "o.pth", None),
    ("convert {ws}/vit.safetensors {ws}/o.safetensors --num-classes -3", "-3", None),
    ("convert {ws}/vit.safetensors {ws}/a-file/o.safetensors", "a-file", None),
    ("resize {ws}/vit.safetensors {ws}/o.safetensors --img-size 30",
     "30x30 is not divisible by patch size 4", None),
    # --model NAME: an unknown name, a name the weights do not fit, a CNN (issue 50)
    ("convert {ws}/vit.safetensors {ws}/o.safetensors --model vit_nope",
     "unknown model 'vit_nope'", None),
    ("predict {ws}/vit.safetensors {ws}/good --model vit_base_patch16_224",
     "the weights do not fit: vit_base_patch16_224 has", None),
    ("predict {ws}/cnn.safetensors {ws}/good --model vit_base_patch16_224", "is a CNN", None),
    # attention
    ("attention {ws}/good --checkpoint {ws}/cnn.safetensors --out {ws}/att",
     "attention maps need a ViT", None),
    ("attention {ws}/bomb.png --checkpoint {ws}/vit.safetensors --out {ws}/att",
     "bomb.png: it is too large", None),
    ("attention {ws}/text.jpg --checkpoint {ws}/vit.safetensors --out {ws}/att",
     "cannot read image", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --layer 9 --out {ws}/att",
     "--layer 9 does not exist: the model has 4 layers", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --head 7 --out {ws}/att",
     "--head 7 does not exist", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --top-k 0 --out {ws}/att",
     "--top-k must be 1 or more", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --out {ws}/a-file",
     "a-file is a file", None),
    ("attention {ws}/empty-dir --checkpoint {ws}/vit.safetensors --out {ws}/att",
     "no images found in", None),
    ("attention {ws}/good --checkpoint {ws}/missing.safetensors --out {ws}/att",
     "missing.safetensors", None),
    # dense, features, probe (issue 50)
    ("dense {ws}/good --checkpoint {ws}/cnn.safetensors --out {ws}/dense",
     "dense features are a ViT's patch tokens; this checkpoint is a CNN", None),
    ("dense {ws}/good --checkpoint {ws}/vit.safetensors --similar 99,0 --out {ws}/dense",
     "patch (row 99, column 0) is outside the 8x8 patch grid", None),
    ("dense {ws}/good --checkpoint {ws}/vit.safetensors --match {ws}/missing.jpg --out "
     "{ws}/dense", "cannot read image {ws}/missing.jpg", None),
    ("features {ws}/vit.safetensors --data nope --out {ws}/feats", "unknown dataset 'nope'",
     None),
    ("features {ws}/cnn.safetensors --data digits --out {ws}/feats", "this checkpoint is a CNN",
     None),
    ("features {ws}/vit.safetensors --data digits --layers 9 --out {ws}/feats",
     "--layers has 9, but the model has 4 blocks (valid: -4..3)", None),
    ("features {ws}/vit.safetensors --data digits --what nope --out {ws}/feats",
     "--what takes a comma-separated list of pooled, cls, prefix, patch", None),
    ("features {ws}/vit.safetensors --data digits --out {ws}/feats --model vit_base_patch16_224",
     "the weights do not fit: vit_base_patch16_224 has", None),
    ("probe {ws}/vit.safetensors --data digits:0 --out {ws}/probe", "holds one class (0); a "
     "probe needs two or more", None),
    ("probe --features {ws}/missing --val-features {ws}/missing --out {ws}/probe",
     "missing holds no manifest.json: expected a folder written by `vitkit features`", None),
    ("probe {ws}/vit.safetensors --data digits --k 0 --out {ws}/probe",
     "--k takes neighbour counts of 1 or more", None),
    # train
    ("train --config {ws}/missing.yaml", "missing.yaml does not exist", None),
    ("train --config {ws}/empty-dir", "empty-dir is a folder", None),
    ("train --config {ws}/bad.yaml", "bad.yaml is not valid YAML", None),
    ("train --config {ws}/abc.yaml", "batch_size = 'abc' is not a whole number", None),
    ("train --config {ws}/negative.yaml", "epochs must be 1 or more, got -2", None),
    ("train --config {ws}/unknown.yaml", "learning_rate", None),
    ("train --config {ws}/list.yaml", "list.yaml must hold a mapping", None),
    ("train --batch-size 0 --out {ws}/runs", "batch_size must be 1 or more, got 0", None),
    ("train --data-fraction 1.5 --out {ws}/runs", "data_fraction must be between 0 and 1", None),
    ("train --model vit_nope --out {ws}/runs", "unknown model 'vit_nope'", None),
    ("train --data nope --out {ws}/runs", "unknown dataset 'nope'", None),
    ("train --data imagefolder:{ws}/missing --out {ws}/runs", "missing does not exist", None),
    ("train --data cifar10 --download --data-root {ws}/cifar --out {ws}/runs",
     "downloading cifar10 failed", _offline),
    ("train --data fashion-mnist --data-root {ws}/empty-dir --out {ws}/runs",
     "apt-get install dataset-fashion-mnist", _no_debian_fashion_mnist),
    ("train --data mnist --data-root {ws}/idx-cut --out {ws}/runs",
     "{ws}/idx-cut/train-images-idx3-ubyte is truncated", None),
    ("train --data fashion-mnist:0-10 --out {ws}/runs", "fashion-mnist:CLASSES takes class "
     "numbers 0-9", None),
    ("train --resume {ws}/missing-run", "--resume {ws}/missing-run: no such run folder", None),
    ("train --resume {ws}/empty-dir", "nothing to resume in {ws}/empty-dir", None),
    ("train --resume {ws}/a-file", "a-file is a file", None),
    ("train --resume {ws}/runs/damaged", "state.pt is damaged", None),
    ("train --resume {ws}/runs/run --config {ws}/abc.yaml", "drop the other options (--config)",
     None),
    ("train --resume {ws}/runs/run --lr 0.1", "drop the other options (--lr)", None),
    ("train --init {ws}/random.pth --out {ws}/runs", "random.pth", None),
    # eval
    ("eval {ws}/vit.safetensors --data nope", "unknown dataset 'nope'", None),
    ("eval {ws}/vit.safetensors --data mnist --data-root {ws}/empty-dir",
     "mnist is not in {ws}/empty-dir", None),
    ("eval {ws}/missing.safetensors --data digits", "missing.safetensors", None),
    ("eval {ws}/vit.safetensors --data digits", "the checkpoint has 3 classes but digits has 10",
     None),
    # predict
    ("predict {ws}/vit.safetensors {ws}/bomb.png", "bomb.png: it is too large", None),
    ("predict {ws}/vit.safetensors {ws}/good --out {ws}/preds.txt",
     "--out must end in .csv or .json", None),
    ("predict {ws}/vit.safetensors {ws}/good --out {ws}/folder.csv", "folder.csv is a folder",
     None),
    ("predict {ws}/vit.safetensors {ws}/empty-dir", "no images found in", None),
    ("predict {ws}/vit.safetensors {ws}/good --top-k 0", "--top-k must be 1 or more", None),
    ("predict {ws}/random.pth {ws}/good", "random.pth", None),
    ("predict hf-hub:acme/nothing {ws}/good", "acme/nothing is not in the local hub cache",
     _hub_offline),
    ("convert facebook/no-such-model {ws}/o.safetensors", "facebook/no-such-model is not in",
     _hub_offline),
    ("predict {ws}/vit.safetensors {ws}/mixed/caf\udce9.png", "caf", None),
    ("predict {ws}/vit.safetensors {ws}/good --out {ws}/read-only/p.csv",
     "cannot write or read {ws}/read-only: read-only file system", _read_only),
    # doctor
    ("doctor {ws}/missing", "no such run folder, checkpoint or maps file", None),
    ("doctor {ws}/random.pth", "random.pth (4,096 bytes) is not a valid checkpoint", None),
    ("doctor {ws}/empty-dir", "empty-dir has no weight files", None),
    ("doctor {ws}/vit.safetensors --img-size 0", "expected a size like 384", None),
    ("doctor {ws}/vit.safetensors --image {ws}/text.jpg", "cannot read image", None),
    ("doctor {ws}/vit.safetensors --data nope", "unknown dataset 'nope'", None),
    ("doctor {ws}/maps.npy", "maps.npy has shape (5,)", None),
    # explore (each refused before a server starts)
    ("explore --checkpoint {ws}/missing.safetensors", "missing.safetensors", None),
    ("explore --checkpoint {ws}/random.pth", "is not a valid checkpoint", None),
    ("explore --checkpoint {ws}/cnn.safetensors", "this checkpoint is a CNN", None),
    ("explore --checkpoint {ws}/vit.safetensors --images {ws}/text.jpg", "is not a folder",
     None),
    ("explore --checkpoint {ws}/vit.safetensors --port 70000", "--port must be 0..65535", None),
    ("explore --checkpoint {ws}/vit.safetensors --max-upload-mb 0",
     "must be a positive finite number", None),
    ("explore --checkpoint {ws}/vit.safetensors --max-megapixels -1",
     "must be a positive finite number", None),
    ("explore --checkpoint {ws}/vit.safetensors --max-megapixels inf",
     "must be a positive finite number below 1,000,000", None),
    ("explore", "no --checkpoint given and no demo model at runs/demo", _elsewhere),
    # demo
    ("demo --vit-steps 0 --out {ws}/demo", "--vit-steps must be 1 or more", None),
    ("demo --quick --out {ws}/read-only/demo", "read-only file system", _read_only),
    ("train --out {ws}/read-only --steps 1", "read-only file system", _read_only),
    ("convert {ws}/vit.safetensors {ws}/read-only/o.safetensors", "read-only file system",
     _read_only),
    ("demo --quick --out {ws}/a-file/demo", "a-file", None),
    # study
    ("study --seeds 0 --out {ws}/study", "--seeds must be 1 or more", None),
    ("study --fractions 0 --out {ws}/study", "--fractions must be shares in (0, 1]", None),
    ("study --mode patch --patch-sizes 0 --out {ws}/study", "--patch-sizes must be 1 or more",
     None),
    # bench
    ("bench vit_nano_patch4_32 --batch 0", "--batch must be 1 or more, got 0", None),
    ("bench vit_nano_patch4_32 --batch -1", "--batch must be 1 or more, got -1", None),
    ("bench vit_nano_patch4_32 --steps 0", "--steps must be 1 or more, got 0", None),
    ("bench vit_nano_patch4_32 --img-size 30", "not divisible by patch size 4", None),
    ("bench vit_nope", "unknown model 'vit_nope'", None),
    # --- every option checked before work starts: finite, in range, known
    ("train --warmup-epochs inf --out {ws}/runs", "warmup_epochs must be a finite number", None),
    ("train --lr inf --out {ws}/runs", "lr must be a finite number, got inf", None),
    ("train --lr nan --out {ws}/runs", "lr must be a finite number, got nan", None),
    ("train --lr 0 --out {ws}/runs", "lr must be a positive finite number, got 0", None),
    ("train --lr -1 --out {ws}/runs", "lr must be a positive finite number, got -1", None),
    ("train --config {ws}/nan.yaml --out {ws}/runs", "lr must be a finite number", None),
    ("train --label-smoothing 2 --out {ws}/runs", "label_smoothing must be at most 0.99", None),
    ("train --randaugment 100 --out {ws}/runs", "randaugment must be at most 30", None),
    ("train --img-size 100000 --out {ws}/runs", "img_size must be at most 2048", None),
    ("train --img-size 0 --out {ws}/runs", "img_size must be 1 or more", None),
    ("train --device gpu --out {ws}/runs", "device 'gpu' is not one vitkit knows", None),
    ("train --ema-decay 1 --out {ws}/runs", "ema_decay must be at most", None),
    ("train --layer-decay 1.5 --out {ws}/runs", "layer_decay must be at most 1.0", None),
    ("train --distill-tau 0 --out {ws}/runs", "distill_tau must be a positive finite number", None),
    ("train --std 0 1 1 --out {ws}/runs", "std must be positive for every channel", None),
    ("train --mean nan 0 0 --out {ws}/runs", "mean must be a finite number", None),
    ("train --clip-grad inf --out {ws}/runs", "clip_grad must be a finite number", None),
    ("train --weight-decay nan --out {ws}/runs", "weight_decay must be a finite number", None),
    ("train --min-lr -1 --out {ws}/runs", "min_lr must be 0 or more", None),
    ("train --epochs 0 --out {ws}/runs", "epochs must be 1 or more, got 0", None),
    ("train --accum-steps 0 --out {ws}/runs", "accum_steps must be 1 or more", None),
    ("train --drop-path 1.5 --out {ws}/runs", "drop_path must be between 0 and 1", None),
    ("train --mixup -1 --out {ws}/runs", "mixup must be 0 or more", None),
    ("train --random-erasing 2 --out {ws}/runs", "random_erasing must be between 0 and 1",
     None),
    ("train --steps -5 --out {ws}/runs", "steps must be 0 or more", None),
    ("train --distill hard --out {ws}/runs", "distillation needs --teacher", None),
    ("train --distill medium --teacher x --out {ws}/runs", "distill must be 'hard' or 'soft'",
     None),
    ("train --recipe nope --out {ws}/runs", "unknown recipe 'nope'", None),
    ("train --batch-size abc --out {ws}/runs", "invalid int value: 'abc'", None),
    ("train --data digits:0-20 --out {ws}/runs", "digits:CLASSES takes class numbers 0-9",
     None),
    ("train --data imagefolder:{ws}/a-file --out {ws}/runs", "a-file", None),
    # --- --init and --resume: what cannot apply is refused with the reason
    ("train --init {ws}/vit.safetensors --patch-size 8 --out {ws}/runs",
     "--patch-size sets the patches of a model trained from scratch", None),
    ("train --init {ws}/vit.safetensors --model vit_base_patch16_224 --data digits "
     "--img-size 32 --steps 1 --out {ws}/runs", "the weights do not fit: vit_base_patch16_224 "
     "has patch_size=16, embed_dim=768", None),
    ("train --init {ws}/cnn.safetensors --model resnet34 --data digits --img-size 32 --steps 1 "
     "--out {ws}/runs", "is resnet18, not resnet34", None),
    ("train --resume {ws}/runs/run --overwrite", "drop the other options (--overwrite)", None),
    ("train --resume {ws}/runs/run --steps 9", "drop the other options (--steps)", None),
    ("train --teacher {ws}/random.pth --distill hard --data digits --img-size 16 --steps 1 "
     "--out {ws}/runs", "random.pth", None),
    # --- a finished run is never replaced: refused with the choices
    ("train --data digits --img-size 16 --steps 1 --out {ws}/runs --name run",
     "{ws}/runs/run already holds a run", None),
    ("train --data digits --img-size 16 --steps 1 --out {ws}/runs --name run",
     "--resume {ws}/runs/run", None),
    ("train --steps 1 --out {ws}/a-file", "{ws}/a-file is a file; a run needs a folder there",
     None),
    ("train --steps 1 --out {ws}/runs --name damaged", "already holds a run", None),
    ("train --data imagefolder:{ws}/cut-folder --img-size 16 --batch-size 2 --steps 12 "
     "--model vit_nano_patch4_32 --out {ws}/runs",
     "cannot read image {ws}/cut-folder/train/a/cut.jpg while training", None),
    # --- checkpoints whose metadata or config says what cannot be read
    ("convert {ws}/newer.safetensors {ws}/o.safetensors", "describes options this vitkit does "
     "not know: shiny_new_option", None),
    ("convert {ws}/hf-no-width {ws}/o.safetensors", "whose config lacks 'hidden_size'", None),
    ("predict {ws}/hf-bad-json {ws}/good", "{ws}/hf-bad-json/config.json is not valid JSON: "
     "Expecting property name enclosed in double quotes at line 2", None),
    ("eval {ws}/vit.safetensors --data digits:0-2 --out {ws}/a-file",
     "already exists and is not a folder", None),
    # --- study
    ("study --epochs inf --out {ws}/study", "--epochs must be a positive finite number", None),
    ("study --epochs nan --out {ws}/study", "--epochs must be a positive finite number", None),
    ("study --epochs 0 --out {ws}/study", "--epochs must be a positive finite number", None),
    ("study --lr inf --out {ws}/study", "--lr must be a positive finite number", None),
    ("study --warmup 1 --out {ws}/study", "--warmup is a share of each run's steps", None),
    ("study --warmup nan --out {ws}/study", "--warmup is a share of each run's steps", None),
    ("study --max-steps -1 --out {ws}/study", "--max-steps must be 0 (no cap) or more", None),
    ("study --min-steps 0 --out {ws}/study", "--min-steps must be 1 or more", None),
    ("study --batch-size 0 --out {ws}/study", "--batch-size must be 1 or more", None),
    ("study --augmentation extreme --out {ws}/study", "invalid choice: 'extreme'", None),
    ("study --mode patch --patch-sizes 3 --out {ws}/study", "no patch size of [3] divides",
     None),
    ("study --mode patch --lr nan --out {ws}/study", "--lr must be a positive finite number",
     None),
    ("study --mode patch --warmup -0.5 --out {ws}/study", "--warmup is a share", None),
    ("study --mode patch --steps 0 --out {ws}/study", "--steps must be 1 or more", None),
    # --- info, list, convert, resize
    ("info vit_base_patch16_224 --patch-size 0", "patch_size must be 1 or more, got 0", None),
    ("info vit_base_patch16_224 --patch-size -4", "patch_size must be 1 or more, got -4", None),
    ("info vit_base_patch16_224 --patch-size 9", "not divisible by patch size 9", None),
    ("list zzz", "no registered model name contains 'zzz'", None),
    ("info vit_base_patch16_224 --img-size 100000", "is 39,062,500 patches; vitkit builds ViTs "
     "of up to 262,144", None),
    ("bench vit_base_patch16_224 --img-size 100000", "is 39,062,500 patches", None),
    ("convert {ws}/vit.safetensors {ws}/o.safetensors --img-size 100000",
     "is 625,000,000 patches", None),
    ("resize {ws}/cnn.safetensors {ws}/o.safetensors --img-size 64",
     "is a CNN (resnet18): it has no position table to resize", None),
    ("resize {ws}/vit.safetensors {ws}/o.safetensors --img-size 0", "expected a size like 384",
     None),
    ("convert {ws}/vit.safetensors {ws}/o.safetensors --img-size 31x32",
     "not divisible by patch size 4", None),
    ("convert {ws}/vit.safetensors {ws}/o --to nope", "invalid choice: 'nope'", None),
    ("convert {ws}/random.npz {ws}/o.safetensors", "random.npz as .npz: it is not a complete "
     ".npz archive", None),
    # --- predict: a failed run never replaces an earlier file
    ("predict {ws}/vit.safetensors {ws}/text.jpg --out {ws}/kept.csv",
     "{ws}/kept.csv was not written", None),
    ("predict {ws}/vit.safetensors {ws}/empty.pth --out {ws}/kept.csv", "was not written",
     None),
    ("predict {ws}/vit.safetensors {ws}/good --top-k -1", "--top-k must be 1 or more", None),
    ("predict {ws}/cnn.safetensors {ws}/good --out {ws}/a-file/p.csv", "a-file", None),
    # --- attention
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --method nope --out {ws}/att",
     "invalid choice: 'nope'", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --head foo --out {ws}/att",
     "expected a head index or mean/max/min", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --layer -9 --out {ws}/att",
     "--layer -9 does not exist", None),
    ("attention {ws}/good --checkpoint {ws}/vit.safetensors --method map --out {ws}/att",
     "--method map does not apply to this model", None),
    ("attention {ws}/mixed/text.jpg {ws}/bomb.png --checkpoint {ws}/vit.safetensors "
     "--out {ws}/att", "none of the 2 images could be read", None),
    # --- eval
    ("eval {ws}/vit.safetensors --data digits --split test", "invalid choice: 'test'", None),
    ("eval {ws}/cnn.safetensors --data nope", "unknown dataset 'nope'", None),
    ("eval {ws}/vit.safetensors --data imagefolder:{ws}/missing", "missing does not exist",
     None),
    ("eval {ws}/vit.safetensors --data digits:0-2 --out {ws}/a-file", "a-file", None),
    # --- the four messages of the last probe: each says what it is
    ("doctor {ws}/strings_maps.npy", "it holds <U1 values, not numbers", None),
    ("doctor {ws}/binary-config", "binary-config/config.yaml is not text", None),
    ("attention {ws}/good/china.jpg --checkpoint {ws}/vit.safetensors --out {ws}/att-full",
     "results could be written (No space left on device, writing to {ws}/att-full); the "
     "images were read", _disk_full),
    # --- doctor: its inputs read with messages of its own
    ("doctor {ws}/vit.safetensors --img-size abc", "expected a size like 384", None),
    ("doctor {ws}/random.npz", "it is not a complete .npz archive", None),
    ("doctor {ws}/random_maps.npy", "it holds Python objects, which are never loaded", None),
    ("doctor {ws}/text.jpg", "text.jpg", None),
    ("doctor {ws}/vit.safetensors --image {ws}/bomb.png", "bomb.png: it is too large", None),
    # --- bench
    ("bench vit_nano_patch4_32 --warmup -1", "--warmup must be 0 or more", None),
    ("bench vit_nano_patch4_32 --dtype float16", "invalid choice: 'float16'", None),
    ("bench vit_nano_patch4_32 --img-size 0", "--img-size must be 1 or more", None),
    ("bench vit_nano_patch4_32 --train --attn", "drop --train or --attn", None),
    # --- explore and demo
    ("explore --checkpoint {ws}/vit.safetensors --port -1", "--port must be 0..65535", None),
    ("explore --checkpoint {ws}/vit.safetensors --max-upload-mb nan", "must be a positive",
     None),
    ("explore --checkpoint {ws}/vit.safetensors --images {ws}/missing", "is not a folder",
     None),
    ("demo --num-images 0 --out {ws}/demo", "--num-images must be 1 or more", None),
    ("demo --img-size 0 --out {ws}/demo", "--img-size must be 1 or more", None),
    ("demo --batch-size 0 --out {ws}/demo", "--batch-size must be 1 or more", None),
    ("demo --cnn-steps -1 --out {ws}/demo", "--cnn-steps must be 1 or more", None),
]


def _snapshot(root: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("line", "says", "setup"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_a_message_and_exit_code_2(ws, line, says, setup, capsys, monkeypatch):
    if setup is not None:
        setup(monkeypatch)
    before = _snapshot(ws)
    argv = [part.replace("{ws}", str(ws)) for part in line.split()]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusal of an option: usage + message
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in out + err
    assert says.replace("{ws}", str(ws)) in err
    assert f"vitkit {argv[0]}: error:" in err
    after = _snapshot(ws)
    changed = [str(p) for p, digest in before.items() if after.get(p) != digest]
    assert not changed, f"modified or deleted: {changed}"
    assert not (ws / "runs").exists() or {p.name for p in (ws / "runs").iterdir()} == \
        {"run", "damaged"}, "a run that failed before training left a folder behind"


def test_predict_keeps_every_good_image_of_a_batch_with_bad_ones(ws, tmp_path, capsys):
    out = tmp_path / "predictions.csv"
    assert main(["predict", str(ws / "vit.safetensors"), str(ws / "mixed"),
                 "--out", str(out)]) == 0
    rows = out.read_text(encoding="utf-8").splitlines()[1:]
    good = [r for r in rows if r.endswith(",") and ("china" in r or "flower" in r)]
    bad = [r for r in rows if "cannot read image" in r or "too large" in r]
    assert len(good) == 2 and len(bad) == 3, rows
    assert "Traceback" not in capsys.readouterr().err


def test_attention_goes_on_after_a_bad_image(ws, tmp_path, capsys):
    out = tmp_path / "att"
    assert main(["attention", str(ws / "mixed"), "--checkpoint", str(ws / "vit.safetensors"),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.err.count("skipped:") == 3
    assert "china.jpg:\n  1." in printed.out
    assert (out / "china_rollout.png").exists() and (out / "flower_rollout.png").exists()


def test_the_doctor_reads_a_metrics_file_with_rows_longer_than_its_header(ws, capsys):
    """Extra cells are ignored (a hand-edited or concatenated file), not a traceback, and the
    doctor says which rows are ragged."""
    assert main(["doctor", str(ws / "long-rows")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "metrics.csv: the header has 3 columns but line 2 (5 cells)" in err


def test_a_bug_inside_vitkit_is_a_traceback_and_exit_1(monkeypatch, capsys):
    """A ValueError vitkit did not mean for the user (a failed unpacking) is a bug: its
    traceback, one line saying so, exit code 1; a user's mistake stays a message, exit 2."""
    def broken(*args, **kwargs):
        a, b, c = (1, 2)  # noqa: F841  the planted bug: not enough values to unpack

    monkeypatch.setattr("vitkit.commands.info.summary", broken)
    assert main(["info", "vit_nano_patch4_32"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "not enough values to unpack" in err
    assert "this is a bug in vitkit" in err and "error:" not in err
    monkeypatch.undo()
    assert main(["info", "vit_nope"]) == 2  # the user's mistake, as before
    err = capsys.readouterr().err
    assert "Traceback" not in err and "vitkit info: error:" in err


def test_a_yaml_number_read_as_text_is_converted(tmp_path):
    (tmp_path / "c.yaml").write_text('lr: 5e-4\nepochs: "3"\nhflip: "true"\n')
    cfg = resolve({}, str(tmp_path / "c.yaml"))
    assert (cfg.lr, cfg.epochs, cfg.hflip) == (5e-4, 3, True)


@pytest.mark.parametrize("seed", range(40))
def test_any_random_bytes_are_not_a_checkpoint(tmp_path, seed):
    """The unpickler raises many types on arbitrary bytes; every one is a CheckpointError."""
    path = tmp_path / "random.pth"
    path.write_bytes(random.Random(seed).randbytes(random.Random(seed).randint(1, 5000)))
    with pytest.raises(vitkit.CheckpointError, match="random.pth"):
        vitkit.load_model(path)
