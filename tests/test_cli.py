"""The ``hcrfast`` command line: help, the subcommands it registers, exit codes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hcrfast import cli, zoo


def test_console_entry_point_help():
    proc = subprocess.run([sys.executable, "-m", "hcrfast.cli", "--help"], check=False, capture_output=True,
                          text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=120)
    assert proc.returncode == 0
    for command in ("train", "reproduce", "bound", "dp"):
        assert command in proc.stdout


def test_version_names_hcrfast_and_what_it_runs_on():
    from importlib import metadata

    import numpy
    import scipy

    import hcrfast

    # the CLI as a user's shell runs it (the module the console script calls: the script itself may lie
    # outside PATH on a CI machine)
    proc = subprocess.run([sys.executable, "-m", "hcrfast.cli", "--version"], check=False, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0 and proc.stderr == ""
    line = proc.stdout
    assert line.count("\n") == 1 and line.startswith(f"hcrfast {hcrfast.__version__} (")
    assert hcrfast.__version__ == metadata.version("hcrfast")  # the package and its metadata agree
    assert f"torch {metadata.version('torch')}" in line and torch.__version__.startswith(metadata.version("torch"))
    assert f"numpy {numpy.__version__}," in line and f"scipy {scipy.__version__}," in line
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert "no CuPy" in line and "hcrfast[cuda12]" in line
    else:
        assert "cupy-cuda1" in line


@pytest.mark.parametrize("argv, words", [
    (["--help"], ("train", "reproduce", "bound", "dp", "--version")),
    (["bound", "--help"], ("MODEL", "INPUTS", "--sigma-scale", "--weights", "torchrun", "bounds.npz")),
    (["reproduce", "--help"], ("--examples", "--restarts", "--chunk-examples", "--weights", "torchrun",
                               "digits", "swin_t")),
    (["train", "--help"], ("--epochs", "--out", "digits")),
])
def test_help(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in words:
        assert word in out
    assert "--test-crash-after-chunks" not in out and "--train-epochs" not in out  # test hooks stay hidden


def test_bound_help_says_what_singular_steps_cost_and_what_auto_solves(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bound", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "certified with both signs, two forward passes" in out and "one forward pass a step" not in out
    assert "LSQR with --linearize-at current" in out


def test_reproduce_help_lists_published_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["reproduce", "--help"])
    out = capsys.readouterr().out
    for name in zoo.NAMES:
        p = zoo.published_parameters(name)
        row = next(line for line in out.splitlines() if line.split()[:1] == [name])
        assert f"{p['examples']:,}" in row and f"({p['iterations_limit']})" in row


def test_train_digits(tmp_path, capsys):
    out = tmp_path / "d.pt"
    assert cli.main(["train", "digits", "--epochs", "2", "--out", str(out), "--quiet"]) == 0
    path, accuracy = capsys.readouterr().out.strip().split("\t")
    assert path == str(out) and 0.0 <= float(accuracy) <= 1.0
    state = torch.load(out, weights_only=True)
    assert set(state) == set(zoo.build("digits").model.state_dict())


def test_no_command_and_unknown_command(capsys):
    for argv in ([], ["frobnicate"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_errors_exit_2_with_one_line(tmp_path, capsys):
    # missing data: FileNotFoundError → "hcrfast: error: ..." and exit code 2, no traceback
    assert cli.main(["train", "mnist", "--data-root", str(tmp_path / "none"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hcrfast: error: MNIST not found") and "Traceback" not in err
    # a bad value
    assert cli.main(["train", "digits", "--epochs", "0", "--out", str(tmp_path / "x.pt")]) == 2
    assert "error: --epochs must be a positive integer" in capsys.readouterr().err
    # a trainable name only
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "resnet18"])
    assert exc.value.code == 2


def test_a_download_that_fails_offline_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    import urllib.error

    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))

    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    from _fakedata import write_imagefolder

    write_imagefolder(tmp_path / "imagenet" / "val", per_class=1)  # the data is there: the weights are not
    code = cli.main(["reproduce", "resnet18", "--weights", "default", "--examples", "1", "--out", str(tmp_path / "r"),
                     "--data", str(tmp_path / "imagenet"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.startswith("hcrfast: error: Could not get torchvision's pretrained") and "--weights /path/to/" in err

    from torchvision import datasets

    monkeypatch.setattr(datasets.MNIST, "download", lambda self: no_network(None))
    assert cli.main(["train", "mnist", "--download", "--data-root", str(tmp_path / "d"), "--quiet",
                     "--out", str(tmp_path / "m.pt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hcrfast: error: Downloading MNIST into") and "Traceback" not in err


def test_sigterm_is_said_as_ctrl_c_is_and_the_callers_handler_comes_back(monkeypatch, capsys):
    """A scheduler's SIGTERM (before its SIGKILL) ended `hcrfast bound` with exit -15 and nothing said; and a
    Ctrl-C while the subcommands' modules loaded (build_parser) printed a traceback wall. Both now end with
    one line, 143 and 130, and main() gives back the SIGTERM handler it found."""
    import os
    import signal

    from hcrfast import _bound_cli

    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):   # (the handler runs between bytecodes)
            pass
        raise AssertionError("SIGTERM did not stop the command")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(_bound_cli, "_run", terminated)
    assert cli.main(["bound", "m.py:M", "x.pt", "--out", "o"]) == 143
    assert capsys.readouterr().err == ("hcrfast: terminated (SIGTERM); the chunks that finished are kept, and the same "
                                       "command resumes\n")
    assert signal.getsignal(signal.SIGTERM) is before

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["bound", "m.py:M", "x.pt"]) == 130
    assert capsys.readouterr().err == "hcrfast: interrupted\n"


def test_a_signal_that_lands_in_a_long_c_call_still_ends_the_command(tmp_path):
    """SIGTERM's Python handler runs between bytecodes: a command blocked in a C++ wait (torchrun's processes
    joining, here a TCPStore get) ignored the scheduler's SIGTERM until its SIGKILL. A watchdog on the signal wakeup
    fd ends it after a grace period, with the line and exit status of a SIGTERM."""
    import signal
    import time

    script = tmp_path / "block.py"
    script.write_text(
        "import datetime, sys\n"
        "from hcrfast import cli, _bound_cli\n"
        "cli._SIGNAL_GRACE = 1.0\n"
        "def blocked(args):\n"
        "    import torch.distributed as dist\n"
        "    store = dist.TCPStore('127.0.0.1', 0, 1, True, timeout=datetime.timedelta(seconds=120))\n"
        "    print('blocking', flush=True)\n"
        "    store.get('never')\n"
        "_bound_cli._run = blocked\n"
        "sys.exit(cli.main(['bound', 'm.py:M', 'x.pt', '--out', 'o']))\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "blocking"
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and time.monotonic() - t0 < 30
    assert err.endswith("hcrfast: terminated (SIGTERM); the chunks that finished are kept, and the same command "
                        "resumes (ended after 1 s inside a call that does not return to Python)\n")


def test_dp_figure_refuses_a_format_matplotlib_cannot_write_before_simulating(tmp_path, monkeypatch, capsys):
    from hcrfast import dp

    def never(*a, **k):
        raise AssertionError("the attack ran before --out was checked")

    monkeypatch.setattr(dp, "simulate_attack", never)
    (tmp_path / "notes.txt").write_text("my notes")
    for name in ("notes.txt", "fig.xyz"):
        argv = ["dp", "figure", "--out", str(tmp_path / name), "--sigmas", "1", "--n-images", "2", "--repeats", "1"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hcrfast: error: --out {tmp_path / name}: matplotlib writes no {name[-4:]} files; "
                              f"pass a name ending in one of .png, .pdf, .svg, ")
    assert (tmp_path / "notes.txt").read_text() == "my notes"


def test_warnings_of_the_python_layer_name_the_flags(monkeypatch, capsys):
    from hcrfast import HcrfastUserWarning, _bound_cli, _repro_cli

    def warns(args):
        import warnings
        warnings.warn("krylov_pilots='auto' took 25 pilots; pass restarts=25, or krylov_pilots=50 with "
                      "lsqr=dataclasses.replace(hcrfast.krylov.DEFAULT_OPTIONS, iter_lim=163)", HcrfastUserWarning)
        return 0

    monkeypatch.setattr(_bound_cli, "_run", warns)
    monkeypatch.setattr(_repro_cli, "_run", warns)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", lambda m, c, f, l, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(m, c, f, l, line)))
        assert cli.main(["bound", "m.py:M", "x.pt"]) == 0
        assert capsys.readouterr().err == (
            "hcrfast: warning: --krylov-pilots auto took 25 pilots; pass --restarts 25, or --krylov-pilots 50 with "
            "lsqr=dataclasses.replace(hcrfast.krylov.DEFAULT_OPTIONS, iter_lim=163) (lsqr=, iter_lim=: from Python "
            "only; hcrfast bound has no flag for them)\n")
        assert cli.main(["reproduce", "digits"]) == 0
        assert capsys.readouterr().err == (
            "hcrfast: warning: --krylov-pilots auto took 25 pilots; pass --restarts 25, or --krylov-pilots 50 with "
            "--lsqr-iter-lim 163\n")


def test_out_of_memory_is_one_error_naming_the_options(monkeypatch, capsys):
    """One example alone out of memory ended `hcrfast bound` in a raw traceback whose note named Python arguments."""
    from hcrfast import _bound_cli

    def no_room(args):
        exc = MemoryError("Unable to allocate 3.2 GiB")
        exc.add_note("hcrfast.bound: one example alone ran out of memory ... fewer restarts, or solver='lsqr'")
        raise exc

    monkeypatch.setattr(_bound_cli, "_run", no_room)
    assert cli.main(["bound", "m.py:M", "x.pt", "--out", "o"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hcrfast: error: out of memory: Unable to allocate 3.2 GiB\n  hcrfast.bound: one example alone")
    assert "fewer restarts, or --solver lsqr" in err and "solver=" not in err   # said in the flags
    assert "On the command line: --restarts, --solver and --krylov-pilots" in err and "Traceback" not in err

    def users_own(args):   # the user's model's MemoryError, no hcrfast note: its traceback, not hcrfast's advice
        raise MemoryError("cache full")

    monkeypatch.setattr(_bound_cli, "_run", users_own)
    with pytest.raises(MemoryError, match="cache full"):
        cli.main(["bound", "m.py:M", "x.pt", "--out", "o"])


@pytest.mark.parametrize("case", ["own_sigint_handler", "asyncio"])
def test_the_signal_watchdog_leaves_a_caller_s_own_handlers_alone(case, tmp_path):
    """main() called in-process: a caller's SIGINT handler that does not raise (a notebook's, 'stop after this
    step') had the process ended by the watchdog after the grace period, the main thread in plain Python all along;
    and asyncio's signal handlers, which read the wakeup fd main() replaced, never ran."""
    scripts = {
        "own_sigint_handler": (
            "import os, signal, threading, time\n"
            "import hcrfast.cli as cli\n"
            "cli._SIGNAL_GRACE = 0.5\n"
            "stop = []\n"
            "signal.signal(signal.SIGINT, lambda s, f: stop.append(s))\n"
            "class P:\n"
            "    def parse_args(self, argv):\n"
            "        class A: command = 'bound'\n"
            "        a = A()\n"
            "        a.func = lambda args: (threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start(),\n"
            "                               time.sleep(2), 0)[-1]\n"
            "        return a\n"
            "cli.build_parser = lambda: P()\n"
            "print('returned', cli.main([]), len(stop))\n"),
        "asyncio": (
            "import asyncio, os, signal, time\n"
            "import hcrfast.cli as cli\n"
            "class P:\n"
            "    def parse_args(self, argv):\n"
            "        class A: command = 'bound'\n"
            "        a = A()\n"
            "        a.func = lambda args: (os.kill(os.getpid(), signal.SIGUSR1), time.sleep(0.2), 0)[-1]\n"
            "        return a\n"
            "cli.build_parser = lambda: P()\n"
            "async def go():\n"
            "    got = []\n"
            "    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lambda: got.append('USR1'))\n"
            "    code = cli.main([])\n"
            "    await asyncio.sleep(0.3)\n"
            "    return code, got\n"
            "print('returned', *asyncio.run(go()))\n")}
    script = tmp_path / "caller.py"
    script.write_text(scripts[case])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    want = "returned 0 1" if case == "own_sigint_handler" else "returned 0 ['USR1']"
    assert done.returncode == 0 and done.stdout.strip() == want, done.stdout + done.stderr[-2000:]


