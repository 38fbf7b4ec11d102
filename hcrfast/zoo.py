"""The models of the published experiments (METHOD.md §3), split into features and head.

Each model is cut at the released features a(θ) (METHOD.md §1): ``features`` maps a
*normalized* input to the flat feature vector the HCR bounds are about, ``head`` maps
those features to logits. ``ZooModel`` also carries the experiment's published
parameters (σ scale, start size s, outer iterations i, number of examples, the size of
the low-frequency DCT block of the figures), so that a run can start from ``build(name)``.

Models
------
``digits``    sklearn's 8×8 handwritten digits (not in the paper; a small model that
              trains in seconds on a CPU, for tests and examples).
``mnist``     Flatten → Linear(784,784) → ReLU → Linear(784,784) → ReLU | Linear(784,10).
``cifar10``   Conv(3,32,3) → ReLU → MaxPool(2) → Conv(32,1024,5) → ReLU → MaxPool(3)
              → Conv(1024,3072,3) → ReLU → Flatten → Linear(3072,3072) → ReLU | Linear(3072,10).
              Spatial sizes for a 32×32 input: 32 → 30 → 15 → 11 → 3 → 1, so 3072·1·1 = 3072.
``resnet18``  Upsample(224, bilinear) → torchvision resnet18 without avgpool and fc → Flatten
              (512·7·7 = 25,088) | Unflatten(512,7,7) → avgpool → Flatten → fc (1000 logits).
``swin_t``    Upsample(224, bilinear) → torchvision swin_t ``features`` → Flatten
              (7·7·768 = 37,632) | Unflatten(7,7,768) → norm → permute → avgpool → flatten
              → head (1000 logits).

The ImageNet models take 3×91×91 inputs: the torchvision weights' resize and center crop
scaled by 13/32 (METHOD.md §3), which ``features`` upsamples to 224×224.

Weights
-------
``weights=None`` gives a seeded random initialization; a path (or an in-memory mapping)
gives a state dict of the whole ``ZooModel.model`` (``nn.Sequential(features, head)``,
keys ``0.*`` and ``1.*``), as written by ``hcrfast train``. For ``resnet18`` and ``swin_t``
a state dict with torchvision's own key names (for example torchvision's
``resnet18-f37072fd.pth``) is accepted as well. ``weights="default"`` fetches torchvision's
ImageNet weights (through torch.hub's cache, so only when not already cached).
"""
from __future__ import annotations

import os
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

__all__ = ["NAMES", "ZooModel", "build", "published_parameters"]

NAMES = ("digits", "mnist", "cifar10", "resnet18", "swin_t")

# Mean and standard deviation of all pixels of the digits training split of
# hcrfast.data.load("digits", split="train") (1,297 images, values /16 so in [0, 1]),
# measured once with
#     x = hcrfast.data.load("digits", split="train")[0].double()
#     x.mean(), x.std(unbiased=False)
# giving 0.30522585172513494 and 0.3759720769491603 (the unbiased std differs by 6e-6).
DIGITS_MEAN = 0.30522585
DIGITS_STD = 0.37597208

# torchvision's ImageNet weights normalize with these (ResNet18_Weights.IMAGENET1K_V1 and
# Swin_T_Weights.IMAGENET1K_V1 both: ``weights.transforms().mean`` / ``.std``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The transforms' resize and crop scaled by 13/32 (METHOD.md §3): crop 224·13/32 = 91.
# ResNet-18 resizes to 256 (bilinear) → 104; Swin-T resizes to 232 (bicubic) → 94.25 → 94.
_SCALE = 13 / 32
IMAGENET_CROP = round(224 * _SCALE)


