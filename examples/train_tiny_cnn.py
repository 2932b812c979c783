"""Train a tiny CNN on an ImageFolder data set, on CPU: an ordinary training script.

It knows nothing about tiering; it is the "user code" of the demo:

    python -m bench.datagen /tmp/demo-data --classes 10 --files 1000 --jpeg
    python examples/train_tiny_cnn.py --data /tmp/demo-data --epochs 3

Images are decoded with Pillow, resized to --image-size and turned into tensors without
torchvision. With --raw the files are not decoded: the first 3*S*S bytes of each file
become the "image" (for data sets of random bytes, e.g. datagen without --jpeg).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imagefolder import ImageFolder  # noqa: E402


class ToTensor:
    """PIL image -> resized float tensor (3, S, S), roughly centred on 0."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Any) -> torch.Tensor:
        from PIL import Image

        img = img.resize((self.size, self.size), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.uint8)  # (S, S, 3)
        t = torch.from_numpy(arr.copy()).permute(2, 0, 1).float()
        return t.div_(127.5).sub_(1.0)


class RawToTensor:
    """uint8 bytes tensor -> float tensor (3, S, S) from its first bytes (zero-padded)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, data: torch.Tensor) -> torch.Tensor:
        need = 3 * self.size * self.size
        out = torch.zeros(need, dtype=torch.float32)
        n = min(need, data.numel())
        out[:n] = data[:n].float()
        return out.view(3, self.size, self.size).div_(127.5).sub_(1.0)


class TinyCNN(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="ImageFolder root (class folders)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads of the training process (default 1)")
    p.add_argument("--raw", action="store_true",
                   help="do not decode: train on the files' first bytes (random-byte data)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    transform = RawToTensor(args.image_size) if args.raw else ToTensor(args.image_size)
    dataset = ImageFolder(args.data, transform=transform, decode=not args.raw)
    generator = torch.Generator()
    generator.manual_seed(args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, generator=generator)

    model = TinyCNN(len(dataset.classes))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    print(f"data {args.data}: {len(dataset)} samples, {len(dataset.classes)} classes; "
          f"batch {args.batch_size}, workers {args.workers}", flush=True)

    from PIL import UnidentifiedImageError

    try:
        train(args, loader, model, opt, loss_fn)
    except UnidentifiedImageError as e:  # random bytes, not images
        print(f"error: a file does not decode as an image: {str(e).strip().splitlines()[-1]}\n"
              "  generate real images (python -m bench.datagen ... --jpeg) or pass --raw",
              file=sys.stderr)
        return 2
    return 0


def train(args: argparse.Namespace, loader: DataLoader, model: nn.Module,
          opt: torch.optim.Optimizer, loss_fn: nn.Module) -> None:
    total = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        seen, loss_sum, correct = 0, 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
        dt = time.perf_counter() - t0
        print(f"epoch {epoch}/{args.epochs}  {dt:6.2f} s  {seen / dt:8.1f} samples/s  "
              f"loss {loss_sum / seen:.4f}  acc {correct / seen:.3f}", flush=True)
    print(f"total {time.perf_counter() - total:.2f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
