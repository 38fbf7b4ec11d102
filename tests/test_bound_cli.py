"""``hcrfast bound``: a user's own model file and inputs, from the shell, resumable and sharded.

The command must give exactly what ``hcrfast.bound`` gives for the same model, inputs and σ (σ
checked against the RMS computed here with NumPy), resume from its chunks after a loss, refuse a
changed call, and name every bad argument.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import hcrfast
from hcrfast import cli

MODEL_FILE = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):
        def __init__(self, seed=0):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.a = torch.nn.Parameter(torch.randn(24, 64, generator=g) / 8)
            self.b = torch.nn.Parameter(torch.randn(24, generator=g) / 8)
            self.c = torch.nn.Parameter(torch.randn(16, 24, generator=g) / 5)

        def forward(self, x):
            return torch.tanh(x.flatten(1) @ self.a.T + self.b) @ self.c.T

    def make():
        return Net(seed=1)

    instance = Net(seed=2)
    not_a_model = 3

    class Pair(Net):
        def forward(self, x):
            return super().forward(x), x.sum()
""")

TINY = ["--restarts", "2", "--iterations", "2", "--threads", "1", "--no-progress", "--no-report"]
_ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "mynet.py").write_text(MODEL_FILE)
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    torch.save(x, tmp_path / "x.pt")
    return tmp_path, x


def _user_model(tmp_path, name="Net"):
    """The model as a user's own script would make it (the file imported here by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mynet_oracle", tmp_path / "mynet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    obj = getattr(module, name)
    return (obj if isinstance(obj, torch.nn.Module) else obj()).eval()


def _bound(argv):
    torch.set_num_threads(1)
    return cli.main(["bound", *map(str, argv)])


def test_gives_what_the_python_api_gives_with_sigma_the_features_rms(files, capsys):
    tmp_path, x = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "HCR bounds for 6 examples x 64 dct modes" in printed and f"bounds: {out / 'bounds.npz'}" in printed
    got = hcrfast.Bounds.load(out / "bounds.npz")
    model = _user_model(tmp_path)
    with torch.no_grad():
        feats = model(x).double().numpy()
    s = json.loads((out / "summary.json").read_text())
    sigma = s["noise"]["sigma"]
    assert sigma == pytest.approx(np.sqrt(np.mean(feats ** 2)), rel=1e-12)   # σ = 1 × RMS, computed here
    assert s["noise"]["sigma_scale"] == 1.0
    want = hcrfast.bound(model, x, sigma, restarts=2, iterations=2)
    assert got.params["noise"] == want.params["noise"]
    np.testing.assert_array_equal(got.std, want.std)
    np.testing.assert_array_equal(got.divergence, want.divergence)
    assert s["inputs"]["examples"] == 6 and s["inputs"]["shape"] == [1, 8, 8] and s["inputs"]["dtype"] == "float32"
    assert s["std"]["q50"] == pytest.approx(float(np.median(want.std)))
    assert s["params"]["restarts"] == 2 and s["arguments"]["model"].endswith("mynet.py:Net")


def test_summary_records_the_command_to_rerun_with_the_threads_that_ran_and_the_versions(files, capsys):
    """summary.json's "command" is a command line that parses back to this run's arguments, --threads being
    the count torch ran with whether given or left at its default (the float32 solves' rounding follows it);
    "threads" (and arguments.threads) is that count, an int; "versions" names what `hcrfast --version` does."""
    import shlex

    import scipy

    tmp_path, x = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", str(tmp_path / "x.pt"), "--examples", "4", "--restarts", "2",
            "--iterations", "2", "--sigma-scale", "0.5", "--singular-steps", "2", "--cold-start", "--no-progress",
            "--no-report"]
    saved, summaries = torch.get_num_threads(), {}
    try:
        for given, preset, want in ((["--threads", "2"], 1, 2), ([], 2, 2), ([], 1, 1)):
            out = str(tmp_path / f"run_{len(given)}_{preset}")
            torch.set_num_threads(preset)
            assert cli.main(["bound", *argv, *given, "--out", out]) == 0
            s = summaries[out] = json.loads((tmp_path / out / "summary.json").read_text())
            assert type(s["threads"]) is int and s["threads"] == want and s["arguments"]["threads"] == want
            words = shlex.split(s["command"])
            assert words[:2] == ["hcrfast", "bound"] and words[words.index("--threads") + 1] == str(want)
            ran = vars(cli.build_parser().parse_args(["bound", *argv, *given, "--out", out]))
            again = vars(cli.build_parser().parse_args(words[1:]))
            assert again == {**ran, "threads": want}   # the same call, at the count that ran
            assert torch.get_num_threads() == preset   # (and the caller's count given back)
    finally:
        torch.set_num_threads(saved)
    # the command recorded at torch's default of 2 threads computes the same bits again where the default is 1
    torch.set_num_threads(1)
    try:
        command = summaries[str(tmp_path / "run_0_2")]["command"]
        assert cli.main(shlex.split(command.replace("run_0_2", "rerun"))[1:]) == 0
    finally:
        torch.set_num_threads(saved)
    rerun = hcrfast.Bounds.load(tmp_path / "rerun" / "bounds.npz")
    assert rerun.std.tobytes() == hcrfast.Bounds.load(tmp_path / "run_0_2" / "bounds.npz").std.tobytes()
    v = s["versions"]
    assert v["scipy"] == scipy.__version__ and v["torch"] == torch.__version__ and v["numpy"] == np.__version__
    assert {"python", "hcrfast", "numba"} <= set(v)
    capsys.readouterr()


def test_last_iterate_is_the_apis_iterates_last_and_resumes_only_its_own_chunks(files, capsys):
    """--last-iterate gives bound(iterates="last") (the paper's Algorithm 1), says so in summary.json and
    the printed summary, bounds no mode above the default's (every iterate), and its chunks are not
    those of a default run in the same folder: that run is refused as a changed call."""
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", "--restarts", "2", "--iterations", "3",
            "--threads", "1", "--no-progress", "--no-report", "--out", out]
    assert _bound([*argv, "--last-iterate"]) == 0
    printed = capsys.readouterr().out
    assert "every iterate" not in printed
    got = hcrfast.Bounds.load(out / "bounds.npz")
    s = json.loads((out / "summary.json").read_text())
    assert s["params"]["iterates"] == "last" and got.params["iterates"] == "last"
    model = _user_model(tmp_path)
    want = hcrfast.bound(model, x, s["noise"]["sigma"], restarts=2, iterations=3, iterates="last")
    np.testing.assert_array_equal(got.std, want.std)
    every = hcrfast.bound(model, x, s["noise"]["sigma"], restarts=2, iterations=3)
    assert np.all(got.std <= every.std) and (got.std < every.std).any()
    assert _bound(argv) == 2                                  # the default run in the --last-iterate folder
    assert "iterates" in capsys.readouterr().err


def test_singular_steps_are_the_apis_and_a_bad_count_is_refused_by_name(files, capsys):
    """--singular-steps 4 gives bound(singular_steps=4), says so in summary.json's params and the printed
    summary; a negative count exits 2 naming the argument and the fix."""
    tmp_path, x = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", "--restarts", "2", "--iterations", "2",
            "--threads", "1", "--no-progress", "--no-report"]
    assert _bound([*argv[:-1], "--singular-steps", "4", "--out", tmp_path / "run"]) == 0   # with its report
    assert "singular steps: 4 per example" in capsys.readouterr().out
    got = hcrfast.Bounds.load(tmp_path / "run" / "bounds.npz")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["params"]["singular_steps"]["count"] == 4
    assert "Singular steps (4 per example" in (tmp_path / "run" / "report.html").read_text()
    want = hcrfast.bound(_user_model(tmp_path), x, s["noise"]["sigma"], restarts=2, iterations=2, singular_steps=4)
    np.testing.assert_array_equal(got.std, want.std)
    with pytest.raises(SystemExit) as exit_:
        _bound([*argv, "--singular-steps", "-1", "--out", tmp_path / "bad"])
    assert exit_.value.code == 2
    assert "--singular-steps: '-1': pass 0 (none), a positive integer or 'auto'" in capsys.readouterr().err
    # the default is bound()'s "auto" (64 steps, at most min(n, p): Net's 16 features), and 0 is Algorithm 1 alone
    assert _bound([*argv, "--out", tmp_path / "auto"]) == 0
    auto = json.loads((tmp_path / "auto" / "summary.json").read_text())["params"]["singular_steps"]
    assert auto["auto"] is True and auto["count"] == 16
    assert _bound([*argv, "--singular-steps", "0", "--out", tmp_path / "none"]) == 0
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["params"]["singular_steps"] is None


def test_targets_are_bounded_and_summarized(files):
    """--targets low:2: the command's bounds are bound(targets="low:2")'s, and summary.json says how far
    the targeted steps lifted them above Algorithm 1's."""
    tmp_path, x = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--targets", "low:2",
                   "--out", out]) == 0
    want = hcrfast.bound(_user_model(tmp_path), x, 0.3, restarts=2, iterations=2, targets="low:2")
    got = hcrfast.Bounds.load(out / "bounds.npz")
    np.testing.assert_array_equal(got.std, want.std)
    t = json.loads((out / "summary.json").read_text())["targeted"]
    assert t["targets"] == "low:2"
    assert t["modes_lifted_fraction"] == pytest.approx(float(np.mean(want.std > want.std_algorithm1)))
    # the gains are over the bounds without the targeted steps, the default's singular steps included
    count = (want.params["singular_steps"] or {}).get("count", 0)
    assert t["baseline"] == hcrfast.results.targets_baseline(count)
    assert count > 0 and f"and the {count} singular steps" in t["baseline"]


def test_jacobian_auto_is_taken_as_the_api_takes_it(files, capsys):
    """--jacobian auto was refused by argparse, though bound, the attack and targeted_bound take jacobian="auto"
    (reverse for bound and the attack): the command now gives the API's bounds, and refuses a mode that none
    take, naming the choices."""
    tmp_path, x = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--jacobian", "auto",
                   "--out", out]) == 0
    want = hcrfast.bound(_user_model(tmp_path), x, 0.3, restarts=2, iterations=2, jacobian="auto")
    np.testing.assert_array_equal(hcrfast.Bounds.load(out / "bounds.npz").std, want.std)
    with pytest.raises(SystemExit):
        _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--jacobian", "sideways"])
    assert "'reverse', 'forward', 'auto'" in capsys.readouterr().err


def test_attack_beside_the_bounds_is_the_apis_attack_and_comparison(files, capsys):
    """--attack 3: the Gauss-Newton attack of hcrfast.gauss_newton_attack (same draws, bitwise) is written
    beside the bounds, and summary.json holds hcrfast.compare's account of the two; the same command
    made again reads the attack back from its chunks."""
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--attack", "3",
            "--attack-steps", "4", "--out", out]
    assert _bound(argv) == 0
    printed = capsys.readouterr().out
    model = _user_model(tmp_path)
    bounds = hcrfast.bound(model, x, 0.3, restarts=2, iterations=2)
    attack = hcrfast.gauss_newton_attack(model, x, 0.3, draws=3, steps=4)
    got = hcrfast.AttackResult.load(out / "attack.npz")
    np.testing.assert_array_equal(got.estimates, attack.estimates)
    want = hcrfast.compare(bounds, attack)
    s = json.loads((out / "summary.json").read_text())["attack"]
    assert s["median"] == want["median"] and s["mse_ratio_median"] == want["mse_ratio_median"]
    assert s["draws"] == 3 and s["steps"] == 4 and s["start"] == "truth"
    assert f"attack: {out / 'attack.npz'}" in printed and "its error over the bound per mode, median" in printed
    assert len(list((out / "attack_chunks").glob("chunk_*.npz"))) >= 1
    (out / "attack.npz").unlink()
    assert _bound(argv) == 0
    again = hcrfast.AttackResult.load(out / "attack.npz")
    assert again.params["checkpoint"]["examples_read_back"] == 6
    np.testing.assert_array_equal(again.estimates, attack.estimates)


@pytest.mark.filterwarnings("ignore:.*never left their start")  # 2 Gauss-Newton steps: some draws take none
@pytest.mark.parametrize("basis", ["dct", "pixel"])
def test_the_report_shows_the_bounds_and_their_figures(files, capsys, basis):
    """Without --no-report: report.html with the summary's median and every figure it names written
    beside it (in the pixel basis the histogram only: no DCT modes to draw)."""
    tmp_path, _ = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
            "--basis", basis, "--attack", "2", "--attack-steps", "2", "--out", out]
    assert _bound(argv) == 0
    printed = capsys.readouterr().out
    assert f"report: {out / 'report.html'}" in printed
    html = (out / "report.html").read_text()
    s = json.loads((out / "summary.json").read_text())
    unmoved = s["attack"]["n_draws_unmoved"]
    assert (f"{unmoved} draws took no step" in printed) == (unmoved > 0)
    assert (f"{unmoved:,} draws took no step" in html) == (unmoved > 0)
    assert f"{s['std']['q50']:.4g}" in html and "A real attacker beside the bounds" in html
    assert f"where an efficient unbiased attacker at the bound would have {s['attack']['fraction_below_1_efficient']:.1%}" in html
    sing = s["params"]["singular_steps"]   # the lifted bounds out of how many (the report left out the total)
    assert f"raised {sing['modes_lifted']:,} of the {6 * 64:,} (example, mode) bounds" in html
    shown = re.findall(r'<img src="([^"]+)"', html)
    assert shown == (["hist_all.png", "bound_modes.png", "bound_images.png"] if basis == "dct" else ["hist_all.png"])
    assert all((out / name).stat().st_size > 1000 for name in shown)


