"""``hcrfast bound``: the bounds of your own model on your own inputs, from the shell.

``hcrfast reproduce`` runs the paper's experiments; this runs :func:`hcrfast.bound` on any
``torch.nn.Module`` that a Python file or module makes, over inputs saved as ``.pt``, ``.npy`` or
``.npz``, with what a long run needs: progress lines, a checkpoint folder that the same command
made again after a crash resumes from, ``torchrun`` sharding, and the results written as
``bounds.npz`` (``hcrfast.Bounds.load``) and ``summary.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
import textwrap
import time
import warnings
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hcrfast.cli import as_typed, float_literal  # a float as typed: 1e-400 is not 0
from hcrfast.validation import say

_INPUT_SUFFIXES = (".pt", ".pth", ".npy", ".npz")


def _strict_json(summary: dict) -> str:
    """``summary.json``'s text: strict JSON, a statistic over nothing (NaN: an attack with no mode to compare)
    or an infinite one written as null, which every JSON parser reads (Python's NaN and Infinity are not
    JSON; reproduce's summaries have always said null there)."""
    from hcrfast.results import json_default

    def strict(obj):
        if isinstance(obj, float):
            return obj if np.isfinite(obj) else None
        if isinstance(obj, dict):
            return {k: strict(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [strict(v) for v in obj]
        return obj

    return json.dumps(strict(json.loads(json.dumps(summary, default=json_default))), indent=1, allow_nan=False)

def count_at_least(text: str, least: int, fix: str) -> int:
    """An argparse value: an integer of at least ``least`` (else ``fix`` says what to pass)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {fix}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r}: {fix}")
    return value


def auto_or_count(text: str, least: int, fix: str):
    """An argparse value: "auto", or an integer of at least ``least`` (else ``fix`` says what to pass)."""
    return text if text == "auto" else count_at_least(text, least, fix)


def pilots_arg(text: str):
    """``--krylov-pilots`` (``hcrfast bound``, ``hcrfast reproduce``, benchmarks/gpu_targets.py): a positive
    integer or "auto"."""
    return auto_or_count(text, 1, "pass a positive integer or 'auto'")


def steps_arg(text: str):
    """``--singular-steps`` (``hcrfast bound``, ``hcrfast reproduce``, benchmarks/gpu_targets.py): a count
    ≥ 0 or "auto"."""
    return auto_or_count(text, 0, "pass 0 (none), a positive integer or 'auto'")


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "bound",
        help="bound your own model on your own inputs (resumable, sharded under torchrun)",
        description=textwrap.fill(
            "HCR lower bounds (hcrfast.bound) for a model that MODEL names, on the inputs of INPUTS. Writes "
            "OUT/bounds.npz (hcrfast.Bounds.load reads it), OUT/summary.json and OUT/chunks/ (finished chunks: the "
            "same command made again after a crash computes only the rest)."),
        epilog=textwrap.fill(
            "MODEL is 'path/to/file.py:NAME' or 'package.module:NAME' (the file or module is run, as Python runs an "
            "import). NAME (dots reach attributes) is a torch.nn.Module, or a class or function that makes one when "
            "called without arguments. The model runs in eval mode. Under torchrun every process runs the same "
            "command and takes every N-th chunk; rank 0 writes the results.") + (
            "\n\nexamples:\n"
            "  hcrfast bound net.py:Net x.pt                                 # sigma = 1 x RMS of the features\n"
            "  hcrfast bound net.py:Net x.pt --sweep 0.25,0.5,1,2,4          # the bounds against sigma\n"
            "  hcrfast bound net.py:Net x.pt --target-std 0.1                # the sigma whose median bound is 0.1\n"
            "  hcrfast bound net.py:Net x.pt --head net.py:Head --labels y.npy --sweep 0.5,1,2\n"
            "                                                                # ... and the accuracy each costs\n"
            "  hcrfast bound net.py:Net x.pt --head net.py:Head --labels y.npy --min-accuracy 0.9\n"
            "                                                                # the most noise keeping 90%\n"
            "  hcrfast bound net.py:Net x.pt --metric cosine --min-utility 0.95\n"
            "                                                                # embeddings: keep their direction"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="file.py:NAME or package.module:NAME")
    p.add_argument("inputs", metavar="INPUTS",
                   help="a .pt (a tensor, or a dict of them with --key), .npy or .npz file of the inputs, "
                        "shape (B, ...) as the model takes them (normalized as it expects)")
    p.add_argument("--key", default=None, help="the entry of a .npz file or of a .pt dict that holds the inputs "
                                               "(default: its only one)")
    p.add_argument("--weights", default=None, metavar="PATH",
                   help="a state dict (torch.save(model.state_dict(), PATH)) loaded into the model, strictly")
    p.add_argument("--examples", type=int, default=None, metavar="N",
                   help="the first N inputs only (default: all of them)")
    noise = p.add_mutually_exclusive_group()
    noise.add_argument("--sigma", type=float_literal, default=None, help="the dithering's std, in the features' units")
    noise.add_argument("--sigma-scale", type=float_literal, default=None, metavar="K",
                       help="sigma = K x the RMS of the clean features over the inputs (default when no sigma "
                            "is given: K = 1, as published)")
    noise.add_argument("--sigma-file", default=None, metavar="PATH",
                       help="a .npy of one std per feature (the features' shape, or flat)")
    b = p.add_argument_group("hcrfast.bound's arguments (defaults: its own, the published ones)")
    b.add_argument("--size", type=float_literal, default=1 / 200, metavar="S", help="start-vector size s (default 1/200)")
    b.add_argument("--iterations", type=int, default=10, metavar="I", help="LSQR solves per restart (default 10)")
    b.add_argument("--restarts", type=int, default=25, metavar="R",
                   help="start vectors per example; the bound is the max over them (default 25). With the dense "
                        "solve (small inputs) more cost forward passes only: R = 100 raised the median 0.5%% over 25 "
                        "on an MNIST MLP for 2.1x the time with the default singular steps, which lift most of what "
                        "restarts did (21%% for 1.5x without them)")
    b.add_argument("--seed", type=int, default=0, help="example e draws from default_rng([seed, e]) (default 0)")
    b.add_argument("--basis", choices=("dct", "pixel"), default="dct",
                   help="the modes bounded: 2-D DCT-II over the last two axes per channel (default), or the inputs "
                        "themselves")
    b.add_argument("--linearize-at", choices=("input", "current"), default="input",
                   help="J at the input (the paper, default) or at the current point (the published scripts)")
    b.add_argument("--solver", choices=("auto", "lsqr", "dense", "krylov"), default="auto",
                   help="how each step is solved (default auto: dense for small inputs on the CPU, krylov on CUDA "
                        "and for large inputs, LSQR with --linearize-at current, which dense and krylov do not "
                        "take); see hcrfast.bound")
    b.add_argument("--targets", default=None, metavar="SPEC",
                   help="'all' or 'low:K': also aim one certified step at each of these DCT modes")
    b.add_argument("--null-probes", action="store_true",
                   help="with --targets and the dense solve: also certify steps along each target mode's component "
                        "in J's local null space (null_probes=True), where the features move only at second order or "
                        "by rounding: huge bounds, or +inf where the model ignores the step")
    b.add_argument("--singular-steps", type=steps_arg, default="auto", metavar="K",
                   help="also certify a step along each of J's K smallest singular directions (from the dense or "
                        "Krylov solve's own factorization: no model product; each direction is certified with both "
                        "signs, two forward passes); each bounds every mode it moves (default auto: 64 with the "
                        "dense or Krylov solve, none with LSQR; 0: none, Algorithm 1 alone)")
    b.add_argument("--krylov-pilots", type=pilots_arg, default="auto", metavar="S",
                   help="with the Krylov solver: restarts 0..S-1 each build their own Krylov basis and restart r "
                        "uses pilot r mod S's (S times the products and memory; hcrfast.bound's krylov_pilots). "
                        "Default 'auto': 1 where one basis exhausts the space (min(features, inputs) <= 4096), "
                        "else one per restart (at most 100, and 2^30 basis values an example)")
    b.add_argument("--jacobian", choices=("reverse", "forward", "auto"), default="reverse",
                   help="J v by a double backward (reverse, default) or torch.func.jvp (forward: for models that "
                        "refuse a double backward, torch.compile'd ones); 'auto' (hcrfast.targeted_bound's default) is "
                        "reverse, as in hcrfast.bound")
    b.add_argument("--cold-start", action="store_true", help="every LSQR solve from zero (warm_start=False)")
    b.add_argument("--last-iterate", action="store_true",
                   help="bound by Algorithm 1's last iterate alone, as the paper (iterates='last'; default: every "
                        "iterate, each certified, the largest bound per mode)")
    b.add_argument("--tf32", action="store_true", help="let float32 GPU matmuls and convolutions use TF32: faster, still certified, but "
                   "the solver sees a noisier J (a ResNet-18's median bound fell 6.7%% in a CPU emulation)")
    b.add_argument("--chunk-size", type=int, default=None, metavar="K",
                   help="examples per chunk, each written to OUT/chunks/ when done (default: sized from memory)")
    c = p.add_argument_group("the noise to release: the smallest sigma whose bounds reach a target "
                             "(hcrfast.sigma_for)")
    c.add_argument("--target-std", type=float_literal, default=None, metavar="TAU",
                   help="search sigma (as a multiple of --sigma, --sigma-scale's or --sigma-file's, which give the "
                        "start and the unit) until the bounds' --quantile reaches TAU, in the inputs' units; each "
                        "try is one certified bound of all the inputs, and the bounds written are those at the "
                        "sigma found (resumable from OUT/calibration/)")
    c.add_argument("--quantile", type=float_literal, default=None, metavar="Q",
                   help="with --target-std: the share of bounds allowed under TAU (default 0.5, the median; 0.05: "
                        "95%% of them must reach it)")
    c.add_argument("--statistic", choices=("std", "rmse"), default=None,
                   help="with --target-std: over every per-mode bound (std, default) or over each input's RMSE "
                        "bound (rmse: the root of the mean of its modes' bounds squared)")
    c.add_argument("--target-modes", default=None, metavar="SPEC",
                   help="with --target-std: only these modes count ('low:K', 'all')")
    c.add_argument("--rtol", type=float_literal, default=None,
                   help="with --target-std: stop once the statistic lies within TAU x (1 + RTOL) (default 0.05)")
    c.add_argument("--max-calls", type=int, default=None, metavar="N",
                   help="with --target-std: at most N bound calls (default 8)")
    c.add_argument("--reuse-gib", type=float_literal, default=None, metavar="G",
                   help="with --target-std or --sweep: keep up to G GiB of J's factors or Krylov bases from the "
                        "first call for the later ones, which then compute only their solves (default: half the "
                        "memory available on the CPU, at least 1; 1 on a GPU, where they stay in device memory; 0: "
                        "every call builds its own)")
    w = p.add_argument_group("several noise levels: the bounds against sigma (hcrfast.sweep_sigma)")
    w.add_argument("--sweep", default=None, metavar="K1,K2,...",
                   help="bound the inputs at each sigma = K x --sigma (or --sigma-scale's, --sigma-file's), in the "
                        "order given: one full certified bound per K, sharing J's factors (--reuse-gib). Writes "
                        "OUT/sweep/scale_K/bounds.npz for each K instead of OUT/bounds.npz, their numbers in "
                        "summary.json's 'sweep' and the curve of the bounds against sigma in the report "
                        "(resumable from OUT/sweep_chunks/)")
    u = p.add_argument_group("utility: what the noise costs (hcrfast.dithered_accuracy)")
    u.add_argument("--head", default=None, metavar="HEAD",
                   help="file.py:NAME or package.module:NAME, as MODEL: what reads the released features, as MODEL "
                        "returns them; its outputs on the clean and on the dithered features are scored by --metric "
                        "at the sigma bounded (at each, with --sweep). For accuracy, a classifier giving class "
                        "scores (B, C) (torch.nn:Identity where the features are the scores); for --metric cosine "
                        "or a function, optional (default: the features themselves)")
    u.add_argument("--head-weights", default=None, metavar="PATH", help="a state dict loaded into HEAD, strictly")
    u.add_argument("--labels", default=None, metavar="PATH",
                   help="a .pt, .npy or .npz file of the inputs' integer classes, shape (B,) (--labels-key: its "
                        "entry); for a --metric function, its targets: any numbers, one row per input")
    u.add_argument("--labels-key", default=None, metavar="KEY",
                   help="the entry of a .npz file or .pt dict that holds the labels (default: its only one)")
    u.add_argument("--metric", default=None, metavar="METRIC",
                   help="how HEAD's outputs on the dithered features are scored, higher is better: accuracy (the "
                        "default: argmax against --labels), topK (top5: the label among the 5 best classes), "
                        "cosine (each noisy output against the clean one, no labels: for embeddings, with or "
                        "without --head), or file.py:NAME / package.module:NAME, a function (outputs, targets) -> "
                        "one score per noisy copy, shape (N,) (targets: the --labels rows of the copies, or None)")
    u.add_argument("--utility-draws", type=int, default=None, metavar="D",
                   help="noisy copies of each input's features scored (default 10)")
    u.add_argument("--min-accuracy", "--min-utility", dest="min_accuracy", type=float_literal, default=None, metavar="A",
                   action=_NamedFlag,
                   help="bound at the largest sigma (a multiple of --sigma, --sigma-scale's or --sigma-file's) at "
                        "which the dithered --metric (accuracy by default) stays >= A (hcrfast.sigma_for_accuracy: "
                        "the head only, no bound, per sigma tried): the most confidentiality this utility allows")
    a = p.add_argument_group("calibration: a real attacker beside the bounds")
    a.add_argument("--attack", type=int, default=None, metavar="DRAWS",
                   help="also reconstruct every input from DRAWS noisy copies of its features (hcrfast."
                        "gauss_newton_attack) and compare its error with the bounds: OUT/attack.npz, summary.json's "
                        "'attack' (resumable from OUT/attack_chunks; under torchrun rank 0 runs it)")
    a.add_argument("--attack-steps", type=int, default=None, metavar="S",
                   help="Gauss-Newton steps per draw (default 10)")
    a.add_argument("--attack-start", choices=("truth", "mean"), default=None,
                   help="where the attacker starts: the input itself (default; the local bound's setting) or the "
                        "inputs' mean")
    p.add_argument("--out", default="runs/bound", metavar="DIR", help="the results' folder (default runs/bound)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model, inputs and solver run (default cpu)")
    p.add_argument("--double", action="store_true",
                   help="run the model and inputs in float64 (default: float32, or float64 where the weights are, "
                        "the module's own or a float64 --weights file's; a float16 or bfloat16 module runs as a "
                        "float32 copy, with a warning; a float16 or bfloat16 --weights file loads exactly into a "
                        "float32 module's tensors, without one)")
    p.add_argument("--threads", type=int, default=None, metavar="T",
                   help="torch's CPU threads (and the host LAPACK threads of the dense and Krylov solves)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--no-report", action="store_true",
                   help="no OUT/report.html and figures (a histogram of the bounds, the median per DCT mode, "
                        "bound images)")
    p.set_defaults(func=_run)


# ---------------------------------------------------------------------------
# The model, the inputs, the noise
# ---------------------------------------------------------------------------


class _NamedFlag(argparse.Action):
    """Stores the value and which of the flag's names was typed (``args.<dest>_flag``), for the messages."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, self.dest + "_flag", option_string)


def _flag(args, dest: str, default: str) -> str:
    return getattr(args, dest + "_flag", None) or default


def load_model(spec: str, what: str = "MODEL"):
    """The ``torch.nn.Module`` that ``spec`` ('file.py:NAME' or 'package.module:NAME') names or makes
    (``what``: the argument that named it, for the errors)."""
    import torch

    obj, name = _load_object(spec, what, "a torch.nn.Module, or a class or function that makes one")
    if not isinstance(obj, torch.nn.Module):
        if not callable(obj):
            raise ValueError(f"{what} {spec!r}: {name} is a {type(obj).__name__}, not a torch.nn.Module nor a "
                             f"class or function that makes one")
        try:
            made = obj()
        except TypeError as exc:
            raise ValueError(f"{what} {spec!r}: calling {name}() failed ({exc}); name a torch.nn.Module, or a "
                             f"function that makes one without arguments") from exc
        if not isinstance(made, torch.nn.Module):
            raise ValueError(f"{what} {spec!r}: {name}() returned a {type(made).__name__}, not a torch.nn.Module")
        obj = made
    return obj


def load_function(spec: str, what: str = "--metric"):
    """The function that ``spec`` ('file.py:NAME' or 'package.module:NAME') names, not called."""
    obj, name = _load_object(spec, what, "a function (outputs, targets) -> one score per noisy copy")
    if isinstance(obj, type) or not callable(obj):
        raise ValueError(f"{what} {spec!r}: {name} is a {'class' if isinstance(obj, type) else type(obj).__name__}, "
                         f"not a function (outputs, targets) -> one score per noisy copy")

    def named(outputs, targets):  # called by the NAME the user gave (a lambda's own name is "<lambda>")
        return obj(outputs, targets)

    named.__name__ = named.__qualname__ = name.rsplit(".", 1)[-1]
    return named


#: The folders of the Python files this command ran (MODEL, --head, --metric) that were not on ``sys.path``
#: before: first on it while the file runs (as Python runs a script), then last on it for the command's time,
#: so that the files' imports of their neighbours work where they are made, at the top, in a class's
#: ``__init__`` or in ``forward``, while a neighbour named like a module of the standard library or of a
#: package (``profile.py``, ``html.py``) does not shadow it for hcrfast's and torch's own later imports.
#: Before 2026-12-02 each folder left ``sys.path`` once its file had run, before the model was made.
_FILE_FOLDERS: list[str] = []
#: Per folder, the neighbour modules its file imported (name -> module): a later file's neighbour of the
#: same name (a model's ``utils.py`` and its head's) is imported, at the file's top level, from that file's
#: folder, not taken from ``sys.modules`` (the first file's), and the first file's is put back after. (A
#: neighbour imported later, in ``__init__`` or ``forward``, is the one ``sys.modules`` holds then: the first
#: file's, where two files' neighbours share a name.)
_NEIGHBOURS: dict[str, dict[str, object]] = {}


def forget_model_files() -> None:
    """The command's end (:func:`hcrfast.cli.main`; it may run in-process, in tests and notebooks): the model
    files' folders leave ``sys.path`` and their neighbour modules ``sys.modules`` (those imported since the
    first file ran, as it ran or later: in ``__init__``, in ``forward``), so that the next command's files
    import their own."""
    global _MODULES_BEFORE
    for folder in _FILE_FOLDERS:
        for i in range(len(sys.path) - 1, -1, -1):   # the entry this command appended, the last (only that one)
            if sys.path[i] == folder:
                del sys.path[i]
                break
    for name, module in list(sys.modules.items()):
        if name not in _MODULES_BEFORE and any(_neighbour(name, module, folder) for folder in _FILE_FOLDERS):
            del sys.modules[name]
    _FILE_FOLDERS.clear()
    _NEIGHBOURS.clear()
    _MODULES_BEFORE = frozenset()


#: ``sys.modules``' names when the command's first model file ran: none of them is forgotten
_MODULES_BEFORE: frozenset = frozenset()


def _neighbour(name: str, module, folder: str) -> bool:
    """Whether ``module`` (``sys.modules[name]``) is a neighbour of a model file in ``folder``: a module or
    package found there by its top-level name (``helper`` from folder/helper.py, ``pkg.sub`` from
    folder/pkg/sub.py), not one of a deeper folder (a virtual environment's, .venv/...) nor hcrfast's own."""
    file = getattr(module, "__file__", None)
    top = name.partition(".")[0]
    if not isinstance(file, str) or top == "hcrfast" or name.startswith("_hcrfast_model_"):
        return False
    try:
        relative = os.path.relpath(os.path.realpath(file), folder)
    except ValueError:   # other drives (Windows)
        return False
    first = relative.split(os.sep)[0]
    return not first.startswith("..") and (first == top or os.path.splitext(first)[0] == top)


def _run_file(path: Path, module) -> None:
    """Run the model file ``path`` as ``module`` with its folder first on ``sys.path`` (then last, for the
    command, where it was not there before: :data:`_FILE_FOLDERS`) and the neighbours that earlier files
    imported hidden meanwhile (:data:`_NEIGHBOURS`)."""
    global _MODULES_BEFORE
    folder = os.path.realpath(path.parent)
    hidden = {name: sys.modules.pop(name) for other, modules in _NEIGHBOURS.items() if other != folder
              for name, m in list(modules.items()) if sys.modules.get(name) is m}
    before = set(sys.modules)
    if not _NEIGHBOURS:
        _MODULES_BEFORE = frozenset(before)
    kept = folder in sys.path or folder in _FILE_FOLDERS   # the user's own entry, or this command's already
    sys.path.insert(0, folder)
    try:
        module.__spec__.loader.exec_module(module)
    finally:
        if folder in sys.path:
            sys.path.remove(folder)   # the first entry: the one inserted above (or the file's own, alike)
        if not kept:
            sys.path.append(folder)
            _FILE_FOLDERS.append(folder)
        own = _NEIGHBOURS.setdefault(folder, {})
        for name in set(sys.modules) - before:
            if _neighbour(name, sys.modules[name], folder):
                own[name] = sys.modules[name]
        sys.modules.update(hidden)   # the earlier files' neighbours, under their names again


def _load_object(spec: str, what: str, wanted: str):
    """The object ``spec`` names (the file run, or the module imported), and its NAME."""
    import torch

    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"{what} {spec!r}: pass 'path/to/file.py:NAME' or 'package.module:NAME' (NAME: {wanted})")
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where).expanduser()   # (--head=~/h.py:Head: the shell leaves ~ after =)
        if not path.is_file():
            raise FileNotFoundError(f"{what} {spec!r}: no Python file at {path.resolve()}")
        module_name = "_hcrfast_model_" + hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:12]
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look their module up by name
        try:
            _run_file(path, module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
    else:
        # The working directory first, as `python -m hcrfast.cli` (torchrun -m) has it: the console script
        # finds the same packages
        cwd = os.getcwd()
        added = cwd not in sys.path and "" not in sys.path
        if added:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            if exc.name and (where == exc.name or where.startswith(exc.name + ".")):  # not one it imports
                raise ValueError(f"{what} {spec!r}: no module {exc.name!r} in the working directory or on the path "
                                 f"(pass a file as path/to/file.py:{name}, or install the package)") from None
            raise
        finally:
            if added:
                sys.path.remove(cwd)
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            found = sorted(k for k, v in vars(module).items()
                           if not k.startswith("_") and (isinstance(v, torch.nn.Module) or callable(v)))
            raise ValueError(f"{what} {spec!r}: {where} has no {name!r}; it has "
                             f"{', '.join(found[:10]) or 'no module, class or function'}")
        obj = getattr(obj, part)
    return obj, name


def load_inputs(path, key=None):
    """The inputs tensor of a .pt / .npy / .npz file (``key``: its entry, where it holds several)."""
    import torch

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _INPUT_SUFFIXES:
        raise ValueError(f"INPUTS {path}: pass a {', '.join(_INPUT_SUFFIXES)} file (got {suffix or 'no suffix'})")
    if not path.is_file():
        raise FileNotFoundError(f"INPUTS {path}: no such file ({path.resolve()})")
    if suffix == ".npy":
        if key is not None:
            raise ValueError(f"--key {key!r}: {path} is a .npy file, which holds one array; drop --key")
        try:
            value = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"INPUTS {path}: not a .npy of numbers ({exc})") from exc
    elif suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                entries = {k: z[k] for k in z.files}
        except (ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise ValueError(f"INPUTS {path}: not a readable .npz ({exc})") from exc
        value = _entry(path, entries, key)
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable or pickled-object file, named
            raise ValueError(f"INPUTS {path}: not a torch.save file of tensors ({str(exc).splitlines()[0][:200]}); "
                             f"save the inputs with torch.save(tensor, path)") from exc
        if isinstance(obj, dict):
            value = _entry(path, obj, key)
        elif key is not None:
            raise ValueError(f"--key {key!r}: {path} holds a {type(obj).__name__}, not a dict; drop --key")
        else:
            value = obj
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"INPUTS {path}: holds a {type(value).__name__}, not a tensor or array")
    if not (value.is_floating_point() and value.dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                          torch.float64)):
        raise ValueError(f"INPUTS {path}: the inputs are {value.dtype}; bounds are on real-valued inputs: convert "
                         f"them as your model expects them (for images of 0..255, x.float() / 255 and its "
                         f"normalization) and save that")
    if value.dim() < 2:
        raise ValueError(f"INPUTS {path}: shape {tuple(value.shape)}; pass a batch (B, ...) with one input per row")
    if value.shape[0] == 0 or value[0].numel() == 0:
        raise ValueError(f"INPUTS {path}: shape {tuple(value.shape)} holds no inputs (or inputs of no values); pass a "
                         f"batch (B, ...) with B >= 1 inputs, one per row")
    return value


