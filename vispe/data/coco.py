"""COCO detection (Lin et al. 2014) through torchvision's ``CocoDetection`` and its v2 wrapper.

Layout under ``root`` (the official 2017 archives extracted; ``root=None``: ``$VISPE_DATA/coco``,
else ``./data/coco``)::

    root/annotations/instances_train2017.json   root/train2017/<file_name> ...
    root/annotations/instances_val2017.json     root/val2017/<file_name> ...

``CocoDetectionSet(root, split, ...)`` yields ``(image, target)`` as ``det_transforms`` describes
(labels are the COCO category ids, as DETR: 91 classes for COCO's ids 1..90). ``.coco`` is the
pycocotools ``COCO`` of the split, built from the very dictionary the loader reads, for COCOeval.

Checks (each a clear error naming the path, the annotation or image id and the value):

* at construction: a missing folder or file (FileNotFoundError naming the expected path); a
  file that is not JSON or lacks ``images`` / ``annotations`` / ``categories``; an empty
  ``annotations`` list (nothing to learn or evaluate); an annotation whose ``category_id`` is not
  among the file's categories, whose ``image_id`` is not an image of the file, whose ``bbox`` is
  not 4 finite numbers or has a negative width or height, whose ``iscrowd`` is not 0 or 1;
  duplicate ids; an image file listed but absent (ValueError, FileNotFoundError).
* when an image is read: a file that cannot be decoded (truncated or corrupt) or whose size is
  not the JSON's ``width`` x ``height`` (ValueError naming the file and image id).

A box of negative width or height is malformed (no box has one) and refused, where torchvision's
detection reference (``ConvertCocoPolysToMask``) drops it silently and pycocotools does not look.
Boxes that reach outside their image, or have zero width or height, are real annotations (COCO 2017
holds some) and get DETR's and torchvision's handling: clamped to the image, and dropped from the
training target when no area is left; one warning at construction counts them and names a few
annotation ids. COCOeval still sees every annotation through ``.coco``, as in DETR. Annotations without ``iscrowd`` get 0 and without ``area`` the box area (COCOeval needs
it), in the in-memory copy only.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools.coco import COCO
from torch.utils.data import Dataset
from torchvision.datasets import CocoDetection, VisionDataset, wrap_dataset_for_transforms_v2

from vispe.data.common import DataFileError
from vispe.data.det_transforms import DetectionTransform

SPLITS = ("train", "val")
MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, as DETR (pretrained backbones expect them)
STD = (0.229, 0.224, 0.225)
CATEGORIES = {  # COCO 2017 detection: 80 categories, ids 1..90 with gaps
    1: "person", 2: "bicycle", 3: "car", 4: "motorcycle", 5: "airplane", 6: "bus", 7: "train", 8: "truck",
    9: "boat", 10: "traffic light", 11: "fire hydrant", 13: "stop sign", 14: "parking meter", 15: "bench",
    16: "bird", 17: "cat", 18: "dog", 19: "horse", 20: "sheep", 21: "cow", 22: "elephant", 23: "bear",
    24: "zebra", 25: "giraffe", 27: "backpack", 28: "umbrella", 31: "handbag", 32: "tie", 33: "suitcase",
    34: "frisbee", 35: "skis", 36: "snowboard", 37: "sports ball", 38: "kite", 39: "baseball bat",
    40: "baseball glove", 41: "skateboard", 42: "surfboard", 43: "tennis racket", 44: "bottle",
    46: "wine glass", 47: "cup", 48: "fork", 49: "knife", 50: "spoon", 51: "bowl", 52: "banana", 53: "apple",
    54: "sandwich", 55: "orange", 56: "broccoli", 57: "carrot", 58: "hot dog", 59: "pizza", 60: "donut",
    61: "cake", 62: "chair", 63: "couch", 64: "potted plant", 65: "bed", 67: "dining table", 70: "toilet",
    72: "tv", 73: "laptop", 74: "mouse", 75: "remote", 76: "keyboard", 77: "cell phone", 78: "microwave",
    79: "oven", 80: "toaster", 81: "sink", 82: "refrigerator", 84: "book", 85: "clock", 86: "vase",
    87: "scissors", 88: "teddy bear", 89: "hair drier", 90: "toothbrush",
}
DOWNLOAD_HELP = ("get train2017.zip, val2017.zip and annotations_trainval2017.zip from "
                 "https://cocodataset.org/#download and extract them into {root}")


def data_root() -> Path:
    """``$VISPE_DATA`` or ``./data``: where data sets live when no ``root`` is given."""
    return Path(os.environ.get("VISPE_DATA", "data"))


def split_paths(root, split: str) -> tuple[Path, Path]:
    """(image folder, instances JSON) of ``split`` under ``root``."""
    root = Path(root).expanduser()
    return root / f"{split}2017", root / "annotations" / f"instances_{split}2017.json"


def check_layout(root, split: str) -> tuple[Path, Path]:
    """The split's (image folder, JSON), or a FileNotFoundError naming the first one missing."""
    folder, ann_file = split_paths(root, split)
    layout = (f"expected {ann_file} and the images in {folder}/ (COCO 2017 layout; "
              + DOWNLOAD_HELP.format(root=Path(root).expanduser()) + ")")
    for path, kind in ((Path(root).expanduser(), "folder"), (ann_file, "file"), (folder, "folder")):
        if not (path.is_dir() if kind == "folder" else path.is_file()):
            raise FileNotFoundError(f"COCO {kind} {path} not found: {layout}")
    return folder, ann_file


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _load(ann_file: Path) -> tuple[dict, dict, str]:
    """(the JSON's dict, {category id: entry}, how errors name the file), with the top level checked."""
    try:
        with open(ann_file, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"COCO annotation file {ann_file} is not valid JSON ({err})") from err
    where = f"COCO annotation file {ann_file}"
    for key in ("images", "annotations", "categories"):
        if not isinstance(data, dict) or not isinstance(data.get(key), list):
            raise ValueError(f"{where} has no {key!r} list: expected an instances file with 'images', "
                             "'annotations' and 'categories'")
    cats = _ids(data["categories"], where, "category", ("name",))
    if not cats:
        raise ValueError(f"{where} has an empty 'categories' list: expected at least one category")
    for cid in cats:
        if cid < 0:
            raise ValueError(f"{where}: category id {cid} is negative: expected ids >= 0 (they are the labels)")
    return data, cats, where


