"""Detection data: the COCO loader, DETR's transforms, collate and COCOeval on a miniature COCO folder
written in the real on-disk format (vispe.data.miniature_coco)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO

from vispe.data import coco as coco_mod
from vispe.data.coco_eval import coco_evaluate
from vispe.data.det_transforms import detr_scales, scale_list
from vispe.data.detection import build_detection_dataset, collate_detection, detection_info
from vispe.data.miniature_coco import BACKGROUND, CATEGORIES, write_miniature_coco

MEAN, STD = torch.tensor(coco_mod.MEAN)[:, None, None], torch.tensor(coco_mod.STD)[:, None, None]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    return write_miniature_coco(tmp_path_factory.mktemp("coco"), n_images=6)


def build(root, split="val", **kw):
    return build_detection_dataset("coco", split, root=root, **{"img_size": 64, **kw})


def objects_of(ds, image_id):
    """{colour (r, g, b): (category id, iscrowd)} of the image's annotations."""
    return {tuple(a["vispe_colour"]): (a["category_id"], a["iscrowd"]) for a in ds.coco.imgToAnns[image_id]}


def pixel_boxes(image, colours):
    """{colour: (x0, y0, x1, y1)} of the pixels at least half of that colour: a pixel blending colour c
    with the background at a fraction a lies (1 - a) |c - background| away from c."""
    if not colours:
        return {}
    rgb = ((image * STD + MEAN) * 255).permute(1, 2, 0).reshape(-1, 3)  # (H * W, 3)
    palette = torch.tensor(colours, dtype=torch.float32)  # (K, 3)
    dist = (rgb[:, None] - palette).norm(dim=-1)  # (H * W, K)
    half = 0.5 * (palette - torch.tensor(BACKGROUND, dtype=torch.float32)).norm(dim=1)  # (K,)
    nearest = torch.where(dist.min(1).values < half[dist.argmin(1)], dist.argmin(1), -1).reshape(image.shape[1:])
    out = {}
    for k, c in enumerate(colours):
        ys, xs = torch.nonzero(nearest == k, as_tuple=True)
        if len(ys):
            out[c] = (xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1)
    return out


def target_xyxy(target):
    h, w = target["size"].tolist()
    cx, cy, bw, bh = (target["boxes"] * torch.tensor([w, h, w, h])).unbind(-1)
    return torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1)  # (N, 4) pixels


def check_boxes_against_pixels(ds, image, target, tol=1.5):
    """Every target box is the pixel box of one non-crowd object of its category; objects without a
    target box are gone (at most a sliver of ``tol`` pixels); the crowd object is never a target."""
    objects = objects_of(ds, int(target["image_id"]))
    found = pixel_boxes(image, list(objects))
    unmatched = set(found)
    for box, label in zip(target_xyxy(target).tolist(), target["labels"].tolist()):
        err = {c: max(abs(a - b) for a, b in zip(box, found[c])) for c in unmatched}
        c = min(err, key=err.get)
        assert err[c] <= tol, (box, found, target["image_id"])
        assert objects[c] == (label, 0)
        unmatched.discard(c)
    for c in unmatched:
        x0, y0, x1, y1 = found[c]
        assert objects[c][1] == 1 or min(x1 - x0, y1 - y0) <= tol, (c, found[c])


# --------------------------------------------------------------------------------- miniature + info

@pytest.mark.filterwarnings("ignore::DeprecationWarning:pycocotools")  # numpy 2 note inside annToMask
def test_miniature_is_real_coco_format(mini):
    for split in ("train", "val"):
        folder, ann_file = coco_mod.split_paths(mini, split)
        coco = COCO(str(ann_file))
        assert sorted(coco.getCatIds()) == [1, 3, 7] and len(coco.getImgIds()) == 6
        assert any(a["iscrowd"] for a in coco.dataset["annotations"])
        assert any(not coco.getAnnIds(imgIds=i) for i in coco.getImgIds())
        for ann in coco.dataset["annotations"]:  # segmentation (polygon / crowd RLE) = the drawn pixels
            info = coco.imgs[ann["image_id"]]
            pixels = np.asarray(Image.open(folder / info["file_name"]))
            drawn = (pixels == ann["vispe_colour"]).all(-1)
            assert (coco.annToMask(ann).astype(bool) == drawn).all()
            x, y, w, h = ann["bbox"]
            assert drawn[y:y + h, x:x + w].all() and drawn.sum() == w * h == ann["area"]


def test_info():
    info = detection_info("coco")
    assert info.num_classes == 91 and len(info.category_names) == 80 and info.in_chans == 3
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights  # reference: index = category id
    ref = FasterRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"]
    assert {i: n for i, n in enumerate(ref) if n not in ("__background__", "N/A")} == info.category_names
    assert detection_info("shapes").num_classes == 6