def load_labels(path, key=None, integer: bool = True) -> np.ndarray:
    """The integer classes of a .pt / .npy / .npz file (``key``: its entry), shape (B,); with
    ``integer=False``, any numbers with one row per input (a metric function's targets)."""
    import torch

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _INPUT_SUFFIXES:
        raise ValueError(f"--labels {path}: pass a {', '.join(_INPUT_SUFFIXES)} file (got {suffix or 'no suffix'})")
    if not path.is_file():
        raise FileNotFoundError(f"--labels {path}: no such file ({path.resolve()})")
    try:
        if suffix == ".npy":
            value = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                value = _entry(path, {k: z[k] for k in z.files}, key, "--labels-key", "labels")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
            value = _entry(path, obj, key, "--labels-key", "labels") if isinstance(obj, dict) else obj
    except (ValueError, zipfile.BadZipFile, EOFError, RuntimeError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or str(exc).startswith("--labels"):
            raise
        raise ValueError(f"--labels {path}: not a readable file of integer classes ({str(exc).splitlines()[0][:200]})"
                         ) from exc
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    value = np.asarray(value)
    if not integer:
        if value.dtype.kind not in "biuf" or value.ndim < 1:
            raise ValueError(f"--labels {path}: holds {value.dtype} values of shape {value.shape}; pass the metric's "
                             f"targets as numbers, one row per input")
        return value
    if value.dtype.kind not in "iu":
        raise ValueError(f"--labels {path}: holds {value.dtype} values; pass integer classes, one per input")
    if value.ndim != 1:
        raise ValueError(f"--labels {path}: shape {value.shape}; pass one class per input, shape (B,)")
    return value


def load_sigma_file(path) -> np.ndarray:
    """``--sigma-file``: a .npy of one std per feature, float64, finite and positive (its size against the
    features is checked by the bound, which knows them)."""
    path = Path(path)
    if path.suffix.lower() != ".npy":
        raise ValueError(f"--sigma-file {path}: pass a .npy file (np.save(PATH, stds)), got "
                         f"{path.suffix or 'no suffix'}")
    if not path.is_file():
        raise FileNotFoundError(f"--sigma-file {path}: no such file ({path.resolve()})")
    try:
        value = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        raise ValueError(f"--sigma-file {path}: not a readable .npy of numbers ({str(exc).splitlines()[0][:200]}); "
                         f"write it with np.save(PATH, stds)") from exc
    if value.dtype.kind not in "iuf" or value.size == 0:
        raise ValueError(f"--sigma-file {path}: holds {value.size} {value.dtype} values; pass one positive std per "
                         f"feature, as numbers")
    value = value.astype(np.float64)
    if not (np.all(np.isfinite(value)) and np.all(value > 0)):
        raise ValueError(f"--sigma-file {path}: {int(np.sum(~(np.isfinite(value) & (value > 0))))} of its "
                         f"{value.size} stds are not positive finite numbers; every feature needs noise (std > 0)")
    return value


def _entry(path, entries: dict, key, flag: str = "--key", what: str = "inputs"):
    if key is None:
        if len(entries) != 1:
            names = ", ".join(map(str, list(entries)[:10]))
            raise ValueError(f"{'INPUTS' if flag == '--key' else '--labels'} {path}: holds {len(entries)} entries "
                             f"({names}); name the {what} with {flag}")
        (key,) = entries
    if key not in entries:
        raise ValueError(f"{flag} {key!r}: {path} has no such entry; it has {', '.join(map(str, list(entries)[:10]))}")
    return entries[key]


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def _load_weights(model, path, flag: str, spec: str) -> dict | None:
    """Load the state dict at ``path`` into ``model``, strictly; its path and SHA-256 (None without one)."""
    if path is None:
        return None
    import torch

    from hcrfast import reproduce, zoo

    if not Path(path).exists():
        also = (" ('default', torchvision's pretrained weights, exists only for `hcrfast reproduce resnet18` and "
                "`swin_t`)" if str(path) == "default" else "")
        raise FileNotFoundError(f"{flag} {path}: no such file{also}; pass the path of a state dict of {spec}, saved "
                                f"with torch.save(model.state_dict(), PATH)")
    state = zoo._read_state_dict(Path(path))
    expected, given = set(model.state_dict()), set(state)
    missing, unexpected = expected - given, given - expected
    if missing or unexpected:  # (torch's own message puts them after its first line)
        parts = ([f"missing keys ({len(missing)}): {zoo._few(missing)}"] if missing else []) + (
            [f"unexpected keys ({len(unexpected)}): {zoo._few(unexpected)}"] if unexpected else [])
        raise ValueError(f"{flag} {path}: does not fit {spec}: {'; '.join(parts)}; pass a state dict of that model "
                         f"(torch.save(model.state_dict(), PATH))")
    stored = {t.dtype for t in state.values() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    own = {t.dtype for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()}
    if stored == {torch.float64} and own and own != {torch.float64}:
        # "float64 where the weights are" (--double's help): the file's weights, which load_state_dict would
        # round into the module's float32 tensors without a word
        model.double()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # size mismatches; torch lists them one per line after a title
        details = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        raise ValueError(f"{flag} {path}: does not fit {spec}: " + " ".join(details[:3])
                         + (f" ... ({len(details) - 3} more)" if len(details) > 3 else "")) from exc
    return {"path": str(path), "sha256": reproduce._sha256_file(Path(path))}


#: What each kind of run keeps in OUT, for the kinds of `hcrfast bound` and of `hcrfast reproduce` (which
#: share --out's meaning, so that neither takes the other's folder): the files that tell it is there (only it
#: writes them: bound's checkpoint key chunks/key.json, reproduce's run.json), the files it keeps (its chunks,
#: its results: named in the refusal), and what it is.
_OUT_KINDS = {"bound": (("chunks/key.json",), ("chunks", "bounds.npz"), "a plain bound run"),
              "search": (("calibration",), ("calibration", "bounds.npz"), "a --target-std search"),
              "sweep": (("sweep_chunks", "sweep"), ("sweep_chunks", "sweep"), "a --sweep"),
              "reproduce": (("run.json",), ("run.json", "chunks", "bounds.npz"), "a `hcrfast reproduce` run"),
              "reproduce_sweep": (("sweep.json",), ("sweep.json",), "a `hcrfast reproduce --sweep`")}


def _check_out_kind(out: Path, kind: str) -> None:
    """Refuse an OUT that holds another kind of run (a plain run, a --target-std search, a --sweep, a
    `hcrfast reproduce` run or sweep): each resumes from its own chunks, so another kind would run beside
    them and leave its results next to the other's (bounds.npz of one, summary.json and the report of the
    other)."""
    own = set(_OUT_KINDS[kind][1])
    for other, (signs, names, what) in _OUT_KINDS.items():
        if other == kind or not any((out / n).exists() for n in signs):
            continue
        found = ([n for n in names if n not in own and (out / n).exists()]
                 or [n for n in names if (out / n).exists()])   # (its names are all this kind's too)
        raise ValueError(f"--out {out}: holds {what} ({', '.join(f'{n}' for n in found)}), and this command is "
                         f"{_OUT_KINDS[kind][2]}, which would leave its results beside those; pass another --out, "
                         f"or delete {out} to start anew")


#: The list, in OUT, of the files the last hcrfast command (bound, reproduce) wrote there: a rerun removes or
#: replaces those alone, never a file of the user's that has one of their names (an --out of `.`).
OUTPUTS_LIST = ".hcrfast-outputs.json"


def _listed_outputs(out: Path) -> set | None:
    """The files OUTPUTS_LIST names, None where OUT has none (a fresh OUT, or one of an hcrfast from before
    the list, or a list damaged from outside: its own signs say then)."""
    try:
        listed = json.loads((out / OUTPUTS_LIST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return {str(n) for n in listed} if isinstance(listed, list) else None


def outputs_of_earlier(out: Path, known: tuple, signs: tuple, title: str | None = None) -> set:
    """The files in OUT that an earlier hcrfast command wrote: those OUTPUTS_LIST names; in an OUT of an hcrfast
    from before the list, ``known`` (names, or glob patterns) where one of ``signs`` (names or patterns) is
    there (a checkpoint only hcrfast writes: chunks/key.json, run.json), and the report files where
    report.html's title is ``title`` (a page only hcrfast writes)."""
    listed = _listed_outputs(out)
    if listed is not None:
        return listed
    if not out.is_dir():
        return set()
    found = {str(p.relative_to(out)) for n in known for p in out.glob(n) if p.is_file()}
    if any(_hcrfast_wrote(p) for s in signs for p in out.glob(s)):
        return found
    page = out / "report.html"
    if title is not None and page.is_file() and f"<title>{title}" in page.read_text(errors="replace"):
        return {n for n in found if n == "report.html" or n.endswith(".png")}
    return set()


def _hcrfast_wrote(path: Path) -> bool:
    """Whether ``path``, a sign of an earlier run (a checkpoint's key.json, reproduce's run.json, or a folder
    of checkpoints), is hcrfast's own: its JSON names an hcrfast format. The name alone is not enough: a
    user's run.json, or a folder of theirs named calibration, would have made their files in OUT hcrfast's."""
    if path.is_dir():   # (calibration/, sweep_chunks/: a checkpoint per sigma inside)
        return any(_hcrfast_wrote(key) for key in itertools.islice(path.glob("*/key.json"), 64))
    try:
        held = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return False
    if not isinstance(held, dict):
        return False
    if path.name == "run.json":   # hcrfast reproduce's: {"key": {"format": N, "experiment": ...}, ...}
        key = held.get("key")
        return isinstance(key, dict) and isinstance(key.get("format"), int) and "experiment" in key
    fmt = held.get("format")
    return isinstance(fmt, str) and fmt.startswith("hcrfast.") and " checkpoint/" in fmt


def check_outputs(out: Path, planned, known: tuple, signs: tuple, title: str | None = None,
                  rank: int = 0) -> set:
    """Refuse, before anything is computed, an OUT that holds a file at one of the names this command writes
    (``planned``) that no earlier hcrfast command wrote there: it is the user's, and would be written over.
    Returns what earlier commands wrote (removed or replaced by this one's results). Rank 0 writes the list in
    an OUT that had none, so that a run failing after its first checkpoint file leaves the user's files the
    user's (an OUT of an hcrfast from before keeps the files its signs make hcrfast's)."""
    earlier = outputs_of_earlier(out, known, signs, title)
    theirs = sorted(n for n in planned if (out / n).exists() and n not in earlier)
    if theirs:
        raise ValueError(f"--out {out}: holds {', '.join(theirs)}, which this command writes and which no hcrfast "
                         f"command wrote there; pass another --out, or move {'them' if len(theirs) > 1 else 'it'}")
    if rank == 0 and out.is_dir() and _listed_outputs(out) is None:
        write_outputs(out, earlier)
    return earlier


def write_outputs(out: Path, files) -> None:
    """OUTPUTS_LIST: ``files`` (paths relative to OUT), written atomically. Before the results are written it
    names the earlier command's and this one's (a crash between leaves no file of ours unlisted), after them
    this command's alone."""
    from hcrfast.checkpoint import atomic_write_text

    atomic_write_text(out / OUTPUTS_LIST, json.dumps({"writer": "hcrfast", "files": sorted(set(files))}, indent=1)
                      + "\n")


def replace_outputs(out: Path, earlier, written) -> None:
    """After this command's results: remove what the earlier command wrote and this one did not (an attack no
    longer asked for, the report with --no-report), and list this command's files alone."""
    for name in sorted(set(earlier) - set(written)):
        if (out / name).is_file():
            (out / name).unlink()
            if (out / name).parent != out:   # (a sweep's scale_K/ that held nothing else: gone with its files)
                try:
                    (out / name).parent.rmdir()
                except OSError:
                    pass
    write_outputs(out, written)


def _default_sigma_hint(exc: Exception, noise: dict, *, sweep: bool = False) -> Exception:
    """``exc`` (a checkpoint refusal, worded for the shell) with a note where its folder's sigma differs from the
    one this run took as the features' RMS (``noise``: no --sigma or --sigma-file given): that RMS comes from a
    float32 forward, whose last bits follow torch's thread count and the machine, so the same command run with
    another --threads, or elsewhere, was refused as another sigma with no word of why."""
    if "rms" not in noise or "searched_from" in noise:   # (a sigma an accuracy search found is no default RMS)
        return exc
    found = re.search(r"noise: 'Gaussian\(sigma=([^)']+)\)' -> 'Gaussian\(sigma=", str(exc))
    if found is None:
        return exc
    # (a sweep's or a search's folder holds K x the unit, and --sigma sets the unit: the folder's sigma is no --sigma
    # to pass)
    own = "" if sweep else f", or --sigma {found.group(1)}, the folder's own"
    exc.add_note(f"hcrfast bound: sigma was left at its default, {noise['sigma_scale']:g} x the features' RMS, "
                 f"computed by a forward whose last bits follow the thread count and the machine; to resume, pass "
                 f"the first run's --threads (the one in its summary.json's command){own}")
    return exc


def shell_fix(exc: Exception, out: Path, parents: tuple = ("",)) -> Exception:
    """A checkpoint refusal of one sigma of a command-line sweep, worded for the shell: the checkpoint
    (hcrfast.checkpoint, hcrfast.reproduce) tells a Python caller to pass another checkpoint folder or to
    delete the one sigma's folder (OUT/sweep_chunks/scale_K), but the command makes every sigma's folder
    from --out, and a changed command is refused at every sigma, so deleting one folder only moves the
    refusal to the next: the fix is another --out, or deleting OUT. Same class, same notes."""
    import re

    text = str(exc)
    for parent in parents:
        folder = out / parent if parent else out
        text = re.sub("delete " + re.escape(str(folder)) + re.escape(os.sep) + r"scale_[^\s,;)]+",
                      lambda m: f"delete {out}", text)
    text = (text.replace("Make the same call (same model, batch, sigma and arguments) to resume it",
                         "Make the same command to resume it")
            .replace("another checkpoint folder", "another --out"))
    fixed = type(exc)(text)
    for note in getattr(exc, "__notes__", None) or ():
        fixed.add_note(note)
    return fixed


def expand_user(args, *dests) -> None:
    """``~`` in these path options of ``args``: the shell expands it at a word's start only, so that
    ``--out=~/runs`` would otherwise make a folder named ``~`` in the working directory."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None:
            setattr(args, dest, os.path.expanduser(os.fspath(value)))


def _positive(name, value):
    if value is not None and not value > 0:  # argparse has made it an int
        raise ValueError(f"{name} {value!r}: pass a positive integer")


def sweep_scales(text: str) -> list[float]:
    """The scales of ``--sweep`` ('0.5,1,2'): positive, finite, each once, in the order given."""
    fix = "pass comma-separated positive numbers, the sigmas in units of the one given (e.g. 0.5,1,2,4)"
    try:
        scales = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--sweep {text!r}: {fix}") from None
    bad = [k for k in scales if not (np.isfinite(k) and k > 0)]
    if bad:
        raise ValueError(f"--sweep {text!r}: {bad[0]!r} is not a positive finite number; {fix}")
    twice = sorted({k for k in scales if scales.count(k) > 1})
    if twice:
        raise ValueError(f"--sweep {text!r}: {twice[0]:g} is given {scales.count(twice[0])} times; name each sigma "
                         f"once")
    return scales


def utility_metric(args: argparse.Namespace):
    """The metric --head, --labels and --metric ask for (a name, or the function --metric names), checked
    before anything runs; None where no utility is asked for."""
    from hcrfast.utility import _Metric

    if args.head is None and args.labels is None and args.metric is None:
        given = [f for f, v in (("--head-weights", args.head_weights), ("--labels-key", args.labels_key),
                                ("--utility-draws", args.utility_draws),
                                (_flag(args, "min_accuracy", "--min-accuracy"), args.min_accuracy))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set how --head and --labels (or --metric) measure the utility; pass "
                             f"them, or drop {'them' if len(given) > 1 else 'it'}")
        return None
    if args.metric is not None and ":" in args.metric:
        metric = load_function(args.metric)
    else:
        metric = "accuracy" if args.metric is None else args.metric
        try:
            _Metric.of(metric)
        except ValueError:
            raise ValueError(f"--metric {metric!r}: pass accuracy, topK (top5: the label among the 5 best classes), "
                             f"cosine, or file.py:NAME / package.module:NAME naming a function (outputs, targets) -> "
                             f"one score per noisy copy") from None
    score = _Metric.of(metric)
    if score.counts and (args.head is None or args.labels is None):
        if args.head is None and args.labels is None:
            raise ValueError(f"--metric {metric}: it scores a classifier's classes against the inputs' labels; pass "
                             f"--head and --labels")
        raise ValueError(f"{'--head' if args.labels is None else '--labels'} without "
                         f"{'--labels' if args.labels is None else '--head'}: the accuracy of the noise needs both, a "
                         f"classifier of the features and the inputs' classes; pass both (or --metric cosine, which "
                         f"needs no labels)")
    if metric == "cosine" and args.labels is not None:
        raise ValueError("--labels with --metric cosine, which compares each noisy output with the clean one: drop "
                         "--labels")
    for flag, value, needs in (("--head-weights", args.head_weights, args.head),
                               ("--labels-key", args.labels_key, args.labels)):
        if value is not None and needs is None:
            raise ValueError(f"{flag} without {flag.rsplit('-', 1)[0]}: pass {flag.rsplit('-', 1)[0]}, or drop {flag}")
    if args.min_accuracy is not None:
        score.check_target(args.min_accuracy, _flag(args, "min_accuracy", "--min-accuracy") + " ")
    return metric


def _run(args: argparse.Namespace) -> int:
    import torch

    from hcrfast import _repro_cli, algorithm, reproduce, validation
    from hcrfast.calibrate import scale_folder
    from hcrfast.checkpoint import CheckpointMismatchError, atomic_write_text
    from hcrfast.results import json_default

    t_start = time.perf_counter()
    expand_user(args, "out", "inputs", "weights", "sigma_file", "labels", "head_weights")
    for flag, value in (("--examples", args.examples), ("--iterations", args.iterations),
                        ("--restarts", args.restarts), ("--chunk-size", args.chunk_size), ("--threads", args.threads),
                        ("--attack", args.attack), ("--attack-steps", args.attack_steps),
                        ("--utility-draws", args.utility_draws)):
        _positive(flag, value)
    for flag, value in (("--sigma", args.sigma), ("--sigma-scale", args.sigma_scale), ("--size", args.size)):
        if value is not None and not (np.isfinite(value) and value > 0):
            raise ValueError(f"{flag} {as_typed(value)}: pass a positive finite number")
    _repro_cli.check_targets_flag(args.targets)
    if args.attack is None:
        given = [f for f, v in (("--attack-steps", args.attack_steps), ("--attack-start", args.attack_start))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} how --attack reconstructs the "
                             f"inputs; pass --attack DRAWS, or drop {'them' if len(given) > 1 else 'it'}")
    else:  # their defaults, recorded in summary.json's arguments as used
        args.attack_steps = 10 if args.attack_steps is None else args.attack_steps
        args.attack_start = args.attack_start or "truth"
    out_path = Path(args.out)
    if out_path.exists() and not out_path.is_dir():
        raise ValueError(f"--out {args.out}: a file is there; pass a folder for the results (it is made if missing)")
    metric = utility_metric(args)  # (None: no utility asked for)
    scales = None if args.sweep is None else sweep_scales(args.sweep)
    _check_out_kind(out_path, "sweep" if scales is not None else "search" if args.target_std is not None else "bound")
    if args.min_accuracy is not None:
        other = [f for f, v in (("--target-std", args.target_std), ("--sweep", args.sweep)) if v is not None]
        if other:
            flag = _flag(args, "min_accuracy", "--min-accuracy")
            raise ValueError(f"{flag} and {other[0]}: pass one of them ({flag} picks sigma for the utility, "
                             f"{other[0]} for the bounds)")
    if scales is not None and args.target_std is not None:
        raise ValueError("--sweep and --target-std: pass one of them (--sweep bounds the inputs at the sigmas it "
                         "names; --target-std searches the smallest sigma whose bounds reach a target)")
    search_flags = {"--quantile": args.quantile, "--statistic": args.statistic, "--target-modes": args.target_modes,
                    "--rtol": args.rtol, "--max-calls": args.max_calls}
    if args.target_std is None:
        given = [f for f, v in search_flags.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set how --target-std searches sigma; pass --target-std TAU, or drop "
                             f"{'them' if len(given) > 1 else 'it'}")
        if args.reuse_gib is not None and scales is None:
            raise ValueError("--reuse-gib sets what the bound calls of --target-std or --sweep share; pass one of "
                             "them, or drop --reuse-gib (a single bound call keeps nothing)")
    elif not (np.isfinite(args.target_std) and args.target_std > 0):
        raise ValueError(f"--target-std {as_typed(args.target_std)}: pass a positive finite number, in the inputs' "
                         "units")
    if args.target_modes is not None:
        _repro_cli.check_targets_flag(args.target_modes, "--target-modes")
    if args.reuse_gib is not None and not (np.isfinite(args.reuse_gib) and args.reuse_gib >= 0):
        raise ValueError(f"--reuse-gib {as_typed(args.reuse_gib)}: pass a number of GiB >= 0 (0: keep nothing between "
                         "calls)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here; run with --device cpu, or install a CUDA "
                         "build of torch and hcrfast's CuPy extra (pip install 'hcrfast[cuda12]' or '[cuda13]')")
    stds = None if args.sigma_file is None else load_sigma_file(args.sigma_file)  # before the model loads
    progress = not args.no_progress
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out = Path(args.out)

    saved_threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()   # the count that runs, given or torch's default: recorded for a rerun
    try:
        model = load_model(args.model)
        weights = _load_weights(model, args.weights, "--weights", args.model)
        x = load_inputs(args.inputs, args.key)
        n_inputs = len(x)  # (the file's, before --examples)
        if args.examples is not None:
            if args.examples > len(x):
                raise ValueError(f"--examples {args.examples}: {args.inputs} holds {len(x)} inputs")
            x = x[:args.examples]
        earlier = check_outputs(out, _planned_outputs(args, scales, metric, x.dim()), _BOUND_KNOWN,
                                _BOUND_SIGNS, "hcrfast bound", rank)
        for flag, value in (("--targets", args.targets), ("--target-modes", args.target_modes)):
            if value is not None:  # against the inputs' shape now, named as the flag (bound would say targets=)
                from hcrfast.targeted import parse_targets

                try:
                    parse_targets(value, tuple(x.shape[1:]), args.basis)
                except ValueError as exc:
                    why = str(exc).replace(f"targets={value!r}: ", "").replace(f"targets={value!r} ", "")
                    why = why.replace("basis='", "--basis '").replace(" or list the modes", "")
                    raise ValueError(f"{flag} {value}: {why}") from None
        head = labels = head_weights = None
        if args.head is not None:
            head = load_model(args.head, "--head")
            head_weights = _load_weights(head, args.head_weights, "--head-weights", args.head)
        if args.labels is not None:
            labels = load_labels(args.labels, args.labels_key, integer=isinstance(metric, str))
            if len(labels) not in (n_inputs, len(x)):  # one per input of the file, or of the --examples taken
                raise ValueError(f"--labels {args.labels}: {len(labels)} rows for {n_inputs} inputs"
                                 + (f" (--examples {len(x)})" if len(x) != n_inputs else "")
                                 + "; pass one per input, in the inputs' order")
            labels = labels[:len(x)]
        floats = [t.dtype for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
        dtype = torch.float64 if args.double else (floats[0] if floats and floats[0] == torch.float64
                                                   else torch.float32)
        if floats and floats[0] in (torch.float16, torch.bfloat16) and not args.double:
            warnings.warn(f"the model's weights are {str(floats[0]).replace('torch.', '')}: hcrfast bound runs a "
                          f"float32 copy of it, and the bounds are that copy's (as hcrfast.bound in Python solves a "
                          f"float16 model); pass --double for float64", validation.HcrfastUserWarning, stacklevel=2)
        if x.dtype == torch.float64 and dtype != torch.float64:
            warnings.warn(f"the inputs ({args.inputs}) are float64 and the model {str(dtype).replace('torch.', '')}: "
                          f"hcrfast bound rounds the inputs to {str(dtype).replace('torch.', '')} and bounds those; "
                          f"pass --double to run the model and inputs in float64", validation.HcrfastUserWarning,
                          stacklevel=2)
        # Under torchrun each process takes the GPU of its local rank (as `reproduce` does).
        device = torch.device(args.device if args.device == "cpu" or world == 1
                              else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
        model = model.to(device=device, dtype=dtype).eval()
        x = x.to(device=device, dtype=dtype).contiguous()
        if metric is not None:
            from hcrfast.utility import dithered_accuracy

            head = None if head is None else head.to(device=device, dtype=dtype).eval()
            # head, labels and metric checked before the bounds
            dithered_accuracy(model, head, x, labels, 0.0, draws=1, metric=metric)

        if args.sigma_file is not None:
            sigma = stds
            noise = {"sigma_file": str(args.sigma_file), "sha256": reproduce._sha256_file(Path(args.sigma_file))}
        elif args.sigma is not None:
            sigma, noise = float(args.sigma), {"sigma": float(args.sigma)}
        else:
            scale = 1.0 if args.sigma_scale is None else float(args.sigma_scale)
            with torch.no_grad():  # bound's own checked forward: a tensor, batch axis first, finite
                sigma = algorithm.rms_sigma(validation.features_of(model, x), scale)
            noise = {"sigma": sigma, "sigma_scale": scale, "rms": sigma / scale}
        validation.check_batch(x, args.basis)   # (vector inputs under the DCT: refused before the header says where)
        if progress and rank == 0:
            what = (f"one std per feature from {args.sigma_file}" if args.sigma_file is not None
                    else f"sigma {sigma:.6g}" + (f" = {noise['sigma_scale']:g} x RMS {noise['rms']:.6g}"
                                                  if "rms" in noise else ""))
            say(f"hcrfast bound: {len(x)} inputs of shape {tuple(x.shape[1:])} ({str(dtype).replace('torch.', '')}, "
                f"{device}), {what}; "
                f"results in {out}" + (f" ({world} processes)" if world > 1 else ""))

        bound_kwargs = dict(
            size=args.size, iterations=args.iterations, restarts=args.restarts, seed=args.seed,
            basis=args.basis, linearize_at=args.linearize_at, solver=args.solver, targets=args.targets,
            jacobian=args.jacobian, warm_start=not args.cold_start, tf32=args.tf32, chunk_size=args.chunk_size,
            iterates="last" if args.last_iterate else "all", singular_steps=args.singular_steps,
            null_probes=args.null_probes,
            krylov_pilots=args.krylov_pilots, progress=progress, shard=world > 1)
        search = sweep = accuracy_search = None
        if args.min_accuracy is not None:
            from hcrfast.utility import sigma_for_accuracy

            accuracy_search = sigma_for_accuracy(model, head, x, labels, args.min_accuracy, sigma0=sigma,
                                                 seed=args.seed, metric=metric,
                                                 draws=10 if args.utility_draws is None else args.utility_draws)
            if progress and rank == 0:
                say(f"hcrfast bound: {accuracy_search.summary()}")
            noise = dict(noise, searched_from=noise.get("sigma", "the stds of " + str(args.sigma_file)),
                         sigma=accuracy_search.sigma if np.ndim(accuracy_search.sigma) == 0 else None,
                         scale=accuracy_search.scale)
            sigma = accuracy_search.sigma
        reuse_bytes = None if args.reuse_gib is None else int(args.reuse_gib * 2**30)
        if scales is not None:
            from hcrfast.calibrate import sweep_sigma

            if progress and rank == 0:
                say(f"hcrfast bound: a sweep of {len(scales)} sigmas, {', '.join(f'{k:g}' for k in scales)} x the "
                    f"one above")
            try:
                sweep = sweep_sigma(model, x, scales, sigma0=sigma, reuse_bytes=reuse_bytes,
                                    checkpoint=out / "sweep_chunks", **bound_kwargs)
            except CheckpointMismatchError as exc:
                raise _default_sigma_hint(shell_fix(exc, out, ("sweep_chunks",)), noise, sweep=True) from None
        elif args.target_std is None:
            try:
                res = algorithm.bound(model, x, sigma, checkpoint=out / "chunks", **bound_kwargs)
            except CheckpointMismatchError as exc:   # worded for the shell: another --out, or delete OUT/chunks
                raise _default_sigma_hint(shell_fix(exc, out, ("chunks",)), noise) from None
        else:
            from hcrfast.calibrate import sigma_for

            try:
                search = sigma_for(model, x, args.target_std, sigma0=sigma,
                                   quantile=0.5 if args.quantile is None else args.quantile,
                                   statistic=args.statistic or "std", modes=args.target_modes,
                                   rtol=0.05 if args.rtol is None else args.rtol,
                                   max_calls=8 if args.max_calls is None else args.max_calls,
                                   reuse_bytes=reuse_bytes,
                                   checkpoint=out / "calibration", **bound_kwargs)
            except CheckpointMismatchError as exc:   # (each call's folder is OUT/calibration/scale_K, K x sigma0)
                raise _default_sigma_hint(shell_fix(exc, out, ("calibration",)), noise, sweep=True) from None
            res, sigma = search.bounds, search.sigma
            noise = dict(noise, searched_from=noise.get("sigma", "the stds of " + str(args.sigma_file)),
                         sigma=search.sigma if np.ndim(search.sigma) == 0 else None, scale=search.scale)
        attacks = []
        if args.attack is not None and rank == 0:  # the attack does not shard: rank 0 runs it
            from hcrfast.attack import gauss_newton_attack

            levels = ([(sigma, out / "attack_chunks", "")] if sweep is None else
                      [(sig, out / "attack_chunks" / scale_folder(k), f" at {k:g} x sigma")
                       for k, sig in zip(scales, sweep.sigmas)])
            for level_sigma, folder, where in levels:
                if progress:
                    say(f"hcrfast bound: Gauss-Newton attack{where}, {args.attack} draws per input, "
                        f"{args.attack_steps} steps, from the {args.attack_start}")
                try:
                    attacks.append(gauss_newton_attack(model, x, level_sigma, draws=args.attack,
                                                       steps=args.attack_steps, start=args.attack_start,
                                                       seed=args.seed, basis=args.basis, jacobian=args.jacobian,
                                                       chunk_size=args.chunk_size, progress=progress,
                                                       checkpoint=folder))
                except CheckpointMismatchError as exc:
                    raise shell_fix(exc, out, ("attack_chunks",)) from None
        utilities = []
        if metric is not None and rank == 0:
            for level_sigma in ([sigma] if sweep is None else sweep.sigmas):
                utilities.append(dithered_accuracy(model, head, x, labels, level_sigma, seed=args.seed, metric=metric,
                                                   draws=10 if args.utility_draws is None else args.utility_draws))
    finally:
        torch.set_num_threads(saved_threads)  # main() may be called in-process (tests, notebooks)
    if rank != 0:
        return 0

    # chunks read back from an earlier run with another --threads: their bounds are that count's, bit for bit
    # (the float32 solves' rounding follows it), so the command that repeats them names it
    records = ([h.get("checkpoint") for h in search.history] if search is not None else   # every call of the search
               [b.params.get("checkpoint") for b in (sweep.bounds if sweep is not None else [res])])
    records += [a.params.get("checkpoint") for a in attacks]
    computed, counts = _chunk_threads(records, device, threads,
                                      computed_now=bool(utilities) or accuracy_search is not None)
    if computed is not None and computed != threads:
        say(f"hcrfast bound: the results were read back from chunks computed with --threads {computed} (this run "
            f"has {threads}); summary.json's command names --threads {computed}, which repeats them bit for bit")
    elif len(counts) > 1:
        say(f"hcrfast bound: the results' chunks were computed with --threads {', '.join(map(str, sorted(counts)))}: "
            f"no one --threads repeats them all bit for bit (the float32 solves' rounding follows the count), and "
            f"summary.json's command names this run's {threads}")
    summary = {
        # --threads as used (torch's default where not given), as --attack-steps' default is
        "arguments": {k: (threads if k == "threads" else v) for k, v in vars(args).items()
                      if k not in ("func", "command")},
        "command": command_line(args, threads if computed is None else computed),
        "chunks_threads": computed,   # the --threads the bounds' chunks were computed with, where one
        "cwd": os.getcwd(),   # where the command's relative paths are read from
        "threads": threads,
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": args.model, "weights": weights,
        "inputs": {"path": str(args.inputs), "key": args.key, "sha256": reproduce._sha256_file(Path(args.inputs)),
                   "examples": len(x), "shape": list(x.shape[1:]), "dtype": str(dtype).replace("torch.", ""),
                   "device": str(device)},
        "noise": noise,
        "bounds_on": ("coefficients of the orthonormal 2-D DCT-II (per channel, last two axes) of the inputs"
                      if args.basis == "dct" else "the inputs themselves"),
    }
    if metric is not None:
        summary["head"] = {"spec": args.head, "weights": head_weights,
                           "labels": None if args.labels is None else str(args.labels), "labels_key": args.labels_key,
                           "labels_sha256": None if args.labels is None else reproduce._sha256_file(Path(args.labels)),
                           "metric": args.metric or "accuracy"}
    versions = {**package_versions(), "hcrfast": _version("hcrfast"), "torch": torch.__version__,
                "numpy": np.__version__}
    # listed before they are written: a crash between leaves none of this command's files unlisted
    write_outputs(out, earlier | _planned_outputs(args, scales, metric, x.dim()))
    if sweep is not None:
        return _write_sweep(out, args, summary, sweep, attacks, utilities, versions, t_start, earlier)

    h = res.to_numpy()
    res.save(out / "bounds.npz")
    written = {"bounds.npz", "summary.json"}
    summary.update(_numbers(res, args.targets))
    summary.update(wall_seconds=time.perf_counter() - t_start,
                   params=json.loads(json.dumps(res.params, default=json_default)), versions=versions)
    if search is not None:
        summary["calibration"] = {
            "target_std": search.target, "quantile": search.quantile, "statistic": search.statistic_name,
            "target_modes": args.target_modes, "met": search.met, "within_rtol": search.within_rtol,
            "value": search.statistic, "scale": search.scale, "note": search.note, "history": search.history,
            "reuse_bytes": search.reuse_bytes, "sigma_file": None}
        if np.ndim(search.sigma) != 0:  # one std per feature: the stds found, beside the results
            _save_npy(out / "sigma.npy", search.sigma)
            written.add("sigma.npy")
            summary["calibration"]["sigma_file"] = str(out / "sigma.npy")
    attack = attacks[0] if attacks else None
    if attack is not None:
        from hcrfast.attack import compare

        attack.save(out / "attack.npz")
        written.add("attack.npz")
        summary["attack"] = dict(compare(res, attack), steps=args.attack_steps, start=args.attack_start)
    if utilities:
        summary["utility"] = utilities[0].to_dict()
    if accuracy_search is not None:
        a = accuracy_search
        summary["accuracy_search"] = {"min_accuracy": a.target, "metric": a.utility.metric, "scale": a.scale,
                                      "above_scale": a.above_scale,
                                      "above_accuracy": None if a.above is None else a.above.dithered,
                                      "note": a.note, "history": a.history, "sigma_file": None}
        if np.ndim(a.sigma) != 0:  # one std per feature: the stds found, beside the results
            _save_npy(out / "sigma.npy", a.sigma)
            written.add("sigma.npy")
            summary["accuracy_search"]["sigma_file"] = str(out / "sigma.npy")
    atomic_write_text(out / "summary.json", _strict_json(summary) + "\n")
    report = None
    if not args.no_report:
        from hcrfast.report import write_bound_report

        report = write_bound_report(out, json.loads((out / "summary.json").read_text(encoding="utf-8")), h.std)
    replace_outputs(out, earlier, written | _report_files(report))
    if search is not None:
        print(search.summary())
    if accuracy_search is not None:
        print(accuracy_search.summary())
    print(res.summary())
    if utilities:
        print("  " + utilities[0].summary())
    if attack is not None:
        print(_attack_line(summary["attack"], args))
    print(f"bounds: {out / 'bounds.npz'}")
    if attack is not None:
        print(f"attack: {out / 'attack.npz'}")
    print(f"summary: {out / 'summary.json'}")
    if report is not None:
        print(f"report: {report}")
    return 0


def _numbers(res, targets) -> dict:
    """summary.json's account of one call's bounds: their quantiles, the MSE bounds', the infinite ones."""
    from hcrfast import reproduce

    h = res.to_numpy()
    std = np.asarray(h.std, dtype=np.float64)
    return {
        "std": reproduce._quantiles(std),
        "mse_bound": reproduce._quantiles(np.asarray(h.mse, dtype=np.float64)),
        "mse_bound_modes": reproduce._quantiles(np.asarray(h.mse_from_modes, dtype=np.float64)),
        "targeted": (None if h.std_algorithm1 is None else reproduce._targeted_stats(
            targets, std, np.asarray(h.std_algorithm1, dtype=np.float64),
            (res.params.get("singular_steps") or {}).get("count", 0))),
        "infinite_reasons": list(h.infinite_reasons),
        "restarts_bounding_nothing": len(res.params.get("zero_step_reasons") or []),
        "bound_seconds": float(res.seconds),
    }


def _attack_line(c: dict, args) -> str:
    """The printed account of an attack beside its bounds (hcrfast.compare's dict): the median ratio and over
    which pairs (report._attack_pairs), or that no pair was compared, where the median would be NaN."""
    import math

    from hcrfast.report import _attack_pairs

    compared, pairs = _attack_pairs(c)
    mse = c.get("mse_ratio_median")
    line = f"  attack ({args.attack} Gauss-Newton draws per input from the {args.attack_start}): "
    if compared:
        line += (f"its error over the bound per mode, {pairs + ', ' if pairs else ''}median {c['median']:.4g} "
                 f"({c['fraction_below_1']:.1%} below 1, where an efficient unbiased attacker at the bound would "
                 f"have {c['fraction_below_1_efficient']:.1%}; each mode's ratio for it: "
                 f"{c['mc_band'][0]:.3g}..{c['mc_band'][1]:.3g})")
    else:
        line += f"{pairs}, so no error over the bound per mode"
    line += ("; its mse over mse_from_modes: no input whose mse_from_modes is finite and above 0"
             if mse is None or math.isnan(mse) else f"; its mse over mse_from_modes, median {mse:.4g}")
    converged = c.get("fraction_converged")
    line += ("" if converged is None or math.isnan(converged) else
             f"; {converged:.0%} of the draws converged" + ("" if converged >= 0.5 else
                                                              " (the others stopped at --attack-steps)"))
    return line + (f"; {c['n_draws_unmoved']} draws took no step (their error is their start's)"
                   if c["n_draws_unmoved"] else "")


# The params that differ between a sweep's calls: each σ's noise, and each call's own account of what it did
# (earlier_iterates' certified steps and margin, the dense factors' products, the shard's examples), in its
# level's "params" (and its bounds.npz), not in the params the σs share.
_PER_SIGMA_PARAMS = ("sigma", "noise", "noise_asked", "reuse", "zero_step_reasons", "rounding", "checkpoint",
                     "earlier_iterates", "dense", "shard", "features_divided_by")
# The params whose settings the σs share but that also count what each call did (singular_steps' modes_lifted
# and seconds, targeted's seconds and infinite bounds, the Krylov bases' steps and products): the shared params
# keep these settings, each level's "params" the whole entry.
_SHARED_SETTINGS = {"singular_steps": ("count", "auto"), "targeted": ("method", "n_targets", "eps_kept"),
                    "krylov": ("pilots", "pilots_auto")}

#: The files `hcrfast bound`'s reports write in OUT (report.py: write_bound_report, write_sweep_report).
_REPORT_FILES = ("report.html", "hist_all.png", "bound_modes.png", "bound_images.png", "bounds_vs_sigma.png",
                 "tradeoff.png")


#: What `hcrfast bound` writes in OUT (its report's files: _REPORT_FILES); in an OUT of an hcrfast from before
#: OUTPUTS_LIST, these are hcrfast's where one of _BOUND_SIGNS (checkpoints only hcrfast writes) is there.
_BOUND_KNOWN = ("bounds.npz", "summary.json", "attack.npz", "sigma.npy", *_REPORT_FILES, "sweep/sweep.json",
                "sweep/sigma0.npy", "sweep/scale_*/bounds.npz", "sweep/scale_*/attack.npz")
_BOUND_SIGNS = ("chunks/key.json", "calibration", "sweep_chunks")


def _planned_outputs(args, scales, metric, input_dims: int) -> set:
    """The files this `hcrfast bound` command writes in OUT (paths relative to it), as its arguments and the
    inputs' number of axes (with the batch's) tell before anything is computed."""
    from hcrfast.calibrate import scale_folder

    searched = args.target_std is not None or args.min_accuracy is not None
    if scales is None:
        files = {"bounds.npz", "summary.json"} | ({"attack.npz"} if args.attack is not None else set()) | (
            {"sigma.npy"} if args.sigma_file is not None and searched else set())
        figures = {"hist_all.png"} | ({"bound_modes.png", "bound_images.png"}
                                      if args.basis == "dct" and input_dims >= 3 else set())
    else:
        files = {"summary.json", "sweep/sweep.json"} | ({"sweep/sigma0.npy"} if args.sigma_file is not None else set())
        for k in scales:
            files |= {f"sweep/{scale_folder(k)}/bounds.npz"} | (
                {f"sweep/{scale_folder(k)}/attack.npz"} if args.attack is not None else set())
        figures = {"bounds_vs_sigma.png"} | ({"tradeoff.png"} if metric is not None else set())
    return files if args.no_report else files | {"report.html"} | figures


def _report_files(report) -> set:
    """The files the report at ``report`` (None: no report) wrote: the page and the figures it shows."""
    import re

    if report is None:
        return set()
    return {"report.html", *re.findall(r'<img src="([^"]+)"', Path(report).read_text(encoding="utf-8"))}


def _save_npy(path: Path, stds) -> None:
    """One std per feature, float64, written atomically (np.load reads it)."""
    from hcrfast.checkpoint import atomic_write_bytes

    atomic_write_bytes(path, lambda fh: np.save(fh, np.asarray(stds, dtype=np.float64)))


def _shared_params(params: dict) -> dict:
    """The params a sweep's σs share: every call's, less each σ's own (see _PER_SIGMA_PARAMS)."""
    shared = {k: v for k, v in params.items() if k not in _PER_SIGMA_PARAMS}
    for k, keep in _SHARED_SETTINGS.items():
        if isinstance(shared.get(k), dict):
            shared[k] = {name: shared[k][name] for name in keep if name in shared[k]}
    return shared


def _own_params(params: dict) -> dict:
    """A sweep level's "params": what its call alone did (the rest are the shared params)."""
    return {k: v for k, v in params.items() if k in _PER_SIGMA_PARAMS or k in _SHARED_SETTINGS}


def _write_sweep(out: Path, args, summary: dict, sweep, attacks: list, utilities: list, versions: dict,
                 t_start: float, earlier: set) -> int:
    """``hcrfast bound --sweep``'s results: OUT/sweep/scale_K/bounds.npz (and attack.npz) per sigma,
    summary.json with one entry per sigma, the report with the curve of the bounds against sigma."""
    from hcrfast.attack import compare
    from hcrfast.calibrate import scale_folder
    from hcrfast.checkpoint import atomic_write_text
    from hcrfast.results import json_default

    # hcrfast.SigmaSweep.load(OUT/sweep) reads it all back; OUT's files were checked as hcrfast's before computing
    sweep.save(out / "sweep", overwrite=True)
    written = {"sweep/sweep.json"} | ({"sweep/sigma0.npy"} if np.ndim(sweep.sigma0) != 0 else set())
    levels = []
    for i, (k, sig, res) in enumerate(zip(sweep.scales.tolist(), sweep.sigmas, sweep.bounds)):
        folder = out / "sweep" / scale_folder(k)
        level = {"scale": k, "sigma": float(sig) if np.ndim(sig) == 0 else None,
                 "sigma_rms": float(np.sqrt(np.mean(np.square(sig)))), "bounds": str(folder / "bounds.npz"),
                 **_numbers(res, args.targets), "call_seconds": sweep.seconds[i],
                 "reused_examples": sweep.reused_examples[i],
                 "read_back_examples": (res.params.get("checkpoint") or {}).get("examples_read_back", 0),
                 "rounding": res.params.get("rounding"),
                 "params": json.loads(json.dumps(_own_params(res.params), default=json_default))}
        written.add(f"sweep/{scale_folder(k)}/bounds.npz")
        if attacks:
            attacks[i].save(folder / "attack.npz")
            written.add(f"sweep/{scale_folder(k)}/attack.npz")
            with warnings.catch_warnings(record=True) as caught:  # said again below, with their sigma
                warnings.simplefilter("always")
                compared = compare(res, attacks[i])
            for w in caught:
                warnings.warn(f"at {k:g} x sigma: {w.message}", w.category, stacklevel=2)
            level["attack"] = dict(compared, steps=args.attack_steps, start=args.attack_start,
                                   file=str(folder / "attack.npz"))
        if utilities:
            level["utility"] = utilities[i].to_dict()
        levels.append(level)
    shared = _shared_params(sweep.bounds[0].params)
    summary["sweep"] = {"scales": sweep.scales.tolist(), "reuse_bytes": sweep.reuse_bytes,
                        "each_sigma": "scale x the noise above (x each of its stds, for one per feature)",
                        "levels": levels}
    summary.update(wall_seconds=time.perf_counter() - t_start,
                   params=json.loads(json.dumps(shared, default=json_default)), versions=versions)
    atomic_write_text(out / "summary.json", _strict_json(summary) + "\n")
    written.add("summary.json")
    report = None
    if not args.no_report:
        from hcrfast.report import write_sweep_report

        report = write_sweep_report(out, json.loads((out / "summary.json").read_text(encoding="utf-8")))
    replace_outputs(out, earlier, written | _report_files(report))
    print(sweep.summary())
    for i, level in enumerate(levels):
        print(f"  scale {level['scale']:g}: bounds {level['bounds']}"
              + (f"; attack {level['attack']['file']}" if attacks else ""))
        if utilities:
            print("    " + utilities[i].summary())
        if attacks:
            print("  " + _attack_line(level["attack"], args))
    print(f"summary: {out / 'summary.json'}")
    if report is not None:
        print(f"report: {report}")
    return 0


def _chunk_threads(records, device, threads: int, *, computed_now: bool = False) -> tuple[int | None, set]:
    """``(count, counts)``: the torch thread count that every chunk behind a run's results was computed with, and
    the counts found, read from the arithmetic each chunk records (:func:`hcrfast.checkpoint.arithmetic_of`:
    the processor, its cores and "torch threads N"; ``records``: the results' ``params["checkpoint"]``, one per
    bound or attack call). The count is None where the chunks differ in it, or where any was computed on another
    machine or device, or recorded none (a chunk from before it was, or a call without a checkpoint): no
    --threads alone repeats those. ``computed_now``: results computed by this run, without chunks (the
    utilities), at ``threads``."""
    from hcrfast.checkpoint import arithmetic_of

    def kind(text: str) -> str:   # the machine, the count aside (bound's dense solve adds a note after ";")
        return re.sub(r"torch threads \d+", "torch threads N", str(text).split(";")[0])

    here, counts, foreign = kind(arithmetic_of(device)), set(), False
    for record in records:
        for text in ((record or {}).get("arithmetic") or ["not recorded"]):
            match = re.search(r"torch threads (\d+)", str(text))
            if match is None or kind(text) != here:
                foreign = True
            else:
                counts.add(int(match.group(1)))
    if computed_now:
        counts.add(threads)
    return (counts.copy().pop() if len(counts) == 1 and not foreign else None), counts


def command_line(args: argparse.Namespace, threads: int) -> str:
    """The ``hcrfast bound`` command that repeats this one (and resumes it from its chunks): every option set
    spelt out, defaults included, in the parser's order, and ``--threads`` with the count that ran (``threads``)
    also where it was left at torch's default: that default follows the machine and ``OMP_NUM_THREADS``, and
    the float32 solves' rounding follows the count, so the bounds are bitwise only with the same one."""
    import shlex

    parser = argparse.ArgumentParser(prog="hcrfast")
    subparsers = parser.add_subparsers(dest="command")
    add_subparser(subparsers)
    parts, positionals = ["hcrfast", "bound"], []
    for action in subparsers.choices["bound"]._actions:
        value = threads if action.dest == "threads" else getattr(args, action.dest, None)
        if value is None or value is False or action.dest == "help":   # not given (or a switch left off)
            continue
        if not action.option_strings:   # MODEL, INPUTS
            positionals.append(str(value))
            continue
        flag = _flag(args, action.dest, action.option_strings[0])   # --min-utility as typed
        if action.nargs == 0:
            parts.append(flag)
        else:
            parts += option_words(flag, as_typed(value) if isinstance(value, float) else value)
    return " ".join(shlex.quote(str(p)) for p in parts + positional_words(positionals))


def option_words(flag: str, value) -> list[str]:
    """``[flag, value]`` for a command line, or ``[flag=value]`` where the value starts with "-" (a file named
    -x.pt), which argparse would otherwise take for a flag of its own."""
    return [f"{flag}={value}"] if str(value).startswith("-") else [flag, str(value)]


def positional_words(values: list[str]) -> list[str]:
    """The positional arguments of a command line, after "--" where one starts with "-" (a model file named
    -net.py): argparse reads every word after it as positional."""
    return ["--", *values] if any(v.startswith("-") for v in values) else list(values)


def package_versions() -> dict:
    """Python's version and those of the distributions ``hcrfast --version`` names (:data:`hcrfast.cli._VERSIONED`,
    read as :func:`hcrfast.cli.version_line` reads them: the installed metadata), for summary.json's
    ``versions``: one it marks "not installed" is None, an absent optional one (CuPy, nvtx) left out."""
    import platform

    from hcrfast.cli import _VERSIONED

    found = {"python": platform.python_version(), "hcrfast": _version("hcrfast")}
    for name in _VERSIONED:
        version = _version(name)
        if version is not None or name in ("torch", "numpy", "scipy", "numba"):
            found[name] = version
    return found


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None