def _shell(text, command="bound", **args):
    import argparse

    return cli.shell_text(text, argparse.Namespace(command=command, **args))


@pytest.mark.parametrize("text", [
    "runs/size=0.01,seed=1/chunks holds work made with other arguments",
    r"C:\\runs\\size=0.01\\chunks is not a folder",
    "/abs/runs/x,seed=1/bounds.npz exists",
    "sweep-size=2 and k=seed=3 are not ours",
])
def test_shell_text_leaves_names_inside_paths_alone(text):
    """A keyword inside a path (a Hydra-style key=value folder) or glued to another word is the user's."""
    assert _shell(text) == text


def test_shell_text_leaves_the_command_line_s_own_paths_alone():
    """The paths the command line was given are the user's words, even where a keyword starts one."""
    out = "size=0.01 seed=1"
    text = f"{out}/chunks holds work made with other arguments; pass seed=3"
    assert _shell(text, out=out, model="m.py:M") == f"{out}/chunks holds work made with other arguments; pass --seed 3"
    assert _shell("--sigma-file size=1.npy: rtol must be > 0", sigma_file="size=1.npy") == (
        "--sigma-file size=1.npy: --rtol must be > 0")


@pytest.mark.parametrize("text", [
    "targets=[0, 1] needs Gaussian noise", "sigma=array([1., 2.]) is not positive",
    "modes=(0, 1): pass modes of the features", "pass seed=np.random.SeedSequence(1)",
    "the batch's examples (size=3x32x32)", "size=1e3x2 is odd",
])
def test_shell_text_leaves_a_value_it_cannot_read_as_python_s(text):
    assert _shell(text) == text


