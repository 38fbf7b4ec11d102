"""``hcrfast reproduce``: outputs, determinism, resume after a kill, torchrun, errors, figures.

Every run is tiny (10 digits, 2 restarts, 2 iterations, LSQR capped at 30 steps) so the
whole file runs in about a minute on 2 CPU cores; the figures (matplotlib) are most of it.
"""
from __future__ import annotations

import json
import math
import shutil
import os
import re
import shlex
import subprocess
import sys
import warnings
from html import unescape
from pathlib import Path

import numpy as np
import pytest
import scipy
import scipy.fft
import torch

import hcrfast
from hcrfast import cli, report, reproduce, zoo

TINY = ["--examples", "10", "--restarts", "2", "--iterations", "2", "--lsqr-atol", "1e-3",
        "--lsqr-btol", "1e-3", "--lsqr-iter-lim", "30", "--chunk-examples", "4"]
FIGURES = ("hist_all.png", "hist_lowfreq.png", "reconstructions.png", "bound_images.png", "bound_modes.png")
ARRAYS = ("std", "mse", "eps", "z", "divergence", "best_restart", "lsqr_iterations", "lsqr_istop",
          "labels", "example_ids", "sigma", "infinite", "params")
_ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def _hcrfast(*argv) -> subprocess.CompletedProcess:
    """The command line in a fresh process (as a user or torchrun would start it)."""
    return subprocess.run([sys.executable, "-m", "hcrfast.cli", *map(str, argv)], check=False, capture_output=True,
                          text=True, env=_ENV, timeout=300)