MIXED_FILE = textwrap.dedent("""
    import torch

    class Mixed(torch.nn.Module):
        # input 0 moves the ReLU features (finite bounds); input 1's rounded half ignores every step (+inf);
        # input 2 has J = 0: its ReLUs are dead and its rounded half is switched off (bounds 0, D = 0 stored)
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.w = torch.nn.Parameter(torch.rand(6, 64, generator=g) * 0.1)
            self.b = torch.nn.Parameter(torch.full((6,), -20.0))
            self.a = torch.nn.Parameter(torch.randn(6, 64, generator=g))

        def forward(self, x):
            f = x.flatten(1)
            q = f @ self.a.T
            q = q + (torch.round(q) - q).detach()
            return torch.cat([torch.relu(f @ self.w.T + self.b), q * (f.mean(1, keepdim=True) > -5).to(f.dtype)], 1)
""")


@pytest.mark.filterwarnings("ignore")
def test_the_report_counts_infinite_bounds_and_medians_as_the_summary_does(tmp_path, capsys):
    """report.html said "14 infinite bounds" where 64 were (it counted the steps with D = 0), gave the median MSE
    bound of the finite inputs under a label that did not say so while summary() took +inf into its median, and
    summary()'s median D counted the J = 0 input's restarts, which bound nothing, as D = 0. The bounds' own arrays,
    read back from bounds.npz, are the oracle of every count."""
    (tmp_path / "mixed.py").write_text(MIXED_FILE)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    x[0] += 10
    x[2] -= 10
    torch.save(x, tmp_path / "x.pt")
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mixed.py'}:Mixed", tmp_path / "x.pt", "--sigma", "0.5", "--iterations", "2",
            "--restarts", "2", "--solver", "dense", "--threads", "1", "--no-progress", "--out", out]
    assert _bound(argv) == 0
    printed = capsys.readouterr().out
    res = hcrfast.Bounds.load(out / "bounds.npz")
    std = np.asarray(res.std).reshape(3, -1)
    n_inf = int(np.isinf(std).sum())
    assert n_inf == 64 and np.isinf(std[1]).all() and (std[2] == 0).all() and np.isfinite(std[0]).all()
    from html import unescape

    page = unescape((out / "report.html").read_text())
    assert f"{n_inf:,} infinite bounds (D = 0: no unbiased estimator exists there), from " \
           f"{len(res.infinite_reasons):,} steps" in page
    mse = np.asarray(res.mse)
    finite = mse[np.isfinite(mse)]
    assert np.isinf(mse).sum() == 1 and finite.size == 2
    assert "median over the inputs' finite bounds" in page
    assert f"{np.median(finite):.4g} (1 of 3 inputs ∞)" in page
    assert f"(eq. 6, one eps): median {np.median(finite):.4g}, min {finite.min():.4g}, max {finite.max():.4g} " \
           f"(of the 2 finite; 1 +inf)" in printed
    # input 2's restarts bound nothing: their stored D = 0 is left out; input 1's D = 0 (+inf bounds) is not
    d = np.asarray(res.divergence)
    assert (d[2] == 0).all() and len(res.params["zero_step_reasons"]) == 2
    assert f"divergence D: median {np.median(d[:2]):.4g} over the restarts that bound something (2 that bound " \
           f"nothing left out)" in printed


QUANTIZED_FILE = textwrap.dedent("""
    import torch

    class Quantized(torch.nn.Module):
        # a straight-through rounding: J is the identity, but no small step changes the features (every bound +inf)
        def forward(self, x):
            f = x.flatten(1)
            return f + (torch.round(f * 4) / 4 - f).detach()
""")


def _attack_oracle(out) -> dict:
    """Which (input, mode) pairs an attack's ratios can be over, and their median, from bounds.npz and
    attack.npz themselves: a bound of +inf or 0 bounds no ratio."""
    std = np.asarray(hcrfast.Bounds.load(out / "bounds.npz").std, dtype=np.float64).ravel()
    rmse = np.asarray(hcrfast.AttackResult.load(out / "attack.npz").rmse, dtype=np.float64).ravel()
    kept = np.isfinite(std) & (std > 0) & ~np.isnan(rmse)
    return {"n": std.size, "kept": int(kept.sum()), "inf": int(np.isinf(std).sum()), "zero": int((std == 0).sum()),
            "median": float(np.median(rmse[kept] / std[kept])) if kept.any() else None}


@pytest.mark.filterwarnings("ignore")
def test_the_attack_account_says_which_pairs_its_median_is_over(tmp_path, capsys):
    """With some bounds +inf or 0 the attack's median ratio is over the other pairs alone: the printed line, the
    report and a sweep's table said "median 11.62" without saying over 64 of 192 pairs; bounds.npz and
    attack.npz are the oracle of the counts and the median."""
    from html import unescape

    (tmp_path / "mixed.py").write_text(MIXED_FILE)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    x[0] += 10
    x[2] -= 10
    torch.save(x, tmp_path / "x.pt")
    common = [f"{tmp_path / 'mixed.py'}:Mixed", tmp_path / "x.pt", "--sigma", "0.5", "--iterations", "2",
              "--restarts", "2", "--solver", "dense", "--threads", "1", "--no-progress", "--attack", "2",
              "--attack-steps", "2"]
    out = tmp_path / "run"
    assert _bound([*common, "--out", out]) == 0
    printed = capsys.readouterr().out
    o = _attack_oracle(out)
    assert o["inf"] == o["zero"] == 64 and o["kept"] == 64 and o["n"] == 192   # (what MIXED_FILE's inputs make)
    said = (f"its error over the bound per mode, over {o['kept']} of {o['n']} pairs ({o['inf']} with a bound of +inf, "
            f"{o['zero']} with a bound of 0 left out), median {o['median']:.4g} (")
    assert said in printed
    assert said in unescape((out / "report.html").read_text())
    # a sweep: each level's line, and its table's cell, which also names the MSE bound as the single report does
    sweep = tmp_path / "sweep"
    assert _bound([*common, "--sweep", "1,2", "--out", sweep]) == 0
    printed = capsys.readouterr().out
    page = unescape((sweep / "report.html").read_text())
    for name in ("scale_1", "scale_2"):
        o = _attack_oracle(sweep / "sweep" / name)
        pairs = (f"over {o['kept']} of {o['n']} pairs ({o['inf']} with a bound of +inf, {o['zero']} with a bound of 0 "
                 f"left out)")
        assert f"its error over the bound per mode, {pairs}, median {o['median']:.4g} (" in printed
        assert f">{o['median']:.4g} {pairs}</td>" in page
    assert "bound on the MSE per coordinate from every mode's bound, median over the inputs' finite bounds" in page
    assert "MSE bound, median over inputs" not in page


@pytest.mark.filterwarnings("ignore")
def test_an_attack_beside_bounds_all_infinite_says_no_pair_was_compared(tmp_path, capsys):
    """Every bound +inf: no ratio exists; the line printed "median nan (nan% below 1" and the report "median –
    (n/a below 1", never saying that no pair was compared."""
    from html import unescape

    (tmp_path / "quantized.py").write_text(QUANTIZED_FILE)
    torch.save(torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1)), tmp_path / "x.pt")
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'quantized.py'}:Quantized", tmp_path / "x.pt", "--sigma", "0.3", "--iterations", "2",
                   "--restarts", "2", "--threads", "1", "--no-progress", "--attack", "2", "--attack-steps", "2",
                   "--out", out]) == 0
    printed = capsys.readouterr().out
    o = _attack_oracle(out)
    assert o["inf"] == o["n"] == 192 and o["kept"] == 0
    line = next(ln for ln in printed.splitlines() if "Gauss-Newton draws" in ln)
    assert f"no pair compared: all {o['n']} bounds +inf" in line
    assert "nan" not in line
    assert "no input whose mse_from_modes is finite and above 0" in line
    page = unescape((out / "report.html").read_text())
    assert f"no pair compared: all {o['n']} bounds +inf, so there is no error over the bound to show" in page
    assert "median –" not in page and "n/a below 1" not in page


@pytest.mark.parametrize("name, seed", [("make", 1), ("instance", 2)])
def test_a_factory_or_an_instance_names_the_model(files, name, seed):
    tmp_path, x = files
    out = tmp_path / name
    assert _bound([f"{tmp_path / 'mynet.py'}:{name}", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--out", out]) == 0
    want = hcrfast.bound(_user_model(tmp_path, name), x, 0.3, restarts=2, iterations=2)
    np.testing.assert_array_equal(hcrfast.Bounds.load(out / "bounds.npz").std, want.std)


def test_a_module_on_the_path_weights_a_npz_key_and_one_std_per_feature(files, monkeypatch):
    tmp_path, x = files
    monkeypatch.syspath_prepend(str(tmp_path))
    other = _user_model(tmp_path, "make")                   # seed 1: its weights loaded into Net (seed 0)
    torch.save(other.state_dict(), tmp_path / "w.pt")
    np.savez(tmp_path / "inputs.npz", images=x.numpy(), labels=np.arange(6))
    stds = np.linspace(0.2, 0.5, 16)
    np.save(tmp_path / "stds.npy", stds)
    out = tmp_path / "run"
    assert _bound(["mynet:Net", tmp_path / "inputs.npz", "--key", "images", "--weights", tmp_path / "w.pt",
                   "--sigma-file", tmp_path / "stds.npy", "--examples", "4", *TINY, "--out", out]) == 0
    want = hcrfast.bound(other, x[:4], stds, restarts=2, iterations=2)
    np.testing.assert_array_equal(hcrfast.Bounds.load(out / "bounds.npz").std, want.std)
    s = json.loads((out / "summary.json").read_text())
    assert s["weights"]["path"].endswith("w.pt") and s["noise"]["sigma_file"].endswith("stds.npy")


def test_resumes_from_its_chunks_and_refuses_a_changed_call(files, capsys):
    tmp_path, _ = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--chunk-size", "2", "--out", out]
    assert _bound(argv) == 0
    first = hcrfast.Bounds.load(out / "bounds.npz")
    chunks = sorted((out / "chunks").glob("chunk_*.npz"))
    assert len(chunks) == 3
    kept = {p: p.stat().st_mtime_ns for p in chunks[:2]}
    chunks[2].unlink()                                      # the work a crash would have lost
    (out / "bounds.npz").unlink()
    assert _bound(argv) == 0
    again = hcrfast.Bounds.load(out / "bounds.npz")
    np.testing.assert_array_equal(again.std, first.std)     # bitwise: same arithmetic, chunks read back
    assert {p: p.stat().st_mtime_ns for p in chunks[:2]} == kept and chunks[2].exists()
    capsys.readouterr()
    changed = [a if a != "2" or i != argv.index("--restarts") + 1 else "3" for i, a in enumerate(argv)]
    assert _bound(changed) == 2
    err = capsys.readouterr().err
    assert "restarts: 2 -> 3" in err and "other arguments" in err


def test_target_std_searches_sigma_and_writes_the_bounds_at_the_sigma_found(files, capsys):
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--target-std", "0.3", "--quantile", "0.25",
            "--out", out]
    assert _bound(argv) == 0
    printed = capsys.readouterr().out
    model = _user_model(tmp_path)
    want = hcrfast.sigma_for(model, x, 0.3, quantile=0.25, restarts=2, iterations=2)
    got = hcrfast.Bounds.load(out / "bounds.npz")
    np.testing.assert_array_equal(got.std, want.bounds.std)
    assert got.params["sigma"] == pytest.approx(want.sigma, rel=1e-12)
    s = json.loads((out / "summary.json").read_text())
    cal = s["calibration"]
    assert cal["met"] and cal["within_rtol"] and cal["value"] == want.statistic and cal["quantile"] == 0.25
    assert [h["scale"] for h in cal["history"]] == [h["scale"] for h in want.history]
    assert [h["reused_examples"] for h in cal["history"]] == [0] + [6] * (len(cal["history"]) - 1)
    assert s["noise"]["sigma"] == pytest.approx(want.sigma) and s["noise"]["searched_from"] == pytest.approx(want.sigma0)
    assert "0.25-quantile of the per-mode bounds" in printed and ">= target 0.3" in printed
    # 75% of the written bounds reach the target
    assert np.mean(np.asarray(got.std, dtype=np.float64) >= 0.3) >= 0.75
    # made again, the search replays its calls from OUT/calibration/ (nothing recomputed)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "calibration").rglob("*.npz")}
    assert stamps
    assert _bound(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    np.testing.assert_array_equal(hcrfast.Bounds.load(out / "bounds.npz").std, got.std)


@pytest.mark.filterwarnings("ignore:.*never left their start")  # 3 Gauss-Newton steps: some draws take none
def test_the_attack_of_a_sigma_search_runs_at_the_sigma_found(files):
    tmp_path, x = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--target-std", "0.3", "--attack", "2",
                   "--attack-steps", "3", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    found = s["noise"]["sigma"]
    attack = hcrfast.gauss_newton_attack(_user_model(tmp_path), x, found, draws=2, steps=3)
    np.testing.assert_array_equal(hcrfast.AttackResult.load(out / "attack.npz").estimates, attack.estimates)
    assert s["attack"]["median"] == hcrfast.compare(hcrfast.Bounds.load(out / "bounds.npz"), attack)["median"]


def test_the_report_shows_the_sigma_search(files):
    tmp_path, _ = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
            "--target-std", "0.3", "--reuse-gib", "0", "--out", out]
    assert _bound(argv) == 0
    cal = json.loads((out / "summary.json").read_text())["calibration"]
    assert len(cal["history"]) >= 2 and all(h["reused_examples"] == 0 for h in cal["history"])  # nothing kept
    assert cal["reuse_bytes"] == 0
    page = (out / "report.html").read_text()
    assert "sigma searched for a target" in page and "0.5-quantile of the per-mode bounds had to reach 0.3" in page
    calls = re.findall(r"<tr><td class=\"l\">(\d+)</td>", page.split("sigma searched for a target")[1].split("</table>")[0])
    assert calls == [str(i + 1) for i in range(len(cal["history"]))]


def test_target_std_with_one_std_per_feature_writes_the_stds_found(files):
    tmp_path, x = files
    stds = np.linspace(0.2, 0.5, 16)
    np.save(tmp_path / "stds.npy", stds)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma-file", tmp_path / "stds.npy",
                   "--target-std", "0.5", "--statistic", "rmse", "--target-modes", "low:4", "--out", out]) == 0
    found = np.load(out / "sigma.npy")
    s = json.loads((out / "summary.json").read_text())
    np.testing.assert_allclose(found / stds, s["calibration"]["scale"], rtol=1e-14)
    want = hcrfast.bound(_user_model(tmp_path), x, found, restarts=2, iterations=2)
    got = hcrfast.Bounds.load(out / "bounds.npz")
    assert got.params["noise"] == want.params["noise"]  # bounds for these stds, and they say so
    # The search ran on the features divided by the given stds, at a scalar sigma, sharing J's factor
    # between calls: the same problem, in float32 rounded otherwise than a direct call (J of the
    # features divided by other numbers), so the bounds agree to float32 rounding, not bitwise.
    assert len(s["calibration"]["history"]) >= 2
    assert [h["reused_examples"] for h in s["calibration"]["history"][1:]] == [len(x)] * (
        len(s["calibration"]["history"]) - 1)
    np.testing.assert_allclose(got.std, want.std, rtol=5e-3)  # (measured: 4e-4 at most)
    low = np.asarray(got.std, dtype=np.float64)[:, :, :4, :4].reshape(len(x), -1)
    assert np.median(np.sqrt(np.mean(low ** 2, axis=1))) >= 0.5