def test_info_from_root_uses_the_files_categories(mini):
    info = detection_info("coco", root=mini)
    assert info.category_names == CATEGORIES and info.num_classes == 8
    assert build(mini).info.category_names == CATEGORIES


# ----------------------------------------------------------------------------------- loader, eval

def test_items_and_round_trip_to_coco_results(mini):
    ds = build(mini, img_size=64, max_size=100)
    assert len(ds) == 6 and ds.ids == sorted(ds.coco.getImgIds())
    results, n_crowd_seen, n_empty = [], 0, 0
    for i in range(len(ds)):
        image, t = ds[i]
        assert image.dtype == torch.float32 and image.shape[0] == 3
        assert t["boxes"].dtype == torch.float32 and t["labels"].dtype == torch.int64
        assert t["image_id"].dtype == torch.int64 and t["image_id"].dim() == 0 and int(t["image_id"]) == ds.ids[i]
        info = ds.coco.imgs[ds.ids[i]]
        assert t["orig_size"].tolist() == [info["height"], info["width"]]
        assert t["size"].tolist() == list(image.shape[1:])
        h, w = image.shape[1:]
        assert min(h, w) == 64 or max(h, w) in (99, 100)  # shorter side 64, longer capped at 100
        assert ((t["boxes"] >= 0) & (t["boxes"] <= 1)).all()
        anns = ds.coco.imgToAnns[ds.ids[i]]
        n_crowd_seen += sum(a["iscrowd"] for a in anns)
        n_empty += not anns
        assert len(t["boxes"]) == sum(1 - a["iscrowd"] for a in anns)  # crowd dropped
        check_boxes_against_pixels(ds, image, t)
        oh, ow = t["orig_size"].tolist()  # back to the file's pixels, as a detector's post-processing does
        cx, cy, bw, bh = (t["boxes"].double() * torch.tensor([ow, oh, ow, oh])).unbind(-1)
        for x, y, ww, hh, c in zip(cx - bw / 2, cy - bh / 2, bw, bh, t["labels"]):
            results.append(dict(image_id=int(t["image_id"]), category_id=int(c), bbox=[x.item(), y.item(),
                                ww.item(), hh.item()], score=1.0))
    assert n_crowd_seen == 1 and n_empty == 1
    gt = {(a["image_id"], tuple(a["bbox"])) for a in ds.coco.dataset["annotations"] if not a["iscrowd"]}
    assert len(results) == len(gt)
    for r in results:
        assert min(max(abs(a - b) for a, b in zip(r["bbox"], box)) for i, box in gt if i == r["image_id"]) < 1e-3
    stats = coco_evaluate(ds.coco, results)
    assert stats == {"AP": 1.0, "AP50": 1.0, "AP75": 1.0, "APs": 1.0, "APm": -1.0, "APl": -1.0}


def test_coco_evaluate_against_an_exact_iou(mini, capsys):
    coco = build(mini).coco
    gt = [a for a in coco.dataset["annotations"] if not a["iscrowd"]]
    f = (1 / 0.72) ** 0.5  # each box grown from its corner by f per side: IoU = 1 / f^2 = 0.72 exactly
    grown = [dict(image_id=a["image_id"], category_id=a["category_id"], score=0.9,
                  bbox=[a["bbox"][0], a["bbox"][1], a["bbox"][2] * f, a["bbox"][3] * f]) for a in gt]
    stats = coco_evaluate(coco, grown)
    # IoU 0.72 passes the thresholds 0.50..0.70 (5 of 10) and fails 0.75: AP = 0.5, AP50 = 1, AP75 = 0
    assert stats["AP"] == pytest.approx(0.5) and stats["AP50"] == 1.0 and stats["AP75"] == 0.0
    assert capsys.readouterr().out == ""  # pycocotools silenced
    coco_evaluate(coco, grown, verbose=True)
    assert "Average Precision" in capsys.readouterr().out
    empty = coco_evaluate(coco, [])
    assert empty == {"AP": 0.0, "AP50": 0.0, "AP75": 0.0, "APs": 0.0, "APm": -1.0, "APl": -1.0}
    first = [r for r in grown if r["image_id"] == gt[0]["image_id"]]  # detections of one image only
    assert coco_evaluate(coco, first)["AP50"] < 0.9
    assert coco_evaluate(coco, first, img_ids=[gt[0]["image_id"]])["AP50"] == pytest.approx(1.0)
    junk = [{**r, "category_id": c, "score": 0.99} for r in grown for c in (0, 2, 8)]  # labels no category has
    assert coco_evaluate(coco, grown + junk) == stats
    for bad, match in (([{**grown[0], "image_id": 999}], "image_id=999"), ([{"image_id": 1}], "lacks category_id"),
                       ([{**grown[0], "bbox": [0, 0, float("nan"), 1]}], "bbox")):
        with pytest.raises(ValueError, match=match):
            coco_evaluate(coco, bad)