@pytest.mark.parametrize("text, said", [
    ("size=-inf or size=+inf or size=inf or size=nan", "--size -inf or --size +inf or --size inf or --size nan"),
    ("iterates=\"last\" and iterates='last'", "--last-iterate and --last-iterate"),
    ("solver=\"dense\"; pass sigma= or noise=", "--solver dense; pass --sigma or noise="),
    ("seed=-1e3, size=.5", "--seed -1e3, --size .5"),
])
def test_shell_text_reads_infinities_and_double_quoted_values(text, said):
    assert _shell(text).startswith(said)


@pytest.mark.parametrize("text, said", [
    ("the chunk size must be a positive integer", None),
    ("the metric must return one score per copy", None),
    ("rtol must be in (0, 1), got 2", "--rtol must be in (0, 1), got 2"),
    ("bad search: rtol must be > 0; quantile must be in (0, 1)", "bad search: --rtol must be > 0; --quantile must be "
                                                                 "in (0, 1)"),
])
def test_shell_text_rewrites_name_must_only_as_a_message_s_subject(text, said):
    assert _shell(text) == (text if said is None else said)
    if said is None:
        assert _shell("the examples must have shape (B, C, H, W)", "reproduce") == (
            "the examples must have shape (B, C, H, W)")


@pytest.mark.parametrize("text, said", [
    ("pass a sigma nearer the features' scale (hcrfast.rms_sigma(features, scale)), a smaller size, or a float64 "
     "model and batch", "pass --sigma-scale K (σ = K × the features' RMS) or a --sigma nearer the features' scale, a "
                        "smaller --size, or --double"),
    ("its features overflowed there (then pass a sigma nearer the features' scale, hcrfast.rms_sigma(features, "
     "scale), or a smaller size)", "its features overflowed there (then pass --sigma-scale K (σ = K × the features' "
                                   "RMS) or a --sigma nearer the features' scale, or a smaller --size)"),
    ("a sigma far from the features' scale (hcrfast.rms_sigma(features, scale)) is the other cause",
     "a --sigma far from the features' scale (--sigma-scale K (σ = K × the features' RMS)) is the other cause"),
    ("a sigma * size nearer the features' scale, or a float64 model and batch (model.double(), batch.double()), "
     "avoids it", "a sigma * size nearer the features' scale, or --double, avoids it"),
    ("pass a smaller sigma, or run the model and batch in float64 (model.double(), batch.double()), whose features "
     "hold noise up to 1.8e308", "pass a smaller sigma, or --double (the model and inputs in float64), whose features "
                                 "hold noise up to 1.8e308"),
    ("sigma must be a positive finite number, got inf; pass the noise std of the released features, e.g. "
     "hcrfast.rms_sigma(features, 1.0), or one std per feature",
     "sigma (--sigma-scale 1e300 × the features' RMS) must be a positive finite number, got inf; pass the noise std "
     "of the released features, e.g. --sigma-scale 1 (σ = the features' RMS), or one std per feature"),
])
def test_shell_text_says_the_python_layer_s_sigma_and_float64_advice_in_flags(text, said):
    """hcrfast.rms_sigma(features, scale) is --sigma-scale K, a float64 model and batch --double."""
    assert _shell(text, sigma_scale=cli.float_literal("1e300")) == said
    if "--sigma " not in said:
        return
    assert _shell(text, sigma_file="s.npy").replace("--sigma-file stds", "a --sigma") == said