def read_instances(ann_file: Path) -> dict:
    """The instances JSON as a dict, checked (module doc); fills missing ``iscrowd`` / ``area``."""
    data, cats, where = _load(ann_file)
    images = _ids(data["images"], where, "image", ("file_name", "width", "height"))
    for img in data["images"]:
        if not (_is_int(img["width"]) and _is_int(img["height"]) and img["width"] > 0 and img["height"] > 0):
            raise ValueError(f"{where}: image id {img['id']} has width={img['width']!r}, height={img['height']!r}: "
                             "expected positive integers")
    if not data["annotations"]:
        raise ValueError(f"{where} has an empty 'annotations' list: a detection set needs at least one box "
                         "to train or evaluate on")
    _ids(data["annotations"], where, "annotation", ("image_id", "category_id", "bbox"))
    for ann in data["annotations"]:
        aid, box = ann["id"], ann["bbox"]
        if ann["image_id"] not in images:
            raise ValueError(f"{where}: annotation id {aid} has image_id={ann['image_id']!r}, which is not "
                             "among the file's images")
        if ann["category_id"] not in cats:
            raise ValueError(f"{where}: annotation id {aid} has category_id={ann['category_id']!r}, which is "
                             f"not among the file's categories (ids {sorted(cats)})")
        if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
            raise ValueError(f"{where}: annotation id {aid} has bbox={box!r}: expected [x, y, w, h], "
                             "4 finite numbers")
        if box[2] < 0 or box[3] < 0:  # malformed, not merely outside the image (module doc)
            raise ValueError(f"{where}: annotation id {aid} has bbox={box!r}: expected [x, y, w, h] with width and "
                             "height >= 0 (a negative size is a malformed box; torchvision's detection reference "
                             "would drop it silently and pycocotools does not check it)")
        ann.setdefault("iscrowd", 0)
        if ann["iscrowd"] not in (0, 1) or isinstance(ann["iscrowd"], bool):
            raise ValueError(f"{where}: annotation id {aid} has iscrowd={ann['iscrowd']!r}: expected 0 or 1")
        ann.setdefault("area", float(box[2] * box[3]))
    _warn_outside(data, where)
    return data


def _ids(entries: list, where: str, kind: str, required: tuple[str, ...]) -> dict:
    """{id: entry} of ``entries``; each must be a dict with an integer ``id`` (unique) and ``required`` keys."""
    out = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not _is_int(e.get("id")):
            raise ValueError(f"{where}: {kind} entry #{i} has no integer 'id' ({str(e)[:80]})")
        missing = [k for k in required if k not in e]
        if missing:
            raise ValueError(f"{where}: {kind} id {e['id']} lacks {', '.join(map(repr, missing))}")
        if e["id"] in out:
            raise ValueError(f"{where}: {kind} id {e['id']} appears twice")
        out[e["id"]] = e
    return out