def test_sweep_bounds_at_each_sigma_what_bound_gives_there_and_resumes(files, capsys):
    """--sweep 0.5,2,1: at each sigma = K x the features' RMS, the bounds a direct hcrfast.bound call gives
    (bitwise: the dense solve's kept factor changes no rounding), in OUT/sweep/scale_K/; made again, the
    sweep reads its calls back from OUT/sweep_chunks/ and recomputes nothing."""
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
            "--sweep", "0.5,2,1", "--out", out]
    assert _bound(argv) == 0
    printed = capsys.readouterr().out
    model = _user_model(tmp_path)
    with torch.no_grad():
        rms = float(np.sqrt(np.mean(model(x).double().numpy() ** 2)))
    s = json.loads((out / "summary.json").read_text())
    levels = s["sweep"]["levels"]
    assert [lv["scale"] for lv in levels] == [0.5, 2.0, 1.0] and s["sweep"]["scales"] == [0.5, 2.0, 1.0]
    assert [lv["reused_examples"] for lv in levels] == [0, 6, 6]   # the first call's factors serve the others
    assert not (out / "bounds.npz").exists() and "sigma" not in s["params"] and s["params"]["restarts"] == 2
    for lv, name in zip(levels, ("scale_0.5", "scale_2", "scale_1")):
        assert lv["sigma"] == pytest.approx(lv["scale"] * rms, rel=1e-12) and lv["sigma_rms"] == lv["sigma"]
        got = hcrfast.Bounds.load(out / "sweep" / name / "bounds.npz")
        want = hcrfast.bound(model, x, lv["sigma"], restarts=2, iterations=2)
        np.testing.assert_array_equal(got.std, want.std)
        assert got.params["noise"] == want.params["noise"]
        assert lv["std"]["q50"] == pytest.approx(float(np.median(want.std)))
        assert lv["bounds"] == str(out / "sweep" / name / "bounds.npz") and f"bounds {lv['bounds']}" in printed
    assert "3 sigmas, certified bounds at each" in printed
    loaded = hcrfast.SigmaSweep.load(out / "sweep")    # the whole sweep, as sweep_sigma returned it
    assert loaded.scales.tolist() == [0.5, 2.0, 1.0] and loaded.reused_examples == [0, 6, 6]
    assert loaded.sigma0 == pytest.approx(rms, rel=1e-12)
    page = (out / "report.html").read_text()
    assert "3 noise levels" in page and re.findall(r'<img src="([^"]+)"', page) == ["bounds_vs_sigma.png"]
    assert (out / "bounds_vs_sigma.png").stat().st_size > 1000
    assert all(f"{lv['std']['q50']:.4g}" in page for lv in levels)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "sweep_chunks").rglob("*.npz")}
    assert len({p.parent for p in stamps}) == 3
    first = hcrfast.Bounds.load(out / "sweep" / "scale_2" / "bounds.npz").std
    (out / "sweep" / "scale_2" / "bounds.npz").unlink()
    assert _bound(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    np.testing.assert_array_equal(hcrfast.Bounds.load(out / "sweep" / "scale_2" / "bounds.npz").std, first)


def test_a_sweep_rerun_into_its_out_without_its_lists_writes_its_sweep_again(files):
    """OUT/sweep/sweep.json and OUT's outputs list removed, the same --sweep made again: the command takes OUT as
    its own (its sweep_chunks/), computes, and SigmaSweep.save then refused the scale_K/bounds.npz no save had
    listed, after the compute, in Python's words. The command vouches for the files it checked."""
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.4", "--sweep", "1,2",
            "--out", out]
    assert _bound(argv) == 0
    first = hcrfast.SigmaSweep.load(out / "sweep")
    (out / "sweep" / "sweep.json").unlink()
    (out / ".hcrfast-outputs.json").unlink()
    assert _bound(argv) == 0
    again = hcrfast.SigmaSweep.load(out / "sweep")
    for a, b in zip(first.bounds, again.bounds):
        np.testing.assert_array_equal(a.std, b.std)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "sweep.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds sweep\.json.*overwrite=True"):
        again.save(tmp_path / "mine")
    assert (tmp_path / "mine" / "sweep.json").read_text() == "{}"
    again.save(tmp_path / "mine", overwrite=True)
    assert hcrfast.SigmaSweep.load(tmp_path / "mine").scales.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("reuse", ["0", None], ids=["nothing-kept", "factors-kept"])
def test_sweep_of_one_std_per_feature(files, reuse):
    """--sigma-file with --sweep: each level is the profile times its scale. Kept nothing, each call is a plain
    per-feature call (bitwise); kept factors, the calls run on the features divided by the stds, so they agree
    to float32 rounding."""
    tmp_path, x = files
    stds = np.linspace(0.2, 0.5, 16)
    np.save(tmp_path / "stds.npy", stds)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma-file", tmp_path / "stds.npy",
                   "--sweep", "1,3", *(["--reuse-gib", reuse] if reuse else []), "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    model = _user_model(tmp_path)
    for lv, name in zip(s["sweep"]["levels"], ("scale_1", "scale_3")):
        assert lv["sigma"] is None and lv["sigma_rms"] == pytest.approx(lv["scale"] * np.sqrt(np.mean(stds ** 2)))
        want = hcrfast.bound(model, x, lv["scale"] * stds, restarts=2, iterations=2)
        got = hcrfast.Bounds.load(out / "sweep" / name / "bounds.npz")
        assert got.params["noise"] == want.params["noise"]
        if reuse == "0":
            np.testing.assert_array_equal(got.std, want.std)
        else:
            np.testing.assert_allclose(got.std, want.std, rtol=5e-3)
    assert [lv["reused_examples"] for lv in s["sweep"]["levels"]] == ([0, 0] if reuse == "0" else [0, 6])
    assert (s["sweep"]["reuse_bytes"] == 0) == (reuse == "0")


@pytest.mark.filterwarnings("ignore:.*never left their start")  # 3 Gauss-Newton steps: some draws take none
def test_the_attack_of_a_sweep_runs_at_each_sigma(files, capsys):
    tmp_path, x = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.4", "--sweep", "1,4",
                   "--attack", "2", "--attack-steps", "3", "--out", out]) == 0
    printed = capsys.readouterr().out
    levels = json.loads((out / "summary.json").read_text())["sweep"]["levels"]
    for lv, name in zip(levels, ("scale_1", "scale_4")):
        assert lv["sigma"] == pytest.approx(0.4 * lv["scale"], rel=1e-15)
        attack = hcrfast.gauss_newton_attack(_user_model(tmp_path), x, lv["sigma"], draws=2, steps=3)
        got = hcrfast.AttackResult.load(out / "sweep" / name / "attack.npz")
        np.testing.assert_array_equal(got.estimates, attack.estimates)
        bounds = hcrfast.Bounds.load(out / "sweep" / name / "bounds.npz")
        assert lv["attack"]["median"] == hcrfast.compare(bounds, attack)["median"]
        assert f"attack {out / 'sweep' / name / 'attack.npz'}" in printed
    assert levels[0]["attack"]["median"] != levels[1]["attack"]["median"]


HEAD_FILE = textwrap.dedent("""
    import torch

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(7)
            self.w = torch.nn.Parameter(torch.randn(4, 16, generator=g))

        def forward(self, f):
            return f @ self.w.T
""")


def _head_files(tmp_path, x):
    """A 4-class head on Net's 16 features, and labels: its own clean predictions, every third moved."""
    (tmp_path / "head.py").write_text(HEAD_FILE)
    import importlib.util

    spec = importlib.util.spec_from_file_location("head_oracle", tmp_path / "head.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    head = module.Head().eval()
    with torch.no_grad():
        labels = head(_user_model(tmp_path)(x)).argmax(dim=1).numpy()
    labels[::3] = (labels[::3] + 1) % 4
    np.save(tmp_path / "y.npy", labels)
    return head, labels


def test_the_head_s_accuracy_on_the_dithered_features_is_the_api_s(files, capsys):
    tmp_path, x = files
    head, labels = _head_files(tmp_path, x)
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
            "--head", f"{tmp_path / 'head.py'}:Head", "--labels", tmp_path / "y.npy", "--utility-draws", "5",
            "--seed", "2", "--out", out]
    assert _bound(argv) == 0
    printed = capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    want = hcrfast.dithered_accuracy(_user_model(tmp_path), head, x, labels, s["noise"]["sigma"], draws=5, seed=2)
    assert s["utility"]["per_draw"] == want.per_draw.tolist() and s["utility"]["clean"] == want.clean == 4 / 6
    assert s["utility"]["draws"] == 5 and s["head"]["spec"].endswith("head.py:Head")
    assert want.summary() in printed
    assert "What the noise costs" in (out / "report.html").read_text()


def test_the_head_runs_in_the_model_s_dtype(files):
    """--double: the head, the model and the inputs all in float64 (the head's check included)."""
    tmp_path, x = files
    head, labels = _head_files(tmp_path, x)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--double", "--sigma", "0.3",
                   "--head", f"{tmp_path / 'head.py'}:Head", "--labels", tmp_path / "y.npy", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    want = hcrfast.dithered_accuracy(_user_model(tmp_path).double(), head.double(), x.double(), labels, 0.3)
    assert s["inputs"]["dtype"] == "float64" and s["utility"]["per_draw"] == want.per_draw.tolist()


def test_a_sweep_reports_the_accuracy_at_each_sigma_and_the_trade(files):
    tmp_path, x = files
    head, labels = _head_files(tmp_path, x)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
                   "--sweep", "0.1,10", "--head", f"{tmp_path / 'head.py'}:Head", "--labels", tmp_path / "y.npy",
                   "--out", out]) == 0
    levels = json.loads((out / "summary.json").read_text())["sweep"]["levels"]
    model = _user_model(tmp_path)
    for lv in levels:
        want = hcrfast.dithered_accuracy(model, head, x, labels, lv["sigma"], draws=10)
        assert lv["utility"]["per_draw"] == want.per_draw.tolist()
    assert levels[0]["utility"]["dithered"] > levels[1]["utility"]["dithered"]   # 100 x the noise costs accuracy
    page = (out / "report.html").read_text()
    assert re.findall(r'<img src="([^"]+)"', page) == ["bounds_vs_sigma.png", "tradeoff.png"]
    assert f"{levels[1]['utility']['dithered']:.4f} ± {levels[1]['utility']['stderr']:.4f}" in page


def test_min_accuracy_bounds_at_the_largest_sigma_the_head_allows(files, capsys):
    tmp_path, x = files
    head, labels = _head_files(tmp_path, x)
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--head", f"{tmp_path / 'head.py'}:Head",
            "--labels", tmp_path / "y.npy", "--min-accuracy", "0.5", "--utility-draws", "20", "--out", out]
    assert _bound(argv) == 0
    model = _user_model(tmp_path)
    want = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, draws=20)
    s = json.loads((out / "summary.json").read_text())
    assert s["noise"]["sigma"] == want.sigma and s["accuracy_search"]["scale"] == want.scale
    assert s["utility"]["dithered"] == want.utility.dithered >= 0.5 > s["accuracy_search"]["above_accuracy"]
    np.testing.assert_array_equal(hcrfast.Bounds.load(out / "bounds.npz").std,
                                  hcrfast.bound(model, x, want.sigma, restarts=2, iterations=2).std)
    assert want.summary() in capsys.readouterr().out
    stamps = {p: p.stat().st_mtime_ns for p in (out / "chunks").rglob("*.npz")}
    assert stamps and _bound(argv) == 0   # the same search again: the same sigma, its chunks read back
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_an_accuracy_the_clean_features_miss_is_refused_before_any_bound(files, capsys):
    tmp_path, x = files
    _head_files(tmp_path, x)   # labels: the head's own predictions, every third moved (clean accuracy 4/6)
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--head", f"{tmp_path / 'head.py'}:Head",
                   "--labels", tmp_path / "y.npy", "--min-accuracy", "0.9", "--out", tmp_path / "run"]) == 2
    assert "the head's clean accuracy on these inputs is 0.6667, under the target" in capsys.readouterr().err
    assert not (tmp_path / "run" / "chunks").exists()