@dataclass(eq=False)
class ZooModel:
    """A model cut at its released features, with the published experiment parameters.

    Attributes
    ----------
    name : str
        One of ``NAMES``.
    features : torch.nn.Module
        Normalized input of shape ``(B, *input_shape)`` → features of shape ``(B, n_features)``.
    head : torch.nn.Module
        Features ``(B, n_features)`` → logits ``(B, n_classes)``.
    input_shape : tuple of int
        ``(C, H, W)`` of one input.
    normalization : tuple of (tuple of float, tuple of float)
        ``(mean, std)`` per channel, applied to images in [0, 1] by ``normalize``.
    n_features : int
        n, the length of the feature vector.
    sigma_scale : float
        σ = sigma_scale × RMS of the features (METHOD.md §3).
    size, size_limit : float
        Start-vector size s of Algorithm 1, and its "limit" setting.
    iterations, iterations_limit : int
        Outer repetitions i of Algorithm 1 with ``size`` and with ``size_limit``.
    examples : int
        How many test (ImageNet: validation) examples the published experiment evaluated.
    lowfreq : int
        Side of the low-frequency DCT block shown in the figures.
    dataset : str
        The ``hcrfast.data.load`` name of the model's data.
    resize, interpolation : int or None, str or None
        ImageNet models only: the resize (before the center crop to 91) and its
        interpolation that the torchvision weights' own transforms use, scaled by 13/32.
    """

    name: str
    features: nn.Module
    head: nn.Module
    input_shape: tuple[int, int, int]
    normalization: tuple[tuple[float, ...], tuple[float, ...]]
    n_features: int
    sigma_scale: float
    size: float
    size_limit: float
    iterations: int
    iterations_limit: int
    examples: int
    lowfreq: int
    dataset: str
    resize: int | None = None
    interpolation: str | None = None
    _model: nn.Sequential = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._model = nn.Sequential(self.features, self.head)

    @property
    def model(self) -> nn.Sequential:
        """``nn.Sequential(features, head)``: normalized input → logits; its state dict is
        what ``build(name, weights=path)`` loads."""
        return self._model

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Map images in [0, 1] of shape ``(..., C, H, W)`` to the model's input, channel-wise
        ``(x - mean) / std``."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Expected a torch.Tensor of images, got {type(x).__name__}.")
        if tuple(x.shape[-3:]) != tuple(self.input_shape):
            raise ValueError(
                f"Shape mismatch: {self.name} expects images of shape (B, {', '.join(map(str, self.input_shape))}), "
                f"got {tuple(x.shape)}."
            )
        if not x.is_floating_point():
            raise TypeError(f"Expected floating-point images in [0, 1], got dtype {x.dtype}; divide by 255 first.")
        mean, std = self.normalization
        mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        return (x - mean_t) / std_t


# ----------------------------------------------------------------------------------------
# architectures


def _digits() -> tuple[nn.Module, nn.Module]:
    features = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    return features, nn.Linear(64, 10)


def _mnist() -> tuple[nn.Module, nn.Module]:
    features = nn.Sequential(nn.Flatten(), nn.Linear(784, 784), nn.ReLU(), nn.Linear(784, 784), nn.ReLU())
    return features, nn.Linear(784, 10)


def _cifar10() -> tuple[nn.Module, nn.Module]:
    features = nn.Sequential(
        nn.Conv2d(3, 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 1024, 5),
        nn.ReLU(),
        nn.MaxPool2d(3),
        nn.Conv2d(1024, 3072, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3072, 3072),
        nn.ReLU(),
    )
    return features, nn.Linear(3072, 10)


def _upsample() -> nn.Module:
    return nn.Upsample(size=224, mode="bilinear")


def _resnet18_split(tv: nn.Module) -> tuple[nn.Module, nn.Module]:
    # Named children keep torchvision's names, so the keys of .model's state dict are
    # torchvision's with a "0." (features) or "1." (head) prefix.
    body = [(n, m) for n, m in tv.named_children() if n not in ("avgpool", "fc")]
    features = nn.Sequential(OrderedDict([("upsample", _upsample()), *body, ("flatten", nn.Flatten())]))
    head = nn.Sequential(
        OrderedDict(
            [
                ("unflatten", nn.Unflatten(1, (512, 7, 7))),
                ("avgpool", tv.avgpool),
                ("flatten", nn.Flatten()),
                ("fc", tv.fc),
            ]
        )
    )
    return features, head


