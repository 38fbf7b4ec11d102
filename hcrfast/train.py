"""Train the small zoo models with the published recipe (AdamW, batch 32; the paper's epochs).

AdamW (lr 1e-3, PyTorch's other defaults), minibatches of 32 reshuffled every epoch,
cross-entropy on the logits of ``ZooModel.model`` applied to normalized images; 6 epochs for
MNIST, 7 for CIFAR-10. For ``digits`` (not in the paper) the default is 30 epochs
(1,297 training images, 41 steps per epoch): measured on 2 CPU cores, about 1.6 s of training
and a test accuracy of 97–98% (see ``DEFAULT_EPOCHS``).

The run is seeded — the initialization through ``hcrfast.zoo.build(name, seed=seed)``, the
shuffling through its own ``torch.Generator`` — and deterministic on the CPU (same seed, same
thread count → same weights); the global RNG is not touched.

Runs resume: after every epoch the model, the optimizer and the shuffling generator are written
(atomically) to ``OUT.resume`` beside the state dict ``OUT`` (a shorter name where that one would pass
the file system's limit: :func:`resume_path`); the same call made again after a crash
or an interrupt goes on from the last finished epoch and ends with the weights of an uninterrupted
run (bitwise on the CPU with the same thread count). The file goes once ``OUT`` is written. A call
with other arguments or data is refused, naming what differs; more epochs than the interrupted run
asked for extend it (the recipe has no schedule: its first epochs are those of any longer run).
A file at ``OUT`` that train did not write (its state dicts carry a mark) is refused, never written over.
"""
from __future__ import annotations

import math
import numbers
import os
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from hcrfast import data as _data
from hcrfast import zoo as _zoo
from hcrfast.checkpoint import CheckpointMismatchError, atomic_write_bytes, check_key, sha256_tensors
from hcrfast.validation import say

__all__ = ["DEFAULT_EPOCHS", "TrainResult", "accuracy", "add_subparser", "train"]

# digits, measured on 2 CPU cores with torch 2.14 (500 test images): 30 epochs give a test
# accuracy of 0.980 / 0.978 / 0.974 / 0.972 for seeds 0 / 1 / 2 / 3 in about 1.6 s of
# training; 5 epochs already give 0.95, 10 give 0.964 (seed 0).
DEFAULT_EPOCHS = {"digits": 30, "mnist": 6, "cifar10": 7}


@dataclass(frozen=True)
class TrainResult:
    """What ``train`` produced.

    Attributes
    ----------
    state_dict_path : pathlib.Path
        The saved ``ZooModel.model.state_dict()``; load it with ``zoo.build(name, weights=path)``.
    test_accuracy : float
        Fraction of the test split classified correctly, in [0, 1].
    train_seconds : float
        Wall time of the optimization loop (data loading and evaluation excluded).
    epochs : int
        Epochs run.
    """

    state_dict_path: Path
    test_accuracy: float
    train_seconds: float
    epochs: int


def _logits_fn(model):
    if isinstance(model, _zoo.ZooModel):
        return lambda x: model.model(model.normalize(x))
    if isinstance(model, nn.Module):
        return model
    raise TypeError(f"Expected a hcrfast.zoo.ZooModel or a torch.nn.Module, got {type(model).__name__}.")


@torch.no_grad()
def accuracy(model, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int = 256) -> float:
    """Fraction of ``images`` whose arg-max logit equals ``labels``.

    Parameters
    ----------
    model : hcrfast.zoo.ZooModel or torch.nn.Module
        A ZooModel gets images in [0, 1] and normalizes them itself; a plain module gets
        ``images`` as they are (normalize them first if it expects that).
    images : torch.Tensor
        (N, C, H, W); moved batch by batch to the model's device.
    labels : torch.Tensor
        (N,) integer class indices.
    batch_size : int
        Examples per forward pass.
    """
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"Shape mismatch: {images.shape[0]} images but {labels.shape[0]} labels.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    if images.shape[0] == 0:
        raise ValueError("accuracy of an empty set of images is undefined.")
    module = model.model if isinstance(model, _zoo.ZooModel) else model
    logits_of = _logits_fn(model)
    device = next(module.parameters()).device
    was_training = module.training
    module.eval()
    correct = 0
    try:
        for start in range(0, images.shape[0], batch_size):
            x = images[start : start + batch_size].to(device)
            y = labels[start : start + batch_size].to(device)
            correct += int((logits_of(x).argmax(dim=1) == y).sum())  # host copy: one per batch
    finally:
        module.train(was_training)
    return correct / images.shape[0]