def test_a_sigma_search_reports_the_accuracy_at_the_sigma_found(files):
    tmp_path, x = files
    head, labels = _head_files(tmp_path, x)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--target-std", "0.3",
                   "--head", f"{tmp_path / 'head.py'}:Head", "--labels", tmp_path / "y.npy", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    want = hcrfast.dithered_accuracy(_user_model(tmp_path), head, x, labels, s["noise"]["sigma"], draws=10)
    assert s["utility"]["per_draw"] == want.per_draw.tolist() and s["utility"]["sigma"] == s["noise"]["sigma"]


@pytest.mark.parametrize("line", ["raise ValueError('boom in forward')",
                                  "return x + 'a'"])   # a TypeError inside torch, called by the model
def test_an_error_the_users_model_raises_keeps_its_traceback(files, line):
    """hcrfast's own refusals print one line (exit 2); a ValueError or TypeError raised in the user's model
    (or a library it calls) is not hcrfast's to reword: it propagates with its traceback and hcrfast's note of
    where it was running the model."""
    tmp_path, _ = files
    (tmp_path / "bad.py").write_text(f"import torch\nclass Bad(torch.nn.Module):\n    def forward(self, x):\n"
                                     f"        {line}\n")
    with pytest.raises((ValueError, TypeError)) as info:
        _bound([f"{tmp_path / 'bad.py'}:Bad", tmp_path / "x.pt", *TINY, "--out", tmp_path / "run"])
    assert any("the model raised this on its first forward pass" in note for note in info.value.__notes__)


def test_an_out_holding_another_kind_of_run_is_refused_and_a_rerun_leaves_nothing_of_the_last(files, capsys):
    """A plain run, a --target-std search and a --sweep each resume from their own chunks: one OUT holds one
    kind. Within a kind, what the last command wrote and this one does not (a sweep's other scales, an
    attack no longer asked for) is removed, so OUT holds this command's results alone."""
    tmp_path, _ = files
    model, x = f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt"
    out = tmp_path / "run"
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--attack", "2", "--attack-steps", "1",
                   "--out", out]) == 0
    assert (out / "attack.npz").is_file()
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--out", out]) == 0   # no attack now
    assert not (out / "attack.npz").exists() and "attack" not in json.loads((out / "summary.json").read_text())
    capsys.readouterr()
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--sweep", "1,2", "--out", out]) == 2
    assert (f"--out {out}: holds a plain bound run (chunks, bounds.npz), and this command is a --sweep, which "
            f"would leave its results beside those") in capsys.readouterr().err
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--target-std", "1", "--out", out]) == 2
    assert "holds a plain bound run (chunks)" in capsys.readouterr().err

    swept = tmp_path / "swept"
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--sweep", "1,2", "--out", swept]) == 0
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--sweep", "2,4", "--out", swept]) == 0
    assert sorted(p.name for p in (swept / "sweep").iterdir()) == ["scale_2", "scale_4", "sweep.json"]
    again = hcrfast.SigmaSweep.load(swept / "sweep")
    np.testing.assert_array_equal(again.scales, [2.0, 4.0])
    assert _bound([model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--out", swept]) == 2
    assert "holds a --sweep (sweep_chunks, sweep)" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*never left their start")  # 1 Gauss-Newton step: some draws take none
def test_a_sweep_rerun_without_attack_removes_the_last_attack(files):
    """README: a rerun removes what the last command wrote and it does not, "an attack no longer asked for"
    included; in a sweep, each scale's attack.npz (as the plain run's OUT/attack.npz)."""
    tmp_path, _ = files
    model, x = f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt"
    out = tmp_path / "swept"
    argv = [model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--sweep", "2,1", "--out", out]
    assert _bound([*argv, "--attack", "2", "--attack-steps", "1"]) == 0
    assert (out / "sweep" / "scale_1" / "attack.npz").is_file()
    assert _bound(argv) == 0
    assert sorted(p.name for p in (out / "sweep" / "scale_1").iterdir()) == ["bounds.npz"]
    assert sorted(p.name for p in (out / "sweep" / "scale_2").iterdir()) == ["bounds.npz"]
    assert all("attack" not in lv for lv in json.loads((out / "summary.json").read_text())["sweep"]["levels"])


@pytest.mark.parametrize("sweep", [["--sweep", "1,8"], []], ids=["sweep", "plain"])
def test_a_rerun_with_no_report_removes_the_last_report(files, sweep):
    """--no-report after a report: the old report.html and figures showed the last command's numbers (a sweep's
    other sigmas), so they go; a report that leaves a figure out (tradeoff.png without --head) removes it too."""
    tmp_path, _ = files
    model, x = f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt"
    out = tmp_path / "run"
    base = [model, x, *[a for a in TINY if a != "--no-report"], "--sigma", "0.3", "--examples", "2", "--out", out]
    assert _bound([*base, *sweep]) == 0
    figures = ["bounds_vs_sigma.png"] if sweep else ["bound_images.png", "bound_modes.png", "hist_all.png"]
    assert all((out / f).is_file() for f in ["report.html", *figures])
    (out / "tradeoff.png").write_bytes(b"the user's own figure")   # no hcrfast command wrote it: kept
    assert _bound([*base, *(["--sweep", "1,2"] if sweep else []), "--no-report"]) == 0
    assert not [f for f in ["report.html", *figures] if (out / f).exists()]
    assert _bound([*base, *(["--sweep", "1,2"] if sweep else [])]) == 0
    assert (out / "report.html").is_file() and (out / "tradeoff.png").read_bytes() == b"the user's own figure"
    # an --out that also holds a page hcrfast did not write: --no-report removes none of its files
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("<html><title>my notes</title></html>")
    (mine / "hist_all.png").write_bytes(b"my figure")
    assert _bound([*base[:-1], mine, *(["--sweep", "1,2"] if sweep else []), "--no-report"]) == 0
    assert (mine / "report.html").read_text() == "<html><title>my notes</title></html>"
    assert (mine / "hist_all.png").read_bytes() == b"my figure"


def test_a_sweep_s_shared_params_are_settings_and_each_level_has_its_own_account(files):
    """summary.json's params are what the sigmas share: singular_steps' count, not the modes the first call's
    steps lifted; each call's own account (earlier iterates, singular and targeted steps' counts and
    seconds) is in its level's params, as in its bounds.npz."""
    tmp_path, _ = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--examples", "3", "--targets", "low:2",
                   "--sweep", "1e-6,1,1e8", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    p = s["params"]
    assert p["singular_steps"] == {"count": 16, "auto": True}
    assert set(p["targeted"]) <= {"method", "n_targets", "eps_kept"} and p["targeted"]["n_targets"] == 4
    assert not {"earlier_iterates", "dense", "sigma", "noise", "reuse", "checkpoint", "rounding"} & set(p)
    assert p["restarts"] == 2 and p["solver"] == "dense"
    for lv in s["sweep"]["levels"]:
        own = hcrfast.Bounds.load(lv["bounds"]).params
        for key in ("singular_steps", "earlier_iterates", "targeted"):
            assert lv["params"][key] == json.loads(json.dumps(own[key], default=hcrfast.results.json_default))
    lifted = [lv["params"]["singular_steps"]["modes_lifted"] for lv in s["sweep"]["levels"]]
    assert len(set(lifted)) > 1    # what made the first sigma's count wrong for the others


def test_a_sweep_s_error_says_which_scale_and_a_changed_sweep_the_fix_for_the_shell(files, capsys):
    """The note sweep_sigma adds (the scale that failed) is printed below the message; a changed sweep
    refused by one scale's checkpoint folder says to pass another --out or delete OUT (deleting that one
    folder would move the refusal to the next scale)."""
    tmp_path, _ = files
    model, x = f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt"
    out = tmp_path / "run"
    assert _bound([model, x, *TINY, "--examples", "2", "--sweep", "1,1e-20", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hcrfast: error: ") and "Traceback" not in err
    assert "\n  hcrfast.sweep_sigma: raised by the bound call at scale 1e-20 x sigma0 (1 of 2 sigmas done" in err
    assert _bound([model, x, *TINY, "--examples", "2", "--sweep", "1,2", "--out", out]) == 0
    capsys.readouterr()
    assert _bound([model, x, *TINY, "--examples", "2", "--sweep", "1,2", "--out", out, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "seed: 0 -> 1" in err and f"pass another --out (or delete {out}) to start anew" in err
    assert "checkpoint folder" not in err and not re.search(r"delete \S*sweep_chunks", err)


def test_a_package_in_the_working_directory_is_found_as_python_m_finds_it(files, monkeypatch):
    """MODEL as package.module:NAME: the console script looks in the working directory first, as
    `python -m hcrfast.cli` (and torchrun -m) does, and leaves sys.path as it was."""
    tmp_path, x = files
    (tmp_path / "mypkg_cwd").mkdir()
    (tmp_path / "mypkg_cwd" / "__init__.py").write_text("")
    (tmp_path / "mypkg_cwd" / "models.py").write_text(MODEL_FILE)
    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    assert _bound(["mypkg_cwd.models:Net", "x.pt", *TINY, "--out", "run"]) == 0
    assert sys.path == path
    want = hcrfast.bound(_user_model(tmp_path), x, float(json.loads((tmp_path / "run" / "summary.json").read_text())
                                                          ["noise"]["sigma"]), restarts=2, iterations=2)
    np.testing.assert_array_equal(hcrfast.Bounds.load(tmp_path / "run" / "bounds.npz").std, want.std)


def test_an_out_that_is_a_file_is_refused_before_the_model_runs(files, capsys):
    tmp_path, _ = files
    (tmp_path / "taken").write_text("a user's file")
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--out", tmp_path / "taken"]) == 2
    assert "taken: a file is there; pass a folder for the results" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "a user's file"


METRIC_FILE = textwrap.dedent("""
    def neg_sq_error(outputs, targets):
        return -((outputs - targets) ** 2).sum(dim=1)

    first = lambda outputs, targets: outputs[:, 0]
""")


def test_a_lambda_metric_is_named_by_its_name_in_the_file_and_shown_in_the_report(files):
    """--metric metric.py:first, a lambda: summary.json and the page call it first(), not <lambda> (which
    the page would read as a tag)."""
    tmp_path, x = files
    (tmp_path / "metric.py").write_text(METRIC_FILE)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
                   "--metric", f"{tmp_path / 'metric.py'}:first", "--min-utility", "-5", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["utility"]["metric"] == s["accuracy_search"]["metric"] == "first()"
    page = (out / "report.html").read_text()
    assert "keeps a dithered first() of at least -5" in page and "each the dithered features alone" in page
    with torch.no_grad():
        first = _user_model(tmp_path)(x)[:, 0]
    assert s["utility"]["clean"] == pytest.approx(float(first.double().mean()), rel=1e-6)


def test_cosine_needs_no_head_nor_labels_and_each_sigma_s_is_the_api_s(files):
    """Embeddings released as they are: --metric cosine, each noisy copy against the clean features."""
    tmp_path, x = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"],
                   "--sweep", "0.5,4", "--metric", "cosine", "--utility-draws", "3", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    model = _user_model(tmp_path)
    for lv in s["sweep"]["levels"]:
        want = hcrfast.dithered_accuracy(model, None, x, None, lv["sigma"], draws=3, metric="cosine")
        assert lv["utility"]["per_draw"] == want.per_draw.tolist() and lv["utility"]["metric"] == "cosine"
    assert s["head"] == {"spec": None, "weights": None, "labels": None, "labels_key": None, "labels_sha256": None,
                         "metric": "cosine"}
    page = (out / "report.html").read_text()
    assert "cosine similarity, dithered" in page and "The features themselves (no head)" in page


def test_a_metric_function_scores_the_copies_against_the_labels_rows(files):
    """--metric file.py:NAME with float targets, one row of 4 per input, through a head."""
    tmp_path, x = files
    head, _ = _head_files(tmp_path, x)
    (tmp_path / "metric.py").write_text(METRIC_FILE)
    targets = np.random.default_rng(3).standard_normal((6, 4))
    np.save(tmp_path / "t.npy", targets)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--head", f"{tmp_path / 'head.py'}:Head",
                   "--labels", tmp_path / "t.npy", "--metric", f"{tmp_path / 'metric.py'}:neg_sq_error",
                   "--min-utility", "-60", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())

    def neg_sq_error(outputs, rows):
        return -((outputs - rows) ** 2).sum(dim=1)

    want = hcrfast.sigma_for_accuracy(_user_model(tmp_path), head, x, targets, -60, draws=10, metric=neg_sq_error)
    assert s["noise"]["sigma"] == want.sigma and s["utility"]["dithered"] == want.utility.dithered >= -60
    assert s["accuracy_search"]["metric"] == "neg_sq_error()" and s["head"]["metric"].endswith("metric.py:neg_sq_error")


def test_top_k_accuracy_from_the_shell_is_the_api_s(files):
    tmp_path, x = files
    head, labels = _head_files(tmp_path, x)
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--head", f"{tmp_path / 'head.py'}:Head",
                   "--labels", tmp_path / "y.npy", "--metric", "top2", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    want = hcrfast.dithered_accuracy(_user_model(tmp_path), head, x, labels, s["noise"]["sigma"], metric="top2")
    assert s["utility"]["per_draw"] == want.per_draw.tolist() and s["utility"]["metric"] == "top2"


@pytest.mark.parametrize("model, inputs, extra, words", [
    ("{d}/mynet.py:Net", "x.pt", ["--quantile", "0.1"], "--quantile set how --target-std searches sigma"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "0"], "--target-std 0: pass a positive finite number"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "1", "--quantile", "2"], "error: --quantile 2.0: pass a number in "
                                                                           "[0, 1]"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "1", "--rtol", "0"],
     "error: --rtol must be a positive finite number, got 0.0"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "1", "--target-modes", "7"], "--target-modes takes 'all' or"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "1", "--max-calls", "0"], "error: --max-calls must be at least 1"),
    # the Python layer's refusals, in the flags of the command line (its keywords are Python's)
    ("{d}/mynet.py:Net", "x.pt", ["--solver", "dense", "--linearize-at", "current"],
     "error: --solver dense factors J at the input once, but --linearize-at current needs a new J for every solve; "
     "pass --linearize-at input or --solver lsqr"),
    ("{d}/mynet.py:Net", "x.pt", ["--singular-steps", "3", "--solver", "lsqr"],
     "error: --singular-steps 3 takes J's smallest singular directions"),
    ("{d}/mynet.py:Net", "x.pt", ["--singular-steps", "3", "--solver", "lsqr"],
     "pass --solver dense or --solver krylov (--linearize-at input), or --singular-steps 0"),
    ("{d}/mynet.py:Net", "x.pt", ["--seed", "-1"], "error: --seed must be a non-negative integer, got -1\n"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/s15.npy"], "error: --sigma-file "),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/s15.npy"],
     "s15.npy holds 15 stds, one per feature, but the model gives 16 features"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/s15.npy"], "or one number (--sigma)"),
    ("{d}/mynet.py:Net", "x.pt", ["--krylov-pilots", "2", "--solver", "dense"],
     "error: --krylov-pilots 2 applies to --solver krylov only, but this call solves with 'dense'; pass --solver "
     "krylov, or leave --krylov-pilots at its default"),
    ("{d}/mynet.py:Net", "x.pt", ["--krylov-pilots", "3"], "error: --krylov-pilots 3 exceeds --restarts 2"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "1", "--reuse-gib", "-1"], "--reuse-gib -1: pass a number"),
    ("{d}/mynet.py:Net", "x.pt", ["--reuse-gib", "2"], "--reuse-gib sets what the bound calls of --target-std or "
                                                        "--sweep share"),
    ("{d}/mynet.py:Net", "x.pt", ["--sweep", "1,x"], "--sweep '1,x': pass comma-separated positive numbers"),
    ("{d}/mynet.py:Net", "x.pt", ["--sweep", "1,-2"], "-2.0 is not a positive finite number"),
    ("{d}/mynet.py:Net", "x.pt", ["--sweep", "1,inf"], "inf is not a positive finite number"),
    ("{d}/mynet.py:Net", "x.pt", ["--sweep", "2,1,2.0"], "2 is given 2 times; name each sigma once"),
    ("{d}/mynet.py:Net", "x.pt", ["--sweep", "1,2", "--target-std", "1"], "--sweep and --target-std: pass one"),
    ("{d}/mynet.py:Net", "x.pt", ["--sweep", "1", "--quantile", "0.1"], "--quantile set how --target-std searches"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net"], "--head without --labels"),
    ("{d}/mynet.py:Net", "x.pt", ["--labels", "{d}/y.npy"], "--labels without --head"),
    ("{d}/mynet.py:Net", "x.pt", ["--utility-draws", "3"],
     "--utility-draws set how --head and --labels (or --metric) measure"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "f1"], "--metric 'f1': pass accuracy, topK"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "top3"],
     "--metric top3: it scores a classifier's classes against the inputs' labels; pass --head and --labels"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "cosine", "--labels", "{d}/y.npy"], "--labels with --metric cosine"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "{d}/mynet.py:Net"], "Net is a class, not a function (outputs, "),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "{d}/mynet.py:nope"], "mynet.py has no 'nope'; it has Net, Pair, instance, make"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "cosine", "--head-weights", "{d}/bad_w.pt"],
     "--head-weights without --head: pass --head, or drop --head-weights"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "cosine", "--min-utility", "1.5"],
     "--min-utility 1.5: pass the dithered cosine to keep, a number in (0, 1)"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "cosine", "--min-utility", "0.9", "--sweep", "1,2"],
     "--min-utility and --sweep: pass one of them (--min-utility picks sigma for the utility"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", ""], "--metric '': pass accuracy"),
    ("{d}/mynet.py:Net", "x.pt", ["--metric", "{d}/mynet.py:make", "--labels", "{d}/two.npz"],
     "holds 2 entries (images, labels); name the labels with --labels-key"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/y.npy", "--utility-draws", "0"],
     "--utility-draws 0: pass a positive integer"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/y5.npy"],
     "5 rows for 6 inputs; pass one per input"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/y9.npy", "--examples", "3"],
     "9 rows for 6 inputs (--examples 3); pass one per input"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/yf.npy"],
     "holds float64 values; pass integer classes"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/two.npz"],
     "holds 2 entries (images, labels); name the labels with --labels-key"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/two.npz", "--labels-key", "no"],
     "--labels-key 'no': "),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/head.py:Head", "--labels", "{d}/y.npy"],
     "labels hold class 20, but the head scores 4 classes (0..3)"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/mynet.py:Net", "--labels", "{d}/y.npy"],
     "the head failed on the features, shape (6, 16) (mat1 and mat2 shapes cannot be multiplied"),
    ("{d}/mynet.py:Net", "x.pt", ["--min-accuracy", "0.5"], "--min-accuracy set how --head and --labels (or"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/head.py:Head", "--labels", "{d}/y4.npy", "--min-accuracy", "1.5"],
     "--min-accuracy 1.5: pass the dithered accuracy to keep, a number in (0, 1]"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/head.py:Head", "--labels", "{d}/y4.npy", "--min-accuracy", "0.5",
                                  "--sweep", "1,2"], "--min-accuracy and --sweep: pass one of them"),
    ("{d}/mynet.py:Net", "x.pt", ["--head", "{d}/head.py:Head", "--labels", "{d}/y4.npy", "--min-accuracy", "0.5",
                                  "--target-std", "1"], "--min-accuracy and --target-std: pass one of them"),
    ("{d}/mynet.py", "x.pt", [], "pass 'path/to/file.py:NAME'"),
    ("{d}/mynet.py:Nope", "x.pt", [], "has no 'Nope'; it has Net, Pair, instance, make"),
    ("{d}/nofile.py:Net", "x.pt", [], "no Python file at"),
    ("no_such_module_xyz:Net", "x.pt", [], "no module 'no_such_module_xyz' in the working directory or on the path"),
    ("no_such_module_xyz.sub:Net", "x.pt", [], "no module 'no_such_module_xyz' in the working directory or on the path"),
    ("{d}/mynet.py:not_a_model", "x.pt", [], "not_a_model is a int, not a torch.nn.Module"),
    ("{d}/mynet.py:Net", "x.txt", [], "pass a .pt, .pth, .npy, .npz file"),
    ("{d}/mynet.py:Net", "missing.pt", [], "no such file"),
    ("{d}/mynet.py:Net", "u8.pt", [], "the inputs are torch.uint8"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/two.npz"], "two.npz: pass a .npy file (np.save(PATH, stds))"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/nope.npy"], "nope.npy: no such file"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/cut.npy"], "cut.npy: not a readable .npy of numbers"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/words.npy"], "words.npy: holds 2 <U1 values; pass one"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma-file", "{d}/zeros.npy"], "zeros.npy: 16 of its 16 stds are not positive"),
    ("{d}/mynet.py:Net", "x.pt", ["--examples", "9"], "--examples 9: "),
    ("{d}/mynet.py:Net", "x.pt", ["--examples", "0"], "--examples 0: pass a positive integer"),
    ("{d}/mynet.py:Net", "x.pt", ["--attack", "0"], "--attack 0: pass a positive integer"),
    ("{d}/mynet.py:Net", "x.pt", ["--attack-steps", "5"], "--attack-steps sets how --attack reconstructs the inputs; "
                                                          "pass --attack DRAWS, or drop it"),
    ("{d}/mynet.py:Net", "x.pt", ["--attack-start", "mean", "--attack-steps", "5"], "drop them"),
    ("{d}/mynet.py:Net", "x.pt", ["--attack", "2", "--attack-steps", "0"], "--attack-steps 0: pass a positive"),
    ("{d}/mynet.py:Net", "x.pt", ["--sigma", "nan"], "--sigma nan: pass a positive finite number"),
    ("{d}/mynet.py:Net", "x.pt", ["--targets", "3"], "--targets takes 'all' or 'low:K'"),
    ("{d}/mynet.py:Net", "x.pt", ["--targets", "low:9"], "--targets low:9: K must lie in 1..8 for examples of shape"),
    ("{d}/mynet.py:Net", "x.pt", ["--target-std", "1", "--target-modes", "low:99"], "--target-modes low:99: K must"),
    ("{d}/mynet.py:Net", "x.pt", ["--targets", "low:2", "--basis", "pixel"],
     "--targets low:2: selects low DCT frequencies, but --basis 'pixel'; pass --basis 'dct'"),
    ("{d}/mynet.py:Net", "x.pt", ["--key", "a"], "--key 'a': "),
    ("{d}/mynet.py:Net", "x.pt", ["--weights", "{d}/bad_w.pt"],
     "mynet.py:Net: missing keys (3): a, b, c; unexpected keys (1): lin.weight; pass a state dict of that model"),
    ("{d}/mynet.py:Net", "x.pt", ["--weights", "{d}/small_w.pt"], "mynet.py:Net: size mismatch for a: copying a "),
    ("{d}/mynet.py:Net", "two.npz", [], "holds 2 entries (images, labels); name the inputs with --key"),
    ("{d}/mynet.py:Pair", "x.pt", [], "the model must return a torch.Tensor of features, got tuple"),
    ("{d}/mynet.py:Net", "two.npz", ["--key", "nope"], "--key 'nope': "),
    ("{d}/mynet.py:Net", "none.pt", [], "none.pt: shape (0, 1, 8, 8) holds no inputs"),
    ("{d}/mynet.py:Net", "x.pt", ["--weights", "default"],
     "--weights default: no such file ('default', torchvision's pretrained weights, exists only for `hcrfast "
     "reproduce resnet18`"),
])
def test_bad_arguments_are_named_with_their_fix(files, capsys, model, inputs, extra, words):
    tmp_path, _ = files
    torch.save(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), tmp_path / "u8.pt")
    torch.save(torch.zeros(0, 1, 8, 8), tmp_path / "none.pt")
    torch.save({"lin.weight": torch.zeros(3, 3)}, tmp_path / "bad_w.pt")
    torch.save({"a": torch.zeros(2, 2), "b": torch.zeros(24), "c": torch.zeros(16, 24)}, tmp_path / "small_w.pt")
    np.savez(tmp_path / "two.npz", images=np.zeros((2, 1, 8, 8)), labels=np.arange(2))
    np.save(tmp_path / "y.npy", np.full(6, 20))
    np.save(tmp_path / "y4.npy", np.zeros(6, dtype=int))
    (tmp_path / "head.py").write_text(HEAD_FILE)
    np.save(tmp_path / "y5.npy", np.zeros(5, dtype=int))
    np.save(tmp_path / "y9.npy", np.zeros(9, dtype=int))
    np.save(tmp_path / "words.npy", np.array(["a", "b"]))
    np.save(tmp_path / "zeros.npy", np.zeros(16))
    np.save(tmp_path / "s15.npy", np.ones(15))
    np.save(tmp_path / "cut.npy", np.ones(16))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:20])
    np.save(tmp_path / "yf.npy", np.zeros(6))
    argv = [model.format(d=tmp_path), tmp_path / inputs, *[e.format(d=tmp_path) for e in extra], *TINY,
            "--out", tmp_path / "run"]
    assert _bound(argv) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "run" / "bounds.npz").exists()


