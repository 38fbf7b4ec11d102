"""The experiments' data sets as tensors: images in [0, 1] of shape (N, C, H, W), int64 labels.

``digits``    sklearn's 8×8 handwritten digits (1,797 images, shipped with scikit-learn), pixel
              values /16. Fixed stratified split: ``train_test_split(test_size=500,
              stratify=labels, random_state=0)`` → 1,297 train / 500 test (about 50 per class),
              in the order that call returns (classes mixed).
``mnist``     torchvision.datasets.MNIST under ``root``: the four uncompressed idx files
              ``root/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (torchvision needs all
              four for either split; it checks only that they exist).
``cifar10``   torchvision.datasets.CIFAR10 under ``root``: the python batches
              ``root/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}``; torchvision
              checks the MD5 of each against the official files.
``imagenet``  a local ImageFolder (one sub-folder per class, sorted WordNet ids = torchvision's
              class indices) of the validation split at ``root/val`` or ``root`` itself
              (``split="train"``: ``root/train``), resized (104, bilinear: ResNet-18's transforms
              scaled by 13/32; pass ``resize=94, interpolation="bicubic"`` for Swin-T's) and
              center-cropped to 91×91.

Nothing is downloaded unless ``download=True`` (MNIST and CIFAR-10 only). ``root=None`` means
``./data`` (``./data/imagenet`` for ImageNet).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from hcrfast import validation

__all__ = ["DATASETS", "load"]

DATASETS = ("digits", "mnist", "cifar10", "imagenet")
_SPLITS = ("train", "test")
IMAGENET_CROP = 91
IMAGENET_RESIZE = 104

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_CIFAR_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch", "batches.meta")


def load(
    name: str,
    *,
    split: str = "test",
    root=None,
    download: bool = False,
    limit: int | None = None,
    resize: int | None = None,
    interpolation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a data set split as ``(images, labels)``.

    Parameters
    ----------
    name : {"digits", "mnist", "cifar10", "imagenet"}
    split : {"train", "test"}
        For ImageNet, "test" is the validation split.
    root : str or os.PathLike, optional
        Where the files are (see the module docstring); ignored for digits.
    download : bool
        MNIST and CIFAR-10: fetch the files into ``root`` if they are missing. Never otherwise.
    limit : int, optional
        Keep at most this many examples: the first ``limit`` (digits, MNIST, CIFAR-10, whose
        orders mix the classes), or ``limit`` evenly spaced ones (ImageNet, whose ImageFolder is
        ordered by class), without decoding the others.
    resize, interpolation : int, str, optional
        ImageNet only: the resize before the 91×91 center crop (default 104, "bilinear").

    Returns
    -------
    images : torch.Tensor
        float32, values in [0, 1], shape (N, C, H, W).
    labels : torch.Tensor
        int64, shape (N,).

    Raises
    ------
    FileNotFoundError
        The files are missing; the message says where it looked, what it expected and how to
        get them.
    ValueError
        Unknown name or split, a bad limit, or files present but failing torchvision's checks.
    RuntimeError
        ``download=True`` and the download failed.
    """
    if name not in DATASETS:
        raise ValueError(f"Unknown data set {name!r}; valid names: {', '.join(DATASETS)}.")
    if split not in _SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits: {', '.join(_SPLITS)}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}.")
    if name != "imagenet" and (resize is not None or interpolation is not None):
        raise ValueError(f"resize and interpolation apply to imagenet only, not {name!r}.")
    if download and name not in ("mnist", "cifar10"):
        raise ValueError(f"download=True is supported for mnist and cifar10 only, not {name!r}.")

    if name == "digits":
        images, labels = _digits(split)
    elif name == "mnist":
        images, labels = _mnist(_root(root, "data"), split, download)
    elif name == "cifar10":
        images, labels = _cifar10(_root(root, "data"), split, download)
    else:
        return _imagenet(_root(root, os.path.join("data", "imagenet")), split, limit, resize, interpolation)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images.contiguous(), labels.contiguous()


def _root(root, default: str) -> Path:
    return Path(default if root is None else root).expanduser().resolve()


# ----------------------------------------------------------------------------------------
# digits


def _digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    index = np.arange(len(bunch.target))
    train, test = train_test_split(index, test_size=500, stratify=bunch.target, random_state=0)
    chosen = train if split == "train" else test
    images = torch.from_numpy((bunch.images[chosen] / 16.0).astype(np.float32)).unsqueeze(1)
    labels = torch.from_numpy(bunch.target[chosen].astype(np.int64))
    return images, labels


# ----------------------------------------------------------------------------------------
# MNIST, CIFAR-10


class DownloadError(RuntimeError):
    """Something the user asked to download (``--download``, ``--weights default``) could not be
    fetched; the message says what and how to do without network."""


def _download_failed(name: str, where: Path, exc: BaseException) -> RuntimeError:
    return DownloadError(
        f"Downloading {name} into {where} failed ({type(exc).__name__}: {str(exc).strip()[:300]}). "
        f"This needs network access; otherwise copy the files there from a machine that has them."
    )