def _swin_t_split(tv: nn.Module) -> tuple[nn.Module, nn.Module]:
    children = list(tv.named_children())
    tail_names = [n for n, _ in children[-5:]]
    if tail_names != ["norm", "permute", "avgpool", "flatten", "head"]:  # torchvision changed swin_t
        raise NotImplementedError(f"Unexpected torchvision swin_t layout: last children {tail_names}.")
    features = nn.Sequential(OrderedDict([("upsample", _upsample()), *children[:-5], ("flatten_features", nn.Flatten())]))
    head = nn.Sequential(OrderedDict([("unflatten", nn.Unflatten(1, (7, 7, 768))), *children[-5:]]))
    return features, head


def _torchvision(name: str):
    import torchvision.models as tvm

    if name == "resnet18":
        return tvm.resnet18, tvm.ResNet18_Weights.IMAGENET1K_V1, _resnet18_split
    return tvm.swin_t, tvm.Swin_T_Weights.IMAGENET1K_V1, _swin_t_split


# Published parameters of METHOD.md §3; digits chosen here (see build's docstring).
_SPECS = {
    "digits": dict(
        input_shape=(1, 8, 8), normalization=((DIGITS_MEAN,), (DIGITS_STD,)), n_features=64,
        sigma_scale=1.0, size=1 / 200, size_limit=1 / 1000, iterations=10, iterations_limit=10,
        examples=500, lowfreq=4, dataset="digits",
    ),
    "mnist": dict(
        input_shape=(1, 28, 28), normalization=((0.1307,), (0.3081,)), n_features=784,
        sigma_scale=1.0, size=1 / 200, size_limit=1 / 1000, iterations=10, iterations_limit=10,
        examples=10_000, lowfreq=8, dataset="mnist",
    ),
    "cifar10": dict(
        input_shape=(3, 32, 32), normalization=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), n_features=3072,
        sigma_scale=5.0, size=1 / 500, size_limit=1 / 1000, iterations=6, iterations_limit=4,
        examples=2_500, lowfreq=8, dataset="cifar10",
    ),
    "resnet18": dict(
        input_shape=(3, IMAGENET_CROP, IMAGENET_CROP), normalization=(IMAGENET_MEAN, IMAGENET_STD),
        n_features=25_088, sigma_scale=2.0, size=1 / 500, size_limit=1 / 1000, iterations=10,
        iterations_limit=10, examples=128, lowfreq=32, dataset="imagenet",
        resize=round(256 * _SCALE), interpolation="bilinear",
    ),
    "swin_t": dict(
        input_shape=(3, IMAGENET_CROP, IMAGENET_CROP), normalization=(IMAGENET_MEAN, IMAGENET_STD),
        n_features=37_632, sigma_scale=3.0, size=1 / 500, size_limit=1 / 1000, iterations=10,
        iterations_limit=10, examples=128, lowfreq=32, dataset="imagenet",
        resize=round(232 * _SCALE), interpolation="bicubic",
    ),
}


def published_parameters(name: str) -> dict:
    """The experiment parameters ``build(name)`` puts on its ZooModel, without building it.

    Keys: ``sigma_scale``, ``size``, ``size_limit``, ``iterations``, ``iterations_limit``,
    ``examples``, ``lowfreq``, ``dataset``, ``input_shape``, ``n_features``.
    """
    if not isinstance(name, str) or name not in _SPECS:
        raise ValueError(f"Unknown model {name!r}; valid names: {', '.join(NAMES)}.")
    keys = ("sigma_scale", "size", "size_limit", "iterations", "iterations_limit", "examples", "lowfreq",
            "dataset", "input_shape", "n_features")
    return {k: _SPECS[name][k] for k in keys}


# ----------------------------------------------------------------------------------------
# weights