def test_the_python_layer_keeps_its_keywords_where_the_command_line_says_flags(files):
    """Only the command line's messages are said in flags: hcrfast.bound's own still name its keywords."""
    tmp_path, x = files
    with pytest.raises(ValueError, match=r"solver='dense' .* pass linearize_at='input' or solver='lsqr'"):
        hcrfast.bound(_user_model(tmp_path), x, 1.0, solver="dense", linearize_at="current", restarts=2)
    with pytest.raises(ValueError, match=r"^seed must be a non-negative integer, got -1$"):
        hcrfast.bound(_user_model(tmp_path), x, 1.0, seed=-1, restarts=2)


CAST_FILE = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 16)

        def forward(self, x):
            return torch.tanh(self.lin(x.float().flatten(1)))
""")


def test_a_fix_only_python_has_is_said_to_be_python_s(files, capsys):
    """A forward that casts to float32 fails certify's float64 copy; the fix certify=False has no flag."""
    tmp_path, _ = files
    (tmp_path / "castnet.py").write_text(CAST_FILE)
    assert _bound([f"{tmp_path}/castnet.py:Net", tmp_path / "x.pt", *TINY, "--out", tmp_path / "run"]) == 2
    err = capsys.readouterr().err
    assert "or certify=False" in err
    assert err.rstrip().endswith("(certify=: from Python only; hcrfast bound has no flag for it)")


@pytest.mark.parametrize("flag, value, read_as", [("--size", "1e-400", "0"), ("--sigma", "1e-400", "0"),
                                                   ("--sigma-scale", "1e400", "inf"),
                                                   ("--sigma", "1e-320", "9.99989e-321")])