def _arrays(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _assert_same_bounds(a: Path, b: Path) -> None:
    x, y = _arrays(a), _arrays(b)
    assert set(x) == set(y) == set(ARRAYS) | {"meta"}  # meta: the Bounds header, with the run's timings
    for k in ARRAYS:
        assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
        # bitwise: the same bytes, NaN/inf included
        assert x[k].tobytes() == y[k].tobytes(), f"{k} differs"


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """One tiny run that also trains the digits model itself (2 epochs, hidden test option)."""
    out = tmp_path_factory.mktemp("repro") / "first"
    assert cli.main(["reproduce", "digits", *TINY, "--out", str(out), "--train-epochs", "2"]) == 0
    return out


@pytest.fixture(scope="module")
def weights(first):
    return first / "digits_state_dict.pt"


def test_bounds_npz_records_the_revision_that_computed_it(first):
    """reproduce writes bounds.npz itself: it recorded no revision, so its own fresh bounds loaded with the note of
    a file from before 2026-12-01."""
    with np.load(first / "bounds.npz") as z:
        assert json.loads(str(z["meta"]))["params"]["revision"] == hcrfast.checkpoint.FORMAT
    loaded = hcrfast.Bounds.load(first / "bounds.npz")
    assert "revision" not in loaded.params and not loaded.summary().startswith("NOTE")


def test_every_output_is_written(first, weights, capsys):
    assert weights.is_file()
    for name in ("bounds.npz", "summary.json", "report.html", "run.json", *FIGURES):
        assert (first / name).is_file(), name
    assert sorted(p.name for p in (first / "chunks").iterdir()) == [f"chunk_0000{i}.npz" for i in range(3)]

    b = _arrays(first / "bounds.npz")
    assert b["std"].shape == (10, 1, 8, 8) and b["eps"].shape == (10, 1, 8, 8)
    assert b["z"].shape == (10, 64) and b["mse"].shape == (10,)
    assert b["divergence"].shape == (10, 2)
    assert b["lsqr_iterations"].shape == b["lsqr_istop"].shape == (10, 2, 2)
    assert np.all(np.isfinite(b["std"])) and np.all(b["std"] > 0)
    assert np.all(b["mse"] > 0) and np.all(b["divergence"] > 0)
    assert np.array_equal(b["example_ids"], np.arange(10))
    assert np.all(b["lsqr_iterations"] <= 30)
    params = json.loads(str(b["params"]))
    assert params["restarts"] == 2 and params["iterations"] == 2 and params["lsqr"]["iter_lim"] == 30
    assert params["sigma"] == float(b["sigma"])
    # the same file as hcrfast.Bounds.save writes: Bounds.load reads it, with the run's parameters
    loaded = hcrfast.Bounds.load(first / "bounds.npz")
    for k in ("std", "mse", "eps", "z", "divergence", "best_restart", "lsqr_iterations", "lsqr_istop"):
        assert np.array_equal(getattr(loaded, k), b[k]), k
    assert loaded.params["sigma"] == float(b["sigma"]) and loaded.params["certify"] is True
    assert loaded.params["noise"].startswith("Gaussian(sigma=") and loaded.infinite_reasons == []
    assert "None" not in loaded.summary()

    s = json.loads((first / "summary.json").read_text())
    assert s["examples"] == 10 and s["chunks"] == 3 and s["trained_weights"]
    assert 0 <= s["accuracy"]["clean"] <= 1 and 0 <= s["accuracy"]["dithered"] <= 1
    assert len(s["accuracy"]["dithered_per_draw"]) == 2
    assert s["accuracy"]["dithered"] == pytest.approx(np.mean(s["accuracy"]["dithered_per_draw"]))
    assert s["sigma"] == pytest.approx(s["sigma_scale"] * s["rms"])
    for block in ("bounds", "bounds_lowfreq"):
        q = [s[block][f"q{p}"] for p in (5, 25, 50, 75, 95)]
        assert q == sorted(q) and q[0] > 0
    assert s["bounds"]["q50"] == pytest.approx(np.median(b["std"]))
    assert s["bounds_lowfreq"]["q50"] == pytest.approx(np.median(b["std"][:, :, :4, :4]))
    assert s["bounds_lowfreq"]["finite"] == 10 * 16
    assert s["infinite"]["coordinates"] == 0 and s["infinite"]["fraction"] == 0.0
    assert s["lsqr"]["solves"] == 10 * 2 * 2
    # what `hcrfast --version` names: SciPy (whose LAPACK the dense solve runs) and Numba too
    assert {"python", "torch", "numpy", "hcrfast", "scipy", "numba"} <= set(s["versions"])
    assert s["versions"]["scipy"] == scipy.__version__ and s["versions"]["torch"] == torch.__version__
    assert s["threads"] == 1 and "--threads 1" in s["command"]   # digits' default on the command line: 1

    page = (first / "report.html").read_text()
    assert "<script" not in page
    for name in FIGURES:
        assert f'src="{name}"' in page  # relative paths, next to report.html
    assert "dithered" in page and "Accuracy" in page
    # the report's versions are summary.json's, all of them (it showed python, torch, numpy and hcrfast alone)
    assert all(f"{name} {value}" in page for name, value in s["versions"].items() if value is not None)


@pytest.mark.parametrize("name", ["digits", "mnist", "cifar10"])
def test_published_parameters_are_the_built_models(name):
    zm = zoo.build(name)
    for key, value in zoo.published_parameters(name).items():
        assert getattr(zm, key) == value, key


def test_defaults_come_from_the_zoo_model(first):
    key = json.loads((first / "run.json").read_text())["key"]
    zm = zoo.published_parameters("digits")
    assert key["size"] == zm["size"] and key["sigma_scale"] == zm["sigma_scale"]
    assert key["linearize_at"] == "input" and key["seed"] == 0


def test_same_seed_gives_identical_bounds_and_reuses_weights(first, weights, tmp_path, capsys):
    mtime = weights.stat().st_mtime_ns
    again = tmp_path / "again"
    assert cli.main(["reproduce", "digits", *TINY, "--out", str(again), "--weights", str(weights)]) == 0
    err = capsys.readouterr().err
    assert "chunk 1/3 done" in err and "ETA" in err and "examples 4/10" in err  # progress lines
    _assert_same_bounds(first / "bounds.npz", again / "bounds.npz")
    assert weights.stat().st_mtime_ns == mtime

    # a rerun of a finished run reuses every chunk and changes nothing
    assert cli.main(["reproduce", "digits", *TINY, "--out", str(again), "--weights", str(weights),
                     "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
    s = json.loads((again / "summary.json").read_text())
    assert s["timings"]["chunks_reused"] == 3 and s["timings"]["chunks_computed_this_run"] == 0
    _assert_same_bounds(first / "bounds.npz", again / "bounds.npz")


def test_other_seed_gives_other_bounds(first, weights, tmp_path):
    other = tmp_path / "seed1"
    # one chunk (the first 4 examples) is enough to see the start vectors change
    tiny = TINY[:1] + ["4"] + TINY[2:]
    assert cli.main(["reproduce", "digits", *tiny, "--seed", "1", "--out", str(other), "--weights", str(weights),
                     "--no-progress"]) == 0
    got, want = _arrays(other / "bounds.npz"), _arrays(first / "bounds.npz")
    assert got["std"].shape == (4, 1, 8, 8)
    assert not np.array_equal(got["std"], want["std"][:4])


def test_other_arguments_in_the_same_out_are_refused(first, weights, capsys):
    code = cli.main(["reproduce", "digits", *TINY, "--seed", "3", "--out", str(first), "--weights", str(weights)])
    err = capsys.readouterr().err
    assert code == 2
    assert "other arguments" in err and "seed: 0 -> 3" in err and "fresh --out" in err


def test_a_run_of_an_earlier_format_is_refused(first, weights, tmp_path, capsys):
    """A run folder written by an older hcrfast (run.json's key of format 5: D not yet past float64's rounding
    of the passes, 2026-11-30) is refused, naming the format, not mixed into the new run."""
    old = tmp_path / "old"
    shutil.copytree(first, old)
    stored = json.loads((old / "run.json").read_text())
    assert stored["key"]["format"] == 7
    stored["key"]["format"] = 5
    (old / "run.json").write_text(json.dumps(stored))
    code = cli.main(["reproduce", "digits", *TINY, "--out", str(old), "--weights", str(weights)])
    err = capsys.readouterr().err
    assert code == 2 and "format: 5 -> 7" in err
    # no rerun resumes it (the generic "rerun with the same arguments to resume it" could not work)
    assert "another version of hcrfast" in err and "fresh --out" in err and "Rerun with the same" not in err


def test_a_run_that_fails_before_its_first_chunk_leaves_no_run_json(weights, tmp_path, capsys):
    """A --size that overflows fails before any chunk is written; its run.json stayed behind, and the corrected
    command in the same --out was refused for "other arguments (size: 1e+300 -> 0.005)"."""
    out = tmp_path / "ex"
    args = ["reproduce", "digits", "--examples", "2", "--restarts", "2", "--iterations", "2", "--weights",
            str(weights), "--out", str(out)]
    assert cli.main([*args, "--size", "1e300"]) == 2
    assert not (out / "run.json").exists()
    capsys.readouterr()
    assert cli.main(args) == 0


def test_cold_start_is_recorded_and_not_mixed_with_warm_chunks(first, weights, tmp_path, capsys):
    key = json.loads((first / "run.json").read_text())["key"]
    assert key["warm_start"] is True
    code = cli.main(["reproduce", "digits", *TINY, "--cold-start", "--out", str(first), "--weights", str(weights)])
    assert code == 2 and "warm_start: True -> False" in capsys.readouterr().err
    cold = tmp_path / "cold"
    tiny = TINY[:1] + ["4"] + TINY[2:]
    assert cli.main(["reproduce", "digits", *tiny, "--cold-start", "--out", str(cold), "--weights", str(weights),
                     "--no-progress"]) == 0
    assert json.loads((cold / "run.json").read_text())["key"]["warm_start"] is False
    summary = json.loads((cold / "summary.json").read_text())
    assert summary["warm_start"] is False and "--cold-start" in summary["command"]


def test_last_iterate_is_recorded_not_mixed_and_bounds_no_more_than_every_iterate(first, weights, tmp_path, capsys):
    """--last-iterate (the paper's: each restart bounded by its last step) is a run of its own: refused in
    the folder of a default run (every iterate), recorded in run.json, summary and command; its bounds are
    at most the default run's, whose max takes the last steps in too, and below them somewhere."""
    key = json.loads((first / "run.json").read_text())["key"]
    assert key["iterates"] == "all"
    code = cli.main(["reproduce", "digits", *TINY, "--last-iterate", "--out", str(first), "--weights", str(weights)])
    assert code == 2 and "iterates" in capsys.readouterr().err
    last = tmp_path / "last"
    assert cli.main(["reproduce", "digits", *TINY, "--last-iterate", "--out", str(last), "--weights", str(weights),
                     "--no-progress"]) == 0
    assert "iterates" not in json.loads((last / "run.json").read_text())["key"]  # as runs made before it existed
    summary = json.loads((last / "summary.json").read_text())
    assert summary["iterates"] == "last" and "--last-iterate" in summary["command"]
    every, only = _arrays(first / "bounds.npz")["std"], _arrays(last / "bounds.npz")["std"]
    assert np.all(every >= only * (1 - 1e-9)) and np.any(every > only * (1 + 1e-6))


def test_killed_run_resumes_to_identical_bounds(first, weights, tmp_path, capsys):
    out = tmp_path / "killed"
    argv = ["reproduce", "digits", *TINY, "--out", out, "--weights", weights, "--no-progress"]
    crashed = _hcrfast(*argv, "--test-crash-after-chunks", "1")
    assert crashed.returncode == 1, crashed.stderr
    assert [p.name for p in (out / "chunks").glob("chunk_*.npz")] == ["chunk_00000.npz"]
    assert not (out / "bounds.npz").exists()

    # the restart in this process: cheaper than another interpreter, and the same code path
    assert cli.main([str(a) for a in argv]) == 0
    assert f"report: {out / 'report.html'}" in capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert s["timings"]["chunks_reused"] == 1 and s["timings"]["chunks_computed_this_run"] == 2
    _assert_same_bounds(first / "bounds.npz", out / "bounds.npz")


def test_torchrun_two_processes_match_one(first, weights, tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    out = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "-m",
         "hcrfast.cli", "reproduce", "digits", *TINY, "--out", str(out), "--weights", str(weights)],
        check=False, capture_output=True, text=True, env=_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[rank 1/2]" in proc.stderr and "[rank 0/2]" in proc.stderr
    # chunk c is computed by rank c % 2, the merge by rank 0
    assert proc.stdout.count("report:") == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 2
    # the run's counts, both ranks' (rank 0 alone computed 2 of the 3)
    assert s["timings"]["chunks_computed_this_run"] == 3 and s["timings"]["chunks_reused"] == 0
    _assert_same_bounds(first / "bounds.npz", out / "bounds.npz")


TORCHRUN_TWICE = """
import contextlib, io, json, os, sys
from hcrfast import cli

rank = int(os.environ["RANK"])
got = {{}}
for name, given in (("mismatch", dict(examples="10" if rank == 0 else "8")),
                    ("weights", dict(weights=None, train_epochs="1") if rank == 0 else {{}}),  # rank 0 trains its own
                    ("folders", dict(out="folders%d" % rank)),
                    ("bad", dict(size="-1") if rank == 1 else {{}}),  # refused on rank 1 before any step
                    ("same", {{}})):
    argv = {tiny!r}
    options = {{"out": name, "weights": {weights!r}, **given}}
    for option, value in options.items():
        flag = "--" + option.replace("_", "-")
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        elif option == "out":
            argv += [flag, os.path.join({root!r}, value)]
        elif value is not None:
            argv += [flag, value]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["reproduce", "digits", *argv])
    got[name] = [code, err.getvalue()]
with open(os.path.join({root!r}, "rank%d.json" % rank), "w") as fh:
    json.dump(got, fh)
"""


def test_torchrun_processes_with_other_arguments_all_stop_and_the_next_run_works(first, weights, tmp_path):
    """reproduce.run called per process (a script, not one command line): a process with other
    arguments must not write into rank 0's run; every process says so, and the next run in the
    same processes (the process group hcrfast made, reused) gives the one-process bounds."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    script = tmp_path / "twice.py"
    script.write_text(TORCHRUN_TWICE.format(tiny=TINY, root=str(tmp_path), weights=str(weights)))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(script)], check=False, capture_output=True, text=True, env=_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in (0, 1):
        code, err = got[r]["mismatch"]
        assert code == 1 and (f"hcrfast: error: hcrfast reproduce digits [rank {r}/2]: the processes do not run the "
                              f"same thing; where they differ from rank 0 (rank 1: data, examples): give every process "
                              f"the same arguments") in err, err
        code, err = got[r]["weights"]  # rank 0 trained its own: the keys name it (this hung at rank 0's training)
        assert code == 1 and "where they differ from rank 0 (rank 1: weights)" in err, err
        code, err = got[r]["folders"]  # both name both folders
        assert code != 0 and re.search(r"--out '.*folders0' on rank 0, but rank 1's '.*folders1' is not that folder "
                                       r"\(rank 0's file \.shard-[0-9a-f]+ is not in it\)", err), err
        code, err = got[r]["bad"]  # rank 1's bad value, checked inside the processes' session, reaches rank 0 at once
        assert code != 0 and "--size must be a positive finite number, got -1.0" in err, err
        assert got[r]["same"][0] == 0, got[r]["same"][1]
    assert not (tmp_path / "mismatch" / "run.json").exists()  # nothing was started there
    # rank 0 made its folder, looked no further (no weights trained, no key written, no token left)
    # and took the empty folder back
    assert not (tmp_path / "folders0").exists() and not (tmp_path / "folders1").exists()
    _assert_same_bounds(first / "bounds.npz", tmp_path / "same" / "bounds.npz")


# ----------------------------------------------------------------------------------------
# errors


def test_unknown_experiment_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "mnist2"])
    assert exc.value.code == 2
    assert "invalid choice: 'mnist2'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def mnist_weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("mnist") / "mnist.pt"
    torch.save(zoo.build("mnist").model.state_dict(), path)
    return path


def test_mnist_missing_data_directory(mnist_weights, tmp_path, capsys):
    missing = tmp_path / "no-such-dir"
    code = cli.main(["reproduce", "mnist", "--examples", "2", "--weights", str(mnist_weights),
                     "--data", str(missing), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hcrfast: error: MNIST not found") and "--download" in err
    assert not (tmp_path / "o").exists()  # the refused run leaves no empty run folder behind


def test_missing_data_is_named_before_weights_are_downloaded(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))

    def download(url, *args, **kwargs):
        raise AssertionError(f"downloaded {url} for a run whose data is missing")

    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    code = cli.main(["reproduce", "resnet18", "--weights", "default", "--data", str(tmp_path / "no-imagenet"),
                     "--out", str(tmp_path / "o")])
    assert code == 2 and capsys.readouterr().err.startswith("hcrfast: error: ImageNet not found")


def test_a_failed_run_takes_back_the_parent_folders_it_made(mnist_weights, tmp_path, monkeypatch):
    """The default OUT, runs/mnist: a run refused for missing data left an empty runs/ behind."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="MNIST not found"):
        reproduce.run("mnist", examples=2, weights=mnist_weights, data_root=tmp_path / "none", progress=False)
    assert not (tmp_path / "runs").exists()


def test_failed_run_keeps_what_it_found_and_trained(mnist_weights, tmp_path):
    out = tmp_path / "o"
    (out / "chunks").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileNotFoundError, match="MNIST not found"):
        reproduce.run("mnist", examples=2, weights=mnist_weights, data_root=tmp_path / "none", out=out,
                      progress=False)
    assert (out / "chunks").is_dir() and (out / "notes.txt").read_text() == "mine"  # not made by the run: kept


def test_mnist_without_weights_says_to_train_first(tmp_path, capsys):
    assert cli.main(["reproduce", "mnist", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "hcrfast train mnist" in err and "--weights" in err


def test_corrupt_state_dict(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"this is not a torch file" * 10)
    assert cli.main(["reproduce", "digits", *TINY, "--weights", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a readable torch.save file" in capsys.readouterr().err


def test_pickled_model_is_refused(tmp_path, capsys):
    pickled = tmp_path / "model.pt"
    torch.save(zoo.build("digits").model, pickled)
    assert cli.main(["reproduce", "digits", *TINY, "--weights", str(pickled), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pickled Python objects" in err and "state_dict()" in err


def test_missing_weights_file(tmp_path, capsys):
    assert cli.main(["reproduce", "digits", "--weights", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o")]) == 2
    assert "No weights file" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, text", [
    ("--restarts", "0", "restarts must be a positive integer"),
    ("--chunk-examples", "0", "--chunk-examples must be a positive integer"),
    ("--size", "-1", "size must be a positive finite number"),
])
def test_bad_values(weights, tmp_path, capsys, flag, value, text):
    code = cli.main(["reproduce", "digits", *TINY, flag, value, "--weights", str(weights),
                     "--out", str(tmp_path / "o")])
    assert code == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, text", [
    ("--examples", "0", "examples must be a positive integer"),
    ("--sigma-scale", "nan", "--sigma-scale must be a positive finite number"),
])
def test_bad_values_are_refused_before_the_run_folder_is_made_or_a_model_trained(tmp_path, capsys, flag, value, text):
    assert cli.main(["reproduce", "digits", flag, value, "--out", str(tmp_path / "o")]) == 2
    assert text in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_out_that_cannot_be_a_run_folder_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    for out, text in ((tmp_path / "afile", "is a file; pass a folder"),
                      (tmp_path / "afile" / "sub", "the run folder cannot be created (Not a directory")):
        assert cli.main(["reproduce", "digits", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hcrfast: error: --out") and text in err and "Traceback" not in err


@pytest.mark.parametrize("argv, text", [
    (["--seed", "-1"], "hcrfast: error: --seed must be a non-negative integer, got -1\n"),
    (["--targets", "low:9"], "hcrfast: error: --targets low:9: K must lie in 1..8 for examples of shape (1, 8, 8)"),
    (["--singular-steps", "3", "--solver", "lsqr"], "hcrfast: error: --singular-steps 3 takes J's"),
])
def test_the_python_layer_s_refusals_name_the_flags(tmp_path, capsys, argv, text):
    assert cli.main(["reproduce", "digits", "--out", str(tmp_path / "o"), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert text in err and "=" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, text", [
    (["--lsqr-atol", "-1"], "argument --lsqr-atol: -1: pass a finite number >= 0 (default 1e-05)"),
    (["--lsqr-btol", "inf"], "argument --lsqr-btol: inf: pass a finite number >= 0"),
    (["--size", "1e-400"], "argument --size: 1e-400 is outside float64's normal range"),
    (["--sigma-scale", "1e-320"], "argument --sigma-scale: 1e-320 is outside float64's normal range"),
])
def test_float_flags_are_refused_as_typed(tmp_path, capsys, argv, text):
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "digits", "--out", str(tmp_path / "o"), *argv])
    assert exc.value.code == 2
    assert text in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_train_checks_its_output_path_and_device_before_training(tmp_path, capsys):
    for argv, text in ((["--out", str(tmp_path)], "is a folder; pass a file path"),
                       (["--out", f"{tmp_path / 'new'}/"], "new/ names a folder; pass a file path"),  # not a file 'new'
                       (["--seed", "-1"], "error: --seed must be a non-negative integer, got -1\n"),
                       (["--epochs", "0"], "error: --epochs must be a positive integer")):
        assert cli.main(["train", "digits", "--epochs", "1", *argv]) == 2
        assert text in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    with pytest.raises(SystemExit) as exc:   # a device train cannot run on: argparse's refusal, as bound's
        cli.main(["train", "digits", "--epochs", "1", "--device", "foo"])
    assert exc.value.code == 2 and "--device: invalid choice: 'foo'" in capsys.readouterr().err


def test_the_same_weights_trained_twice_have_one_fingerprint(tmp_path):
    """torch.save names the archive's records after the path it writes to; the run key must not see that:
    a retrained digits model (or weights copied under another name) resumes its run folder."""
    from hcrfast import train

    a = train.train("digits", out=tmp_path / "a.pt", epochs=1, progress=False).state_dict_path
    b = train.train("digits", out=tmp_path / "other_name.pt", epochs=1, progress=False).state_dict_path
    assert reproduce._weights_fingerprint(a) == reproduce._weights_fingerprint(b)
    assert reproduce._weights_fingerprint(a).startswith("state-dict-sha256:")
    state = torch.load(a, weights_only=True)
    torch.save(state, tmp_path / "x.pt")  # saved by path: torch writes the name into the archive
    torch.save(state, tmp_path / "yy.pt")
    assert (tmp_path / "x.pt").read_bytes() != (tmp_path / "yy.pt").read_bytes()  # what a byte hash saw
    assert reproduce._weights_fingerprint(tmp_path / "x.pt") == reproduce._weights_fingerprint(a)
    assert reproduce._weights_fingerprint(tmp_path / "yy.pt") == reproduce._weights_fingerprint(a)
    next(iter(state.values())).view(-1)[0] += 1e-3
    torch.save(state, tmp_path / "c.pt")
    assert reproduce._weights_fingerprint(tmp_path / "c.pt") != reproduce._weights_fingerprint(a)
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # not a state dict: its bytes
    assert reproduce._weights_fingerprint(tmp_path / "module.pt").startswith("sha256:")


def test_interrupt_is_one_line_saying_the_run_resumes(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce, "run", interrupted)
    assert cli.main(["reproduce", "digits"]) == 130
    assert capsys.readouterr().err == ("hcrfast: interrupted; the chunks that finished are kept, and the same "
                                       "command resumes\n")


def test_imagenet_models_without_weights_warn_loudly(tmp_path, capsys):
    world = reproduce._World("cpu")
    with pytest.warns(UserWarning, match="RANDOMLY INITIALIZED"):
        arg, fingerprint, text, trained = reproduce._weights("resnet18", None, tmp_path, world=world,
                                                               progress=False, train_epochs=None)
    assert arg is None and not trained and "NOT the published" in text
    assert "WARNING" in capsys.readouterr().err
    arg, fingerprint, _, trained = reproduce._weights("swin_t", "default", tmp_path, world=world,
                                                        progress=False, train_epochs=None)
    assert arg == "default" and trained and fingerprint.startswith("torchvision:")  # nothing downloaded yet


# ----------------------------------------------------------------------------------------
# figures


def test_reconstruction_matches_scipy_oracle():
    rng = np.random.default_rng(0)
    images = rng.uniform(0.2, 0.8, size=(3, 3, 6, 5))
    norm = ((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    std = rng.uniform(0, 0.05, size=images.shape)
    got = report.reconstructions(images, std, norm, np.random.default_rng(7))
    signs = np.random.default_rng(7).choice(np.array([-1.0, 1.0]), size=std.shape)
    mean, scale = (np.array(v).reshape(-1, 1, 1) for v in norm)
    coeffs = scipy.fft.dctn((images - mean) / scale, axes=(-2, -1), norm="ortho") + signs * std
    want = np.clip(scipy.fft.idctn(coeffs, axes=(-2, -1), norm="ortho") * scale + mean, 0, 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # a zero bound gives the image back
    np.testing.assert_allclose(report.reconstructions(images, 0 * std, norm, rng), images, atol=1e-12)
    np.testing.assert_allclose(report.bound_images(std),
                               scipy.fft.idctn(std, axes=(-2, -1), norm="ortho").mean(axis=1), atol=1e-12)


def test_figures_survive_infinite_and_zero_bounds(tmp_path):
    rng = np.random.default_rng(1)
    std = rng.lognormal(size=(5, 1, 8, 8))
    std[1] = np.inf  # an example whose best restart had D = 0
    std[2, 0, 3, 3] = 0.0
    images = rng.uniform(size=(5, 1, 8, 8))
    figures = report.write_figures(tmp_path, images=images, std=std, normalization=((0.3,), (0.4,)),
                                   lowfreq=4, labels=np.arange(5), seed=0, name="test")
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 1000
    assert figures["hist_all"]["infinite_left_out"] == 64
    assert figures["hist_lowfreq"]["infinite_left_out"] == 16
    assert figures["hist_all"]["zeros_left_out"] == 1 and figures["hist_all"]["log_x"]
    # everything infinite: still no crash
    all_inf = np.full_like(std, np.inf)
    notes = report._histogram(tmp_path / "inf.png", all_inf, title="t", xlabel="x")
    assert notes["infinite_left_out"] == all_inf.size
    report._reconstruction_figure(tmp_path / "inf_r.png", images, all_inf, ((0.3,), (0.4,)), np.arange(5), [0, 1], 0)
    report._bound_image_figure(tmp_path / "inf_b.png", all_inf, [0, 1])
    report._modes_figure(tmp_path / "inf_m.png", all_inf, 4)


def test_the_modes_figure_tells_zeros_from_infinite_and_says_why_it_is_empty(tmp_path):
    """bound_modes.png drew modes whose median bound is 0 white like +inf ones and counted the +inf alone in a
    title cut off at the figure's edge; with no median finite and above 0 it drew empty axes with no word.
    The medians np.median takes of the bounds are the oracle of the counts the figure's texts give."""
    std = np.full((3, 1, 4, 4), 2.0)
    std[:, :, 2:, :] = 0.0          # 8 modes that bound nothing
    std[:, :, 0, 0] = np.inf        # 1 mode with D = 0
    std[1, :, 1, 1] = np.inf        # one example's +inf: the median stays finite
    cases = {"mixed": std, "all zero": np.zeros((3, 2, 4, 4)), "all inf": np.full((3, 1, 4, 4), np.inf),
             "zero and inf": np.where(np.arange(4)[:, None] < 2, np.inf, 0.0) * np.ones((3, 1, 4, 4)),
             "all positive": np.random.default_rng(0).lognormal(size=(3, 1, 4, 4))}
    for name, bounds in cases.items():
        path = tmp_path / f"{name}.png"
        texts = report._modes_figure(path, bounds, 2)
        assert path.stat().st_size > 1000, name
        median = np.median(bounds, axis=0).mean(axis=0)
        zero, inf = int((median == 0).sum()), int(np.isinf(median).sum())
        positive = median.size - zero - inf
        assert (texts["zero_modes"], texts["infinite_modes"], texts["positive_modes"]) == (zero, inf, positive), name
        # each kind in its own colour, counted apart in the legend
        assert texts["legend"] == ([f"median 0 (bounds nothing): {zero}"] if zero else []) + (
            [f"median +∞ (D = 0): {inf}"] if inf else []), name
        # the title in short lines (the one cut off ran 68 characters a line)
        assert all(len(line) <= 48 for line in texts["title"].splitlines()), texts["title"]
        if positive:
            assert texts["notes"] == [], name
        else:   # nothing to colour: the figure says why
            note = texts["notes"][0].replace("\n", " ")
            assert f"No mode's median bound is finite and above 0: of the {median.size} modes," in note, name
            assert (f"{zero} are 0 (they bound nothing)" in note) == bool(zero), name
            assert (f"{inf} are +∞ (D = 0)" in note) == bool(inf), name
    assert cases["mixed"] is std and report._modes_figure(tmp_path / "m.png", std, 2)["legend"] == [
        "median 0 (bounds nothing): 8", "median +∞ (D = 0): 1"]   # (counted by hand: rows 2, 3 and mode (0, 0))


def test_the_report_says_which_steps_its_bounds_are_the_largest_over(first, tmp_path):
    """The note under the bounds' table said "Bounds are the maximum over the R restarts" whatever ran: by
    default every iterate of each restart and the singular steps bound the modes. The run's command (TINY: 2
    restarts, 2 iterations, LSQR so no singular steps, iterates "all" by default) is the oracle."""
    s = json.loads((first / "summary.json").read_text())
    page = unescape((first / "report.html").read_text())
    assert "maximum over the R restarts" not in page
    assert ("Each bound is the largest, per mode, over every iterate ε(1) … ε(2) of each of the R = 2 restarts; "
            "the MSE bound of eq. 6 is (1/p)‖ε‖²/D of the step with the largest (of any restart and iterate)"
            in page)
    # the same run's summary as Algorithm 1's last iterates alone with 64 singular steps would have said it
    page = unescape(report.write_html(tmp_path / "report.html", dict(s, iterates="last", singular_steps=64),
                                           {}).read_text())
    assert ("Each bound is the largest, per mode, over the last iterate ε(2) of each of the R = 2 restarts and 64 "
            "singular steps per example (each direction with both signs); the MSE bound of eq. 6 is (1/p)‖ε‖²/D "
            "of the best restart" in page)


def test_a_median_bound_past_the_pixels_range_says_it_rules_out_unbiased_estimators_only(first, tmp_path):
    """`reproduce digits` printed a median bound of 32.36 (12.2 in [0, 1] pixel units) without a word that such a
    bound, 12x the pixels' whole range, rules out unbiased reconstruction only: an estimator that clips to [0, 1]
    is biased, and errs by less than 1 on every pixel. The oracle is bounds.npz's own bounds times the channel's
    std, and a summary rewritten to either side of 1."""
    s = json.loads((first / "summary.json").read_text())
    std = _arrays(first / "bounds.npz")["std"]
    px = float(np.median(std * np.asarray(s["normalization"]["std"]).reshape(1, -1, 1, 1)))
    assert s["bounds_pixel_units"]["q50"] == pytest.approx(px)
    for median, said in ((12.2, True), (0.97, False), (math.inf, False)):
        ran = dict(s, bounds_pixel_units=dict(s["bounds_pixel_units"], q50=median))
        line = reproduce._beyond_range(ran)
        page = unescape(report.write_html(tmp_path / "report.html", ran, {}).read_text())
        if said:
            assert line == (" (12.2 in [0, 1] pixel units, 12.2x the pixels' whole range: no unbiased estimator "
                            "comes near the images, but a biased one, one that clips to [0, 1] or uses a prior "
                            "over the images, can)")
            assert ("That is 12.2× the pixels' whole range: no unbiased estimator comes near the images, but a "
                    "biased one (one that clips to [0, 1], or uses a prior over the images) can." in page)
        else:
            assert line == "" and "whole range" not in page


def test_targets_report_the_gain_over_algorithm_1(tmp_path, weights):
    out = tmp_path / "targeted"
    assert cli.main(["reproduce", "digits", *TINY, "--weights", str(weights), "--out", str(out),
                     "--targets", "low:2", "--no-progress"]) == 0
    arrays = _arrays(out / "bounds.npz")
    std, alg1 = arrays["std"], arrays["std_algorithm1"]
    assert np.all(std >= alg1)
    low = np.zeros(std.shape[1:], dtype=bool)
    low[:, :2, :2] = True
    assert np.any(std[:, ~low] > alg1[:, ~low])  # the targeted steps bound the untargeted modes they move too
    summary = json.loads((out / "summary.json").read_text())
    tg = summary["targeted"]
    assert tg["targets"] == "low:2"
    np.testing.assert_allclose(tg["modes_lifted_fraction"], np.mean(std > alg1))
    assert "--targets low:2" in summary["command"]
    assert "Targeted bounds (low:2)" in (out / "report.html").read_text()
    assert summary["infinite"]["targeted_steps"] == int((np.isinf(std) & ~np.isinf(alg1)).sum())
    # With LSQR (TINY's --lsqr-* options) no singular steps are taken: the gains are over Algorithm 1's
    assert summary["solver"] == "lsqr" and summary["singular_steps"] == 0
    assert tg["baseline"] == "Algorithm 1's bounds"
    # Bounds.load keeps Algorithm 1's bounds beside the larger ones, and its summary says which are which
    assert (f"targeted bounds folded in: the bounds above are the larger of Algorithm 1's bounds (.std_algorithm1) "
            f"and the targeted ones, which lifted {np.mean(std > alg1):.1%} of them"
            in hcrfast.Bounds.load(out / "bounds.npz").summary())
    # The dense solve takes the default's 64 singular steps (8x8 digits: n = p = 64): the bounds without the
    # targeted steps hold theirs, the gains are over those, and summary.json, the report and Bounds.summary()
    # say so, not "Algorithm 1's"
    dense = tmp_path / "targeted_dense"
    assert cli.main(["reproduce", "digits", "--examples", "4", "--restarts", "2", "--iterations", "2",
                     "--solver", "dense", "--weights", str(weights), "--out", str(dense), "--targets", "low:2",
                     "--no-progress"]) == 0
    summary = json.loads((dense / "summary.json").read_text())
    arrays = _arrays(dense / "bounds.npz")
    std, without = arrays["std"], arrays["std_algorithm1"]
    assert summary["singular_steps"] == 64
    assert summary["targeted"]["baseline"] == "the bounds of Algorithm 1 and the 64 singular steps"
    assert "above the bounds of Algorithm 1 and the 64 singular steps; gain" in (dense / "report.html").read_text()
    # the report's note names every step its bounds are the largest over (it said "the maximum over the R restarts")
    assert ("Each bound is the largest, per mode, over every iterate ε(1) … ε(2) of each of the R = 2 restarts, 64 "
            "singular steps per example (each direction with both signs) and the targeted steps"
            in unescape((dense / "report.html").read_text()))
    assert (f"targeted bounds folded in: the bounds above are the larger of the bounds of Algorithm 1 and the 64 "
            f"singular steps (.std_algorithm1) and the targeted ones, which lifted {np.mean(std > without):.1%} of them"
            in hcrfast.Bounds.load(dense / "bounds.npz").summary())
    # and the bounds without the targeted steps are those of the same run without them (the singular steps in)
    plain = tmp_path / "plain_dense"
    assert cli.main(["reproduce", "digits", "--examples", "4", "--restarts", "2", "--iterations", "2",
                     "--solver", "dense", "--weights", str(weights), "--out", str(plain), "--no-progress"]) == 0
    np.testing.assert_array_equal(without, _arrays(plain / "bounds.npz")["std"])
    with pytest.raises(ValueError, match="low"):
        reproduce.run("digits", examples=4, weights=str(weights), out=tmp_path / "bad", targets="low:99",
                      progress=False)


def test_singular_steps_raise_the_bounds_are_keyed_and_need_an_exact_solve(tmp_path, weights, capsys):
    """--singular-steps 8: bound(singular_steps=8)'s bounds, no mode below the plain run's, some above; the
    command names it; the same folder without it is another run (refused); with LSQR it is refused before
    anything is trained or made."""
    small = ["--examples", "4", "--restarts", "2", "--iterations", "2", "--chunk-examples", "4",
             "--weights", str(weights), "--no-progress"]
    assert cli.main(["reproduce", "digits", *small, "--out", str(tmp_path / "plain"), "--singular-steps", "0"]) == 0
    assert cli.main(["reproduce", "digits", *small, "--out", str(tmp_path / "sing"), "--singular-steps", "8"]) == 0
    plain, sing = _arrays(tmp_path / "plain" / "bounds.npz")["std"], _arrays(tmp_path / "sing" / "bounds.npz")["std"]
    assert np.all(sing >= plain) and np.any(sing > plain)
    summary = json.loads((tmp_path / "sing" / "summary.json").read_text())
    assert "--singular-steps 8" in summary["command"] and summary["singular_steps"] == 8
    assert "8 certified steps along J's smallest singular directions" in (tmp_path / "sing" / "report.html").read_text()
    assert "singular directions" not in (tmp_path / "plain" / "report.html").read_text()
    assert json.loads((tmp_path / "sing" / "run.json").read_text())["key"]["singular_steps"] == 8
    # their account, summed over the chunks: the (example, mode) bounds above the plain run's (the steps leave
    # Algorithm 1's part as it was), in summary.json and in the summary of the run's Bounds
    lifted = summary["singular_steps_lifted"]
    assert lifted["examples"] == 4 and lifted["modes_lifted"] == int((sing > plain).sum()) and lifted["seconds"] > 0
    assert (f"they raised {int((sing > plain).sum()):,} of the {sing.size:,} (example, mode) bounds above "
            f"Algorithm 1's" in (tmp_path / "sing" / "report.html").read_text())
    loaded = hcrfast.Bounds.load(tmp_path / "sing" / "bounds.npz")
    assert (f"singular steps: 8 per example along J's smallest singular directions, each certified with both signs; "
            f"they raised {int((sing > plain).sum()):,} of the {sing.size:,} (example, mode) bounds") in loaded.summary()
    loaded.params["singular_steps"] = 8   # as runs made before the account was kept wrote it: still summarized
    assert "singular steps: 8 per example along J's smallest singular directions, each certified with both " \
           "signs\n" in loaded.summary() + "\n"
    assert reproduce._singular_account(8, [{"singular": np.array([4.0, 9.0, 0.5])}, {}]) is None  # an older chunk
    assert reproduce._singular_account(0, []) is None
    # none is spelt out in the command (the default would take 64), and the default's 64 are keyed as such
    assert "--singular-steps 0" in json.loads((tmp_path / "plain" / "summary.json").read_text())["command"]
    assert cli.main(["reproduce", "digits", *small, "--out", str(tmp_path / "auto")]) == 0
    auto = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert auto["singular_steps"] == 64 and "--singular-steps 64" in auto["command"]
    assert json.loads((tmp_path / "auto" / "run.json").read_text())["key"]["singular_steps"] == 64
    assert np.all(_arrays(tmp_path / "auto" / "bounds.npz")["std"] >= plain)
    capsys.readouterr()
    assert cli.main(["reproduce", "digits", *small, "--out", str(tmp_path / "sing")]) == 2
    assert "singular_steps" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--singular-steps 4 takes J's smallest singular directions"):
        reproduce.run("digits", examples=4, weights=str(weights), out=tmp_path / "lsqr", solver="lsqr",
                      singular_steps=4, progress=False)
    assert not (tmp_path / "lsqr").exists()


def test_solver_is_resolved_into_the_run_key_and_never_mixed(weights, tmp_path, capsys):
    """Without --lsqr-* options, digits (64 inputs, CPU) runs the dense solve; the resolved solver
    is part of the key, so a rerun that asks for LSQR in the same folder is refused."""
    out = tmp_path / "dense"
    small = ["--examples", "4", "--restarts", "2", "--iterations", "2", "--chunk-examples", "4"]
    assert cli.main(["reproduce", "digits", *small, "--out", str(out), "--weights", str(weights),
                     "--no-progress"]) == 0
    assert json.loads((out / "run.json").read_text())["key"]["solver"] == "dense"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["solver"] == "dense" and "--solver dense" in summary["command"]
    assert "--lsqr-" not in summary["command"]  # the dense solve runs no LSQR: rerun, they would warn as unused
    with warnings.catch_warnings():   # (hcrfast's own: matplotlib 3.8 with pyparsing 3.3 warns of its own calls)
        warnings.simplefilter("error", hcrfast.HcrfastWarning)
        assert cli.main(shlex.split(summary["command"])[1:] + ["--no-progress"]) == 0  # resumes: same key
    assert summary["lsqr"]["istop_counts"] == {"-1": 4 * 2 * 2} and "dense" in summary["lsqr"]["istop_meaning"]["-1"]
    page = (out / "report.html").read_text()
    assert "<h2>Solver</h2>" in page and "no LSQR ran" in page and "<h2>LSQR</h2>" not in page
    code = cli.main(["reproduce", "digits", *small, "--solver", "lsqr", "--out", str(out), "--weights", str(weights)])
    assert code == 2 and "solver: 'dense' -> 'lsqr'" in capsys.readouterr().err.replace('"', "'")
    code = cli.main(["reproduce", "digits", *small, "--solver", "dense", "--linearize-at", "current",
                     "--out", str(tmp_path / "bad"), "--weights", str(weights)])
    assert code == 2 and "--linearize-at input" in capsys.readouterr().err


def test_krylov_solver_runs_with_its_own_stopping_rules(weights, tmp_path):
    """--solver krylov: the run key holds hcrfast.krylov.DEFAULT_OPTIONS (not DEFAULT_LSQR's pilot tolerance),
    the basis' steps sit at restart 0, iteration 0 of each example, every other step is a projection (-2)."""
    out = tmp_path / "krylov"
    small = ["--examples", "4", "--restarts", "2", "--iterations", "2", "--chunk-examples", "4"]
    assert cli.main(["reproduce", "digits", *small, "--solver", "krylov", "--out", str(out), "--weights", str(weights),
                     "--no-progress"]) == 0
    key = json.loads((out / "run.json").read_text())["key"]
    assert key["solver"] == "krylov" and key["lsqr"]["atol"] == 0 and key["lsqr"]["conlim"] == 0
    assert key["krylov_pilots"] == 1
    # an option given equal to DEFAULT_LSQR's value is still given: the basis stops by it
    out_atol = tmp_path / "krylov_atol"
    assert cli.main(["reproduce", "digits", *small, "--solver", "krylov", "--lsqr-atol", "1e-5", "--out",
                     str(out_atol), "--weights", str(weights), "--no-progress"]) == 0
    assert json.loads((out_atol / "run.json").read_text())["key"]["lsqr"]["atol"] == 1e-5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lsqr"]["istop_counts"]["-2"] == 4 * (2 * 2 - 1)
    assert "Krylov basis" in (out / "report.html").read_text()
    # two pilots: a basis per restart here (R = 2), in the key and the command that repeats the run
    out2 = tmp_path / "krylov2"
    assert cli.main(["reproduce", "digits", *small, "--solver", "krylov", "--krylov-pilots", "2", "--out", str(out2),
                     "--weights", str(weights), "--no-progress"]) == 0
    assert json.loads((out2 / "run.json").read_text())["key"]["krylov_pilots"] == 2
    summary2 = json.loads((out2 / "summary.json").read_text())
    assert "--krylov-pilots 2" in summary2["command"] and summary2["lsqr"]["istop_counts"]["-2"] == 4 * (2 * 2 - 2)
    for bad, msg in ((["--solver", "dense", "--krylov-pilots", "2"], "--krylov-pilots 2 applies"),
                     (["--solver", "krylov", "--krylov-pilots", "3"], "exceeds --restarts 2")):
        with pytest.raises(ValueError, match=msg):
            reproduce.run("digits", examples=4, restarts=2, iterations=2, weights=str(weights),
                          out=tmp_path / "bad", progress=False, solver=bad[1],
                          krylov_pilots=int(bad[3]))



def test_krylov_pilots_auto_is_resolved_into_the_key_and_the_command(weights, tmp_path, monkeypatch, capsys):
    """--krylov-pilots auto: on digits (64 inputs) one basis exhausts the space, so the key is the default
    run's (1 pilot, no iter_lim); with MAX_STEPS = 8 it splits into 2 pilots of 4 steps, which the key and
    the command spell out, and that command resumes the run (every chunk read back)."""
    small = ["--examples", "4", "--restarts", "2", "--iterations", "2", "--chunk-examples", "2", "--solver", "krylov",
             "--weights", str(weights), "--no-progress"]
    out = tmp_path / "auto"
    assert cli.main(["reproduce", "digits", *small, "--krylov-pilots", "auto", "--out", str(out)]) == 0
    key = json.loads((out / "run.json").read_text())["key"]
    assert key["krylov_pilots"] == 1 and key["lsqr"]["iter_lim"] is None
    monkeypatch.setattr(hcrfast.krylov, "MAX_STEPS", 8)
    monkeypatch.setattr(hcrfast.krylov, "AUTO_PILOT_STEPS", 4)
    out2 = tmp_path / "auto_split"
    assert cli.main(["reproduce", "digits", *small, "--krylov-pilots", "auto", "--out", str(out2)]) == 0
    key = json.loads((out2 / "run.json").read_text())["key"]
    assert key["krylov_pilots"] == 2 and key["lsqr"]["iter_lim"] == 4
    command = json.loads((out2 / "summary.json").read_text())["command"]
    assert "--krylov-pilots 2" in command and "--lsqr-iter-lim 4" in command
    assert "2 reorthogonalized LSQRs (pilots) per example" in (out2 / "report.html").read_text()
    capsys.readouterr()
    assert cli.main(command.split()[1:] + ["--weights", str(weights), "--no-progress"]) == 0
    assert json.loads((out2 / "summary.json").read_text())["timings"]["chunks_reused"] == 2
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            cli.main(["reproduce", "digits", *small, "--krylov-pilots", bad, "--out", str(tmp_path / "bad")])
        assert "pass a positive integer or 'auto'" in capsys.readouterr().err


def test_the_command_recorded_names_the_threads_that_ran(weights, tmp_path):
    """Runs that differ in --threads differ in the last bits of their bounds: summary.json's "command" says
    --threads with the count that ran (given on the command line, or torch's as a Python caller left it), and
    "threads" is that count, an int."""
    def command(out):
        s = json.loads((out / "summary.json").read_text())
        assert type(s["threads"]) is int
        words = shlex.split(s["command"])
        return s["threads"], words[words.index("--threads") + 1], s["command"].replace(str(out), "OUT")

    small = ["--examples", "4", "--restarts", "2", "--iterations", "2", "--chunk-examples", "4", "--no-progress",
             "--weights", str(weights)]
    for t in (1, 2):
        assert cli.main(["reproduce", "digits", *small, "--threads", str(t), "--out", str(tmp_path / f"t{t}")]) == 0
    one, two = command(tmp_path / "t1"), command(tmp_path / "t2")
    assert one[:2] == (1, "1") and two[:2] == (2, "2") and one[2] != two[2]
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:   # no --threads: the Python API at the caller's count
        reproduce.run("digits", examples=4, restarts=2, iterations=2, chunk_examples=4, weights=str(weights),
                      out=tmp_path / "api", progress=False)
    finally:
        torch.set_num_threads(saved)
    assert command(tmp_path / "api") == two


def test_a_resume_with_other_threads_warns_that_the_bounds_are_no_longer_bitwise(weights, tmp_path, capsys):
    out = tmp_path / "threads"
    base = ["reproduce", "digits", *TINY, "--weights", str(weights), "--out", str(out)]
    assert cli.main(base + ["--threads", "1"]) == 0
    first = json.loads((out / "summary.json").read_text())["device"]
    assert first.endswith("torch threads 1)") and f"<td class=\"\">{first}</td>" in (out / "report.html").read_text()
    assert cli.main(base + ["--threads", "2"]) == 0      # reads every chunk back: the bounds are the first run's
    now = json.loads((out / "summary.json").read_text())["device"]
    assert now.endswith("torch threads 2)")
    assert json.loads((out / "summary.json").read_text())["threads"] == 2
    assert f"<td class=\"\">bounds computed on {first}; this run: {now}</td>" in (out / "report.html").read_text()
    (out / "chunks" / "chunk_00001.npz").unlink()
    with pytest.warns(UserWarning, match=r"chunks were computed with different arithmetic .*torch threads 1\).*"
                                         r"torch threads 2\).*not bitwise"):
        assert cli.main(base + ["--threads", "2"]) == 0
    arithmetic = json.loads((out / "summary.json").read_text())["chunks_arithmetic"]
    assert len(arithmetic) == 2 and all("torch threads" in a for a in arithmetic)
    assert (f"<td class=\"\">bounds computed on {'; '.join(arithmetic)} (chunks of different arithmetic: they agree to "
            f"rounding, not bitwise); this run: {now}</td>") in (out / "report.html").read_text()


def test_bounds_npz_records_the_run_and_says_where_resumed_chunks_differ(weights, tmp_path):
    """hcrfast.bound's results carried params["run"] (ids, chunk size, torch threads, versions); reproduce's
    bounds.npz none. It records the ids of every example and --chunk-examples, and the chunks' threads and versions
    where they agree; a chunk computed again at other threads makes torch_threads None, listed in "differ", and one
    from before chunks recorded it (no "run") makes every entry unknown."""
    import hashlib

    out = tmp_path / "run"
    base = ["reproduce", "digits", "--examples", "5", "--restarts", "2", "--iterations", "2", "--chunk-examples",
            "2", "--no-progress", "--weights", str(weights), "--out", str(out)]
    assert cli.main(base + ["--threads", "1"]) == 0
    run = hcrfast.Bounds.load(out / "bounds.npz").params["run"]
    ids = dict(count=5, first=0, last=4, sha256=hashlib.sha256(np.arange(5, dtype="<i8").tobytes()).hexdigest()[:16],
               ids=[0, 1, 2, 3, 4])
    assert run["example_ids"] == ids and run["chunk_examples"] == 2
    assert run["chunk_size"] == 2 and run["torch_threads"] == 1 and "differ" not in run   # (the last chunk: 1, whole)
    assert run["versions"]["torch"] == torch.__version__ and run["versions"]["hcrfast"] == hcrfast.__version__
    assert json.loads((out / "summary.json").read_text())["run"] == run
    ours = ", ".join(f"{k} {v}" for k, v in run["versions"].items() if v is not None)
    assert f"versions the bounds were computed with</td><td class=\"\">{ours} (every chunk)</td>" in unescape(
        (out / "report.html").read_text())
    loaded = hcrfast.Bounds.load(out / "bounds.npz")
    other = hcrfast.Bounds.load(out / "bounds.npz")
    other.params["run"] = dict(run, torch_threads=64)
    assert other == loaded   # recorded, not compared

    (out / "chunks" / "chunk_00001.npz").unlink()
    with pytest.warns(UserWarning, match="different arithmetic"):
        assert cli.main(base + ["--threads", "2"]) == 0
    run = hcrfast.Bounds.load(out / "bounds.npz").params["run"]
    assert run["torch_threads"] is None and run["differ"] == dict(torch_threads=[1, 2])
    assert run["example_ids"] == ids and run["chunk_size"] == 2

    chunk = out / "chunks" / "chunk_00002.npz"   # as a chunk written before chunks recorded their run
    arrays = _arrays(chunk)
    del arrays["run"]
    np.savez(chunk, **arrays)
    with pytest.warns(UserWarning, match="different arithmetic"):   # (chunk 0's threads still differ)
        assert cli.main(base + ["--threads", "2"]) == 0
    run = hcrfast.Bounds.load(out / "bounds.npz").params["run"]
    assert run["versions"] is None and run["differ"]["versions"][-1] is None and run["example_ids"] == ids
    # the report says the chunks' versions, not this session's alone (it showed those whatever the chunks recorded)
    page = unescape((out / "report.html").read_text())
    ours = ", ".join(f"{k} {v}" for k, v in run["differ"]["versions"][0].items() if v is not None)
    assert (f"versions the bounds were computed with</td><td class=\"\">the chunks differ, 2 sets: ({ours}); (not "
            f"recorded (chunks written before chunks recorded them))</td>") in page


def test_restarts_whose_eps_came_out_0_are_counted_apart_from_infinite_bounds(weights, tmp_path, monkeypatch):
    """A restart with eps = 0 has D = 0 but proves no +inf: the summary counts it under zero_steps
    (it used to count as a restart with infinite bounds), and a resumed run still knows it. (--last-iterate: with
    every iterate certified, a restart whose earlier iterates moved bounds by them, and is not lost.)"""
    from hcrfast import algorithm

    real = algorithm._certified_shift

    def first_row_lost(model64, rows, eps):  # restart 0 of each chunk's first example
        eps = eps.copy()
        eps[0] = 0
        return real(model64, rows, eps)

    monkeypatch.setattr(algorithm, "_certified_shift", first_row_lost)
    out = tmp_path / "zero"
    argv = ["reproduce", "digits", *TINY, "--out", str(out), "--weights", str(weights), "--no-progress",
            "--last-iterate"]
    for run in range(2):  # the second run reads every chunk back
        if run == 0:
            with pytest.warns(UserWarning, match="restarts' eps came out 0"):  # hcrfast.bound's, per chunk
                assert cli.main(argv) == 0
        else:
            assert cli.main(argv) == 0
        s = json.loads((out / "summary.json").read_text())
        assert s["timings"]["chunks_reused"] == (0, 3)[run]
        assert {k: v for k, v in s["zero_steps"].items() if k != "reason"} == {
            "restarts": 3, "eps_zero": 3, "at_zero_jacobian": 0, "rounded": 0, "coarse": 0, "rounding": 0,
            "uncertified": 0, "d_overflow": 0, "examples_affected": 3, "examples_bounding_nothing": 0}
        assert s["infinite"]["restarts_with_zero_divergence"] == 0 and s["infinite"]["coordinates"] == 0
        assert _arrays(out / "bounds.npz")["infinite"].shape == (0, 2)
        assert ("3 restarts in 3 examples bound nothing (0) by their last iterate: 3 because their eps came out 0"
                in (out / "report.html").read_text())


def test_a_sigma_float64_cannot_resolve_is_reported_as_bounding_nothing(weights, tmp_path, capsys):
    """At --sigma-scale 1e-11 every step's shift is below float64's resolution of the digits model's
    features (or too coarse for D): every bound is 0. The outputs say so and why (they said 'median
    bound 0' with the reason of an eps that came out 0, and 'the other restarts still bound it')."""
    out = tmp_path / "tiny"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hcrfast.bound's own warnings, per chunk
        assert cli.main(["reproduce", "digits", *TINY, "--solver", "dense", "--sigma-scale", "1e-11",
                         "--singular-steps", "0", "--out", str(out), "--weights", str(weights)]) == 0
    s = json.loads((out / "summary.json").read_text())
    std = _arrays(out / "bounds.npz")["std"]
    assert s["bounds"]["zero"] == int((std == 0).sum()) == std.size  # the oracle: the saved bounds
    assert {k: s["zero_steps"][k] for k in ("restarts", "rounding", "eps_zero", "examples_bounding_nothing")} == {
        "restarts": 20, "rounding": 20, "eps_zero": 0, "examples_bounding_nothing": 10}
    assert "float64 could not" in s["zero_steps"]["reason"] and "still bound" not in s["zero_steps"]["reason"]
    # the two kinds float64's rounding leaves, counted apart, as bound() names them (its reasons, kept in bounds.npz)
    reasons = hcrfast.Bounds.load(out / "bounds.npz").params["zero_step_reasons"]
    assert len(reasons) == 20
    for kind, marker in (("rounded", "below float64's resolution"), ("coarse", "within float64's rounding")):
        assert s["zero_steps"][kind] == sum(marker in r for r in reasons)
    assert f"({std.size:,} of {std.size:,} bounds are 0, which bounds nothing" in capsys.readouterr().err
    assert f"{std.size:,} of the {std.size:,} bounds are 0, which bounds nothing" in (out / "report.html").read_text()
    # at 3e-10 the shifts are resolved, but only to ~1e-4 of D: kept, and said so beside the warning
    out = tmp_path / "rough"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["reproduce", "digits", *TINY, "--solver", "dense", "--sigma-scale", "3e-10",
                         "--singular-steps", "0", "--out", str(out), "--weights", str(weights), "--no-progress"]) == 0
    rough = json.loads((out / "summary.json").read_text())
    assert rough["zero_steps"]["restarts"] == 0 and rough["bounds"]["zero"] == 0
    assert rough["rounding"]["restarts"] == 20 and 1e-6 < rough["rounding"]["worst_relative_error"] < 1e-3
    assert "20 restarts are exact only to float64's rounding" in (out / "report.html").read_text()
    # with singular steps, theirs are counted apart: the restarts' count stays the restarts'
    out = tmp_path / "rough_steps"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["reproduce", "digits", *TINY, "--solver", "dense", "--sigma-scale", "3e-10",
                         "--singular-steps", "4", "--out", str(out), "--weights", str(weights), "--no-progress"]) == 0
    steps = json.loads((out / "summary.json").read_text())["rounding"]
    assert steps["restarts"] == 20 and 0 < steps["singular_steps"] <= 10 * 4 * 2
    assert f"{steps['singular_steps']:,} singular steps (counted apart" in (out / "report.html").read_text()
    out = tmp_path / "tiny"
    loaded = hcrfast.Bounds.load(out / "bounds.npz").summary()  # the zero steps' reasons travel with the bounds
    assert "20 restarts bound nothing (0): 20 float64's rounding" in loaded and "no restart moved them" not in loaded


def test_dense_solve_names_the_lsqr_options_it_does_not_use(weights, tmp_path):
    """--solver dense with --lsqr-atol: one warning naming it; the chunks' bound calls raise none of their own."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["reproduce", "digits", *TINY, "--solver", "dense", "--out", str(tmp_path / "d"),
                         "--weights", str(weights)]) == 0
    said = [str(w.message) for w in caught if "runs no LSQR" in str(w.message)]
    assert len(said) == 1 and "go unused: --lsqr-atol" in said[0], said


@pytest.mark.parametrize("argv,error", [
    (["digits", "--targets", "low:0"], r"K must lie in 1\.\.8"),  # before the digits model is trained
    (["digits", "--krylov_pilots", 5, "--restarts", 2, "--solver", "krylov"], r"--krylov-pilots 5 exceeds --restarts 2"),
    (["digits", "--krylov_pilots", 2, "--restarts", 2], r"--krylov-pilots 2 applies to the Krylov solver, .*'dense'"),
    (["mnist"], r"mnist needs trained weights"),
    (["digits", "--weights", "default"], r"--weights default exists only for resnet18 and swin_t"),
    (["cifar10", "--weights", "no/such/file.pt"], r"No weights file at"),
])
def test_refused_arguments_leave_nothing_behind(argv, error, tmp_path):
    """Arguments that need no model or data are refused before the run folder is made or a model trained."""
    out = tmp_path / "run"
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        reproduce.run(argv[0], out=out, **dict(zip((a.lstrip("-") for a in argv[1::2]), argv[2::2])))
    assert not out.exists()


def test_summary_statistics_against_numpy():
    """summary.json's statistics, from arrays with zeros and infinities, against NumPy on the raw values."""
    values = np.array([0.0, 1.0, 2.0, np.inf, 3.0, 10.0, np.inf, 0.5])
    finite = values[np.isfinite(values)]
    q = reproduce._quantiles(values)
    for p in (5, 25, 50, 75, 95):
        assert q[f"q{p}"] == pytest.approx(np.percentile(finite, p), rel=1e-15)
    assert (q["min"], q["max"], q["finite"], q["zero"], q["infinite"]) == (0.0, 10.0, 6, 1, 2)
    assert q["mean"] == pytest.approx(finite.mean(), rel=1e-15)
    assert reproduce._quantiles(np.full(3, np.inf)) == {"q5": None, "q25": None, "q50": None, "q75": None,
                                                         "q95": None, "finite": 0, "zero": 0, "infinite": 3}

    itn = np.array([[[3, 5], [7, 30]], [[1, 1], [2, 9]]])
    istop = np.array([[[1, 2], [1, 7]], [[1, 1], [2, 7]]])
    s = reproduce._lsqr_stats(itn, istop)
    assert s["solves"] == 8 and s["iterations_total"] == int(itn.sum()) and s["iterations_max"] == 30
    assert s["iterations_median"] == float(np.median(itn)) and s["iterations_mean"] == pytest.approx(itn.mean())
    assert s["istop_counts"] == {"1": 4, "2": 2, "7": 2}
    assert set(s["istop_meaning"]) == {"1", "2", "7"} and "?" not in s["istop_meaning"].values()

    alg1 = np.array([1.0, 2.0, 0.0, 4.0, np.inf, 3.0])
    std = np.array([2.0, 2.0, 5.0, 6.0, np.inf, np.inf])
    t = reproduce._targeted_stats("low:2", std, alg1)
    ok = np.isfinite(std) & np.isfinite(alg1) & (alg1 > 0)       # gains of finite, non-zero bounds: [2, 1, 1.5]
    lifted = std > alg1                                           # 0 -> 5 and 3 -> inf lift too, without a gain
    assert t["targets"] == "low:2" and t["modes_lifted_fraction"] == pytest.approx(lifted.mean())
    g = t["gain_over_algorithm1_all_modes"]
    assert {k: g[k] for k in reproduce._quantiles(std[ok] / alg1[ok])} == reproduce._quantiles(std[ok] / alg1[ok])
    assert g["finite"] == 3 and g["infinite"] == 0
    # the pairs a ratio leaves out are counted, each once: 0 -> 5, 3 -> inf, inf -> inf
    assert (g["pairs"], g["from_zero_baseline_lifted"], g["from_zero_baseline_still_zero"],
            g["to_infinite_by_targeted"], g["infinite_both"]) == (6, 1, 0, 1, 1)
    assert g["finite"] + g["from_zero_baseline_lifted"] + g["to_infinite_by_targeted"] + g["infinite_both"] == 6
    assert t["gain_over_algorithm1_lifted_modes"]["q50"] == pytest.approx(np.median([2.0, 1.5]))
    assert t["bounds_algorithm1_only"] == reproduce._quantiles(alg1)
    assert t["baseline"] == "Algorithm 1's bounds"
    assert reproduce._targeted_stats("low:2", std, alg1, 8)["baseline"] == \
        "the bounds of Algorithm 1 and the 8 singular steps"
    assert reproduce._targeted_stats(None, std, alg1) is None


def test_steps_that_followed_float32_rounding_are_counted_in_the_summary_also_on_resume(weights, tmp_path, capsys):
    """At --sigma-scale 1e-4 the digits model's float32 shifts are mostly its rounding, which then sets Algorithm 1's
    next steps: hcrfast.bound warns of it per chunk, but the run's summary, report and closing line did not say it,
    and a resume (every chunk reused, bound not called) said nothing at all. The count is the warnings' own total."""
    out = tmp_path / "drift"
    args = ["reproduce", "digits", *TINY, "--solver", "dense", "--sigma-scale", "1e-4", "--singular-steps", "0",
            "--out", str(out), "--weights", str(weights)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(args) == 0
    said = [str(w.message) for w in caught if "strayed from the float64 ones" in str(w.message)]
    warned = sum(int(m.split(" restarts'")[0]) for m in said)
    assert warned > 0
    first = json.loads((out / "summary.json").read_text())["rounding"]
    assert first["dtype_drift"] == warned and first["worst_dtype_drift"] > 0.1
    line = f"({warned:,} restarts' steps followed the model's rounding: see summary.json's rounding.dtype_drift)"
    assert line in capsys.readouterr().err
    assert f"{warned:,} restarts' steps followed the model's rounding: these restarts&#x27;" in (out / "report.html").read_text()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(args) == 0   # a resume: every chunk reused
    assert not [w for w in caught if "strayed" in str(w.message)]
    assert json.loads((out / "summary.json").read_text())["rounding"] == first
    assert line in capsys.readouterr().err


def test_zero_steps_summary_counts_kinds_examples_and_whole_examples():
    # (example, restart, kind): example 0 loses both of its 2 restarts, examples 3 and 5 one each
    zero_steps = np.array([[0, 0, 0], [0, 1, 2], [3, 1, 1], [5, 0, 4]])
    s = reproduce._zero_steps_summary(zero_steps, restarts=2)
    assert {k: v for k, v in s.items() if k != "reason"} == {
        "restarts": 4, "eps_zero": 1, "at_zero_jacobian": 1, "rounded": 1, "coarse": 1, "rounding": 2,
        "uncertified": 0, "d_overflow": 0, "examples_affected": 3, "examples_bounding_nothing": 1}
    assert "1 because float64 could not resolve" in s["reason"] and "1 because float64 could not establish D" in s["reason"]
    assert "every restart of 1 example bounds nothing" in s["reason"] and "still bound" in s["reason"]
    every = reproduce._zero_steps_summary(np.array([[2, 0, 3], [2, 1, 3]]), restarts=2)
    assert every["examples_affected"] == 1 and every["examples_bounding_nothing"] == 1
    assert every["uncertified"] == 2 and "still bound" not in every["reason"]
    # restarts whose D overflowed to +inf (bound 0; not in the chunks' zero_steps) count as a kind of their own:
    # example 3's other restart overflows (it now bounds nothing at all), example 7's one restart of two
    mixed = reproduce._zero_steps_summary(zero_steps, restarts=2, overflowed=np.array([[3, 0], [7, 1]]))
    assert {k: mixed[k] for k in ("restarts", "d_overflow", "examples_affected", "examples_bounding_nothing")} == {
        "restarts": 6, "d_overflow": 2, "examples_affected": 4, "examples_bounding_nothing": 2}
    assert "2 because their last iterate's D overflowed to +inf" in mixed["reason"]
    # an example all of whose restarts are listed, but bounded by an earlier iterate or a singular step, is
    # not one that bounds nothing
    bounded = np.zeros(8, dtype=bool)
    bounded[3] = True   # example 3: both restarts listed (one rounded, one overflowed), bounded otherwise
    partly = reproduce._zero_steps_summary(zero_steps, restarts=2, overflowed=np.array([[3, 0], [7, 1]]),
                                           bounded=bounded)
    assert partly["examples_bounding_nothing"] == 1 and partly["restarts"] == 6
    # and the reason says what bounds it: not "the remaining restarts", which it has none of
    assert ("every restart's last iterate of 1 example bounds nothing, but an earlier iterate, a singular or a "
            "targeted step bounds it") in partly["reason"]
    assert "every restart's last iterate" not in mixed["reason"]
    assert "still bound them" in partly["reason"]   # example 5's and 7's other restarts do
    alone = reproduce._zero_steps_summary(np.array([[3, 0, 2], [3, 1, 2]]), restarts=2, bounded=bounded)
    assert alone["examples_bounding_nothing"] == 0 and "still bound them" not in alone["reason"]


def test_restarts_whose_d_overflowed_are_counted_among_those_that_bound_nothing(weights, tmp_path):
    """At --size 30 every restart's D overflows to +inf (bound 0): summary.json's zero_steps, the account of the
    restarts that bound nothing, left them out (0 restarts) while every bound was 0; they are its kind
    d_overflow, and divergence.infinite still counts them."""
    out = tmp_path / "overflow"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hcrfast.bound's "D(z) overflowed", per chunk
        assert cli.main(["reproduce", "digits", *TINY, "--size", "30", "--out", str(out), "--weights", str(weights),
                         "--no-progress"]) == 0
    s = json.loads((out / "summary.json").read_text())
    b = _arrays(out / "bounds.npz")
    overflowed = np.isposinf(b["divergence"])   # the oracle: the saved D
    assert overflowed.sum() == b["divergence"].size == 20 and (b["std"] == 0).all()
    zero = s["zero_steps"]
    assert zero["d_overflow"] == zero["restarts"] == s["divergence"]["infinite"] == int(overflowed.sum())
    assert zero["examples_affected"] == zero["examples_bounding_nothing"] == int(overflowed.all(axis=1).sum())
    assert zero["eps_zero"] == zero["rounding"] == 0 and s["infinite"]["restarts_with_zero_divergence"] == 0
    html = (out / "report.html").read_text().replace("&#x27;", "'")
    assert ("20 restarts in 10 examples bound nothing (0) by their last iterate: 20 because their last "
            "iterate's D overflowed to +inf" in html)


def test_summary_numbers_are_those_of_the_saved_arrays(first):
    """summary.json against bounds.npz and the chunks on disk: pixel units, MSE, LSQR and timings."""
    s = json.loads((first / "summary.json").read_text())
    b = _arrays(first / "bounds.npz")
    scale = np.asarray(s["normalization"]["std"]).reshape(1, -1, 1, 1)
    assert scale.ravel()[0] != 1.0 and s["normalization"]["mean"] != s["normalization"]["std"]
    assert s["bounds_pixel_units"]["q50"] == pytest.approx(np.median(b["std"] * scale), rel=1e-12)
    assert s["bounds_pixel_units"]["mean"] == pytest.approx(np.mean(b["std"] * scale), rel=1e-12)
    assert s["mse_bound"]["q50"] == pytest.approx(np.median(b["mse"]), rel=1e-12)
    per_mode = (b["std"].reshape(len(b["std"]), -1) ** 2).mean(axis=1)
    assert s["mse_bound_modes"]["q50"] == pytest.approx(np.median(per_mode), rel=1e-12)
    assert s["mse_bound_modes"]["min"] >= s["mse_bound"]["min"]
    assert s["divergence"]["mean"] == pytest.approx(np.mean(b["divergence"]), rel=1e-12)
    itn = b["lsqr_iterations"]
    assert (s["lsqr"]["iterations_total"], s["lsqr"]["iterations_max"]) == (int(itn.sum()), int(itn.max()))
    assert s["lsqr"]["iterations_median"] == float(np.median(itn))
    chunk_seconds = [float(_arrays(p)["seconds"]) for p in sorted((first / "chunks").glob("chunk_*.npz"))]
    assert len(chunk_seconds) == 3
    assert s["timings"]["bound_seconds_all_chunks"] == pytest.approx(sum(chunk_seconds), rel=1e-12)


def test_a_later_restart_that_bounds_nothing_is_not_counted_infinite(weights, tmp_path, monkeypatch):
    """As the eps-came-out-0 test, for the last restart of each chunk's last example (not restart 0); its only
    step (--last-iterate)."""
    from hcrfast import algorithm

    real = algorithm._certified_shift

    def last_row_lost(model64, rows, eps):
        eps = eps.copy()
        eps[-1] = 0
        return real(model64, rows, eps)

    monkeypatch.setattr(algorithm, "_certified_shift", last_row_lost)
    out = tmp_path / "zero_last"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["reproduce", "digits", *TINY, "--out", str(out), "--weights", str(weights),
                         "--no-progress", "--last-iterate"]) == 0
    s = json.loads((out / "summary.json").read_text())
    b = _arrays(out / "bounds.npz")
    assert s["zero_steps"]["restarts"] == s["zero_steps"]["eps_zero"] == 3
    lost = [(e, r) for e, r in zip(*np.nonzero(b["divergence"] == 0))]
    assert len(lost) == 3 and all(r == 1 for _, r in lost)  # the oracle: D = 0 at restart 1 of 3 examples
    assert s["infinite"]["restarts_with_zero_divergence"] == 0 and s["infinite"]["coordinates"] == 0
    assert b["infinite"].shape == (0, 2)
    # their stored D = 0 is no D of the features (that would make bounds +inf): the D quantiles leave them out
    kept = np.ones(b["divergence"].shape, dtype=bool)
    kept[tuple(np.array(lost).T)] = False
    assert s["divergence"]["restarts_bounding_nothing_left_out"] == 3 and s["divergence"]["zero"] == 0
    assert s["divergence"]["q50"] == pytest.approx(np.median(b["divergence"][kept]), rel=1e-12)
    assert s["divergence"]["finite"] == int(kept.sum())


def test_histogram_counts_zeros_left_out_only_on_a_log_axis(tmp_path):
    """Bounds within a decade: a linear axis shows the zeros, so none are left out; spanning more, they are."""
    narrow = np.array([0.0, 0.0, 1.0, 2.0, 3.0, np.inf])
    notes = report._histogram(tmp_path / "n.png", narrow, title="t", xlabel="x")
    assert notes == {"infinite_left_out": 1, "zeros_left_out": 0, "log_x": False}
    wide = np.array([0.0, 0.0, 0.01, 2.0, 3.0, np.inf])
    notes = report._histogram(tmp_path / "w.png", wide, title="t", xlabel="x")
    assert notes == {"infinite_left_out": 1, "zeros_left_out": 2, "log_x": True}


def test_a_sweep_is_one_run_per_sigma_each_the_run_alone(weights, tmp_path, capsys):
    """--sweep 0.5,2: each sigma is the run that --sigma-scale alone gives (bitwise bounds, the same
    accuracies), sweep.json and the page gather them, and a rerun computes nothing again."""
    out = tmp_path / "sweep"
    argv = ["reproduce", "digits", *TINY, "--weights", str(weights), "--sweep", "0.5,2", "--out", str(out),
            "--no-progress"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    s = json.loads((out / "sweep.json").read_text())
    assert [lv["scale"] for lv in s["levels"]] == [0.5, 2.0] and s["sigma_scale_unit"] == s["published_sigma_scale"]
    alone = tmp_path / "alone"
    assert cli.main(["reproduce", "digits", *TINY, "--weights", str(weights), "--sigma-scale", "2", "--out",
                     str(alone), "--no-progress"]) == 0
    _assert_same_bounds(out / "scale_2" / "bounds.npz", alone / "bounds.npz")
    a = json.loads((alone / "summary.json").read_text())
    lv = s["levels"][1]
    assert lv["sigma"] == a["sigma"] and lv["std"] == a["bounds"] and lv["bounds_lowfreq"] == a["bounds_lowfreq"]
    assert lv["utility"]["clean"] == a["accuracy"]["clean"] and lv["utility"]["dithered"] == a["accuracy"]["dithered"]
    assert s["levels"][0]["sigma"] == pytest.approx(a["sigma"] / 4, rel=1e-12)
    assert s["levels"][0]["std"]["q50"] < lv["std"]["q50"]          # 4x the noise: larger bounds
    assert f"run {out / 'scale_0.5'}" in printed and f"report: {out / 'report.html'}" in printed
    page = (out / "report.html").read_text()
    assert '<a href="scale_0.5/report.html">' in page and '<a href="scale_2/report.html">' in page
    assert re.findall(r'<img src="([^"]+)"', page) == ["bounds_vs_sigma.png", "tradeoff.png"]
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("chunks/*.npz")}
    assert len(stamps) == 2 * 3
    assert cli.main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert json.loads((out / "sweep.json").read_text())["levels"][1]["std"] == lv["std"]


def test_one_out_holds_one_kind_of_run_for_reproduce_and_bound(first, weights, tmp_path, capsys):
    """A reproduce sweep, a plain reproduce run and hcrfast bound's runs each keep their own files in OUT: a
    command into another kind's OUT is refused before it writes anything (else its report.html would replace
    the other's page, beside the other's sweep.json, figures or bounds.npz), naming what OUT holds and the fix."""
    swept = tmp_path / "swept"
    tiny = [*TINY, "--weights", str(weights), "--no-progress"]
    assert cli.main(["reproduce", "digits", *tiny, "--sweep", "1", "--out", str(swept)]) == 0
    page = (swept / "report.html").read_bytes()
    capsys.readouterr()
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(swept)]) == 2
    assert (f"--out {swept}: holds a `hcrfast reproduce --sweep` (sweep.json), and this command is a `hcrfast "
            f"reproduce` run, which would leave its results beside those; pass another --out, or delete {swept}"
            ) in capsys.readouterr().err
    assert (swept / "report.html").read_bytes() == page and not (swept / "bounds.npz").exists()
    assert cli.main(["reproduce", "digits", *tiny, "--sweep", "1,2", "--out", str(first)]) == 2
    assert "holds a `hcrfast reproduce` run (run.json" in capsys.readouterr().err
    assert not (first / "sweep.json").exists()
    torch.save(torch.randn(2, 1, 4, 4), tmp_path / "x.pt")
    bound = ["bound", "torch.nn:Flatten", str(tmp_path / "x.pt"), "--restarts", "2", "--iterations", "2",
             "--no-progress", "--no-report"]
    assert cli.main([*bound, "--sweep", "1,2", "--out", str(swept)]) == 2
    assert "holds a `hcrfast reproduce --sweep` (sweep.json), and this command is a --sweep" in capsys.readouterr().err
    assert cli.main([*bound, "--out", str(first)]) == 2
    assert "holds a `hcrfast reproduce` run (run.json)" in capsys.readouterr().err
    assert cli.main([*bound, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(tmp_path / "b")]) == 2
    assert "holds a plain bound run (chunks, bounds.npz), and this command is a `hcrfast reproduce` run" in (
        capsys.readouterr().err)
    assert not (tmp_path / "b" / "run.json").exists()


def test_a_changed_sweep_says_to_pass_another_out_not_to_delete_one_sigma_s_run(weights, tmp_path, capsys):
    """Each sigma's run folder refuses a changed command; deleting that one folder would move the refusal to
    the next sigma's, so the sweep's message names the fix for the whole sweep: another --out, or delete OUT."""
    out = tmp_path / "rk"
    tiny = [*TINY, "--weights", str(weights), "--no-progress", "--out", str(out)]
    assert cli.main(["reproduce", "digits", *tiny, "--sweep", "0.5"]) == 0
    capsys.readouterr()
    assert cli.main(["reproduce", "digits", *tiny, "--sweep", "0.5", "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'scale_0.5'}" in err and f"(or delete {out})" in err and f"delete {out / 'scale_0.5'}" not in err


def test_a_digits_sweep_trains_its_model_once(tmp_path):
    out = tmp_path / "sweep"
    assert cli.main(["reproduce", "digits", "--examples", "4", "--restarts", "2", "--iterations", "2",
                     "--sweep", "1,3", "--out", str(out), "--train-epochs", "1", "--no-progress"]) == 0
    assert (out / "scale_1" / "digits_state_dict.pt").is_file()
    assert not (out / "scale_3" / "digits_state_dict.pt").exists()   # the first run's weights serve the second
    keys = [json.loads((out / f / "run.json").read_text())["key"] for f in ("scale_1", "scale_3")]
    assert keys[0]["weights"] == keys[1]["weights"] and keys[0]["weights"].startswith("state-dict-sha256:")


@pytest.mark.parametrize("extra, words", [
    (["--sweep", "1,0"], "0.0 is not a positive finite number"),
    (["--sweep", "1,1"], "1 is given 2 times"),
])
def test_a_bad_sweep_is_named(tmp_path, capsys, extra, words):
    assert cli.main(["reproduce", "digits", *TINY, *extra, "--out", str(tmp_path / "s"), "--no-progress"]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_the_report_of_a_short_krylov_run_with_pilots_says_what_ran(weights, tmp_path):
    """Two pilots of 1 basis step: the Solver section names two LSQRs per example and counts steps per
    pilot; their bases keep at most 2 of the 4 singular directions asked for, and the report says how few
    an example had (the rest are steps of 0)."""
    out = tmp_path / "kry"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["reproduce", "digits", *TINY, "--solver", "krylov", "--krylov-pilots", "2",
                         "--lsqr-iter-lim", "1", "--singular-steps", "4", "--out", str(out), "--weights", str(weights),
                         "--no-progress"]) == 0
    html = (out / "report.html").read_text()
    assert "2 reorthogonalized LSQRs per example (pilots: restarts 0..1's start vectors)" in html
    assert "Basis steps per pilot: max 1," in html
    s = json.loads((out / "summary.json").read_text())
    fewest = s["singular_steps_lifted"]["directions"]["fewest"]
    assert 1 <= fewest <= 2 and f"an example had as few as {fewest:,} such directions" in html
    assert f"an example had as few as {fewest}" in hcrfast.Bounds.load(out / "bounds.npz").summary()


def test_files_of_the_user_s_at_the_output_names_are_refused_before_anything_runs(weights, tmp_path, capsys):
    """An --out that holds the user's own file at a name the run writes (summary.json, a figure; with --sweep
    the sweep's page beside its runs) is refused, naming them, before a run folder or chunk is made; a rerun of
    a run replaces what it wrote itself."""
    tiny = [*TINY, "--weights", str(weights), "--no-progress"]
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    (out / "reconstructions.png").write_bytes(b"my figure")
    (out / "notes.txt").write_text("mine")
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(out)]) == 2
    assert (f"--out {out}: holds reconstructions.png, summary.json, which this command writes and which no hcrfast "
            f"command wrote there; pass another --out, or move them") in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "notes.txt", "reconstructions.png", "summary.json"]
    assert (out / "summary.json").read_text() == '{"mine": 1}'
    (out / "summary.json").unlink()
    (out / "reconstructions.png").unlink()
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(out)]) == 0
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(out)]) == 0   # its own files: replaced
    assert (out / "notes.txt").read_text() == "mine" and json.loads((out / "summary.json").read_text())["examples"] == 10
    swept = tmp_path / "swept"
    swept.mkdir()
    (swept / "tradeoff.png").write_bytes(b"my figure")
    assert cli.main(["reproduce", "digits", *tiny, "--sweep", "1,2", "--out", str(swept)]) == 2
    assert f"--out {swept}: holds tradeoff.png, which this command writes" in capsys.readouterr().err
    assert sorted(p.name for p in swept.iterdir() if not p.name.startswith(".")) == ["tradeoff.png"]


