"""vispe.data: embedded digit-canvas tasks, CIFAR-10 through torchvision (on a miniature copy), errors."""
from __future__ import annotations

import pickle
import re
import shutil
import urllib.error

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from vispe.data import available_datasets, build_dataset, cifar10 as cifar_mod, dataset_info, write_miniature_cifar10
from vispe.data.digits_canvas import source_indices

DIGITS = ["digits_class", "digits_cell", "digits_relative", "digits_content_position"]
SMALL = dict(n_train=400, n_test=200)
TARGET = load_digits().target
SOURCES = load_digits().images  # (1797, 8, 8)
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)  # published CIFAR-10 statistics
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def build(name, split="train", **kw):
    return build_dataset(name, split, **{**SMALL, **kw})


def stack(ds):
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    return torch.stack(xs), torch.tensor(ys)  # (n, C, H, W), (n,)


def ink(ds):
    """Boolean ink masks (n, H, W): pixels above the normalised background value."""
    background = -ds.info.mean[0] / ds.info.std[0]
    return (ds.images[:, 0] > background + 1e-4).numpy()


def ink_centre(mask):
    """Centre (y, x) of the ink bounding box of a (H, W) mask."""
    ys, xs = np.nonzero(mask)
    return np.array([(ys.min() + ys.max() + 1) / 2, (xs.min() + xs.max() + 1) / 2])


# ---------------------------------------------------------------------------------------- registry

def test_registry_and_info():
    assert set(DIGITS + ["cifar10"]) <= set(available_datasets())
    for name in available_datasets():
        info = dataset_info(name)
        assert info.num_classes == len(info.class_names) == len(set(info.class_names))
        assert len(info.mean) == len(info.std) == info.in_chans == 3 and min(info.std) > 0
    assert dataset_info("digits_cell", k=4).num_classes == 16
    assert dataset_info("digits_class", in_chans=1).in_chans == 1


# ------------------------------------------------------------------------------- embedded tasks

@pytest.mark.parametrize("name", DIGITS)
def test_deterministic_by_seed(name):
    a, b, c = build(name, seed=3), build(name, seed=3), build(name, seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)
    assert not torch.equal(a.images[:200], build(name, "test", seed=3).images)


@pytest.mark.parametrize("name", DIGITS)
def test_labels_in_range_every_class_present(name):
    info = dataset_info(name)
    for split in ("train", "test"):
        ds = build(name, split)
        x, y = ds[0]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and isinstance(y, int)
        counts = torch.bincount(ds.labels, minlength=info.num_classes)
        assert len(counts) == info.num_classes and counts.min() > 0
        assert counts.max() - counts.min() <= 1  # balanced


@pytest.mark.parametrize("name", DIGITS)
def test_train_and_test_digit_images_are_disjoint(name):
    tr, te = build(name, "train", seed=0), build(name, "test", seed=5)
    assert not set(tr.digits.ravel()) & set(te.digits.ravel())
    assert set(tr.digits.ravel()) <= set(source_indices("train"))
    assert set(te.digits.ravel()) <= set(source_indices("test"))
    assert not set(source_indices("train")) & set(source_indices("test"))
    assert len(source_indices("train")) + len(source_indices("test")) == len(TARGET)


