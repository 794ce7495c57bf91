"""The embedded detection set "shapes": deterministic, written once and atomically, read as COCO."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vispe.data import shapes
from vispe.data.detection import build_detection_dataset, collate_detection, detection_info

SMALL = dict(n_train=12, n_val=4)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_seed_same_files_other_seed_other_files(tmp_path):
    a = shapes.ensure_shapes(tmp_path / "a", seed=3, **SMALL)
    b = shapes.ensure_shapes(tmp_path / "b", seed=3, **SMALL)
    c = shapes.ensure_shapes(tmp_path / "c", seed=4, **SMALL)
    fa, fb, fc = files(a), files(b), files(c)
    assert len(fa) == 12 + 4 + 2 + 1 and fa == fb
    ann = "annotations/instances_train2017.json"
    assert fa[ann] != fc[ann] and fa["train2017/000000000001.jpg"] != fc["train2017/000000000001.jpg"]
    stamp = json.loads(fa[shapes.STAMP])
    assert stamp["seed"] == 3 and stamp["version"] == shapes.VERSION and stamp["n_train"] == 12


def test_second_call_reuses_the_set(tmp_path, monkeypatch):
    root = shapes.ensure_shapes(tmp_path / "s", **SMALL)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}

    def fail(*args, **kwargs):
        raise AssertionError("the set was written again")

    monkeypatch.setattr(shapes, "write_shapes", fail)
    assert shapes.ensure_shapes(tmp_path / "s", **SMALL) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_default_folder_depends_on_seed_and_options(tmp_path, monkeypatch):
    monkeypatch.setenv("VISPE_DATA", str(tmp_path))
    a = shapes.ensure_shapes(seed=0, **SMALL)
    assert a.parent == tmp_path / "shapes" and a.name.startswith("seed0-")
    assert shapes.default_folder(1, shapes.shapes_options(SMALL)) != a
    assert shapes.default_folder(0, shapes.shapes_options({**SMALL, "max_objects": 2})) != a


def test_refuses_a_folder_of_other_settings_or_without_stamp(tmp_path):
    root = shapes.ensure_shapes(tmp_path / "s", seed=1, **SMALL)
    with pytest.raises(ValueError, match=r"other settings \(seed: has 1, asked 2\)"):
        shapes.ensure_shapes(root, seed=2, **SMALL)
    (root / shapes.STAMP).unlink()
    with pytest.raises(ValueError, match="no vispe_shapes.json: it is not a complete shapes set"):
        shapes.ensure_shapes(root, seed=1, **SMALL)
    (tmp_path / "empty").mkdir()  # an empty folder is fine to fill
    assert shapes.ensure_shapes(tmp_path / "empty", seed=1, **SMALL) == tmp_path / "empty"


def test_a_write_that_dies_half_way_is_never_taken_as_complete(tmp_path, monkeypatch):
    root = tmp_path / "s"
    calls = []

    def dies_after_3(image, path):
        calls.append(path)
        if len(calls) > 3:
            raise KeyboardInterrupt("killed")
        image.save(path, quality=shapes.JPEG_QUALITY)

    monkeypatch.setattr(shapes, "_save_image", dies_after_3)
    with pytest.raises(KeyboardInterrupt):
        shapes.ensure_shapes(root, **SMALL)
    assert not root.exists() and not list(tmp_path.iterdir())  # the temporary folder is removed too
    monkeypatch.undo()
    assert files(shapes.ensure_shapes(root, **SMALL)) == files(shapes.ensure_shapes(tmp_path / "clean", **SMALL))


def _write_until_killed(root: Path, marker: Path) -> None:
    """In a forked child: write the set, stopping for good after the third image (the parent kills it)."""
    save = shapes._save_image

    def slow(image, path):
        save(image, path)
        if len(list(path.parent.iterdir())) == 3:
            marker.touch()
            time.sleep(120)

    shapes._save_image = slow
    shapes.ensure_shapes(root, **SMALL)


def test_sigkill_half_way_leaves_no_complete_set(tmp_path):
    """A process killed with SIGKILL (no cleanup runs) leaves only its temporary folder."""
    root, marker = tmp_path / "s", tmp_path / "marker"
    other_host = tmp_path / ".s.tmp-1@another-host-abcd1234"  # a rank elsewhere writing on a shared disk
    other_host.mkdir()
    proc = multiprocessing.get_context("fork").Process(target=_write_until_killed, args=(root, marker))
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the writer did not reach its third image"
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == -signal.SIGKILL
    temps = [p for p in tmp_path.iterdir() if p.name.startswith(".s.tmp-") and p != other_host]
    assert not root.exists() and len(temps) == 1 and len(list((temps[0] / "train2017").iterdir())) == 3
    assert files(shapes.ensure_shapes(root, **SMALL)) == files(shapes.ensure_shapes(tmp_path / "clean", **SMALL))
    assert not temps[0].exists() and other_host.exists()  # this host's dead process's leftovers are cleaned up


def test_another_process_finishing_first_is_fine(tmp_path, monkeypatch):
    root, real = tmp_path / "s", shapes.write_shapes

    def racing(folder, seed, opts):  # while this call writes, another one completes the same set
        monkeypatch.setattr(shapes, "write_shapes", real)
        shapes.ensure_shapes(root, seed, **opts)
        real(folder, seed, opts)

    monkeypatch.setattr(shapes, "write_shapes", racing)
    assert shapes.ensure_shapes(root, **SMALL) == root
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_rendered_objects_follow_the_documented_rules():
    opts = shapes.shapes_options({})
    counts, cut, empty, sizes = np.zeros(6, dtype=int), 0, 0, set()
    for i in range(150):
        pixels, objects = shapes.render_image(np.random.default_rng([0, 0, i]), opts)
        h, w = pixels.shape[:2]
        sizes.add((h, w))
        assert 64 <= h <= 96 and 64 <= w <= 96 and len(objects) <= 4
        empty += not objects
        union = np.zeros((h, w), dtype=bool)
        for cat, mask in objects:
            counts[cat] += 1
            assert not (union & mask).any()  # objects never overlap
            union |= mask
            colours = np.unique(pixels[mask], axis=0)
            assert len(colours) == 1  # one solid colour ...
            ys, xs = np.nonzero(mask)
            y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
            assert 6 <= y1 - y0 <= 40 and 6 <= x1 - x0 <= 40
            ring = np.zeros((h, w), dtype=bool)  # ... far from the background right around it
            ring[max(y0 - 2, 0):y1 + 2, max(x0 - 2, 0):x1 + 2] = True
            ring &= ~union
            if ring.any():
                assert np.linalg.norm(pixels[ring].mean(0) - colours[0]) > 40
            cut += y0 == 0 or x0 == 0 or y1 == h or x1 == w
    assert counts[0] == 0 and counts[1:].min() > 30  # every class, ids 1..5
    assert 10 <= empty <= 60 and 20 <= cut <= 0.5 * counts.sum()
    assert len(sizes) > 100 and sum(h != w for h, w in sizes) > 100


def test_shape_masks_fill_their_square():
    rng = np.random.default_rng(0)
    for cat in shapes.CATEGORIES:
        m = shapes.shape_mask(cat, 30, rng)
        assert m.shape == (30, 30) and m.any(0).all() and m.any(1).all()  # touches all four sides
    disc, ring, square = (shapes.shape_mask(c, 30, rng) for c in (2, 5, 1))
    assert square.all() and not ring[15, 15] and disc[15, 15] and ring.sum() < disc.sum() < square.sum()


def test_json_boxes_are_the_objects_in_the_files(tmp_path):
    """Boxes written to the JSON equal the tight boxes of the rendered objects (before JPEG)."""
    root = shapes.ensure_shapes(tmp_path / "s", seed=5, **SMALL)
    data = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    first_val = 1 + SMALL["n_train"]
    for i in range(SMALL["n_val"]):
        pixels, objects = shapes.render_image(np.random.default_rng([5, 1, i]), shapes.shapes_options(SMALL))
        anns = [a for a in data["annotations"] if a["image_id"] == first_val + i]
        img = next(im for im in data["images"] if im["id"] == first_val + i)
        assert (img["height"], img["width"]) == pixels.shape[:2]
        assert len(anns) == len(objects)
        for a, (cat, mask) in zip(anns, objects):
            ys, xs = np.nonzero(mask)
            assert a["category_id"] == cat and a["area"] == mask.sum() and a["iscrowd"] == 0
            assert a["bbox"] == [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()]


def test_read_through_the_coco_loader_in_padded_batches(tmp_path):
    info = detection_info("shapes")
    assert info.num_classes == 6 and info.category_names == shapes.CATEGORIES
    ds = build_detection_dataset("shapes", "val", root=tmp_path / "s", **SMALL)
    assert len(ds) == 4 and ds.coco.getCatIds() == [1, 2, 3, 4, 5]
    items = [ds[i] for i in range(len(ds))]
    for image, t in items:
        h, w = image.shape[1:]
        assert min(h, w) == 64 or max(h, w) in (95, 96)  # the set's default sizes
        assert set(t["labels"].tolist()) <= {1, 2, 3, 4, 5}
    images, mask, targets = collate_detection(items, size_divisibility=32)
    assert len(targets) == 4 and images.shape[-2] % 32 == 0 and images.shape[-1] % 32 == 0
    padding = sum(images.shape[-2] * images.shape[-1] - x.shape[1] * x.shape[2] for x, _ in items)
    assert mask.sum() == padding > 0
    train = build_detection_dataset("shapes", "train", root=tmp_path / "s", **SMALL)
    torch.manual_seed(0)
    assert len({tuple(train[i][0].shape) for i in range(6)}) > 1
    with pytest.raises(ValueError, match="unknown option n_test=3"):
        build_detection_dataset("shapes", "val", root=tmp_path / "s", n_test=3)
    with pytest.raises(ValueError, match="max_object=200: expected at most min_side=64"):
        detection_info("shapes", max_object=200)


def test_colours_by_class_and_desaturated_backgrounds():
    """Default: each class has its own hue (saturated objects) on greyish textured backgrounds."""
    import colorsys

    opts = shapes.shapes_options({})
    hues = {c: [] for c in shapes.CATEGORIES}
    bg_sat, fg_sat = [], []
    for i in range(60):
        pixels, objects = shapes.render_image(np.random.default_rng([1, i]), opts)
        union = np.zeros(pixels.shape[:2], dtype=bool)
        for cat, mask in objects:
            r, g, b = pixels[mask][0] / 255.0
            h, s, _ = colorsys.rgb_to_hsv(r, g, b)
            if s > 0.3:  # a rare fallback colour (the complement of the background) is not the class's hue
                hues[cat].append(h)
            fg_sat.append(s)
            union |= mask
        rgb = pixels[~union].astype(float)
        bg_sat.append(((rgb.max(-1) - rgb.min(-1)) / np.maximum(rgb.max(-1), 1)).mean())
    for cat, hs in hues.items():
        centre = (cat - 1) / len(shapes.CATEGORIES)
        dist = [min(abs(h - centre), 1 - abs(h - centre)) for h in hs]
        assert len(hs) > 5 and max(dist) <= 0.045, (cat, max(dist))
    assert np.mean(bg_sat) < 0.25 and np.mean(fg_sat) > 0.5
    rand = shapes.shapes_options({"colours": "random", "bg_saturation": 1.0})
    sat = []
    for i in range(20):
        pixels, objects = shapes.render_image(np.random.default_rng([1, i]), rand)
        rgb = pixels.reshape(-1, 3).astype(float)
        sat.append(((rgb.max(-1) - rgb.min(-1)) / np.maximum(rgb.max(-1), 1)).mean())
    assert np.mean(sat) > np.mean(bg_sat) + 0.05
    with pytest.raises(ValueError, match=r"texture=1.5: expected a number in \[0, 1\]"):
        shapes.shapes_options({"texture": 1.5})
    with pytest.raises(ValueError, match=r"colours='rainbow': expected one of 'by_class', 'random'"):
        shapes.shapes_options({"colours": "rainbow"})