def _read_state_dict(path: Path) -> Mapping[str, torch.Tensor]:
    how = "Save one with torch.save(model.state_dict(), path)."
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No weights file at {path.resolve()}. Pass weights=None (random init), a path to a "
            f"state dict, or 'default' (torchvision's pretrained weights, resnet18 and swin_t only)."
        ) from None
    except pickle.UnpicklingError as exc:
        if "Unsupported global" in str(exc):
            # weights_only=True refuses arbitrary pickled classes: never unpickle them here.
            raise ValueError(
                f"{path} holds pickled Python objects, not only tensors (for example a whole "
                f"nn.Module saved with torch.save(model, path)). Only state dicts are accepted: "
                f"{how}"
            ) from exc
        raise ValueError(f"{path} is not a readable torch.save file (corrupt or another format): {_first_line(exc)}") from exc
    # Arbitrary bytes fail inside the unpickler in arbitrary ways (text files raise IndexError
    # from its mark stack): all of them mean "not a torch.save file".
    except (RuntimeError, EOFError, KeyError, IndexError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a readable torch.save file (corrupt or truncated?): {_first_line(exc)}") from exc
    return _check_state_dict(obj, str(path))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _check_state_dict(obj, where: str) -> Mapping[str, torch.Tensor]:
    how = "Save one with torch.save(model.state_dict(), path)."
    if not isinstance(obj, Mapping):
        raise ValueError(f"{where} holds a {type(obj).__name__}, not a state dict. Only state dicts are accepted: {how}")
    bad = [k for k, v in obj.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        nested = [k for k in bad if isinstance(obj[k], Mapping)]
        hint = f" It looks like a checkpoint holding a state dict under {nested[0]!r}: save that entry alone." if nested else ""
        raise ValueError(
            f"{where} is a dict but not a state dict (entries that are not name → tensor: "
            f"{_few(bad)}).{hint} {how}"
        )
    return obj


def _few(keys, k: int = 5) -> str:
    keys = sorted(map(str, keys))
    more = f", ... ({len(keys) - k} more)" if len(keys) > k else ""
    return ", ".join(keys[:k]) + more


def _load_into(zm: ZooModel, tv: nn.Module | None, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Load ``state`` into ``zm.model`` (keys ``0.*``/``1.*``) or, for the ImageNet models,
    into the torchvision model whose modules ``zm`` shares (torchvision's key names)."""
    targets = [("hcrfast", zm.model)]
    if tv is not None:
        targets.append(("torchvision", tv))
    given = set(state)
    # Choose the layout the file shares most keys with; report against it.
    label, target = max(targets, key=lambda t: len(given & set(t[1].state_dict())))
    expected = set(target.state_dict())
    missing, unexpected = expected - given, given - expected
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {_few(unexpected)}")
        raise ValueError(
            f"State dict {where} does not fit the {zm.name} model ({label} key names): "
            + "; ".join(parts)
            + ". Expected the state dict of hcrfast.zoo.build(...).model"
            + (" or of the torchvision model" if tv is not None else "")
            + "."
        )
    try:
        target.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # size mismatches; torch lists them one per line after a title
        details = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        raise ValueError(
            f"State dict {where} does not fit the {zm.name} model: " + " ".join(details[:3])
            + (f" ... ({len(details) - 3} more)" if len(details) > 3 else "")
        ) from exc


def _default_state_dict(name: str, weights_enum) -> Mapping[str, torch.Tensor]:
    url = weights_enum.url
    try:
        # torch.hub's cache first (no network when the file is already there).
        return weights_enum.get_state_dict(progress=True, check_hash=True)
    except Exception as exc:  # URLError, OSError, hash mismatch, ...: all mean "could not fetch"
        from hcrfast.data import DownloadError

        cache = Path(torch.hub.get_dir()) / "checkpoints"
        cached = cache / os.path.basename(url)
        if cached.is_file():  # torch.hub read its cache and failed: no download was tried
            raise ValueError(
                f"torchvision's pretrained {weights_enum} for {name} is cached in {cached}, but that file could "
                f"not be read ({type(exc).__name__}: {_first_line(exc)}): it is corrupt or an interrupted "
                f"download. Delete it and run again with network access (it is then downloaded from {url}), "
                f"or replace it with a good copy of that file."
            ) from exc
        raise DownloadError(
            f"Could not get torchvision's pretrained {weights_enum} for {name} ({type(exc).__name__}: "
            f"{_first_line(exc)}). weights='default' needs network access to download {url} "
            f"(once; it is then cached in {cache}). Without network, copy that file into {cache} "
            f"or pass its path (--weights /path/to/{os.path.basename(url)}, or in Python "
            f"hcrfast.zoo.build({name!r}, weights='/path/to/{os.path.basename(url)}') after import hcrfast.zoo)."
        ) from exc


# ----------------------------------------------------------------------------------------
# public


def build(name: str, weights=None, *, seed: int = 0) -> ZooModel:
    """Build one of the experiment models, in eval mode, on the CPU.

    Parameters
    ----------
    name : {"digits", "mnist", "cifar10", "resnet18", "swin_t"}
    weights : None, str, os.PathLike, or mapping
        None: random initialization seeded by ``seed`` (the global RNG is left as it was).
        A path: a state dict saved with ``torch.save(model.state_dict(), path)``, loaded with
        ``weights_only=True``; it covers the whole ``ZooModel.model`` (for resnet18/swin_t a
        torchvision-named state dict is accepted too). A mapping: such a state dict in memory.
        ``"default"``: torchvision's ImageNet weights (``ResNet18_Weights.IMAGENET1K_V1``,
        ``Swin_T_Weights.IMAGENET1K_V1``), downloaded only if torch.hub has not cached them.
    seed : int
        Seed of the random initialization.

    Returns
    -------
    ZooModel

    Raises
    ------
    ValueError
        Unknown name; ``"default"`` for a model without published weights; a file that is
        corrupt, is not a state dict (e.g. a pickled whole module), or has missing/unexpected
        keys or wrong shapes.
    FileNotFoundError
        ``weights`` names a file that does not exist.
    RuntimeError
        ``"default"`` and the download failed (no network).

    Notes
    -----
    The digits model is not in the paper. Its parameters follow MNIST's (σ = 1 × RMS,
    s = 1/200 (1/1000), i = 10 (10)); examples = the 500 images of the digits test split.
    ``lowfreq`` is 4: an 8×8 block would be the whole 8×8 DCT, making the low-frequency
    histogram a copy of the full one, while the 1/4-of-the-side ratio of CIFAR (8 of 32)
    would leave 2×2 = 4 modes per image; 4×4 keeps the lower half of the frequencies along
    each axis (16 of 64 modes).
    """
    if not isinstance(name, str) or name not in _SPECS:
        raise ValueError(f"Unknown model {name!r}; valid names: {', '.join(NAMES)}.")
    if weights is not None and not isinstance(weights, (str, os.PathLike, Mapping)):
        raise TypeError(
            f"weights must be None, 'default', a path to a state dict or a state dict mapping; "
            f"got {type(weights).__name__}."
        )
    if isinstance(weights, str) and weights == "default" and name not in ("resnet18", "swin_t"):
        raise ValueError(
            f"No published weights for {name!r}: weights='default' exists only for resnet18 and "
            f"swin_t (torchvision's). Train the model with `hcrfast train {name}` "
            f"(hcrfast.train.train) and pass the saved state dict's path."
        )

    spec = _SPECS[name]
    tv = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name in ("resnet18", "swin_t"):
            constructor, _, split = _torchvision(name)
            tv = constructor(weights=None)
            features, head = split(tv)
        else:
            features, head = {"digits": _digits, "mnist": _mnist, "cifar10": _cifar10}[name]()
    zm = ZooModel(name=name, features=features, head=head, **spec)

    if isinstance(weights, str) and weights == "default":
        _, weights_enum, _ = _torchvision(name)
        _load_into(zm, tv, _default_state_dict(name, weights_enum), f"{weights_enum}")
    elif isinstance(weights, Mapping):
        _load_into(zm, tv, _check_state_dict(weights, "The weights mapping"), "given as a mapping")
    elif weights is not None:
        path = Path(weights)
        _load_into(zm, tv, _read_state_dict(path), str(path))

    zm.model.eval()
    return zm