@pytest.mark.parametrize("name", DIGITS)
def test_label_follows_documented_rule(name):
    ds = build(name)
    S, s, y = ds.canvas, ds.digit_size, ds.labels.numpy()
    top, cls = ds.tops, TARGET[ds.digits]  # (n, m, 2), (n, m)
    assert (top >= 0).all() and (top + s <= S).all()
    if name == "digits_class":
        assert (cls[:, 0] == y).all()
    elif name == "digits_cell":  # the digit lies wholly in cell (row, col) of a 3x3 grid
        row, col = y // 3, y % 3
        for axis, want in ((0, row), (1, col)):
            assert (np.floor(top[:, 0, axis] * 3 / S) == want).all()
            assert (np.floor((top[:, 0, axis] + s - 1) * 3 / S) == want).all()
    elif name == "digits_relative":
        assert (cls[:, 0] < cls[:, 1]).all()  # A is the smaller class
        d = top[:, 0] - top[:, 1]  # (n, 2) A - B as (dy, dx)
        assert (y == 2 * (d[:, 0] > 0) + (d[:, 1] > 0)).all()
        assert (np.abs(d) >= 4).all() and (np.abs(d).max(1) >= s).all()  # margin, no overlap
    else:
        x = top[:, 0, 1]
        assert (cls[:, 0] == y % 10).all()
        assert ((y >= 10) == (x >= S / 2)).all() and ((x + s <= S / 2) | (x >= S / 2)).all()


@pytest.mark.parametrize("name", DIGITS)
def test_rendered_digit_is_the_source_image_in_its_box(name):
    ds = build(name, n_train=60)
    mask = ink(ds)
    inside = np.zeros_like(mask)
    for i in range(len(ds)):
        for j, (y0, y1, x0, x1) in enumerate(ds.boxes[i]):
            inside[i, y0:y1, x0:x1] = True
            crop = ds.images[i, :, y0:y1, x0:x1][None]  # (1, 1, s, s)
            small = torch.nn.functional.adaptive_avg_pool2d(crop, 8).flatten().numpy()
            src = SOURCES[ds.digits[i, j]].ravel()
            assert np.corrcoef(small, src)[0, 1] > 0.9
    assert not (mask & ~inside).any()  # no ink outside the digit boxes