# ---------------------------------------------------------------------------------- transforms

def test_detr_scales():
    assert detr_scales(800) == dict(scales=tuple(range(480, 801, 32)), crop_resize=(400, 500, 600), crop=(384, 600))
    s = detr_scales(128)
    assert s["scales"][0] == 77 and s["scales"][-1] == 128  # 480/800 * 128 = 76.8 -> 77
    assert s["crop_resize"] == (64, 80, 96) and s["crop"] == (61, 96)
    assert scale_list((480, 481), 1) == (1,)


def test_train_augmentation_keeps_boxes_on_their_objects(mini):
    ds = build(mini, "train", img_size=64, max_size=96)
    ref = build(mini, "train", img_size=64, max_size=96, train_augment=False)
    scales = detr_scales(64)["scales"]
    kinds = {"same": 0, "mirrored": 0, "other": 0}
    sizes = set()
    r = ref[1][1]["boxes"]  # unaugmented boxes of the image with an object at its left edge
    mirrored = r * torch.tensor([-1, 1, 1, 1]) + torch.tensor([1, 0, 0, 0])
    for seed in range(24):
        for i in (0, 1, 3):
            torch.manual_seed(seed)
            image, t = ds[i]
            check_boxes_against_pixels(ds, image, t)
            h, w = t["size"].tolist()
            sizes.add((h, w))
            assert max(h, w) <= 96 and (min(abs(min(h, w) - s) for s in scales) <= 1 or max(h, w) >= 95)
            if i == 1:
                b = t["boxes"]
                if b.shape == r.shape and torch.allclose(b, r, atol=0.03):
                    kinds["same"] += 1
                elif b.shape == r.shape and torch.allclose(b, mirrored, atol=0.03):
                    kinds["mirrored"] += 1
                else:
                    kinds["other"] += 1  # the crop path
    print(kinds)
    assert min(kinds.values()) > 0, kinds  # flips happen, and the resize-crop-resize path too
    assert len(sizes) > 10


def test_train_augment_none_and_callable(mini):
    plain = build(mini, "train", train_augment="none")
    ev = build(mini, "val")
    assert plain.transform.augment == "none" and ev.transform.augment == "none"
    calls = []

    def aug(image, target):
        calls.append(1)
        return image, target

    ds = build(mini, "train", train_augment=aug)
    image, t = ds[0]
    assert calls and image.shape[1:] == tuple(t["orig_size"].tolist())  # the callable replaced the resize
    check_boxes_against_pixels(ds, image, t)
    with pytest.raises(ValueError, match="train_augment='flip'"):
        build(mini, "train", train_augment="flip")


# -------------------------------------------------------------------------------------- collate

def test_collate_mask_marks_exactly_the_padding():
    torch.manual_seed(0)
    a, b = torch.randn(3, 5, 7), torch.randn(3, 6, 4)
    for d, (H, W) in ((1, (6, 7)), (4, (8, 8)), (32, (32, 32))):
        images, mask, targets = collate_detection([(a, {"i": 0}), (b, {"i": 1})], size_divisibility=d)
        assert images.shape == (2, 3, H, W) and mask.shape == (2, H, W) and mask.dtype == torch.bool
        assert targets == [{"i": 0}, {"i": 1}]
        for k, x in enumerate((a, b)):
            h, w = x.shape[1:]
            want = torch.ones(H, W, dtype=torch.bool)
            want[:h, :w] = False
            assert torch.equal(mask[k], want)  # divisibility padding included (rf-detr#992)
            assert torch.equal(images[k, :, :h, :w], x) and (images[k][:, mask[k]] == 0).all()
    with pytest.raises(ValueError, match="size_divisibility=0"):
        collate_detection([(a, {})], size_divisibility=0)
    with pytest.raises(ValueError, match="batch"):
        collate_detection([(a, {}), (torch.zeros(1, 2, 2), {})])


# ------------------------------------------------------------------------------------ bad input

def edited(mini, tmp_path, edit, split="val"):
    """A copy of the miniature set whose ``split`` JSON went through ``edit(data)``."""
    import shutil
    root = tmp_path / "edited"
    shutil.copytree(mini, root)
    ann_file = coco_mod.split_paths(root, split)[1]
    data = json.loads(ann_file.read_text())
    edit(data)
    ann_file.write_text(json.dumps(data))
    return root, data


