"""hcrfast.train: a short digits training, the saved state dict, determinism, accuracy."""
from __future__ import annotations

import pytest
import torch

from hcrfast import data, train, zoo


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "digits.pt"
    # 8 epochs instead of the default 30: ≈0.95 test accuracy in well under a second.
    return train.train("digits", epochs=8, out=out, progress=False)


def test_short_digits_training_learns(short_run):
    assert short_run.epochs == 8
    assert short_run.test_accuracy > 0.8  # chance is 0.1
    assert short_run.train_seconds > 0
    assert short_run.state_dict_path.is_file()


def test_saved_state_dict_loads_back_with_identical_logits(short_run):
    loaded = zoo.build("digits", weights=short_run.state_dict_path)
    images, labels = data.load("digits")
    saved = torch.load(short_run.state_dict_path, map_location="cpu", weights_only=True)
    assert set(saved) == set(loaded.model.state_dict())
    # the same logits as a model holding the saved tensors directly
    reference = zoo.build("digits", seed=123)
    reference.model.load_state_dict(saved)
    with torch.no_grad():
        assert torch.equal(loaded.model(loaded.normalize(images)), reference.model(reference.normalize(images)))
    assert train.accuracy(loaded, images, labels) == pytest.approx(short_run.test_accuracy)


def test_training_is_deterministic(short_run, tmp_path):
    again = train.train("digits", epochs=8, out=tmp_path / "again.pt", progress=False)
    a = torch.load(short_run.state_dict_path, weights_only=True)
    b = torch.load(again.state_dict_path, weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert again.test_accuracy == short_run.test_accuracy
    other = train.train("digits", epochs=1, seed=1, out=tmp_path / "other.pt", progress=False, limit=64)
    c = torch.load(other.state_dict_path, weights_only=True)
    assert not torch.equal(a["1.weight"], c["1.weight"])


def test_progress_one_line_per_epoch(tmp_path, capsys):
    train.train("digits", epochs=2, out=tmp_path / "p.pt", limit=64)
    err = capsys.readouterr().err.strip().splitlines()
    epoch_lines = [line for line in err if "epoch" in line]
    assert len(epoch_lines) == 2
    assert "loss" in epoch_lines[0] and "accuracy" in epoch_lines[0]


def test_accuracy_oracle():
    # a fixed linear "model" whose predictions are known
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.0, 3.0], [5.0, 4.0]])
    labels = torch.tensor([0, 1, 1, 1, 0])
    assert train.accuracy(model, images, labels, batch_size=2) == pytest.approx(4 / 5)


def test_refuses_imagenet_and_unknown_names(tmp_path):
    with pytest.raises(NotImplementedError, match="weights='default'"):
        train.train("resnet18", out=tmp_path / "x.pt")
    with pytest.raises(ValueError, match="trainable names"):
        train.train("vgg", out=tmp_path / "x.pt")
    with pytest.raises(ValueError, match="epochs"):
        train.train("digits", epochs=0, out=tmp_path / "x.pt")


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), 0.0, -1e-3, True, "1e-3"])
def test_refuses_a_learning_rate_that_is_not_positive_and_finite(lr, tmp_path):
    with pytest.raises(ValueError, match=r"lr must be a positive finite number"):
        train.train("digits", epochs=1, lr=lr, out=tmp_path / "x.pt", limit=64, progress=False)
    assert not (tmp_path / "x.pt").exists()


def test_a_diverged_run_writes_no_state_dict(tmp_path):
    """lr = 1e6 turns the weights into NaN within two epochs: refused, nothing saved (it was saved, rc 0)."""
    with pytest.raises(ValueError, match=r"digits training diverged at epoch [12] .*no state dict was written"):
        train.train("digits", epochs=2, lr=1e6, out=tmp_path / "x.pt", limit=64, progress=False)
    assert not (tmp_path / "x.pt").exists()