def test_reproduce_run_from_python_refuses_the_user_s_files_too(weights, tmp_path):
    """hcrfast.reproduce.run (the Python entry point) wrote over the user's summary.json and figures in its out:
    only the command line checked them. It refuses them as the command does, and an OUT of `hcrfast bound`."""
    from hcrfast import reproduce

    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    kw = dict(examples=10, restarts=2, iterations=2, weights=weights, chunk_examples=4, progress=False)
    with pytest.raises(ValueError, match=r"holds summary\.json, which this command writes and which no hcrfast command "
                                         r"wrote there; pass another --out, or move it"):
        reproduce.run("digits", out=out, **kw)
    assert (out / "summary.json").read_text() == '{"mine": 1}'
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["summary.json"]
    other = tmp_path / "sweep_out"
    (other / "sweep_chunks").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds a --sweep \(sweep_chunks\), and this command is a `hcrfast reproduce` "
                                         r"run, which would leave its results beside those; pass another --out"):
        reproduce.run("digits", out=other, **kw)
    (out / "summary.json").unlink()
    assert reproduce.run("digits", out=out, **kw).summary["examples"] == 10


def test_a_tilde_after_an_equals_sign_is_the_home_folder(weights, tmp_path, monkeypatch):
    """--out=~/r --weights=~/w.pt: the shell leaves ~ after '=', so hcrfast expands it, never making a folder
    named ~ in the working directory."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(weights, home / "w.pt")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["reproduce", "digits", *TINY, "--weights=~/w.pt", "--out=~/r", "--no-progress"]) == 0
    assert (home / "r" / "bounds.npz").is_file() and not (tmp_path / "~").exists()
    assert json.loads((home / "r" / "summary.json").read_text())["command"].count(str(home / "w.pt")) == 1


def test_a_run_json_of_the_user_s_makes_none_of_their_files_hcrfast_s(weights, tmp_path, capsys):
    """A user's own run.json in --out made the OUT an older hcrfast's: the refused run still listed the user's
    summary.json and report.html as hcrfast's, and once run.json was moved away the next run replaced them."""
    tiny = [*TINY, "--weights", str(weights), "--no-progress"]
    out = tmp_path / "mine"
    out.mkdir()
    (out / "run.json").write_text('{"my": "run"}')
    (out / "summary.json").write_text('{"mine": 1}')
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(out)]) == 2
    capsys.readouterr()
    (out / "run.json").unlink()
    assert cli.main(["reproduce", "digits", *tiny, "--out", str(out)]) == 2
    assert "holds summary.json, which this command writes and which no hcrfast command wrote there" in \
        capsys.readouterr().err
    assert (out / "summary.json").read_text() == '{"mine": 1}'


