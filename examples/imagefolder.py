"""torchvision.datasets.ImageFolder without torchvision.

Same sample order as torchvision (the order a sampler's indices refer to):

* classes: the entries of root that are directories (symlinks to directories count),
  sorted by name; class index = position in that list;
* samples: for each class in sorted order, ``sorted(os.walk(class_dir, followlinks=True))``
  (note: the walk tuples are sorted by their directory path *string*, so "a-b" and
  "a.b" come between "a" and "a/x"), then the file names of each directory sorted;
* a file is kept if ``is_valid_file(path)`` is true, by default if its lower-cased name
  ends with one of IMG_EXTENSIONS; files directly in root are never samples;
* a class without any valid file raises FileNotFoundError unless ``allow_empty``.

One difference: torchvision's ``make_dataset`` needs exactly one of ``extensions`` and
``is_valid_file``; here leaving both out means IMG_EXTENSIONS. Passing both is still a
ValueError.

``ImageFolder(root, decode=False)`` returns each file's raw bytes as a 1-D uint8 tensor
instead of a decoded PIL image (for data sets of random bytes, or I/O-only runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

IMG_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif",
                                   ".tiff", ".webp")

PathLike = str | Path


def has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    """Case-insensitive suffix check, e.g. "x.JPEG" matches ".jpeg"."""
    suffixes = extensions if isinstance(extensions, str) else tuple(extensions)
    return filename.lower().endswith(suffixes)


def find_classes(directory: PathLike) -> tuple[list[str], dict[str, int]]:
    """Sorted names of the directories (or symlinks to directories) in ``directory``."""
    with os.scandir(directory) as entries:
        classes = sorted(e.name for e in entries if e.is_dir())  # follows symlinks
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: i for i, name in enumerate(classes)}


def make_dataset(directory: PathLike, class_to_idx: dict[str, int] | None = None,
                 extensions: str | tuple[str, ...] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False) -> list[tuple[str, int]]:
    """(path, class_index) for every sample, in torchvision's order (see module doc)."""
    directory = os.path.expanduser(os.fspath(directory))
    if class_to_idx is None:
        _, class_to_idx = find_classes(directory)
    elif not class_to_idx:
        raise ValueError("'class_to_idx' must have at least one entry to collect any samples.")
    if extensions is not None and is_valid_file is not None:
        raise ValueError("Both extensions and is_valid_file cannot be not None at the same time")
    if is_valid_file is None:
        if extensions is None:
            extensions = IMG_EXTENSIONS
        exts = extensions

        def is_valid_file(path: str) -> bool:
            return has_file_allowed_extension(path, exts)

    samples: list[tuple[str, int]] = []
    found: set[str] = set()
    for name in sorted(class_to_idx):
        index = class_to_idx[name]
        class_dir = os.path.join(directory, name)
        if not os.path.isdir(class_dir):
            continue
        for dirpath, _dirnames, filenames in sorted(os.walk(class_dir, followlinks=True)):
            for filename in sorted(filenames):
                path = os.path.join(dirpath, filename)
                if is_valid_file(path):
                    samples.append((path, index))
                    found.add(name)

    empty = set(class_to_idx) - found
    if empty and not allow_empty:
        msg = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
        if extensions is not None:
            msg += "Supported extensions are: " + (
                extensions if isinstance(extensions, str) else ", ".join(extensions))
        raise FileNotFoundError(msg)
    return samples


def pil_loader(path: str) -> Any:
    """Decode an image file to an RGB PIL image (like torchvision's default loader)."""
    from PIL import Image

    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def raw_loader(path: str) -> torch.Tensor:
    """The file's bytes as a 1-D uint8 tensor (its length is the file size)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8)


class ImageFolder(Dataset):
    """Samples ``root/<class>/**/<file>`` in torchvision ImageFolder order.

    Attributes as in torchvision: ``classes``, ``class_to_idx``, ``samples`` (list of
    (path, class_index)), ``imgs`` (same list), ``targets``, ``loader``, ``transform``,
    ``target_transform``, ``extensions`` (None when ``is_valid_file`` is given).
    """

    def __init__(self, root: PathLike, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None,
                 loader: Callable[[str], Any] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False, decode: bool = True) -> None:
        self.root = os.fspath(root)
        self.transform = transform
        self.target_transform = target_transform
        self.extensions = IMG_EXTENSIONS if is_valid_file is None else None
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx, self.extensions,
                                    is_valid_file, allow_empty)
        self.imgs = self.samples
        self.targets = [target for _, target in self.samples]
        if loader is None:
            loader = pil_loader if decode else raw_loader
        self.loader = loader

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __repr__(self) -> str:
        return (f"ImageFolder(root={self.root!r}, samples={len(self.samples)}, "
                f"classes={len(self.classes)})")