def test_a_float_flag_float64_would_change_is_refused_as_typed(files, capsys, flag, value, read_as):
    tmp_path, _ = files
    with pytest.raises(SystemExit) as exc:
        _bound([f"{tmp_path}/mynet.py:Net", tmp_path / "x.pt", flag, value, *TINY, "--out", tmp_path / "run"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {value} is outside float64's normal range" in err
    assert f"(it would be read as {read_as})" in err
    assert not (tmp_path / "run").exists()


def test_a_run_read_back_from_chunks_of_another_threads_count_records_that_count(files, capsys):
    """Run with --threads 1, then again into the same --out with --threads 2: every chunk is read back (the bounds
    are the 1-thread run's, bit for bit), but summary.json's command said --threads 2, which computes other bits
    (the float32 LSQR's rounding follows the count: 1.5e-4 apart in an audit). It now names the chunks' count, and
    the run says so; chunks of mixed counts leave the run's own count (and the checkpoint warns of the mix). (A
    given --sigma: the default, the features' RMS, is a float32 sum whose last bits follow the count too, and
    the call made with another count is refused as another sigma.)"""
    import shlex

    tmp_path, _ = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", "--restarts", "2", "--iterations", "2", "--solver",
            "lsqr", "--chunk-size", "2", "--sigma", "0.5", "--no-progress", "--no-report", "--out", tmp_path / "run"]
    saved = torch.get_num_threads()
    try:
        assert cli.main(["bound", *map(str, argv), "--threads", "1"]) == 0
        first = json.loads((tmp_path / "run" / "summary.json").read_text())
        capsys.readouterr()
        assert cli.main(["bound", *map(str, argv), "--threads", "2"]) == 0
        again = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert ("results were read back from chunks computed with --threads 1 (this run has 2); summary.json's "
                "command names --threads 1" in capsys.readouterr().err)
        words = shlex.split(again["command"])
        assert words[words.index("--threads") + 1] == "1" and again["command"] == first["command"]
        assert again["chunks_threads"] == 1 and again["threads"] == 2
        # a chunk computed again at 2 threads: a mix, no single count to name
        chunk = sorted((tmp_path / "run" / "chunks").glob("chunk_*.npz"))[0]
        chunk.unlink()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert cli.main(["bound", *map(str, argv), "--threads", "2"]) == 0
        mixed = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert mixed["chunks_threads"] is None
        words = shlex.split(mixed["command"])
        assert words[words.index("--threads") + 1] == "2"
        assert "no one --threads repeats them all bit for bit" in capsys.readouterr().err
        # an attack computed by the rerun (its chunks at 2 threads) beside bounds read back from 1 thread: no one
        # count; and a search's every call counts, not its last alone (a review: both named one count)
        attack = [*map(str, argv[:-1]), str(tmp_path / "attacked")]
        assert cli.main(["bound", *attack, "--threads", "1"]) == 0
        assert cli.main(["bound", *attack, "--threads", "2", "--attack", "2", "--attack-steps", "2"]) == 0
        assert json.loads((tmp_path / "attacked" / "summary.json").read_text())["chunks_threads"] is None
        search = [*map(str, argv[:-1]), str(tmp_path / "search"), "--target-std", "0.6", "--quantile", "0.37",
                  "--statistic", "rmse"]
        assert cli.main(["bound", *search, "--threads", "1", "--max-calls", "1"]) == 0
        assert cli.main(["bound", *search, "--threads", "2", "--max-calls", "3"]) == 0
        done = json.loads((tmp_path / "search" / "summary.json").read_text())
        calls = len(done["calibration"]["history"])
        assert calls > 1 and done["chunks_threads"] is None
    finally:
        torch.set_num_threads(saved)


def test_a_default_sigma_refused_on_resume_says_why_and_how_to_resume(files, capsys):
    """The default sigma is the features' RMS from a float32 forward, whose last bits follow --threads and the
    machine: the same command run again with another --threads was refused as another sigma ('Gaussian(sigma=
    0.6271854575593698)' -> 'Gaussian(sigma=0.6271854729719915)'), with no word of why. (The folder here is made at
    the next float64 above the RMS, what another thread count gave.) The refusal now says so, and names the fixes."""
    tmp_path, _ = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY]
    assert _bound([*argv, "--out", tmp_path / "first"]) == 0
    rms = json.loads((tmp_path / "first" / "summary.json").read_text())["noise"]["sigma"]
    other = float(np.nextafter(rms, np.inf))
    assert _bound([*argv, "--sigma", repr(other), "--out", tmp_path / "run"]) == 0
    capsys.readouterr()
    assert _bound([*argv, "--out", tmp_path / "run"]) == 2
    err = capsys.readouterr().err
    assert "holds work made with other arguments (noise: " in err
    assert (f"sigma was left at its default, 1 x the features' RMS, computed by a forward whose last bits follow the "
            f"thread count and the machine; to resume, pass the first run's --threads (the one in its summary.json's "
            f"command), or --sigma {other!r}, the folder's own") in err
    # a sigma given is no default: the refusal stays as it was
    assert _bound([*argv, "--sigma", "0.5", "--out", tmp_path / "run"]) == 2
    assert "left at its default" not in capsys.readouterr().err
    # a sweep's folder holds K x the unit, which --sigma sets: the folder's sigma is no --sigma to pass (a review)
    assert _bound([*argv, "--sigma", repr(other), "--sweep", "0.5,1", "--out", tmp_path / "swept"]) == 0
    capsys.readouterr()
    assert _bound([*argv, "--sweep", "0.5,1", "--out", tmp_path / "swept"]) == 2
    err = capsys.readouterr().err
    assert "the first run's --threads (the one in its summary.json's command)" in err and "the folder's own" not in err
    # so is a --target-std search's (the last session's found-not-fixed: its refusal had no note)
    search = ["--target-std", "0.3", "--max-calls", "2"]
    assert _bound([*argv, "--sigma", repr(other), *search, "--out", tmp_path / "searched"]) == 0
    capsys.readouterr()
    assert _bound([*argv, *search, "--out", tmp_path / "searched"]) == 2
    err = capsys.readouterr().err
    assert "holds work made with other arguments (noise: " in err
    assert "the first run's --threads (the one in its summary.json's command)" in err and "the folder's own" not in err


def test_null_probes_from_the_shell_are_the_apis(files, capsys):
    """--null-probes is bound(null_probes=True): the same bounds, bit for bit, in the command that repeats the run;
    without --targets it is refused in the command's words."""
    import shlex

    tmp_path, x = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", "--sigma", "0.5", "--targets", "low:2", *TINY]
    assert _bound([*argv, "--null-probes", "--out", tmp_path / "run"]) == 0
    got = hcrfast.Bounds.load(tmp_path / "run" / "bounds.npz")
    want = hcrfast.bound(_user_model(tmp_path), x, 0.5, restarts=2, iterations=2, targets="low:2", null_probes=True)
    np.testing.assert_array_equal(got.std, want.std)
    assert got.targeted.params["null_probes"]
    command = json.loads((tmp_path / "run" / "summary.json").read_text())["command"]
    assert "--null-probes" in shlex.split(command)
    capsys.readouterr()
    assert _bound([*argv[:4], *TINY, "--null-probes", "--out", tmp_path / "none"]) == 2
    assert ("--null-probes probes the null space of J for the target modes, but no --targets asks for none: pass "
            "--targets (e.g. 'all' or 'low:8') or no --null-probes") in capsys.readouterr().err


def test_krylov_pilots_from_the_shell_are_the_apis(files, capsys):
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [f"{tmp_path}/mynet.py:Net", tmp_path / "x.pt", "--sigma", "0.5", "--solver", "krylov",
            "--krylov-pilots", "2", *TINY, "--out", out]
    assert _bound(argv) == 0
    torch.set_num_threads(1)
    ref = hcrfast.bound(_user_model(tmp_path), x, 0.5, solver="krylov", krylov_pilots=2, restarts=2, iterations=2)
    got = hcrfast.Bounds.load(out / "bounds.npz")
    np.testing.assert_array_equal(got.to_numpy().std, ref.to_numpy().std)
    assert got.params["krylov"]["pilots"] == 2


@pytest.mark.parametrize("extra", [[], ["--target-std", "0.3"], ["--sweep", "2,1"]],
                         ids=["bound", "sigma-search", "sweep"])
def test_torchrun_two_processes_match_one(files, extra):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    tmp_path, _ = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", str(tmp_path / "x.pt"), *TINY, "--chunk-size", "2", *extra]
    one = subprocess.run([sys.executable, "-m", "hcrfast.cli", "bound", *argv, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=_ENV, timeout=300, check=False)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                          "-m", "hcrfast.cli", "bound", *argv, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=_ENV, timeout=300, check=False)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("summary: ") == 1                # rank 0 writes the results
    # what the run reports of itself is the whole run's, not rank 0's share
    accounts = ("singular_steps", "modes_lifted"), ("singular_steps", "examples"), ("earlier_iterates", "certified"), (
        "earlier_iterates", "steps")
    if "--sweep" in extra:
        for name in ("scale_2", "scale_1"):
            a, b = (hcrfast.Bounds.load(tmp_path / d / "sweep" / name / "bounds.npz") for d in ("one", "two"))
            np.testing.assert_array_equal(a.std, b.std)
            assert b.params["shard"]["world_size"] == 2
            assert [b.params[k][f] for k, f in accounts] == [a.params[k][f] for k, f in accounts]
        l1, l2 = (json.loads((tmp_path / d / "summary.json").read_text())["sweep"]["levels"] for d in ("one", "two"))
        assert [v["reused_examples"] for v in l2] == [v["reused_examples"] for v in l1] == [0, 6]
        return
    a, b = (hcrfast.Bounds.load(tmp_path / d / "bounds.npz") for d in ("one", "two"))
    np.testing.assert_array_equal(a.std, b.std)
    assert b.params["shard"]["world_size"] == 2
    assert [b.params[k][f] for k, f in accounts] == [a.params[k][f] for k, f in accounts]
    if extra:  # every process made the same search: the same sigmas, each call sharded
        c1, c2 = (json.loads((tmp_path / d / "summary.json").read_text())["calibration"] for d in ("one", "two"))
        assert len(c1["history"]) >= 2 and [h["scale"] for h in c1["history"]] == [h["scale"] for h in c2["history"]]
        assert a.params["sigma"] == b.params["sigma"]


def test_summary_json_is_strict_json_with_null_for_a_statistic_over_nothing(files):
    """--attack 1: the std ratio over one draw and its bias test are NaN, written as bare NaN, which strict
    JSON parsers (jq, JavaScript) refuse. Now null."""
    tmp_path, _ = files
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--attack", "1", "--out", out]) == 0

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    s = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    assert s["attack"]["std_ratio_median"] is None and s["attack"]["significant_bias"] is None
    assert s["attack"]["median"] > 0


def test_float64_inputs_rounded_to_a_float32_model_are_said(files):
    """float64 inputs with a float32 model were rounded to float32 without a word (summary.json said float32);
    --double keeps them, without the warning."""
    tmp_path, x = files
    torch.save(x.double() / 3, tmp_path / "x64.pt")
    args = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x64.pt", *TINY]
    with pytest.warns(UserWarning, match=r"x64\.pt\) are float64 and the model float32: hcrfast bound rounds"):
        assert _bound([*args, "--out", tmp_path / "run"]) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _bound([*args, "--double", "--out", tmp_path / "run64"]) == 0
    assert not [w for w in caught if "are float64 and the model" in str(w.message)]


def test_a_float16_model_is_run_in_float32_with_a_warning(files):
    """A float16 model named on the command line was cast to float32 without a word (--help said the weights'
    own dtype was kept): the bounds are the float32 copy's, now said."""
    tmp_path, _ = files
    (tmp_path / "half.py").write_text(MODEL_FILE + "\n\ndef half():\n    return Net(seed=1).half()\n")
    with pytest.warns(UserWarning, match=r"the model's weights are float16: hcrfast bound runs a float32 copy"):
        assert _bound([f"{tmp_path / 'half.py'}:half", tmp_path / "x.pt", *TINY, "--out", tmp_path / "run"]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["params"]["dtype"] == "float32"


def test_a_float64_weights_file_runs_in_float64(files):
    """--double's help says runs are float64 where the weights are, but a float64 --weights file was loaded into
    the module's float32 tensors, rounded, without a word (summary.json said float32). It runs in float64 now,
    as the module made float64 does; a float32 file keeps float32."""
    tmp_path, _ = files
    net = _user_model(tmp_path)
    torch.save({k: v.double() if v.is_floating_point() else v for k, v in net.state_dict().items()},
               tmp_path / "w64.pt")
    torch.save(net.state_dict(), tmp_path / "w32.pt")
    for name, dtype in (("w64.pt", "float64"), ("w32.pt", "float32")):
        out = tmp_path / f"run_{name}"
        assert _bound([f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--weights", tmp_path / name,
                       "--out", out]) == 0
        assert json.loads((out / "summary.json").read_text())["params"]["dtype"] == dtype


def test_files_of_the_user_s_at_the_output_names_are_refused_before_computing_and_never_removed(files, capsys):
    """--out . among the user's own files: a file at a name the command writes is refused (named, with the
    fix) before anything is computed; the rest of the user's files are neither removed nor replaced, with or
    without --no-report, --attack, a search or a sweep."""
    tmp_path, _ = files
    model, x = f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt"
    out = tmp_path / "mine"
    out.mkdir()
    np.save(tmp_path / "stds.npy", np.full(16, 0.3))
    mine = {"attack.npz": b"mine", "sigma.npy": b"mine", "hist_all.png": b"mine", "summary.json": b'{"mine": 1}',
            "tradeoff.png": b"mine", "report.html": b"<title>my notes</title>"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    base = [model, x, *TINY, "--sigma", "0.3", "--examples", "2", "--out", out]
    report = [a for a in base if a != "--no-report"]
    for argv, names in ((base, "summary.json"),
                        ([*base, "--attack", "2"], "attack.npz, summary.json"),
                        ([*base, "--sweep", "1,2"], "summary.json"),
                        ([*report, "--sweep", "1,2", "--metric", "cosine"], "report.html, summary.json, tradeoff.png")):
        assert _bound(argv) == 2, argv
        assert (f"--out {out}: holds {names}, which this command writes and which no hcrfast command wrote there; "
                f"pass another --out, or move") in capsys.readouterr().err
    argv = [model, x, *TINY, "--sigma-file", tmp_path / "stds.npy", "--target-std", "1", "--examples", "2",
            "--out", out]
    assert _bound(argv) == 2 and "holds sigma.npy, summary.json," in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(mine)  # nothing computed
    (out / "summary.json").unlink()
    del mine["summary.json"]
    assert _bound(base) == 0
    assert _bound(base) == 0   # a rerun replaces its own summary.json
    assert all((out / name).read_bytes() == data for name, data in mine.items())
    assert _bound([*base, "--sweep", "1,2"]) == 2   # (another kind of run: refused as before)
    capsys.readouterr()
    assert _bound(report) == 2 and "holds hist_all.png, report.html," in capsys.readouterr().err
    assert all((out / name).read_bytes() == data for name, data in mine.items())


def test_an_out_of_an_hcrfast_from_before_the_list_of_outputs_is_still_its_own(files):
    """An OUT written before hcrfast listed its outputs (no .hcrfast-outputs.json): its checkpoint
    (chunks/key.json) makes its known files hcrfast's, which a rerun replaces or removes as before."""
    tmp_path, _ = files
    out = tmp_path / "run"
    base = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--examples", "2",
            "--out", out]
    assert _bound([*base, "--attack", "2", "--attack-steps", "1"]) == 0
    listed = out / ".hcrfast-outputs.json"
    assert json.loads(listed.read_text())["files"] == ["attack.npz", "bounds.npz", "summary.json"]
    listed.unlink()
    assert _bound(base) == 0
    assert not (out / "attack.npz").exists() and (out / "summary.json").is_file()
    assert json.loads(listed.read_text())["files"] == ["bounds.npz", "summary.json"]


def test_summary_and_report_are_replaced_atomically(files):
    """summary.json and report.html are written to a temporary file and renamed over the old one (as
    reproduce's summary): a crash while writing leaves the old file or the new, never a truncated one. The
    sign: a rerun's file is a new inode, and a hard link to the old one keeps the old text."""
    tmp_path, _ = files
    out = tmp_path / "run"
    argv = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *[a for a in TINY if a != "--no-report"], "--sigma",
            "0.3", "--examples", "2", "--out", out]
    assert _bound(argv) == 0
    for name in ("summary.json", "report.html"):
        os.link(out / name, tmp_path / f"kept_{name}")
    old = {name: (out / name).read_text() for name in ("summary.json", "report.html")}
    assert _bound(argv) == 0
    for name in ("summary.json", "report.html"):
        assert (tmp_path / f"kept_{name}").read_text() == old[name]
        assert (out / name).stat().st_ino != (tmp_path / f"kept_{name}").stat().st_ino
    assert json.loads((out / "summary.json").read_text())["model"].endswith("mynet.py:Net")


