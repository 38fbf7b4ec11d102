"""hcrfast.zoo: architectures, feature sizes, the features/head split against torchvision, weights."""
from __future__ import annotations

import functools
import urllib.error

import pytest
import torch
import torchvision
from torch import nn

from hcrfast import zoo

IMAGENET_INPUT = (3, 91, 91)


@functools.lru_cache(maxsize=None)
def built(name: str) -> zoo.ZooModel:
    """One random-init model per name, shared by the tests that only read it."""
    return zoo.build(name)


@pytest.mark.parametrize(
    "name, input_shape, n_features, n_classes",
    [
        ("digits", (1, 8, 8), 64, 10),
        ("mnist", (1, 28, 28), 784, 10),
        ("cifar10", (3, 32, 32), 3072, 10),
        # resnet18 (25,088) and swin_t (37,632): in test_features_then_head_equals_torchvision,
        # which needs the same (slow on a CPU) forward pass.
    ],
)
def test_feature_and_logit_sizes(name, input_shape, n_features, n_classes):
    zm = built(name)
    assert zm.name == name
    assert zm.input_shape == input_shape
    assert zm.n_features == n_features
    x = torch.rand(1, *input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = zm.features(zm.normalize(x))
        logits = zm.head(features)
        whole = zm.model(zm.normalize(x))
    assert features.shape == (1, n_features)
    assert logits.shape == (1, n_classes)
    assert torch.equal(whole, logits)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_eval_mode_on_return(name):
    zm = built(name)
    assert not any(m.training for m in zm.model.modules())
    assert zm.model[0] is zm.features and zm.model[1] is zm.head
    assert zm.model is zm.model


def _randomize_batchnorm(model: nn.Module, seed: int) -> None:
    """Non-trivial running statistics and affine parameters, so eval-mode BatchNorm matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))


@pytest.mark.parametrize(
    "name, constructor, n_features",
    [("resnet18", torchvision.models.resnet18, 25_088), ("swin_t", torchvision.models.swin_t, 37_632)],
)
def test_features_then_head_equals_torchvision(tmp_path, name, constructor, n_features):
    # Oracle: torchvision's own forward on the upsampled input, same weights (saved with
    # torchvision's key names and loaded through build).
    torch.manual_seed(1)
    reference = constructor()
    _randomize_batchnorm(reference, seed=2)
    reference.eval()
    path = tmp_path / f"{name}_torchvision.pt"
    torch.save(reference.state_dict(), path)

    zm = zoo.build(name, weights=path)
    x = torch.rand(1, *IMAGENET_INPUT, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(nn.Upsample(size=224, mode="bilinear")(x))
        features = zm.features(x)
        got = zm.head(features)
    assert zm.input_shape == IMAGENET_INPUT
    assert zm.n_features == n_features
    assert features.shape == (1, n_features)
    assert got.shape == expected.shape == (1, 1000)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_imagenet_parameters_from_torchvision_transforms():
    for name, weights in (("resnet18", torchvision.models.ResNet18_Weights.IMAGENET1K_V1),
                          ("swin_t", torchvision.models.Swin_T_Weights.IMAGENET1K_V1)):
        zm = built(name)
        t = weights.transforms()
        assert zm.normalization == (tuple(t.mean), tuple(t.std))
        assert zm.input_shape[1:] == (t.crop_size[0] * 13 // 32,) * 2
        assert zm.resize == round(t.resize_size[0] * 13 / 32)
        assert zm.interpolation == t.interpolation.value


def test_published_parameters():
    expected = {
        #            sigma, size, size_limit, it, it_limit, examples, lowfreq
        "mnist": (1.0, 1 / 200, 1 / 1000, 10, 10, 10_000, 8),
        "cifar10": (5.0, 1 / 500, 1 / 1000, 6, 4, 2_500, 8),
        "resnet18": (2.0, 1 / 500, 1 / 1000, 10, 10, 128, 32),
        "swin_t": (3.0, 1 / 500, 1 / 1000, 10, 10, 128, 32),
        "digits": (1.0, 1 / 200, 1 / 1000, 10, 10, 500, 4),
    }
    for name, values in expected.items():
        zm = built(name)
        assert (zm.sigma_scale, zm.size, zm.size_limit, zm.iterations, zm.iterations_limit, zm.examples, zm.lowfreq) == values
    assert built("mnist").normalization == ((0.1307,), (0.3081,))
    assert built("cifar10").normalization == ((0.5,) * 3, (0.5,) * 3)


def test_digits_normalization_matches_training_split():
    from hcrfast import data

    x, _ = data.load("digits", split="train")
    (mean,), (std,) = zoo.build("digits").normalization
    assert mean == pytest.approx(float(x.double().mean()), abs=1e-7)
    assert std == pytest.approx(float(x.double().std(unbiased=False)), abs=1e-7)


def test_normalize():
    zm = zoo.build("mnist")
    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    torch.testing.assert_close(zm.normalize(x), (x - 0.1307) / 0.3081)
    with pytest.raises(ValueError, match=r"expects images of shape \(B, 1, 28, 28\), got \(2, 784\)"):
        zm.normalize(x.reshape(2, 784))


def test_random_init_is_seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = zoo.build("mnist", seed=0), zoo.build("mnist", seed=0), zoo.build("mnist", seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["0.1.weight"], sc["0.1.weight"])


def test_state_dict_round_trip(tmp_path):
    source = zoo.build("mnist", seed=5)
    path = tmp_path / "mnist.pt"
    torch.save(source.model.state_dict(), path)
    loaded = zoo.build("mnist", weights=path)
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), source.model(x))
    # an in-memory state dict works as well
    again = zoo.build("mnist", weights=source.model.state_dict())
    with torch.no_grad():
        assert torch.equal(again.model(x), source.model(x))


# ----------------------------------------------------------------------------------------
# errors


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: digits, mnist, cifar10, resnet18, swin_t"):
        zoo.build("vgg16")


def test_default_weights_for_small_models_is_refused():
    for name in ("digits", "mnist", "cifar10"):
        with pytest.raises(ValueError, match=rf"No published weights.*hcrfast train {name}"):
            zoo.build(name, weights="default")


def test_corrupt_file_names_path(tmp_path):
    path = tmp_path / "corrupt.pt"
    path.write_bytes(b"\x80\x02 this is not a torch.save file" * 5)
    with pytest.raises(ValueError, match="corrupt") as info:
        zoo.build("digits", weights=path)
    assert str(path) in str(info.value)
    # a truncated real file
    full = tmp_path / "full.pt"
    torch.save(zoo.build("digits").model.state_dict(), full)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(full.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated.pt"):
        zoo.build("digits", weights=truncated)


def test_pickled_whole_model_is_refused(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(zoo.build("digits").model, path)
    with pytest.raises(ValueError, match=r"Only state dicts are accepted.*torch\.save\(model\.state_dict\(\), path\)"):
        zoo.build("digits", weights=path)


def test_checkpoint_dict_is_refused_with_hint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": zoo.build("digits").model.state_dict(), "epoch": 3}, path)
    with pytest.raises(ValueError, match="not a state dict.*'model'"):
        zoo.build("digits", weights=path)


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    state = dict(zoo.build("digits").model.state_dict())
    del state["1.weight"]
    state["extra.weight"] = torch.zeros(1)
    path = tmp_path / "partial.pt"
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"missing keys \(1\): 1\.weight.*unexpected keys \(1\): extra\.weight"):
        zoo.build("digits", weights=path)


def test_wrong_shapes_are_refused(tmp_path):
    path = tmp_path / "digits.pt"
    torch.save(zoo.build("digits").model.state_dict(), path)
    with pytest.raises(ValueError, match="size mismatch"):
        zoo.build("digits", weights=zoo.build("digits").model.state_dict() | {"1.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="does not fit the mnist model"):
        zoo.build("mnist", weights=path)


def test_missing_weights_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        zoo.build("digits", weights=tmp_path / "nope.pt")


def test_default_download_failure_explains_offline_use(tmp_path, monkeypatch):
    # An empty torch.hub cache and a download that fails as it does without network.
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))

    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    with pytest.raises(RuntimeError, match=r"needs network access.*resnet18-f37072fd\.pth") as info:
        zoo.build("resnet18", weights="default")
    assert str(tmp_path / "hub" / "checkpoints") in str(info.value)
    assert "weights='/path/to/resnet18-f37072fd.pth'" in str(info.value)


def test_corrupt_cached_default_weights_say_delete_it(tmp_path, monkeypatch):
    # torch.hub finds the file in its cache and fails to read it; no download is tried, so
    # "needs network access" would be the wrong advice: the file must go.
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    cached = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK\x03\x04 truncated")

    def no_network(url, *args, **kwargs):
        raise AssertionError("a cached file must not be downloaded again")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    with pytest.raises(ValueError, match="corrupt or an interrupted download. Delete it") as info:
        zoo.build("resnet18", weights="default")
    assert str(cached) in str(info.value)
    assert "needs network access" not in str(info.value)