@pytest.mark.parametrize("given, subject", [
    ({"sigma_file": "sigma has the shape.npy"}, "--sigma-file sigma has the shape.npy"), ({"sigma": 2.0}, "--sigma"),
    ({"sigma_scale": cli.float_literal("0.5")}, "sigma (--sigma-scale 0.5 × the features' RMS)"),
    ({}, "sigma (the features' RMS: --sigma-scale 1, its default)"),
])
def test_shell_text_names_the_flag_the_user_gave_sigma_by(given, subject):
    text = "sigma has the shape (4, 2), one std per feature, but the model's features have the shape (8,)"
    assert _shell(text, **given) == subject + text[len("sigma"):]
    assert _shell("bad: sigma must be positive", **given) == f"bad: {subject} must be positive"


@pytest.mark.parametrize("text, said", [
    ("hcrfast.targeted_bound(model, batch, sigma, null_probes=True) certifies them",
     "--targets all --null-probes (hcrfast.targeted_bound(model, batch, sigma, null_probes=True) in Python) certifies "
     "them"),
    ("their bound is 0, which guarantees nothing; method='dense' with null_probes=True certifies +inf",
     "their bound is 0, which guarantees nothing; --solver dense with --null-probes (method='dense' with "
     "null_probes=True in Python) certifies +inf"),
], ids=["sigma_for's note", "targeted_bound's warning"])
def test_shell_text_says_every_null_probes_advice_in_flags(text, said):
    """The last session's rewrite took 'targeted_bound(..., null_probes=True)' alone: sigma_for's note (the call
    spelled out) and targeted_bound's unseen-modes warning still read '--null-probes' inside a Python call."""
    assert _shell(text) == said