def test_a_tilde_after_an_equals_sign_is_the_home_folder(files, monkeypatch):
    """--out=~/x: the shell leaves ~ after '=', so hcrfast expands it (and in the inputs', weights', sigma
    file's, labels' paths), never making a folder named ~ in the working directory."""
    tmp_path, x = files
    home = tmp_path / "home"
    home.mkdir()
    torch.save(x, home / "in.pt")
    torch.save(_user_model(tmp_path, "make").state_dict(), home / "w.pt")
    np.save(home / "stds.npy", np.full(16, 0.3))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert _bound([f"{tmp_path / 'mynet.py'}:Net", "~/in.pt", *TINY, "--examples", "2", "--weights=~/w.pt",
                   "--sigma-file=~/stds.npy", "--out=~/runs/a"]) == 0
    assert (home / "runs" / "a" / "bounds.npz").is_file() and not (tmp_path / "~").exists()
    s = json.loads((home / "runs" / "a" / "summary.json").read_text())
    assert s["inputs"]["path"] == str(home / "in.pt") and s["weights"]["path"] == str(home / "w.pt")


def test_a_changed_plain_run_is_refused_with_a_fix_for_the_shell(files, capsys):
    """The plain run's checkpoint refusal names --out (the command line's folder), not a 'checkpoint folder'
    the command has no option for; deleting OUT/chunks, the fix it names, lets the corrected command run."""
    tmp_path, _ = files
    out = tmp_path / "run"
    base = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--examples", "2",
            "--out", out]
    assert _bound([*base, "--size", "0.01"]) == 0
    capsys.readouterr()
    assert _bound([*base, "--size", "0.02"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'chunks'} holds work made with other arguments (size: 0.01 -> 0.02)" in err
    assert "Make the same command to resume it, or pass another --out" in err
    assert f"(or delete {out / 'chunks'})" in err and "checkpoint folder" not in err
    shutil.rmtree(out / "chunks")
    assert _bound([*base, "--size", "0.02"]) == 0
    assert json.loads((out / "summary.json").read_text())["params"]["size"] == 0.02


def test_a_folder_of_the_user_s_named_as_an_hcrfast_checkpoint_makes_none_of_their_files_hcrfast_s(files, capsys):
    """An OUT without the list of outputs was taken for an older hcrfast's where a `calibration` folder (or
    `sweep_chunks`, `chunks/key.json`) was there, whatever it held: a user's own folder of that name made their
    summary.json and figures hcrfast's, replaced and removed. Only such a folder holding hcrfast's key counts."""
    tmp_path, _ = files
    base = [f"{tmp_path / 'mynet.py'}:Net", tmp_path / "x.pt", *TINY, "--sigma", "0.3", "--examples", "2"]
    for sign, extra in (("calibration", ["--target-std", "0.5", "--max-calls", "2"]), ("chunks/key.json", [])):
        out = tmp_path / sign.split("/")[0] / "mine"
        (out / sign).parent.mkdir(parents=True, exist_ok=True)
        if sign.endswith(".json"):
            (out / sign).write_text('{"format": "my own"}')
        else:
            (out / sign).mkdir()
        (out / "summary.json").write_text('{"mine": 1}')
        (out / "hist_all.png").write_bytes(b"mine")
        assert _bound([*base, *extra, "--out", out]) == 2
        assert "holds summary.json, which this command writes and which no hcrfast command wrote there" in \
            capsys.readouterr().err
        assert (out / "summary.json").read_text() == '{"mine": 1}' and (out / "hist_all.png").read_bytes() == b"mine"


def test_a_refusal_names_a_hydra_style_out_folder_as_given(files, capsys, monkeypatch):
    """``key=value`` folder names are the user's: the refusal names --out's folder exactly as typed."""
    tmp_path, _ = files
    monkeypatch.chdir(tmp_path)
    out = "runs/size=0.01,seed=1"
    base = ["mynet.py:Net", "x.pt", *TINY, "--sigma", "0.3", "--examples", "2", "--out", out]
    assert _bound(base) == 0
    capsys.readouterr()
    assert _bound([*base, "--restarts", "3"]) == 2
    err = capsys.readouterr().err
    assert f"{out}/chunks holds work made with other arguments (restarts: 2 -> 3)" in err
    assert f"(or delete {out}/chunks)" in err and "--size" not in err and "--seed" not in err


@pytest.mark.parametrize("flag, typed", [("--sigma-scale", "0"), ("--size", "-0e0"), ("--sigma", "0.000")])
def test_a_refused_float_flag_is_echoed_as_typed(files, capsys, flag, typed):
    tmp_path, _ = files
    assert _bound([f"{tmp_path}/mynet.py:Net", tmp_path / "x.pt", *TINY, f"{flag}={typed}", "--out",
                   tmp_path / "run"]) == 2
    assert f"hcrfast: error: {flag} {typed}: pass a positive finite number" in capsys.readouterr().err


@pytest.mark.parametrize("sigma", ["1e-30", "1e39"])
def test_a_sigma_far_from_the_features_scale_is_refused_with_the_flags_that_fix_it(files, capsys, sigma):
    """The Python layer's advice (hcrfast.rms_sigma(features, scale), a float64 model and batch) is said in the
    command's flags: --sigma-scale or --sigma, and --double. (1e39 is past float32; 1e22, refused here before
    2026-12-02, now runs on the features divided by sigma, as 1e9 did: a bound with D ~ 1e-44.)"""
    tmp_path, _ = files
    assert _bound([f"{tmp_path}/mynet.py:Net", tmp_path / "x.pt", "--sigma", sigma, *TINY,
                   "--out", tmp_path / "run"]) == 2
    err = capsys.readouterr().err
    assert "pass --sigma-scale K (σ = K × the features' RMS) or a --sigma nearer the features' scale" in err
    assert err.rstrip().endswith("or --double"), err
    for python in ("hcrfast.rms_sigma", "float64 model and batch", "model.double()", "from Python only"):
        assert python not in err, err


def test_a_wrongly_shaped_sigma_file_is_named_as_its_flag(files, capsys):
    tmp_path, _ = files
    np.save(tmp_path / "s.npy", np.ones((4, 4)))   # 16 stds, the features' count, in another shape than (16,)
    assert _bound([f"{tmp_path}/mynet.py:Net", tmp_path / "x.pt", "--sigma-file", tmp_path / "s.npy", *TINY,
                   "--out", tmp_path / "run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hcrfast: error: --sigma-file {tmp_path / 's.npy'} has the shape (4, 4)"), err
    assert "sigma has" not in err


@pytest.mark.parametrize("stderr", ["closed", "broken pipe"])
def test_progress_to_a_closed_or_broken_stderr_loses_the_lines_not_the_run(files, stderr):
    """Progress lines are best-effort. With standard error closed (``2>&-``: Python's sys.stderr is None) they were
    printed to standard output among the results; with its reader gone (a broken pipe) the first one raised and
    the run exited 1 before computing anything, saying nothing. The run now completes, and its bounds are the
    API's."""
    tmp_path, x = files
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "hcrfast.cli", "bound", f"{tmp_path / 'mynet.py'}:Net", str(tmp_path / "x.pt"),
            *[a for a in TINY if a != "--no-progress"], "--out", str(out)]
    if stderr == "closed":
        done = subprocess.run(["bash", "-c", '"$@" 2>&-', "bash", *argv], capture_output=True, text=True, env=_ENV,
                              timeout=300, check=False)
        code, printed = done.returncode, done.stdout
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV)
        proc.stderr.close()   # the reader of standard error is gone before the first line
        printed, _ = proc.communicate(timeout=300)
        code = proc.returncode
    assert code == 0, printed[-3000:]
    assert "hcrfast bound: 6 inputs" not in printed and f"bounds: {out / 'bounds.npz'}" in printed
    got = hcrfast.Bounds.load(out / "bounds.npz")
    model = _user_model(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as the run's --threads 1: float32 sums in the run's order
    try:
        with torch.no_grad():
            rms = float(np.sqrt(np.mean(model(x).double().numpy() ** 2)))
        sigma = json.loads((out / "summary.json").read_text())["noise"]["sigma"]
        assert sigma == pytest.approx(rms, rel=1e-12)
        want = hcrfast.bound(model, x, sigma, restarts=2, iterations=2)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(got.std, want.std)


def test_reports_and_figures_leave_the_processs_matplotlib_backend_and_figures_as_they_were(files):
    """The figures switched matplotlib to Agg for the whole process (matplotlib.use("Agg")): after
    hcrfast.cli.main([...]) in a notebook or an interactive session, plt.show() showed nothing. They are now
    figures of their own, drawn through an Agg canvas; pyplot's backend and list of figures are left alone."""
    tmp_path, _ = files
    out, fig = tmp_path / "run", tmp_path / "dp.png"
    bound = ["bound", f"{tmp_path / 'mynet.py'}:Net", str(tmp_path / "x.pt"), "--out", str(out),
             *[a for a in TINY if a != "--no-report"]]
    dp = ["dp", "figure", "--out", str(fig), "--sigmas", "0.3", "--n-images", "4", "--repeats", "1", "--dpi", "30"]
    script = (
        "import sys, matplotlib\n"
        "matplotlib.use('svg')\n"
        "import matplotlib.pyplot as plt\n"
        "from hcrfast import cli\n"
        f"assert cli.main({bound!r}) == 0\n"
        f"assert cli.main({dp!r}) == 0\n"
        "print(matplotlib.get_backend(), plt.get_fignums())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_ENV, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "svg []", done.stdout[-2000:]
    pngs = sorted(p.name for p in out.rglob("*.png"))
    assert pngs and fig.stat().st_size > 5_000, pngs
    for png in [fig, *out.rglob("*.png")]:
        import matplotlib.image

        assert matplotlib.image.imread(png).std() > 0.01, png   # drawn, not blank


def test_the_recorded_command_reruns_with_dash_names_and_from_another_folder(files, monkeypatch, capsys):
    """summary.json's command put a model file named -net.py, inputs -x.pt and --out -run as plain words,
    which argparse reads as flags ("unrecognized arguments"), and its relative paths worked only from the
    folder the run was started in, which it did not record. Values that start with "-" are now written as
    --flag=value, positionals after "--", and summary.json's "cwd" is that folder (the report prints
    "cd CWD && COMMAND")."""
    import shlex

    tmp_path, _ = files
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(tmp_path / "mynet.py", work / "-net.py")
    shutil.copy(tmp_path / "x.pt", work / "-x.pt")
    monkeypatch.chdir(work)
    assert cli.main(["bound", *TINY, "--examples", "2", "--out=-run", "--", "-net.py:Net", "-x.pt"]) == 0
    s = json.loads((work / "-run" / "summary.json").read_text())
    assert s["cwd"] == str(work)
    words = shlex.split(s["command"])
    assert "--out=-run" in words and words[-3:] == ["--", "-net.py:Net", "-x.pt"]
    monkeypatch.chdir(tmp_path)   # elsewhere: the command runs where summary.json says
    capsys.readouterr()
    assert cli.main([*words[1:-4], "--out=rerun", *words[-3:]]) != 0   # here its relative paths name nothing
    assert "no Python file" in capsys.readouterr().err
    monkeypatch.chdir(s["cwd"])
    assert cli.main([*words[1:-4], "--out=rerun", *words[-3:]]) == 0
    first, again = (hcrfast.Bounds.load(work / name / "bounds.npz") for name in ("-run", "rerun"))
    assert again.std.tobytes() == first.std.tobytes()
    capsys.readouterr()


def test_model_files_import_their_own_neighbours_wherever_they_import_them(files, capsys):
    """A model file's folder left sys.path once the file had run: a neighbour imported in __init__ or forward
    was not found. A --head file in another folder with a neighbour of the same name (two helper.py) was
    given the model's, already in sys.modules. Each file now imports its own, for the command's time, and the
    command leaves sys.path and sys.modules as it found them."""
    import sys

    tmp_path, x = files
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "model.py").write_text(textwrap.dedent("""
        import torch
        from helper import SCALE

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                import builder   # a neighbour imported in __init__
                self.lin = builder.make()

            def forward(self, x):
                import late      # and one in forward
                return self.lin(x.flatten(1)) * SCALE * late.FACTOR
    """))
    (a / "helper.py").write_text("SCALE = 1.0\n")
    (a / "builder.py").write_text(textwrap.dedent("""
        import torch

        def make():
            torch.manual_seed(0)
            return torch.nn.Linear(64, 16)
    """))
    (a / "late.py").write_text("FACTOR = 1.0\n")
    (b / "head.py").write_text(textwrap.dedent("""
        import torch
        from helper import HEAD_SIGN   # b's helper.py, not a's

        class Head(torch.nn.Module):
            def forward(self, f):
                return HEAD_SIGN * f[:, :4]
    """))
    (b / "helper.py").write_text("HEAD_SIGN = -1.0\n")
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 16)
    with torch.no_grad():
        labels = (-net(x.flatten(1))[:, :4]).argmax(dim=1).numpy()
    np.save(tmp_path / "y.npy", labels)
    path_before, modules_before = list(sys.path), set(sys.modules)
    out = tmp_path / "run"
    assert cli.main(["bound", f"{a / 'model.py'}:Net", str(tmp_path / "x.pt"), *TINY, "--examples", "2",
                     "--head", f"{b / 'head.py'}:Head", "--labels", str(tmp_path / "y.npy"), "--utility-draws", "2",
                     "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["utility"]["clean"] == 1.0   # the head's own sign: with a's helper its import failed
    assert sys.path == path_before
    assert not {"helper", "builder", "late"} & (set(sys.modules) - modules_before)
    capsys.readouterr()


def test_a_model_folder_and_inputs_whose_names_are_not_utf8_run_to_the_report(files, capsys):
    """A MODEL folder whose name is not UTF-8 (Python reads its byte 0xff as a lone surrogate) failed at once
    ("surrogates not allowed", naming no argument); such an INPUTS file failed after the whole run, at
    report.html. Both run; the report, UTF-8, shows the byte as \\xff."""
    tmp_path, _ = files
    folder = tmp_path / os.fsdecode(b"in\xff")
    try:
        folder.mkdir()
    except (OSError, UnicodeError):   # a file system that takes UTF-8 names only (APFS)
        pytest.skip("this file system refuses names that are not UTF-8")
    shutil.copy(tmp_path / "mynet.py", folder / "mynet.py")
    shutil.copy(tmp_path / "x.pt", folder / os.fsdecode(b"x\xfe.pt"))
    out = tmp_path / "run"
    assert cli.main(["bound", f"{folder / 'mynet.py'}:Net", str(folder / os.fsdecode(b"x\xfe.pt")),
                     *[a for a in TINY if a != "--no-report"], "--examples", "2", "--out", str(out)]) == 0
    page = (out / "report.html").read_bytes().decode("utf-8")   # strict: valid UTF-8
    assert "in\\xff/x\\xfe.pt" in page and "in\\xff/mynet.py:Net" in page
    assert f"cd {os.getcwd()} &amp;&amp; hcrfast bound" in page   # the command, from the folder it ran in
    # which bash runs as shown: the bytes as $'\xff' (plain quotes would give a backslash and "xff")
    import html

    line = html.unescape(re.search(r'<td class="">(cd .*? &amp;&amp; hcrfast bound .*?)</td>', page).group(1))
    assert "$'" in line and "\\xfe" in line
    again = subprocess.run(["bash", "-c", line], capture_output=True, env=_ENV, timeout=300)
    assert again.returncode == 0 and b"HCR bounds for 2 examples" in again.stdout, again.stderr[-1500:]
    want = hcrfast.bound(_user_model(tmp_path), torch.load(tmp_path / "x.pt")[:2],
                         json.loads((out / "summary.json").read_text())["noise"]["sigma"], restarts=2, iterations=2)
    assert hcrfast.Bounds.load(out / "bounds.npz").std.tobytes() == want.std.tobytes()
    capsys.readouterr()


def test_an_empty_path_is_refused_and_checkpoint_messages_quote_their_paths(files, capsys):
    """--out "" was read as the working directory (Path("") is "."), and the results went among the user's
    files. The checkpoint's refusals printed a folder named with a space as two words (delete o 1/chunks)."""
    import shlex

    tmp_path, _ = files
    argv = [f"{tmp_path / 'mynet.py'}:Net", str(tmp_path / "x.pt"), *TINY, "--examples", "2"]
    for flag in ("--out", "--sigma-file", "--weights"):
        capsys.readouterr()
        assert cli.main(["bound", *argv, flag, ""]) == 2
        assert f"{flag} '': an empty path names no file or folder" in capsys.readouterr().err
    capsys.readouterr()   # train's --out is a file: no "--out ." hint; its --data is named as typed first
    assert cli.main(["train", "digits", "--out", ""]) == 2 and "(--out ." not in capsys.readouterr().err
    assert cli.main(["train", "digits", "--data", "", "--out", str(tmp_path / "m.pt")]) == 2
    assert "--data '': an empty path" in capsys.readouterr().err
    out = tmp_path / "o 1"
    (out / "chunks").mkdir(parents=True)
    (out / "chunks" / "key.json").write_text("null")
    capsys.readouterr()
    assert cli.main(["bound", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"delete {shlex.quote(str(out / 'chunks'))} or pass another --out" in err


@pytest.mark.parametrize("setting", ["PYTHONIOENCODING=ascii", "LC_ALL=C PYTHONUTF8=0"])
def test_a_terminal_that_is_not_utf8_gets_the_summary_and_exit_status_0(files, setting):
    """With PYTHONIOENCODING=ascii the summary's σ, × and · raised UnicodeEncodeError after the whole run: exit 2,
    "hcrfast: error", no summary printed though every file was written. Under a C locale outside UTF-8 mode,
    reading report.html back (ASCII, the locale's) raised UnicodeDecodeError after the run: exit 1 with a
    traceback. Characters the terminal cannot show are now escapes, and hcrfast reads its files as UTF-8."""
    tmp_path, _ = files
    env = {**_ENV, **dict(pair.split("=") for pair in setting.split())}
    env.pop("LANG", None)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-X", "utf8=0", "-m", "hcrfast.cli", "bound", f"{tmp_path / 'mynet.py'}:Net",
                           str(tmp_path / "x.pt"), *[a for a in TINY if a != "--no-report"], "--examples", "2",
                           "--out", str(out)], capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    printed = done.stdout.decode("ascii")   # what the terminal was sent: ASCII
    assert "HCR bounds for 2 examples" in printed and f"report: {out / 'report.html'}" in printed
    assert b"hcrfast: error" not in done.stderr and b"Traceback" not in done.stderr


def test_progress_lines_reach_a_write_only_or_ascii_stream(monkeypatch):
    """validation.say raised AttributeError at the last progress line where stderr had write() alone (a logging
    wrapper), losing the computed bounds, and dropped a line whose σ or é an ASCII stream cannot hold."""
    import io

    from hcrfast import validation

    class WriteOnly:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

    sink = WriteOnly()
    monkeypatch.setattr(sys, "stderr", sink)
    validation.say("examples 2/2 done")
    assert sink.text == "examples 2/2 done\n"
    raw = io.BytesIO()
    ascii_stream = io.TextIOWrapper(raw, encoding="ascii")
    monkeypatch.setattr(sys, "stderr", ascii_stream)
    validation.say("2 of 2 examples read back from ckpt_é (σ = 1)")
    ascii_stream.flush()
    assert raw.getvalue() == b"2 of 2 examples read back from ckpt_\\xe9 (\\u03c3 = 1)\n"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly():
    """`hcrfast dp table ... | head -1`: the broken pipe was reported as "hcrfast: error: [Errno 32] Broken pipe",
    exit 2. It now ends quietly with 141, as a shell reports a command that a closed pipe ended."""
    done = subprocess.Popen([sys.executable, "-m", "hcrfast.cli", "dp", "table", "--sigma",
                             *[str(s) for s in range(1, 400)], "--N", "64", "100", "--kappa", "0.1", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_ENV)
    done.stdout.readline()
    done.stdout.close()
    err = done.stderr.read()
    assert done.wait(timeout=120) == 141 and err == b"", err


def test_a_neighbour_named_like_a_standard_module_shadows_nothing_and_the_user_s_path_stays(files, monkeypatch,
                                                                                             capsys):
    """With the model's folder first on sys.path for the whole command, a neighbour html.py or profile.py was
    imported for the standard library's by hcrfast's report and torch's compiler after the file had run (the
    report lost after the run). And a folder the caller had on sys.path was removed from it when the command
    ended. The folder is first only while the file runs, then last; the caller's entries stay."""
    import sys

    tmp_path, x = files
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tmp_path / "mynet.py", models / "net.py")
    (models / "html.py").write_text("NOT_THE_STDLIB = True\n")
    (models / "profile.py").write_text("NOT_THE_STDLIB = True\n")
    for name in ("html", "profile"):   # imported afresh, as in a new process
        monkeypatch.delitem(sys.modules, name, raising=False)
    out = tmp_path / "run"
    assert cli.main(["bound", f"{models / 'net.py'}:Net", str(tmp_path / "x.pt"),
                     *[a for a in TINY if a != "--no-report"], "--examples", "2", "--out", str(out)]) == 0
    assert (out / "report.html").is_file()
    import html

    assert hasattr(html, "escape")   # the standard library's
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(tmp_path / "mynet.py", mine / "net.py")
    monkeypatch.syspath_prepend(str(mine))
    assert cli.main(["bound", f"{mine / 'net.py'}:Net", str(tmp_path / "x.pt"), *TINY, "--examples", "2",
                     "--out", str(tmp_path / "run2")]) == 0
    assert sys.path.count(str(mine)) == 1
    capsys.readouterr()


def test_a_sweep_of_features_far_from_1_records_each_level_s_division_and_shares_factors(files, capsys):
    """Features x1e20: a sweep's summary.json gave the first level's features_divided_by among the params every
    level shares, and the levels shared no factor (each divided by its own sigma, a J of its own). Each level
    now records its own; the features are divided once by sigma0, and the factors are shared as at 1."""
    tmp_path, x = files
    (tmp_path / "big.py").write_text(MODEL_FILE + textwrap.dedent("""
        class Big(Net):
            def forward(self, x):
                return super().forward(x) * 1e20
    """))
    out = tmp_path / "run"
    assert _bound([f"{tmp_path / 'big.py'}:Big", tmp_path / "x.pt", *TINY, "--sweep", "0.5,1,2", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    levels = s["sweep"]["levels"]
    assert "features_divided_by" not in s["params"]
    assert [lv["reused_examples"] for lv in levels] == [0, 6, 6]
    for lv in levels:
        got = hcrfast.Bounds.load(out / "sweep" / f"scale_{lv['scale']:g}" / "bounds.npz")
        assert got.params["features_divided_by"] == lv["params"]["features_divided_by"] == pytest.approx(
            lv["sigma"] / lv["scale"], rel=1e-12)
    capsys.readouterr()


def test_vector_inputs_under_the_dct_are_refused_before_the_header_names_where_results_go(tmp_path, capsys):
    """Tabular inputs (B, 64) with the default --basis dct: the header said 'results in OUT' and then the call
    was refused, a check it could make first; now the refusal comes alone."""
    (tmp_path / "vec.py").write_text("import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                                     "        super().__init__()\n        torch.manual_seed(0)\n"
                                     "        self.lin = torch.nn.Linear(64, 8)\n\n"
                                     "    def forward(self, x):\n        return torch.tanh(self.lin(x))\n")
    torch.save(torch.randn(4, 64, generator=torch.Generator().manual_seed(0)), tmp_path / "v.pt")
    code = _bound([f"{tmp_path / 'vec.py'}:Net", tmp_path / "v.pt", "--restarts", "2", "--iterations", "2",
                   "--threads", "1", "--out", tmp_path / "run"])
    err = capsys.readouterr().err
    assert code == 2 and "--basis pixel" in err and "results in" not in err


def test_advice_to_call_targeted_bound_with_null_probes_reads_as_the_command_s_flags(tmp_path, capsys):
    """With --null-probes a flag of hcrfast bound, the Python advice 'hcrfast.targeted_bound(..., null_probes=True)'
    read 'hcrfast.targeted_bound(..., --null-probes)' (a review); it now names the flags, and the call as Python's."""
    (tmp_path / "dead.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.A = torch.nn.Parameter(torch.rand(24, 64, generator=torch.Generator().manual_seed(0)))\n"
        "    def forward(self, x):\n"
        "        return torch.relu(x.flatten(1) @ self.A.T - 20)\n")
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    x[0] = 0   # every unit off at example 0: J = 0 there
    x[1] += 1
    torch.save(x, tmp_path / "x.pt")
    with warnings.catch_warnings():   # (shown as the command shows them, not recorded by pytest)
        warnings.simplefilter("always")
        with pytest.MonkeyPatch.context() as m:
            m.setattr(warnings, "showwarning", lambda msg, c, f, l, file=None, line=None: sys.stderr.write(
                warnings.formatwarning(msg, c, f, l, line)))
            assert _bound([f"{tmp_path / 'dead.py'}:Net", tmp_path / "x.pt", "--sigma", "0.5", *TINY,
                           "--out", tmp_path / "run"]) == 0
    err = capsys.readouterr().err
    assert ("--targets all --null-probes (hcrfast.targeted_bound(..., null_probes=True) in Python) certifies +inf "
            "for its modes") in err
    assert "(..., --null-probes)" not in err
