"""IDX files (MNIST, Fashion-MNIST): the reader against bytes written here by hand, its errors,
where the files are looked for, class subsets, and the real Fashion-MNIST where it is
installed (Debian's dataset-fashion-mnist)."""

import gzip
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from vitkit.data import idx
from vitkit.data.datasets import GreyImages, load_split, parse_classes
from vitkit.errors import DataError

NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")


def _idx_bytes(array: np.ndarray) -> bytes:
    """The IDX layout spelled out: 0x00 0x00 0x08 ndim, big-endian uint32 dims, the bytes."""
    head = bytes([0, 0, 8, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return head + array.astype(np.uint8).tobytes()


def _write(path: Path, array: np.ndarray) -> Path:
    data = _idx_bytes(array)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def _dataset(folder: Path, n_train=20, n_val=10, side=5, gz=True, seed=0):
    """The four files of a tiny dataset in ``folder``: labels cycle 0..9, every pixel of an
    image is (label * 20 + index) % 256, so a mix-up of images and labels shows."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n, (img_name, lab_name) in (("train", n_train, NAMES[:2]),
                                           ("val", n_val, NAMES[2:])):
        labels = (np.arange(n) + seed) % 10
        images = np.broadcast_to(((labels * 20 + np.arange(n)) % 256)[:, None, None],
                                 (n, side, side))
        suffix = ".gz" if gz else ""
        _write(folder / (img_name + suffix), images)
        _write(folder / (lab_name + suffix), labels)
        out[split] = (images.astype(np.uint8), labels)
    return out


@pytest.fixture
def no_debian(monkeypatch, tmp_path):
    """The Debian fallback points at a folder that does not exist."""
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")


# ----------------------------------------------------------------------------- the reader
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_reader_reads_hand_written_files(tmp_path, suffix):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 4, 3), dtype=np.uint8)  # rows != cols: order checked
    labels = rng.integers(0, 10, 7, dtype=np.uint8)
    a = idx.read_idx(_write(tmp_path / f"i{suffix}", images), 3)
    b = idx.read_idx(_write(tmp_path / f"l{suffix}", labels), 1)
    assert a.shape == (7, 4, 3) and a.dtype == np.uint8 and np.array_equal(a, images)
    assert b.shape == (7,) and np.array_equal(b, labels)
    assert not a.flags.writeable  # shared through the cache: nobody may change it


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_write_idx_round_trips_and_matches_the_format(tmp_path, suffix):
    images = np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5)
    path = idx.write_idx(tmp_path / f"x{suffix}", images)
    assert np.array_equal(idx.read_idx(path, 3), images)
    raw = path.read_bytes()
    assert (gzip.decompress(raw) if suffix else raw) == _idx_bytes(images)
    with pytest.raises(ValueError, match="uint8"):
        idx.write_idx(tmp_path / "f", images.astype(np.float32))


def test_a_changed_file_is_read_again(tmp_path):
    path = _write(tmp_path / "l", np.zeros(3, np.uint8))
    assert idx.read_idx(path, 1).tolist() == [0, 0, 0]
    time.sleep(0.01)
    _write(path, np.ones(4, np.uint8))
    assert idx.read_idx(path, 1).tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(("content", "says"), [
    (_idx_bytes(np.zeros(5, np.uint8)), "magic number is 0x00000801, expected 0x00000803"),
    (b"\x00\x00\x0d\x03" + bytes(12), "magic number is 0x00000d03, expected 0x00000803"),
    (_idx_bytes(np.zeros((3, 4, 4), np.uint8))[:-5], "truncated: 43 bytes of values, expected 48"),
    (_idx_bytes(np.zeros((3, 4, 4), np.uint8)) + b"\x00", "longer than its header says"),
    (b"\x00\x00\x08", "3 bytes, fewer than the 16-byte header"),
    (b"", "0 bytes"),
], ids=["labels", "int32", "truncated", "too-long", "short-header", "empty"])
def test_a_wrong_file_names_itself_and_what_was_expected(tmp_path, content, says):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(DataError, match="train-images-idx3-ubyte") as err:
        idx.read_idx(path, 3)
    assert says in str(err.value) and "replace it with the original file" in str(err.value)


def test_a_broken_gz_names_itself(tmp_path):
    good = gzip.compress(_idx_bytes(np.zeros((3, 4, 4), np.uint8)))
    (tmp_path / "cut.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "plain.gz").write_bytes(_idx_bytes(np.zeros(3, np.uint8)))
    for name in ("cut.gz", "plain.gz"):
        with pytest.raises(DataError, match=rf"{name} is not a readable \.gz file.*download it"):
            idx.read_idx(tmp_path / name, 3)


def test_a_missing_file_or_a_folder_is_an_error(tmp_path):
    with pytest.raises(DataError, match="nothing.gz does not exist"):
        idx.read_idx(tmp_path / "nothing.gz", 1)
    with pytest.raises(DataError, match="is a folder"):
        idx.read_idx(tmp_path, 1)


# ------------------------------------------------------------------------- the data specs
@pytest.mark.parametrize("gz", [True, False])
def test_splits_are_rgb_pil_images_with_their_labels(tmp_path, no_debian, gz):
    made = _dataset(tmp_path / "root", gz=gz)
    for split in ("train", "val"):
        s = load_split("fashion-mnist", split, root=tmp_path / "root")
        images, labels = made[split]
        assert len(s) == len(images) and s.labels == labels.tolist()
        assert isinstance(s.images, GreyImages) and s.classes == idx.IDX_CLASSES["fashion-mnist"]
        img, label = s[3]
        assert img.mode == "RGB" and img.size == (5, 5) and label == labels[3]
        assert (np.asarray(img) == images[3][:, :, None]).all()  # grey copied to R, G, B
    assert load_split("mnist", "val", root=tmp_path / "root").classes == [str(i)
                                                                         for i in range(10)]


def test_lookup_order_root_then_subfolders_then_debian(tmp_path, monkeypatch):
    root, debian = tmp_path / "root", tmp_path / "debian"
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", debian)
    _dataset(debian, n_train=11)
    assert len(load_split("fashion-mnist", "train", root=root)) == 11  # root missing
    root.mkdir()
    assert idx.find_idx_folder("fashion-mnist", root) == debian  # root without files
    _dataset(root / "FashionMNIST" / "raw", n_train=12, gz=False)
    assert len(load_split("fashion-mnist", "train", root=root)) == 12
    _dataset(root / "fashion-mnist", n_train=13)
    assert len(load_split("fashion-mnist", "train", root=root)) == 13
    _dataset(root, n_train=14)
    assert len(load_split("fashion-mnist", "train", root=root)) == 14
    # MNIST has its own sub-folders and no Debian fallback
    other = tmp_path / "other"
    _dataset(other / "MNIST" / "raw", n_train=15)
    assert len(load_split("mnist", "train", root=other)) == 15
    _dataset(other / "mnist", n_train=16)
    assert len(load_split("mnist", "train", root=other)) == 16
    with pytest.raises(DataError, match="mnist is not in"):
        load_split("mnist", "train", root=tmp_path / "empty")


def test_uncompressed_files_are_preferred_to_gz(tmp_path, no_debian):
    _dataset(tmp_path, n_train=20, gz=True)
    _dataset(tmp_path, n_train=30, gz=False)
    assert len(load_split("fashion-mnist", "train", root=tmp_path)) == 30


def test_missing_data_says_both_ways_to_get_it(tmp_path, no_debian):
    with pytest.raises(DataError) as err:
        load_split("fashion-mnist", "train", root=tmp_path / "data")
    msg = str(err.value)
    for part in (str(tmp_path / "data"), str(tmp_path / "data" / "FashionMNIST" / "raw"),
                 str(tmp_path / "no-debian"), "apt-get install dataset-fashion-mnist",
                 "https://github.com/zalandoresearch/fashion-mnist", "--data-root",
                 "t10k-labels-idx1-ubyte.gz"):
        assert part in msg
    with pytest.raises(DataError) as err:
        load_split("mnist", "val", root=tmp_path / "data")
    msg = str(err.value)
    assert "apt-get" not in msg and "no-debian" not in msg
    assert str(tmp_path / "data" / "mnist") in msg and "train-images-idx3-ubyte.gz" in msg


def test_a_folder_with_one_split_only_is_an_error_not_a_mix(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", debian)
    _dataset(debian)
    _dataset(tmp_path / "root")
    for name in NAMES[2:]:
        (tmp_path / "root" / f"{name}.gz").unlink()
    assert len(load_split("fashion-mnist", "train", root=tmp_path / "root")) == 20
    with pytest.raises(DataError, match=r"root has IDX files of fashion-mnist but not "
                                        r"t10k-images-idx3-ubyte\(\.gz\)"):
        load_split("fashion-mnist", "val", root=tmp_path / "root")


def test_images_and_labels_must_agree(tmp_path, no_debian):
    _dataset(tmp_path)
    _write(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
    with pytest.raises(DataError, match="holds 20 images but .*train-labels.* 19 labels"):
        load_split("fashion-mnist", "train", root=tmp_path)
    _write(tmp_path / "train-labels-idx1-ubyte.gz", np.full(20, 10, np.uint8))
    with pytest.raises(DataError, match="holds label 10; fashion-mnist has labels 0-9"):
        load_split("fashion-mnist", "train", root=tmp_path)


def test_a_truncated_file_in_the_data_root_is_named(tmp_path, no_debian):
    _dataset(tmp_path, gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match=f"{path} is truncated"):
        load_split("mnist", "val", root=tmp_path)


def test_a_class_subset_is_relabelled_in_the_order_given(tmp_path, no_debian):
    made = _dataset(tmp_path, n_train=40)
    images, labels = made["train"]
    s = load_split("fashion-mnist:7,0-2", "train", root=tmp_path)
    assert s.classes == ["Sneaker", "T-shirt/top", "Trouser", "Pullover"]
    kept = [i for i, v in enumerate(labels) if v in (7, 0, 1, 2)]
    assert s.labels == [[7, 0, 1, 2].index(labels[i]) for i in kept]
    assert all((np.asarray(s[j][0])[:, :, 0] == images[i]).all() for j, i in enumerate(kept))
    assert load_split("mnist:0-4", "val", root=tmp_path).classes == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize(("text", "says"), [("a", "got 'a'"), ("10", "which names 10"),
                                            ("3-1", "got '3-1'"), ("1,1", "each once"),
                                            ("-1", "got '-1'")])
def test_a_bad_class_subset_is_an_error(text, says):
    with pytest.raises(DataError, match="fashion-mnist:CLASSES takes class numbers 0-9") as err:
        parse_classes("fashion-mnist", text, 10)
    assert says in str(err.value)


def test_a_bad_class_subset_is_refused_before_the_files_are_looked_for(tmp_path, no_debian):
    with pytest.raises(DataError, match="mnist:CLASSES takes class numbers 0-9"):
        load_split("mnist:3-12", "train", root=tmp_path / "nothing")


def test_digits_share_the_class_parser():
    assert parse_classes("digits", "0-2,9", 10) == [0, 1, 2, 9]
    assert load_split("digits:5-7", "val", 8).classes == ["5", "6", "7"]
    with pytest.raises(DataError, match="digits:CLASSES takes class numbers"):
        load_split("digits:x", "val", 8)


def test_grey_images_are_a_sequence():
    seq = GreyImages(np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2))
    assert len(seq) == 3 and len(seq[1:]) == 2 and len(list(seq)) == 3
    assert np.asarray(seq[-1]).shape == (2, 2, 3)


# -------------------------------------------------------------------------- the real files
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_the_real_fashion_mnist(tmp_path):
    start = time.perf_counter()
    train = load_split("fashion-mnist", "train", root=tmp_path)  # empty root: the fallback
    seconds = time.perf_counter() - start
    val = load_split("fashion-mnist", "val", root=tmp_path)
    assert (len(train), len(val)) == (60_000, 10_000)
    assert len(train.classes) == 10 and train.classes[9] == "Ankle boot"
    assert np.bincount(train.labels).tolist() == [6000] * 10
    assert np.bincount(val.labels).tolist() == [1000] * 10
    img, _ = train[0]
    assert img.size == (28, 28) and img.mode == "RGB"
    assert seconds < 3, f"loading the train split took {seconds:.1f} s"


def test_the_demo_explains_in_memory_images(tmp_path, monkeypatch, no_debian):
    import vitkit
    from vitkit.train.demo import DemoOptions, examples

    made = _dataset(tmp_path / "data" / "fashion-mnist", side=28)
    monkeypatch.chdir(tmp_path)  # the demo reads ./data
    vit = vitkit.create_model("vit_nano_patch4_32", num_classes=10)
    x, pictures, boxes, labels = examples(DemoOptions(data="fashion-mnist", num_images=3), vit)
    assert x.shape == (3, 3, 32, 32) and boxes is None
    assert labels.tolist() == made["val"][1][:3].tolist() and pictures[0].shape == (32, 32, 3)