def _warn_outside(data: dict, where: str) -> None:
    """One warning counting boxes that reach outside their image or have no area (DETR's handling)."""
    size = {img["id"]: (img["width"], img["height"]) for img in data["images"]}
    anns = data["annotations"]
    box = np.array([a["bbox"] for a in anns], dtype=np.float64)  # (N, 4) x, y, w, h
    wh = np.array([size[a["image_id"]] for a in anns], dtype=np.float64)  # (N, 2)
    x0, y0, x1, y1 = box[:, 0], box[:, 1], box[:, 0] + box[:, 2], box[:, 1] + box[:, 3]
    outside = (np.minimum(x0, x1) < 0) | (np.minimum(y0, y1) < 0) | (np.maximum(x0, x1) > wh[:, 0]) | (
        np.maximum(y0, y1) > wh[:, 1])
    cw = np.clip(x1, 0, wh[:, 0]) - np.clip(x0, 0, wh[:, 0])
    ch = np.clip(y1, 0, wh[:, 1]) - np.clip(y0, 0, wh[:, 1])
    empty = (cw <= 0) | (ch <= 0)
    if outside.any() or empty.any():
        ids = [anns[i]["id"] for i in np.flatnonzero(outside | empty)[:5]]
        warnings.warn(f"{where}: {int(outside.sum())} annotation boxes reach outside their image and "
                      f"{int(empty.sum())} have no area inside it (e.g. annotation ids {ids}); as DETR, boxes "
                      "are clamped to the image and those left without area are dropped from training "
                      "targets (COCOeval still sees them)", stacklevel=3)


def make_coco(data: dict) -> COCO:
    """A pycocotools ``COCO`` indexing ``data`` (no file read again, nothing printed)."""
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


class _CocoImages(CocoDetection):
    """torchvision's ``CocoDetection`` over an already checked ``COCO``, with named image errors."""

    def __init__(self, folder: Path, coco: COCO, transforms=None) -> None:
        # not CocoDetection.__init__, which would read the JSON again (COCO train: 450 MB)
        VisionDataset.__init__(self, str(folder), transforms=transforms)
        self.coco = coco
        self.ids = sorted(coco.imgs)

    def _load_image(self, id: int) -> Image.Image:
        info = self.coco.imgs[id]
        path = Path(self.root) / info["file_name"]
        try:
            with Image.open(path) as im:
                image = im.convert("RGB")
        except FileNotFoundError as err:
            raise DataFileError(f"COCO image file {path} (image id {id}) not found") from err
        except (OSError, SyntaxError, ValueError) as err:
            raise DataFileError(f"COCO image file {path} (image id {id}) cannot be decoded ({type(err).__name__}: "
                                f"{err}); it may be truncated or corrupt") from err
        if image.size != (info["width"], info["height"]):
            raise DataFileError(f"COCO image file {path} (image id {id}) is {image.size[0]}x{image.size[1]} "
                             f"(w x h); its annotation file says {info['width']}x{info['height']}")
        return image


class CocoDetectionSet(Dataset):
    """One split of a COCO-layout folder; yields ``(image (3, H, W), target)`` (see ``det_transforms``).

    ``train_augment``: "default" (DETR's), "none" or a callable (train split only). Attributes:
    ``coco`` (pycocotools COCO), ``ids`` (image ids in item order), ``categories`` {id: name},
    ``root``, ``split``, ``transform``.
    """

    def __init__(self, root, split: str, *, img_size: int, max_size: int, mean=MEAN, std=STD,
                 train_augment="default") -> None:
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: expected one of {', '.join(map(repr, SPLITS))}")
        self.root, self.split = Path(root).expanduser(), split
        folder, ann_file = check_layout(self.root, split)
        data = read_instances(ann_file)
        _check_files(folder, data["images"])
        self.coco = make_coco(data)
        self.categories = {c["id"]: c["name"] for c in data["categories"]}
        self.transform = DetectionTransform(split == "train", img_size, max_size, mean, std, train_augment)
        images = _CocoImages(folder, self.coco, transforms=self.transform)
        self.ids = images.ids
        self._data = wrap_dataset_for_transforms_v2(images, target_keys={"image_id", "boxes", "labels", "iscrowd"})

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self._data[int(i)]  # torchvision's CocoDetection refuses numpy integers

    def __repr__(self) -> str:
        return f"CocoDetectionSet(root={str(self.root)!r}, split={self.split!r}, n={len(self)}, {self.transform})"


def _check_files(folder: Path, images: list) -> None:
    present = set(os.listdir(folder))
    missing = [img["file_name"] for img in images
               if img["file_name"] not in present and not (folder / img["file_name"]).is_file()]
    if missing:
        raise FileNotFoundError(f"COCO image folder {folder} lacks {len(missing)} file(s) listed in its "
                                f"annotation file, e.g. {folder / missing[0]}")


def categories_of(root, split: str = "val") -> dict[int, str]:
    """{id: name} read from ``root``'s instances file of ``split`` (the other split if it is absent)."""
    for s in (split, *[t for t in SPLITS if t != split]):
        ann_file = split_paths(root, s)[1]
        if ann_file.is_file():
            return {cid: c["name"] for cid, c in sorted(_load(ann_file)[1].items())}
    raise FileNotFoundError(f"no COCO annotation file under {Path(root).expanduser() / 'annotations'}: expected "
                            f"{split_paths(root, split)[1]} (" + DOWNLOAD_HELP.format(root=root) + ")")
