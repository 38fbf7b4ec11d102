"""hcrfast.data: each loader on fake files in torchvision's formats; missing data; no network."""
from __future__ import annotations

import socket

import numpy as np
import pytest
import torch

from hcrfast import data

from _fakedata import cifar_md5_bypass, write_cifar10, write_imagefolder, write_mnist


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every test here fails loudly if anything tries to open a connection or resolve a name."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _check(images, labels, n, chw):
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.shape == (n, *chw) and labels.shape == (n,)
    assert images.min() >= 0 and images.max() <= 1


# ----------------------------------------------------------------------------------------
# digits


def test_digits_split():
    x_train, y_train = data.load("digits", split="train")
    x_test, y_test = data.load("digits", split="test")
    _check(x_train, y_train, 1297, (1, 8, 8))
    _check(x_test, y_test, 500, (1, 8, 8))
    assert x_test.max() == 1.0  # the raw values run 0..16
    # stratified: every class 48..51 times in the test split
    counts = torch.bincount(y_test, minlength=10)
    assert counts.min() >= 48 and counts.max() <= 51
    # a fixed split: the same on every call, train and test disjoint and together all 1,797
    from sklearn.datasets import load_digits

    bunch = load_digits()
    all_images = torch.from_numpy(bunch.images / 16.0).float().reshape(1797, 64)
    train_rows = {tuple(r.tolist()) for r in x_train.reshape(-1, 64)}
    test_rows = {tuple(r.tolist()) for r in x_test.reshape(-1, 64)}
    assert len(train_rows | test_rows) == len({tuple(r.tolist()) for r in all_images})
    x_again, y_again = data.load("digits", split="test")
    assert torch.equal(x_again, x_test) and torch.equal(y_again, y_test)


def test_limit_keeps_the_first_examples():
    x, y = data.load("digits", limit=7)
    x_all, y_all = data.load("digits")
    assert torch.equal(x, x_all[:7]) and torch.equal(y, y_all[:7])


# ----------------------------------------------------------------------------------------
# MNIST


def test_mnist_reads_idx_files(tmp_path):
    written = write_mnist(tmp_path, n_train=12, n_test=7)
    for split in ("train", "test"):
        images, labels = data.load("mnist", split=split, root=tmp_path)
        expected_images, expected_labels = written[split]
        _check(images, labels, len(expected_labels), (1, 28, 28))
        assert torch.equal(labels, torch.from_numpy(expected_labels.astype(np.int64)))
        torch.testing.assert_close(images[:, 0], torch.from_numpy(expected_images).float() / 255)
    images, labels = data.load("mnist", root=tmp_path, limit=3)
    assert images.shape[0] == labels.shape[0] == 3


def test_mnist_missing_says_where_and_how(tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        data.load("mnist", root=root)
    message = str(info.value)
    assert str(root.resolve() / "MNIST" / "raw") in message
    assert "t10k-images-idx3-ubyte" in message and "--download" in message


def test_mnist_compressed_only_hint(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="gunzip"):
        data.load("mnist", root=tmp_path)


# ----------------------------------------------------------------------------------------
# CIFAR-10


def test_cifar10_reads_pickle_batches(tmp_path, monkeypatch):
    written = write_cifar10(tmp_path, n_per_batch=3, n_test=5)
    cifar_md5_bypass(monkeypatch)  # fakes cannot match the official MD5s; see _fakedata
    for split, n in (("train", 15), ("test", 5)):
        images, labels = data.load("cifar10", split=split, root=tmp_path)
        expected_images, expected_labels = written[split]
        _check(images, labels, n, (3, 32, 32))
        assert torch.equal(labels, torch.from_numpy(expected_labels.astype(np.int64)))
        # torchvision's (N, H, W, C) → (N, C, H, W)
        torch.testing.assert_close(images, torch.from_numpy(expected_images).permute(0, 3, 1, 2).float() / 255)


def test_cifar10_md5_mismatch_is_reported(tmp_path):
    write_cifar10(tmp_path)
    with pytest.raises(ValueError, match="MD5") as info:
        data.load("cifar10", root=tmp_path)
    assert str(tmp_path.resolve() / "cifar-10-batches-py") in str(info.value)


def test_cifar10_missing_says_where_and_how(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        data.load("cifar10", root=tmp_path)
    message = str(info.value)
    assert str(tmp_path.resolve() / "cifar-10-batches-py") in message
    assert "test_batch" in message and "--download" in message


# ----------------------------------------------------------------------------------------
# ImageNet


def test_imagenet_imagefolder(tmp_path):
    write_imagefolder(tmp_path / "val", per_class=2, size=(120, 100))
    with pytest.warns(UserWarning, match="3 class folders, not 1,000"):
        images, labels = data.load("imagenet", root=tmp_path)
    _check(images, labels, 6, (3, 91, 91))
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    # the same as torchvision's own transforms with resize 104, crop 91 on the first image
    from PIL import Image
    from torchvision import transforms

    first = sorted((tmp_path / "val" / "n01440764").iterdir())[0]
    expected = transforms.Compose([transforms.Resize(104), transforms.CenterCrop(91), transforms.ToTensor()])(
        Image.open(first).convert("RGB")
    )
    torch.testing.assert_close(images[0], expected)
    # root may be the ImageFolder itself; limit spreads over the classes
    with pytest.warns(UserWarning):
        images, labels = data.load("imagenet", root=tmp_path / "val", limit=3)
    assert labels.tolist() == [0, 1, 2]


def test_imagenet_missing_says_where_and_how(tmp_path):
    root = tmp_path / "imagenet"
    with pytest.raises(FileNotFoundError) as info:
        data.load("imagenet", root=root)
    message = str(info.value)
    assert str(root.resolve()) in message and "ImageFolder" in message and str(root.resolve() / "val") in message
    root.mkdir()
    with pytest.raises(FileNotFoundError, match="ImageFolder"):
        data.load("imagenet", root=root)  # a directory without class folders


# ----------------------------------------------------------------------------------------
# arguments


def test_bad_arguments():
    with pytest.raises(ValueError, match="valid names: digits, mnist, cifar10, imagenet"):
        data.load("svhn")
    with pytest.raises(ValueError, match="split"):
        data.load("digits", split="validation")
    with pytest.raises(ValueError, match="limit"):
        data.load("digits", limit=0)
    with pytest.raises(ValueError, match="imagenet only"):
        data.load("digits", resize=104)
    with pytest.raises(ValueError, match="download"):
        data.load("imagenet", download=True)


def test_mnist_labels_that_disagree_with_the_images_are_refused(tmp_path):
    """A labels file of 30 for 40 images was loaded as is (training then died with an IndexError far away, and
    a limit of 20 paired the first 20 silently); classes past 9 crashed the loss. Both are refused at load,
    naming the way out."""
    import struct

    import _fakedata
    from hcrfast import data

    _fakedata.write_mnist(tmp_path, n_train=40, n_test=8)
    labels = tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    labels.write_bytes(struct.pack(">II", 0x801, 30) + bytes(30))
    with pytest.raises(ValueError, match=r"40 images but labels of shape \(30,\).*--download"):
        data.load("mnist", split="train", root=tmp_path)
    labels.write_bytes(struct.pack(">II", 0x801, 40) + bytes([200] * 40))
    with pytest.raises(ValueError, match=r"classes 200\.\.200 \(MNIST's are 0\.\.9\)"):
        data.load("mnist", split="train", root=tmp_path)