def test_a_run_of_format_6_from_before_the_dense_rank_rule_is_refused(first, weights, tmp_path, capsys):
    """Run format 6 (as hcrfast.bound checkpoint/6) was not bumped when the dense solve's rank rule changed
    (2026-11-30): a run folder written before resumed silently, its chunks of the old rule beside new ones. The
    format is now 7, and a folder of 6 is refused as another version's, with the fix."""
    from hcrfast import reproduce

    assert reproduce._FORMAT == 7
    old = tmp_path / "old"
    shutil.copytree(first, old)
    stored = json.loads((old / "run.json").read_text())
    stored["key"]["format"] = 6
    (old / "run.json").write_text(json.dumps(stored))
    assert cli.main(["reproduce", "digits", *TINY, "--out", str(old), "--weights", str(weights)]) == 2
    err = capsys.readouterr().err
    assert (f"{old} holds a run written by another version of hcrfast (format: 6 -> 7), whose chunks this one does "
            f"not mix with its own") in err and f"pass a fresh --out (or delete {old})" in err, err


def test_the_report_says_where_the_dense_solve_found_j_rank_deficient(weights, tmp_path):
    """The trained digits MLP's J has rank as low as 37 of its 64 inputs (the full run, 2026-12-02): a null space
    that no step of the run probes. The report and the merged result's summary, which keep no rank of their own,
    read it from the singular steps taken within each example's rank, and say so; the Krylov basis' kept
    vectors tell no rank of J, and its run says nothing of a null space."""
    out = tmp_path / "dense"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["reproduce", "digits", *TINY, "--examples", "40", "--solver", "dense", "--out", str(out),
                         "--weights", str(weights), "--no-progress"]) == 0
    s = json.loads((out / "summary.json").read_text())
    fewest = s["singular_steps_lifted"]["directions"]["fewest"]
    assert fewest < s["singular_steps"] == 64
    html = (out / "report.html").read_text()
    assert f"J's rank was as low as {fewest:,} at an example, below its inputs: J has a local null space" in html
    summary = hcrfast.Bounds.load(out / "bounds.npz").summary()
    assert (f"J's local null space: up to {64 - fewest} of its 64 input directions (J's rank was {fewest} at an "
            f"example)") in summary
    krylov = tmp_path / "kry"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["reproduce", "digits", *TINY, "--solver", "krylov", "--lsqr-iter-lim", "4", "--out",
                         str(krylov), "--weights", str(weights), "--no-progress"]) == 0
    assert "null space" not in (krylov / "report.html").read_text()
    assert "null space" not in hcrfast.Bounds.load(krylov / "bounds.npz").summary()