def test_shell_text_says_which_sigma_advice_reproduce_has_no_flag_for():
    """reproduce runs the zoo's float32 models: a float64 model and batch is Python's alone, and said so."""
    text = "pass a sigma nearer the features' scale (hcrfast.rms_sigma(features, scale)), or a float64 model and batch"
    assert _shell(text, "reproduce") == (
        "pass a --sigma-scale K nearer 1 (σ = K × the features' RMS), or a float64 model and batch (a float64 model "
        "and batch: from Python only; hcrfast reproduce has no flag for it)")
    # the user's path is theirs, and train's messages have no sigma
    out = "runs/a sigma nearer the features' scale (hcrfast.rms_sigma(features, scale))"
    assert _shell(f"{out}: a smaller size", out=out) == f"{out}: a smaller --size"
    assert _shell("a float64 model and batch", "train") == "a float64 model and batch"


def test_shell_text_rewrites_has_of_sigma_alone_and_leaves_the_command_line_s_words():
    """Any flag name before " has" was taken for a message's subject (a model's own "size has to be even" became
    "--size has ..."), the rewrites reached a --key the user gave, a --sweep's sigma was said to be the features'
    RMS, and reproduce's advice to run in float64 was left bare of its "from Python only" note."""
    assert _shell("the model raised: size has to be even") == "the model raised: size has to be even"
    assert _shell("sigma has the shape (4, 2)").startswith("sigma (the features' RMS")
    key = "a float64 model and batch"
    assert _shell(f"--key '{key}' is not in x.npz", key=key) == f"--key '{key}' is not in x.npz"
    assert _shell("sigma must be a positive finite number, got inf", sweep="1,1e308") == (
        "sigma (a --sweep level K × the features' RMS) must be a positive finite number, got inf")
    assert _shell("sigma must be positive", sweep="1,2", sigma=0.4) == (
        "sigma (a --sweep level K × --sigma) must be positive")
    text = "run the model and batch in float64 (model.double(), batch.double())"
    assert _shell(text, "reproduce").endswith("from Python only; hcrfast reproduce has no flag for it)")