def test_boxes_outside_the_image_are_clamped_or_dropped_as_detr(mini, tmp_path):
    def edit(data):
        img = data["images"][1]
        anns = [a for a in data["annotations"] if a["image_id"] == img["id"]]
        w, h = img["width"], img["height"]
        anns[0]["bbox"] = [w - 5, 2, 20, 10]  # reaches out on the right: clamped to 5 pixels wide
        anns[1]["bbox"] = [-3, -4, 10, 10]  # above-left: clamped to 7 x 6
        extra = [[w + 5, 2, 10, 10], [3, 3, 0, 10], [10, 3, 4, 0], [2, h, 5, 5]]  # outside / zero width / height / below
        data["annotations"] += [{**anns[0], "id": 900 + k, "bbox": box} for k, box in enumerate(extra)]

    root, data = edited(mini, tmp_path, edit)
    img = data["images"][1]
    w, h = img["width"], img["height"]
    with pytest.warns(UserWarning, match=r"4 annotation boxes reach outside .* 4 have no area inside it .*clamped"):
        ds = build(root, img_size=min(w, h), max_size=500)  # no resize: target pixels are the file's
    _, t = ds[1]
    kept = [a["bbox"] for a in data["annotations"] if a["image_id"] == img["id"] and a["id"] < 900]
    want = [[max(x, 0), max(y, 0), min(x + bw, w), min(y + bh, h)] for x, y, bw, bh in kept]
    assert [w - 5, 2, w, 12] in want and [0, 0, 7, 6] in want
    np.testing.assert_allclose(sorted(target_xyxy(t).tolist()), sorted(want), atol=1e-4)


@pytest.mark.parametrize("case", ["category", "empty", "not_json", "bbox", "negative_width", "negative_height",
                                  "image_id", "duplicate", "no_key"])
def test_bad_annotation_files_are_named(mini, tmp_path, case):
    edits = {
        "category": (lambda d: d["annotations"][2].update(category_id=99), r"annotation id \d+ has category_id=99"),
        "empty": (lambda d: d.update(annotations=[]), "empty 'annotations' list"),
        "bbox": (lambda d: d["annotations"][0].update(bbox=[1, 2, 3]), r"bbox=\[1, 2, 3\]"),
        # a negative size is malformed, not merely outside: refused as the README says (issue 28, item 12)
        "negative_width": (lambda d: d["annotations"][1].update(bbox=[10, 3, -4, 8]),
                           r"annotation id \d+ has bbox=\[10, 3, -4, 8\]: expected .*width and height >= 0"),
        "negative_height": (lambda d: d["annotations"][1].update(bbox=[10, 3, 4, -0.5]), r"bbox=\[10, 3, 4, -0.5\]"),
        "image_id": (lambda d: d["annotations"][0].update(image_id=12345), "image_id=12345"),
        "duplicate": (lambda d: d["annotations"][1].update(id=d["annotations"][0]["id"]), "appears twice"),
        "no_key": (lambda d: d.pop("categories"), "no 'categories' list"),
        "not_json": (None, "not valid JSON"),
    }
    edit, match = edits[case]
    root, _ = edited(mini, tmp_path, edit or (lambda d: None))
    ann_file = coco_mod.split_paths(root, "val")[1]
    if edit is None:
        ann_file.write_text("{not json")
    with pytest.raises(ValueError, match=match) as err:
        build(root)
    assert str(ann_file) in str(err.value)


def test_bad_image_files_are_named(mini, tmp_path):
    root, data = edited(mini, tmp_path, lambda d: d["images"][3].update(width=d["images"][3]["width"] + 1))
    folder = coco_mod.split_paths(root, "val")[0]
    ds = build(root)
    with pytest.raises(ValueError, match=r"is \d+x\d+ .*says"):
        ds[3]
    names = [img["file_name"] for img in data["images"]]
    (folder / names[0]).write_bytes(b"this is not a PNG")
    raw = (folder / names[1]).read_bytes()
    (folder / names[1]).write_bytes(raw[: len(raw) // 2])  # truncated
    for i in (0, 1):
        with pytest.raises(ValueError, match=f"{folder / names[i]}.*cannot be decoded"):
            ds[i]
    (folder / names[2]).unlink()
    with pytest.raises(FileNotFoundError, match=str(folder / names[2])):
        build(root)


def test_missing_layout_and_refused_options(mini, tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        build(tmp_path / "nowhere")
    (tmp_path / "half" / "annotations").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "half" / "annotations" / "instances_val2017.json")):
        build(tmp_path / "half")
    (tmp_path / "half" / "annotations" / "instances_val2017.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "half" / "val2017")):
        build(tmp_path / "half")
    with pytest.raises(ValueError, match="cocodataset.org"):
        build(mini, download=True)
    with pytest.raises(ValueError, match="name='cocoo'.*did you mean coco"):
        build_detection_dataset("cocoo", "val")
    with pytest.raises(ValueError, match="unknown option.*year=2014"):
        build(mini, year=2014)
    with pytest.raises(ValueError, match="split='test'"):
        build(mini, "test")
    with pytest.raises(ValueError, match="max_size=64"):
        build(mini, img_size=64, max_size=64)