def _mnist(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.datasets import MNIST

    raw = root / "MNIST" / "raw"
    missing = [f for f in _MNIST_FILES if not (raw / f).is_file()]
    if missing and not download:
        gz = [f for f in missing if (raw / (f + ".gz")).is_file()]
        gz_hint = f" Found {', '.join(f + '.gz' for f in gz)}: decompress them (gunzip)." if gz else ""
        raise FileNotFoundError(
            f"MNIST not found in {raw}: missing {', '.join(missing)} (torchvision reads the four "
            f"uncompressed idx files {', '.join(_MNIST_FILES)}, for either split).{gz_hint} "
            f"Pass --download (download=True) to fetch them into {root}, or pass the root "
            f"directory that contains MNIST/raw/ (--data-root)."
        )
    try:
        ds = MNIST(str(root), train=split == "train", download=download)
    except RuntimeError as exc:
        if download and missing:
            raise _download_failed("MNIST", root, exc) from exc
        raise ValueError(f"torchvision could not read MNIST from {raw}: {exc}. The files are damaged or "
                         f"truncated: delete them and fetch them again (--download)") from exc
    except (AssertionError, TypeError, ValueError) as exc:  # torchvision's idx parser asserts
        raise ValueError(
            f"The MNIST files in {raw} are not valid idx files ({type(exc).__name__}: {exc}). "
            f"Delete them and fetch them again (--download)."
        ) from exc
    except OSError as exc:  # URLError is an OSError
        raise _download_failed("MNIST", root, exc) from exc
    images = ds.data.to(torch.float32).div_(255.0).unsqueeze(1)
    labels = ds.targets.to(torch.int64)
    # the idx files of a split come in a pair: a labels file of another count or with classes past 0..9
    # (damaged, or of another dataset) would crash training far from here, or pair images with wrong labels
    if labels.shape != (len(images),) or (len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) <= 9):
        raise ValueError(
            f"The MNIST {split} files in {raw} disagree: {len(images)} images but labels of shape "
            f"{tuple(labels.shape)}" + (f", classes {int(labels.min())}..{int(labels.max())} (MNIST's are 0..9)"
                                         if len(labels) else "") + ". Delete them and fetch them again (--download).")
    return images, labels


def _cifar10(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.datasets import CIFAR10

    folder = root / CIFAR10.base_folder
    missing = [f for f in _CIFAR_FILES if not (folder / f).is_file()]
    if missing and not download:
        raise FileNotFoundError(
            f"CIFAR-10 not found in {folder}: missing {', '.join(missing)} (torchvision reads the "
            f"python-version pickle batches {', '.join(_CIFAR_FILES)} of cifar-10-python.tar.gz, "
            f"extracted). Pass --download (download=True) to fetch them into {root}, or pass the "
            f"root directory that contains cifar-10-batches-py/ (--data-root)."
        )
    try:
        ds = CIFAR10(str(root), train=split == "train", download=download)
    except RuntimeError as exc:
        if download and missing:
            raise _download_failed("CIFAR-10", root, exc) from exc
        raise ValueError(
            f"The CIFAR-10 files in {folder} exist but torchvision rejected them ({exc}): they fail "
            f"its MD5 check against the official cifar-10-python.tar.gz. Delete {folder} and fetch "
            f"them again (--download)."
        ) from exc
    except OSError as exc:
        raise _download_failed("CIFAR-10", root, exc) from exc
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    return images, torch.as_tensor(ds.targets, dtype=torch.int64)


# ----------------------------------------------------------------------------------------
# ImageNet


def _imagenet(root: Path, split: str, limit, resize, interpolation) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    resize = IMAGENET_RESIZE if resize is None else resize
    interpolation = "bilinear" if interpolation is None else interpolation
    if isinstance(resize, bool) or not isinstance(resize, int) or resize < IMAGENET_CROP:
        raise ValueError(f"resize must be an integer >= {IMAGENET_CROP} (the crop), got {resize!r}.")
    modes = {m.value: m for m in transforms.InterpolationMode}
    if interpolation not in modes:
        raise ValueError(f"Unknown interpolation {interpolation!r}; valid: {', '.join(modes)}.")

    if split == "train":
        folder = root / "train"
    else:
        folder = root / "val" if (root / "val").is_dir() else root
    hint = (
        f"Expected a torchvision ImageFolder: one sub-folder per class named by its WordNet id "
        f"(n01440764, ...; all 1,000, so that the sorted folder names give torchvision's class "
        f"indices), holding that class's images (JPEG, PNG, ...). For the validation split put it "
        f"at {root / 'val'} or at {root} itself (for split='train' at {root / 'train'}), or pass "
        f"its location as root (--data-root); ImageNet cannot be downloaded by hcrfast."
    )
    if not folder.is_dir():
        raise FileNotFoundError(f"ImageNet not found: {folder} is not a directory. {hint}")
    transform = transforms.Compose(
        [
            transforms.Resize(resize, interpolation=modes[interpolation]),
            transforms.CenterCrop(IMAGENET_CROP),
            transforms.ToTensor(),
        ]
    )
    try:
        ds = ImageFolder(str(folder), transform=transform, allow_empty=True)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"ImageNet not found in {folder} ({exc}). {hint}") from exc
    if len(ds) == 0:
        raise FileNotFoundError(f"ImageNet not found: the class folders in {folder} hold no images. {hint}")
    if len(ds.classes) != 1000:
        validation.warn(f"{folder} has {len(ds.classes)} class folders, not 1,000: labels are positions among "
                        f"these folders, not torchvision's ImageNet class indices.")
    n = len(ds)
    if limit is None or limit >= n:
        index = range(n)
    else:
        index = np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64)).tolist()
    images, labels = zip(*(ds[i] for i in index))
    return torch.stack(images).contiguous(), torch.as_tensor(labels, dtype=torch.int64)