def test_only_hcrfast_s_own_warnings_are_said_in_flags():
    """A warning of the user's model names its own keywords: printed as written, on one line, its category said."""
    import argparse

    from hcrfast import HcrfastRuntimeWarning, HcrfastUserWarning

    args = argparse.Namespace(command="bound")
    text = "inputs resized to size=8x8; pass seed=0 to Net()"
    assert cli._format_warning(text, UserWarning, "net.py", 3, args=args) == f"hcrfast: warning: UserWarning: {text}\n"
    assert cli._format_warning("pass seed=0", HcrfastUserWarning, "x.py", 3, args=args) == (
        "hcrfast: warning: pass --seed 0\n")
    assert cli._format_warning("size=0.5 is large", HcrfastRuntimeWarning, "x.py", 3, args=args) == (
        "hcrfast: warning: --size 0.5 is large\n")


def test_lsqr_tolerances_name_their_own_defaults(monkeypatch, capsys):
    import dataclasses

    import hcrfast

    monkeypatch.setattr(hcrfast, "DEFAULT_LSQR", dataclasses.replace(hcrfast.DEFAULT_LSQR, atol=1e-5, btol=1e-7))
    for flag, default in (("--lsqr-atol", "1e-05"), ("--lsqr-btol", "1e-07")):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["reproduce", "digits", flag, "-1"])
        assert f"argument {flag}: -1: pass a finite number >= 0 (default {default})" in capsys.readouterr().err


def test_main_leaves_the_warning_filters_as_it_found_them(tmp_path):
    """`reproduce` left ('ignore', '.*RANDOMLY INITIALIZED') in the caller's filters; a training's first gradient
    imported SymPy, whose filters stayed (run in a fresh interpreter: SymPy not yet imported)."""
    import warnings

    before = list(warnings.filters)
    assert cli.main(["reproduce", "digits", "--examples", "2", "--restarts", "1", "--out", str(tmp_path / "r"),
                     "--no-progress"]) == 0
    assert warnings.filters == before
    code = ("import sys, warnings; from hcrfast import cli; before = list(warnings.filters); "
            f"assert cli.main(['train', 'digits', '--epochs', '1', '--out', {str(tmp_path / 'd.pt')!r}, "
            "'--quiet']) == 0; assert 'sympy' in sys.modules; "
            "print([f for f in warnings.filters if f not in before] or 'same', warnings.filters == before)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "same True"


def test_reproduce_takes_chunk_size_as_bound_spells_it():
    """bound's --chunk-size was reproduce's --chunk-examples alone: the one spelling failed at the other command."""
    parse = cli.build_parser().parse_args
    assert parse(["reproduce", "digits", "--chunk-size", "5"]).chunk_examples == 5
    assert parse(["reproduce", "digits", "--chunk-examples", "5"]).chunk_examples == 5
    assert parse(["reproduce", "digits"]).chunk_examples is None
    assert parse(["bound", "m.py:M", "x.pt", "--chunk-size", "5"]).chunk_size == 5