def train(
    name: str,
    *,
    data_root=None,
    download: bool = False,
    epochs: int | None = None,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    out=None,
    limit: int | None = None,
    progress: bool = True,
    device=None,
) -> TrainResult:
    """Train ``zoo.build(name)`` from a seeded random initialization and save its state dict.

    Parameters
    ----------
    name : {"digits", "mnist", "cifar10"}
        The ImageNet models are not trained here (use ``weights="default"``).
    data_root, download :
        Passed to ``hcrfast.data.load`` as ``root`` and ``download``.
    epochs : int, optional
        Default ``DEFAULT_EPOCHS[name]`` (digits 30, MNIST 6, CIFAR-10 7).
    batch_size, lr : int, float
        Minibatch size and AdamW learning rate (published: 32, 1e-3).
    seed : int
        Seeds the initialization and the shuffling.
    out : str or os.PathLike, optional
        Where to save the state dict; default ``./{name}_state_dict.pt``.
    limit : int, optional
        Use at most this many examples of each split (quick runs).
    progress : bool
        Print one line per epoch (mean training loss, training accuracy) to stderr.
    device : str or torch.device, optional
        Default CPU. Runs are deterministic on the CPU only.

    Returns
    -------
    TrainResult
    """
    if name not in DEFAULT_EPOCHS:
        if name in _zoo.NAMES:
            raise NotImplementedError(
                f"hcrfast trains only {', '.join(DEFAULT_EPOCHS)}; for {name!r} use torchvision's "
                f"ImageNet weights: zoo.build({name!r}, weights='default')."
            )
        raise ValueError(f"Unknown model {name!r}; trainable names: {', '.join(DEFAULT_EPOCHS)}.")
    epochs = DEFAULT_EPOCHS[name] if epochs is None else epochs
    for label, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}.")
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr!r} (--lr); the recipe's is 1e-3.")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r} (--seed)")
    try:
        device = torch.device("cpu" if device is None else device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device ({exc}); pass cpu or cuda (--device)") from None
    if device.type not in ("cpu", "cuda"):   # (meta, mps, xla: the recipe runs on neither; meta failed deep inside)
        raise ValueError(f"device {str(device)!r}: train runs on cpu or cuda (cuda:N); pass one of them (--device)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but torch sees no CUDA device; use cpu (--device)")
    out = _writable_file(f"{name}_state_dict.pt" if out is None else out)

    zm = _zoo.build(name, seed=seed)
    if os.path.lexists(out) and not _own_output(out, zm.model.state_dict()):
        raise ValueError(f"{out} is there and is not a state dict hcrfast train wrote: it would be written over; "
                         f"pass another --out, or remove it")
    dataset = zm.dataset
    if download and dataset not in ("mnist", "cifar10"):   # as hcrfast reproduce: nothing to fetch, not an error
        from hcrfast import validation

        warnings.warn(f"download=True ignored: {dataset} is not downloadable (digits ships with scikit-learn; "
                      f"ImageNet must be local)", validation.HcrfastUserWarning, stacklevel=2)
        download = False
    train_x, train_y = _data.load(dataset, split="train", root=data_root, download=download, limit=limit)
    test_x, test_y = _data.load(dataset, split="test", root=data_root, download=download, limit=limit)
    # What an interrupted run must share with this one to be resumed by it (epochs excepted: see above).
    key = {"format": _RESUME_FORMAT, "name": name, "batch_size": batch_size, "lr": float(lr), "seed": int(seed),
           "device": device.type, "train_examples": int(train_x.shape[0]),
           "train_data": sha256_tensors(train_x, train_y)[:16], "torch": str(torch.__version__)}

    model = zm.model.to(device)
    # Normalize once: the same values as normalizing each minibatch.
    train_x = zm.normalize(train_x).to(device)
    train_y = train_y.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    n = train_x.shape[0]

    resume = resume_path(out)
    done, seconds_before = _resume(resume, key, epochs, model, optimizer, generator, device)
    if done and progress:
        say(f"{name}: resuming after epoch {done}/{epochs} from {resume}")

    model.train()
    start = time.perf_counter() - seconds_before
    session = time.perf_counter()  # this call's epochs time the ETA: a resumed run's first ones ran elsewhere
    for epoch in range(done + 1, epochs + 1):
        order = torch.randperm(n, generator=generator).to(device)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        for first in range(0, n, batch_size):
            idx = order[first : first + batch_size]
            x, y = train_x[idx], train_y[idx]
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * y.shape[0]
            correct += (logits.detach().argmax(dim=1) == y).sum()
        if progress:
            # host copy: once per epoch
            now = time.perf_counter()
            eta = f", ETA {(now - session) / (epoch - done) * (epochs - epoch):.0f} s" if epoch < epochs else ""
            say(
                f"{name} epoch {epoch}/{epochs}: loss {float(loss_sum) / n:.4f}, "
                f"train accuracy {int(correct) / n:.4f} ({now - start:.1f} s{eta})")
        # host read: once per epoch. A diverged run (lr too large) is refused before anything is saved.
        if not math.isfinite(float(loss_sum)) or not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise ValueError(f"{name} training diverged at epoch {epoch} (loss {float(loss_sum) / n:g}, "
                                     f"lr={lr:g}): no state dict was written; pass a smaller --lr (the recipe's "
                                     f"is 1e-3)")
        snapshot = {"key": key, "epoch": epoch, "seconds": time.perf_counter() - start,
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state()}
        atomic_write_bytes(resume, lambda fh: torch.save(snapshot, fh))
    train_seconds = time.perf_counter() - start
    model.eval()

    test_accuracy = accuracy(zm, test_x, test_y)
    trained = model.state_dict()
    state = OrderedDict((k, v.detach().cpu()) for k, v in trained.items())
    # torch's module versions, as Module.state_dict() keeps them, and train's mark (see _own_output)
    state._metadata = {**getattr(trained, "_metadata", {}), _OWN_MARK: {"format": _RESUME_FORMAT}}
    # Atomic, and through a file object: torch names the archive's records after a path it writes to,
    # so the same weights would give other bytes under another (temporary) name.
    atomic_write_bytes(out, lambda fh: torch.save(state, fh))
    resume.unlink(missing_ok=True)
    if progress:
        say(
            f"{name}: test accuracy {test_accuracy:.4f} on {test_x.shape[0]} images; "
            f"trained in {train_seconds:.1f} s; state dict saved to {out}")
    return TrainResult(state_dict_path=out, test_accuracy=test_accuracy, train_seconds=train_seconds, epochs=epochs)


#: The layout of ``OUT.resume``; a file of another layout is refused by its key.
_RESUME_FORMAT = 1

#: The entry of the state dict's ``_metadata`` (torch's module versions, which ``load_state_dict`` reads by module
#: name: a name with a space is no module's) that marks ``OUT`` as train's own: a rerun may write over it.
_OWN_MARK = "hcrfast train"


def _own_output(path: Path, expected) -> bool:
    """Whether ``path`` is a state dict :func:`train` wrote (and a rerun may replace): one carrying its mark, or,
    from an hcrfast before the mark, a plain dict (``Module.state_dict()`` gives an OrderedDict) of the tensors of
    ``expected`` (the model's state dict), of their shapes. Anything else is the user's, not to be written over."""
    import zipfile

    try:   # (torch.save writes a zip; mmap: a large file of the user's is not read into memory)
        if not (Path(path).is_file() and zipfile.is_zipfile(path)):
            return False
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - whatever a file fails to load with, it is no state dict of train's
        return False
    if not isinstance(saved, dict):
        return False
    metadata = getattr(saved, "_metadata", None)
    if isinstance(metadata, dict) and _OWN_MARK in metadata:
        return True
    return (type(saved) is dict and saved.keys() == expected.keys()
            and all(isinstance(v, torch.Tensor) and v.shape == expected[k].shape for k, v in saved.items()))


def resume_path(out) -> Path:
    """Where :func:`train` keeps the last finished epoch of a run that writes its state dict to ``out``."""
    from hcrfast.checkpoint import fitting_name

    out = Path(out)
    return out.with_name(fitting_name(out.parent if out.parent.is_dir() else ".", out.name + ".resume"))


def _resume(path: Path, key: dict, epochs: int, model, optimizer, generator, device) -> tuple[int, float]:
    """Load the interrupted run in ``path`` into ``model``, ``optimizer`` and ``generator``: its finished
    epochs and training seconds, or (0, 0.0) where there is none. A run of other arguments is refused."""
    if not path.is_file():
        return 0, 0.0
    fix = f"Delete {path} to train from the start, or pass the arguments of the interrupted run."
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
        stored_key, done = saved["key"], int(saved["epoch"])
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say which and how to go on
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CheckpointMismatchError(f"{path} is not a resumable run of hcrfast train ({type(exc).__name__}: "
                                      f"{first}). {fix}") from None
    check_key(path, stored_key, key, fix)
    if done > epochs:
        raise CheckpointMismatchError(f"{path} holds a run already trained for {done} epochs, more than the "
                                      f"{epochs} asked for: pass --epochs {done} or more to finish it. {fix}")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"].cpu())
    return done, float(saved["seconds"])


# ----------------------------------------------------------------------------------------
# command line: `hcrfast train NAME` (registered by hcrfast.cli through add_subparser)


def _writable_file(out) -> Path:
    """``out``, checked before any training: not a folder (nor a path ending in a separator, which names one:
    ``Path`` would drop it and write a file of that name), its folder created (or an error naming why not)."""
    from hcrfast.checkpoint import name_max

    text = os.fspath(out)
    out = Path(out)
    folder = next((p for p in out.parents if p.is_dir()), Path("."))
    size, limit = len(os.fsencode(out.name)), name_max(folder)
    if size > limit:   # (refused before the first epoch, not at its end; is_dir itself raises on it)
        raise ValueError(f"{text}: its name is {size} bytes, and the file system of {folder} takes names of "
                         f"{limit} bytes at most; pass a shorter name (--out)")
    if out.is_dir() or text.endswith(("/", os.sep)):
        raise ValueError(f"{text} {'is' if out.is_dir() else 'names'} a folder; pass a file path for the state dict, "
                         f"e.g. {out / 'model.pt'} (--out)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the folder of {out} ({exc.strerror}); pass a path you can write to "
                         f"(--out)") from None
    if not os.access(out.parent, os.W_OK):
        raise ValueError(f"cannot write to {out.parent}; pass a path you can write to (--out)")
    return out


def _device_flag(text: str) -> str:
    """--device: cpu, cuda or cuda:N (the others, as bound's and reproduce's, refused by argparse)."""
    import argparse
    import re

    if re.fullmatch(r"cpu|cuda(?::\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from cpu, cuda, cuda:N)")


def add_subparser(subparsers) -> None:
    """Register ``hcrfast train`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "train",
        help="train digits/mnist/cifar10 with the published recipe and save the state dict",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("name", choices=sorted(DEFAULT_EPOCHS), help="model to train")
    p.add_argument("--data", "--data-root", dest="data_root", default=None, metavar="DIR",
                   help="data directory (default ./data)")
    p.add_argument("--download", action="store_true", help="download MNIST/CIFAR-10 if missing")
    p.add_argument("--epochs", type=int, default=None, help="default: digits 30, mnist 6, cifar10 7")
    p.add_argument("--batch-size", type=int, default=32, help="default 32")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate, default 1e-3")
    p.add_argument("--seed", type=int, default=0, help="initialization and shuffling, default 0")
    p.add_argument("--out", default=None, help="state dict path (default ./NAME_state_dict.pt)")
    p.add_argument("--limit", type=int, default=None, help="at most this many examples per split")
    p.add_argument("--device", type=_device_flag, default="cpu", metavar="{cpu,cuda,cuda:N}",
                   help="default cpu; cuda:N picks GPU N")
    p.add_argument("--no-progress", "--quiet", dest="quiet", action="store_true",
                   help="no per-epoch progress lines")
    p.set_defaults(func=_run_cli)


def _run_cli(args) -> int:
    from hcrfast._bound_cli import expand_user

    expand_user(args, "out", "data_root")
    result = train(
        args.name,
        data_root=args.data_root,
        download=args.download,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        out=args.out,
        limit=args.limit,
        progress=not args.quiet,
        device=args.device,
    )
    print(f"{result.state_dict_path}\t{result.test_accuracy:.4f}")
    return 0