@pytest.mark.parametrize("name", DIGITS)
@pytest.mark.parametrize("size", [24, 48, (24, 40)])
def test_other_img_size_same_label_positions_scale(name, size):
    native, ds = build(name, n_train=80), build(name, n_train=80, img_size=size)
    H, W = (size, size) if isinstance(size, int) else size
    assert ds[0][0].shape == (3, H, W) and torch.equal(native.labels, ds.labels)
    f = np.array([H / 32, W / 32])
    m0, m1 = ink(native), ink(ds)
    for i in range(len(ds)):
        for b0, b1 in zip(native.boxes[i], ds.boxes[i]):  # each digit's ink centre scales
            c0 = ink_centre(m0[i, b0[0]:b0[1], b0[2]:b0[3]]) + b0[[0, 2]]
            c1 = ink_centre(m1[i, b1[0]:b1[1], b1[2]:b1[3]]) + b1[[0, 2]]
            assert np.abs(c1 / f - c0).max() <= 1.5
        cy, cx = ink_centre(m1[i])
        label = int(ds.labels[i])
        if name == "digits_cell":  # read the cell off the image at this size
            assert int(cy * 3 // H) * 3 + int(cx * 3 // W) == label
        if name == "digits_content_position":
            assert (cx >= W / 2) == (label >= 10)


def test_cell_task_needs_position():
    """Sorted pixels (a permutation-invariant statistic) carry no cell information; raw pixels do."""
    tr = build_dataset("digits_cell", "train", n_train=900, in_chans=1)
    te = build_dataset("digits_cell", "test", n_test=450, in_chans=1)
    xtr, xte = tr.images.flatten(1).numpy(), te.images.flatten(1).numpy()
    ytr, yte = tr.labels.numpy(), te.labels.numpy()
    raw = LogisticRegression(max_iter=200).fit(xtr, ytr).score(xte, yte)
    # the 64 largest values hold every ink pixel of the 8x8 digit: the whole sorted vector's content
    str_, ste = np.sort(xtr, 1)[:, -64:], np.sort(xte, 1)[:, -64:]
    srt = LogisticRegression(C=0.1, max_iter=300).fit(str_, ytr).score(ste, yte)
    assert raw > 0.9 and srt < 0.2  # chance is 1/9


@pytest.mark.parametrize("name, chance_at_most", [("digits_class", 0.2), ("digits_content_position", 0.15)])
def test_position_alone_does_not_give_the_class(name, chance_at_most):
    """The ink position predicts nothing of the digit class (class task), only the half (content task)."""
    tr, te = build(name, n_train=800), build(name, "test", n_test=400)
    pos = [np.stack([ink_centre(m) for m in ink(ds)]) for ds in (tr, te)]
    ytr, yte = tr.labels.numpy(), te.labels.numpy()
    knn = KNeighborsClassifier(15).fit(pos[0], ytr)
    assert knn.score(pos[1], yte) < chance_at_most
    if name == "digits_content_position":
        assert KNeighborsClassifier(15).fit(pos[0], ytr >= 10).score(pos[1], yte >= 10) == 1.0


def test_relative_needs_content():
    """Positions without knowing which digit is A: at most 1/2; with A and B told apart: solved."""
    tr, te = build("digits_relative", n_train=1200), build("digits_relative", "test", n_test=600)
    feats = []
    for ds in (tr, te):
        t = ds.tops.reshape(len(ds), 2, 2).astype(float)  # (n, [A, B], (y, x))
        order = np.lexsort((t[:, :, 1], t[:, :, 0]))  # sort the two digits by (y, x): content-blind
        feats.append((t.reshape(len(ds), 4), np.take_along_axis(t, order[:, :, None], 1).reshape(len(ds), 4)))
    ytr, yte = tr.labels.numpy(), te.labels.numpy()
    blind = KNeighborsClassifier(15).fit(feats[0][1], ytr).score(feats[1][1], yte)
    told = KNeighborsClassifier(1).fit(feats[0][0], ytr).score(feats[1][0], yte)
    assert blind < 0.6 and told > 0.9


@pytest.mark.parametrize("name", DIGITS)
def test_normalisation(name):
    ds = build_dataset(name, "train", n_train=2000, seed=1)
    x = ds.images
    assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02
    assert build(name, n_train=2000, seed=1, in_chans=1).info.mean == ds.info.mean[:1]
    big = build(name, img_size=48)
    background = -ds.info.mean[0] / ds.info.std[0]
    assert big.images.min().item() == pytest.approx(background) == x.min().item()
    one, three = build(name, in_chans=1)[0][0], build(name)[0][0]
    assert one.shape == (1, 32, 32) and torch.equal(three, one.expand(3, -1, -1))


def test_train_augment_hook():
    plain = build("digits_cell")
    shifted = build("digits_cell", train_augment=lambda x: x + 1.0)
    assert torch.equal(shifted[5][0], plain[5][0] + 1.0) and shifted[5][1] == plain[5][1]
    for off in ("none", False, True):  # embedded default: no augmentation
        assert torch.equal(build("digits_cell", train_augment=off)[5][0], plain[5][0])
    test = build("digits_cell", "test")  # the test split is never augmented
    assert torch.equal(build("digits_cell", "test", train_augment=lambda x: x + 1.0)[5][0], test[5][0])
    for bad in ("flip", 1):
        with pytest.raises(ValueError, match=f"train_augment={bad!r}: expected None, True, False, one of 'default', 'none'"):
            build("digits_cell", "test", train_augment=bad)


# ---------------------------------------------------------------------------------------- bad input

def test_bad_input_names_argument_value_and_choices():
    with pytest.raises(ValueError, match=r"name='digit_cell'.*did you mean digits_cell.*cifar10"):
        build_dataset("digit_cell", "train")
    with pytest.raises(ValueError, match=r"name='nope'.*expected one of .*digits_relative"):
        dataset_info("nope")
    with pytest.raises(ValueError, match=r"split='val'.*'train', 'test'"):
        build("digits_class", "val")
    with pytest.raises(ValueError, match=r"split='valid'.*'train', 'test'"):
        build_dataset("cifar10", "valid", root="/nonexistent")
    with pytest.raises(ValueError, match=r"unknown option k=3 for data set 'digits_class'; valid options: .*n_train"):
        build("digits_class", k=3)
    with pytest.raises(ValueError, match=r"unknown option colour=1 .*'cifar10'; valid options: verify_md5"):
        dataset_info("cifar10", colour=1)
    with pytest.raises(ValueError, match=r"in_chans=2: expected one of 1, 3"):
        dataset_info("digits_cell", in_chans=2)
    with pytest.raises(ValueError, match=r"digit_size=12: expected at most the smallest cell"):
        build("digits_cell", digit_size=12)
    with pytest.raises(ValueError, match=r"root='data'.*generated in memory"):
        build("digits_cell", root="data")
    with pytest.raises(ValueError, match=r"img_size=\(24, 0\)"):
        build("digits_cell", img_size=(24, 0))
    with pytest.raises(ValueError, match=r"img_size=4: renders"):
        build("digits_cell", img_size=4)
    with pytest.raises(ValueError, match=r"seed=-1: expected a non-negative integer"):
        build("digits_cell", seed=-1)


# ------------------------------------------------------------------------------------------ CIFAR-10

@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_miniature_cifar10(root, n_per_batch=20, seed=0)
    return root


def reference(root, name):
    """Normalised images (N, 3, 32, 32) and labels straight from a batch file (R, G, B planes)."""
    with open(root / "cifar-10-batches-py" / name, "rb") as f:
        entry = pickle.load(f, encoding="bytes")
    raw = entry[b"data"].reshape(-1, 3, 32, 32)
    x = (raw / np.float32(255) - CIFAR_MEAN[:, None, None]) / CIFAR_STD[:, None, None]
    return torch.from_numpy(x.astype(np.float32)), entry[b"labels"], raw


def test_miniature_has_the_real_format(mini):
    folder = mini / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"])
    with open(folder / "data_batch_2", "rb") as f:
        b = pickle.load(f, encoding="bytes")  # the recipe on the CIFAR web page
    assert list(b) == [b"batch_label", b"labels", b"data", b"filenames"]
    assert b[b"data"].dtype == np.uint8 and b[b"data"].shape == (20, 3072)
    assert b[b"batch_label"] == b"training batch 2 of 5" and isinstance(b[b"filenames"][0], bytes)
    assert sorted(b[b"labels"]) == sorted(list(range(10)) * 2)
    with open(folder / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="latin1")  # as torchvision reads it: str keys
    assert meta["label_names"][:3] == ["airplane", "automobile", "bird"] and meta["num_vis"] == 3072


def test_cifar_loads_through_torchvision(mini):
    test = build_dataset("cifar10", "test", root=mini, verify_md5=False)
    assert isinstance(test, torchvision.datasets.CIFAR10) and len(test) == 20
    ref, labels, _ = reference(mini, "test_batch")
    xs, ys = stack(test)
    assert xs.shape == (20, 3, 32, 32) and xs.dtype == torch.float32
    torch.testing.assert_close(xs, ref, atol=1e-5, rtol=0)
    assert ys.tolist() == labels and test.classes[9] == "truck"
    assert torch.equal(build_dataset("cifar10", "test", root=mini, verify_md5=False, train_augment=True)[7][0], xs[7])
    train = build_dataset("cifar10", "train", root=mini, verify_md5=False, train_augment=False)
    assert len(train) == 100
    ref3, labels3, _ = reference(mini, "data_batch_3")
    torch.testing.assert_close(stack(train)[0][40:60], ref3, atol=1e-5, rtol=0)


def test_cifar_default_train_augmentation_is_random_crop_and_flip(mini):
    ds = build_dataset("cifar10", "train", root=mini, verify_md5=False)
    ref = reference(mini, "data_batch_1")[0][0]  # (3, 32, 32)
    torch.manual_seed(0)
    outs = [ds[0][0] for _ in range(40)]
    assert all(o.shape == (3, 32, 32) for o in outs)
    assert any(not torch.equal(o, outs[0]) for o in outs)
    black = torch.from_numpy((0 - CIFAR_MEAN) / CIFAR_STD)[:, None, None].expand(3, 40, 40).clone()  # padding
    black[:, 4:36, 4:36] = ref
    crops = {(dy, dx, fl): (black[:, dy:dy + 32, dx:dx + 32].flip(-1) if fl else black[:, dy:dy + 32, dx:dx + 32])
             for dy in range(9) for dx in range(9) for fl in (0, 1)}
    for o in outs:  # each output is one crop of the padded image, maybe mirrored
        assert min((o - c).abs().max().item() for c in crops.values()) < 1e-5


@pytest.mark.parametrize("size", [48, (24, 40)])
def test_cifar_img_size_resizes(mini, size):
    ds = build_dataset("cifar10", "test", root=mini, img_size=size, verify_md5=False)
    h, w = (size, size) if isinstance(size, int) else size
    _, _, raw = reference(mini, "test_batch")
    pil = Image.fromarray(raw[3].transpose(1, 2, 0)).resize((w, h), Image.BILINEAR)
    want = (np.asarray(pil, dtype=np.float32) / 255 - CIFAR_MEAN) / CIFAR_STD  # (h, w, 3)
    got = ds[3][0]
    assert got.shape == (3, h, w)
    torch.testing.assert_close(got, torch.from_numpy(want).permute(2, 0, 1), atol=2 / 255 / 0.24, rtol=0)


def test_cifar_md5_check_names_the_file(mini):
    with pytest.raises(ValueError, match=r"data_batch_1: its MD5 is not the official one.*verify_md5=False"):
        build_dataset("cifar10", "train", root=mini)


def test_cifar_missing_folder_or_file(tmp_path, mini):
    folder = re.escape(str(tmp_path / "cifar-10-batches-py"))
    with pytest.raises(FileNotFoundError, match=folder + r" not found: expected .*data_batch_5.*download=True"):
        build_dataset("cifar10", "train", root=tmp_path)
    shutil.copytree(mini / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(FileNotFoundError, match=folder + r"/test_batch not found"):
        build_dataset("cifar10", "test", root=tmp_path, verify_md5=False)
    assert len(build_dataset("cifar10", "train", root=tmp_path, verify_md5=False)) == 100


def test_cifar_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network unreachable")

    monkeypatch.setattr(cifar_mod.tv_utils, "download_and_extract_archive", offline)
    with pytest.raises(FileNotFoundError, match=r"download into .* failed \(URLError.*download it by hand") as e:
        build_dataset("cifar10", "train", root=tmp_path, download=True)
    assert "pass download=True" not in str(e.value)  # it was already True (issue 19, item 10)
    # a download that "succeeds" but leaves the files missing: no advice to pass download=True either
    monkeypatch.setattr(cifar_mod.tv_utils, "download_and_extract_archive", lambda *a, **k: None)
    with pytest.raises(FileNotFoundError, match=r"not found: expected .*download=True did not") as e:
        build_dataset("cifar10", "train", root=tmp_path, download=True)
    assert "pass download=True" not in str(e.value)


def test_cifar_truncated_or_bad_batch_names_the_file(tmp_path, mini):
    shutil.copytree(mini / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py")
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    path.write_bytes(path.read_bytes()[:1500])
    with pytest.raises(ValueError, match=re.escape(str(path)) + r" cannot be unpickled .*truncated"):
        build_dataset("cifar10", "train", root=tmp_path, verify_md5=False)
    with open(path, "wb") as f:  # readable but a label out of range
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 12]}, f)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r" has 'labels' outside 0..9"):
        build_dataset("cifar10", "train", root=tmp_path, verify_md5=False)
