"""The GPU-session scripts of ``benchmarks/`` run end to end on the CPU at toy sizes.

A GPU lease is short and rare; a script that broke since the last one would waste it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import hcrfast
import hcrfast.krylov

ROOT = Path(__file__).resolve().parents[1]


def _benchmark_script(name: str):
    """A script of benchmarks/ imported as a module (the folder on sys.path only while it loads)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def run_script(name, *args, check=True):
    """Run ``benchmarks/<name>`` with ``args`` in a fresh interpreter; its CompletedProcess (exit 0 checked
    unless ``check=False``)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert not check or proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_gpu_targets_runs_on_cpu_and_accounts_for_its_products(tmp_path):
    proc = run_script("gpu_targets.py", "mnist", "--device", "cpu", "--examples", "3", "--restarts", "2",
                      "--iterations", "1", "--threads", "1", "--solver", "lsqr", "--out", str(tmp_path))
    (path,) = tmp_path.glob("gpu_targets_mnist_cpu_*.json")
    r = json.loads(path.read_text())
    assert (r["examples"], r["restarts"], r["iterations"]) == (3, 2, 1)
    assert 0 < r["jvp_seconds"] + r["vjp_seconds"] <= r["seconds"]
    assert 0 < r["jvp_vjp_share"] <= 1
    # Every product a solve needs went through the timed methods (plus the probes of bound()).
    needed = r["products_per_example"] * r["examples"]
    assert r["rows_through_jvp"] + r["rows_through_vjp"] >= needed
    assert np.isfinite(r["bound"]["median"]) and r["bound"]["median"] > 0
    assert "hcrfast.bound:" in proc.stdout


def test_gpu_targets_runs_the_krylov_solver_and_counts_its_basis(tmp_path):
    proc = run_script("gpu_targets.py", "mnist", "--device", "cpu", "--examples", "2", "--restarts", "3",
                      "--iterations", "2", "--threads", "1", "--solver", "krylov", "--krylov-steps", "20",
                      "--reorth-passes", "2", "--out", str(tmp_path))
    (path,) = tmp_path.glob("gpu_targets_mnist_cpu_*.json")
    r = json.loads(path.read_text())
    assert r["solver"] == "krylov" and r["krylov_steps_median"] == 20 and r["products_per_example"] == 41
    assert r["krylov_reorth_passes"] == 2 and r["krylov_steps_redone_mean"] == 0
    assert r["lsqr"]["atol"] == 0 and r["lsqr"]["iter_lim"] == 20  # the basis' own rules, capped
    assert r["rows_through_jvp"] + r["rows_through_vjp"] >= 41 * 2
    assert "Krylov basis steps median 20" in proc.stdout
    # --singular-steps: the same call with 4 singular steps, recorded, and no bound lower
    run_script("gpu_targets.py", "mnist", "--device", "cpu", "--examples", "2", "--restarts", "3",
               "--iterations", "2", "--threads", "1", "--solver", "krylov", "--krylov-steps", "20",
               "--reorth-passes", "2", "--singular-steps", "4", "--out", str(tmp_path / "sing"))
    (path,) = (tmp_path / "sing").glob("gpu_targets_mnist_cpu_*.json")
    s = json.loads(path.read_text())
    assert s["singular_steps"]["count"] == 4 and s["bound"]["median"] >= r["bound"]["median"]


def test_gpu_targets_double_backward_choice_is_recorded_and_leaves_the_bounds(tmp_path):
    """--double-backward torch records the forward as torch does (hcrfast.bindings.jacobian.LEAN_DOUBLE_BACKWARD
    off); on the CIFAR CNN's convolutions both graphs give the same products, so the same bounds."""
    medians = {}
    for choice in ("lean", "torch"):
        out = tmp_path / choice
        run_script("gpu_targets.py", "cifar10", "--device", "cpu", "--examples", "1", "--restarts", "2",
                   "--iterations", "1", "--threads", "1", "--solver", "krylov", "--krylov-steps", "8",
                   "--double-backward", choice, "--out", str(out))
        (path,) = out.glob("gpu_targets_cifar10_cpu_*.json")
        r = json.loads(path.read_text())
        assert r["double_backward"] == choice and r["jacobian"] == "reverse"
        medians[choice] = r["bound"]["median"]
    assert np.isfinite(medians["lean"]) and medians["lean"] > 0
    np.testing.assert_allclose(medians["lean"], medians["torch"], rtol=1e-5)


def test_gpu_targets_runs_several_krylov_pilots_and_the_summary_names_them(tmp_path):
    """--krylov-pilots 2: two bases of 20 steps per example, 2 x (2 x 20 + 1) products, shown by the summary;
    with another solver the option is refused, naming it."""
    run_script("gpu_targets.py", "mnist", "--device", "cpu", "--examples", "2", "--restarts", "3",
               "--iterations", "1", "--threads", "1", "--solver", "krylov", "--krylov-steps", "20",
               "--krylov-pilots", "2", "--reorth-passes", "2", "--out", str(tmp_path))
    (path,) = tmp_path.glob("gpu_targets_mnist_cpu_*.json")
    r = json.loads(path.read_text())
    assert r["krylov_pilots"] == 2 and r["products_per_example"] == 2 * (2 * 20 + 1)
    assert "solver=krylov pilots=2 steps<=20 reorth=2" in run_script("gpu_summary.py", tmp_path).stdout
    gpu_targets = _benchmark_script("gpu_targets")
    with pytest.raises(SystemExit, match="--krylov-pilots 2 needs the Krylov solver"):
        gpu_targets.main(["mnist", "--device", "cpu", "--examples", "1", "--solver", "lsqr", "--krylov-pilots", "2"])


def test_gpu_targets_records_the_pilots_that_auto_chose(tmp_path, monkeypatch):
    """--krylov-pilots auto with MAX_STEPS = 40 (the MNIST MLP's space is then beyond one basis): the JSON
    records what bound() resolved, 2 pilots (R = 2) of 20 steps, and what was asked."""
    gpu_targets = _benchmark_script("gpu_targets")
    monkeypatch.setattr(hcrfast.krylov, "MAX_STEPS", 40)
    monkeypatch.setattr(hcrfast.krylov, "AUTO_PILOT_STEPS", 20)
    assert gpu_targets.main(["mnist", "--device", "cpu", "--examples", "1", "--restarts", "2", "--iterations", "1",
                             "--solver", "krylov", "--krylov-pilots", "auto", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("gpu_targets_mnist_cpu_*.json")
    r = json.loads(path.read_text())
    assert r["krylov_pilots"] == 2 and r["krylov_pilots_asked"] == "auto" and r["lsqr"]["iter_lim"] == 20
    assert r["products_per_example"] == 2 * (2 * 20 + 1)


def test_lsqr_budget_first_picks_later_examples_of_the_same_stream():
    lsqr_budget = _benchmark_script("lsqr_budget")
    _, _, both, _, _ = lsqr_budget.random_workload("mnist", 2, "cpu")
    _, _, second, _, _ = lsqr_budget.random_workload("mnist", 1, "cpu", first=1)
    torch.testing.assert_close(second, both[1:], rtol=0, atol=0)
    with pytest.raises(SystemExit):
        lsqr_budget.main(["mnist", "--first", "-1"])


def test_gpu_targets_slices_keep_the_bounds_and_a_spent_budget_extrapolates(tmp_path):
    base = ["mnist", "--device", "cpu", "--examples", "3", "--restarts", "2", "--iterations", "1", "--threads", "1",
            "--solver", "dense"]
    runs = {}
    variants = (("one", []), ("sliced", ["--slices", "3"]), ("budget", ["--slices", "3", "--time-budget", "0"]))
    for name, extra in variants:
        out = tmp_path / name
        run_script("gpu_targets.py", *base, *extra, "--out", out)
        (path,) = out.glob("gpu_targets_mnist_cpu_*.json")
        runs[name] = json.loads(path.read_text())
    one, sliced, budget = runs["one"], runs["sliced"], runs["budget"]
    assert one["complete"] and sliced["complete"] and sliced["slices"] == 3
    for q in ("median", "p90"):  # each example keeps its own start vectors; dense steps are exact
        assert sliced["bound"][q] == pytest.approx(one["bound"][q], rel=1e-6)
    assert not budget["complete"] and budget["examples_done"] == 1
    assert budget["extrapolated_seconds"] == pytest.approx(3 * budget["seconds"])


def test_gpu_targets_times_the_bound_calls_not_the_host_work_between_slices(monkeypatch):
    """With --slices, the JSON written after each slice (and the host copy of its result) is outside
    the reported time and the JVP/VJP share's denominator. A clock that jumps 1000 s whenever a slice's
    result is handed over would add 2000 s to both if they spanned the whole run."""
    gpu_targets = _benchmark_script("gpu_targets")
    import time as real_time
    jump = {"s": 0.0}

    class Clock:
        @staticmethod
        def perf_counter():
            return real_time.perf_counter() + jump["s"]

    monkeypatch.setattr(gpu_targets, "time", Clock)
    args = gpu_targets.build_parser().parse_args(["mnist", "--device", "cpu", "--examples", "3", "--restarts", "2",
                                                   "--iterations", "1", "--threads", "1", "--solver", "lsqr",
                                                   "--slices", "3"])
    handed = []

    def on_slice(r):
        handed.append(r["slices_done"])
        jump["s"] += 1000.0

    r = gpu_targets.run(args, on_slice=on_slice)
    assert handed == [1, 2] and r["complete"]
    assert 0 < r["seconds"] < 1000 and r["timeline_seconds"] == pytest.approx(r["seconds"])
    assert 0 < r["jvp_vjp_share"] <= 1 and r["jvp_seconds"] + r["vjp_seconds"] <= r["seconds"]


@pytest.mark.parametrize("solver", ["auto", "krylov"])
def test_gpu_targets_slices_report_what_one_call_over_their_examples_would(tmp_path, monkeypatch, solver):
    """--slices 3 over 5 examples (calls of 2, 2 and 1): the JSON's per-example products and singular-step
    account are the example-weighted combination of the calls' own, as one call over the 5 gives them (it took
    the last call's: 403 products per example where the calls gave 398, 388.5 and 403, singular steps of
    1 example of 5). "auto" is the dense solve on the CPU: it is given no LSQR options, so no call warns of
    unused ones, and the JSON records the one it uses (the kernels), not DEFAULT_LSQR's tolerances."""
    gpu_targets = _benchmark_script("gpu_targets")
    import functools

    real, calls = hcrfast.bound, []

    @functools.wraps(real)   # the script reads bound()'s defaults from its signature
    def recorded(*args, **kwargs):
        res = real(*args, **kwargs)
        if kwargs.get("example_ids") is not None:   # the timed calls, not the warm-up
            calls.append((len(kwargs["example_ids"]), res.params))
        return res

    monkeypatch.setattr(hcrfast, "bound", recorded)
    base = ["mnist", "--device", "cpu", "--examples", "5", "--restarts", "2", "--iterations", "2", "--threads", "1",
            "--solver", solver] + (["--krylov-steps", "20"] if solver == "krylov" else [])
    runs = {}
    for name, extra in (("one", []), ("sliced", ["--slices", "3"])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert gpu_targets.main([*base, *extra, "--out", str(tmp_path / name)]) == 0
        assert not [w for w in caught if "lsqr options go unused" in str(w.message)]
        (path,) = (tmp_path / name).glob("gpu_targets_mnist_cpu_*.json")
        runs[name] = json.loads(path.read_text())
    one, sliced = runs["one"], runs["sliced"]
    slices = calls[1:]
    assert [n for n, _ in slices] == [2, 2, 1] and sliced["examples_done"] == 5
    dense = solver == "auto"
    assert sliced["solver"] == one["solver"] == ("dense" if dense else "krylov")
    per_call = [p["dense"]["jacobian_products"] if dense else p["krylov"]["products_per_example"] for _, p in slices]
    weighted = sum(n * v for (n, _), v in zip(slices, per_call)) / 5
    assert sliced["products_per_example"] == pytest.approx(weighted, rel=1e-12)
    assert sliced["products_per_example"] == pytest.approx(one["products_per_example"], rel=1e-12)
    steps = [p["singular_steps"] for _, p in slices]
    s = sliced["singular_steps"]
    assert s["examples"] == sum(q["examples"] for q in steps) == one["singular_steps"]["examples"] == 5
    assert s["modes_lifted"] == sum(q["modes_lifted"] for q in steps)
    assert s["seconds"] == pytest.approx(sum(q["seconds"] for q in steps), rel=1e-12)
    assert s["directions"] == dict(total=sum(q["directions"]["total"] for q in steps),
                                   fewest=min(q["directions"]["fewest"] for q in steps))
    assert s["directions"] == one["singular_steps"]["directions"]
    if dense:
        assert sliced["lsqr"] == one["lsqr"] == {"kernels": "auto"}
    else:   # the basis' own rules, capped: the options its solves ran with
        assert sliced["lsqr"]["atol"] == 0 and sliced["lsqr"]["iter_lim"] == 20


def test_gpu_session_script_parses_and_refuses_unknown_stages(tmp_path):
    script = ROOT / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script), "no-such-stage"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path), "GPU_SESSION_DEST": str(tmp_path / "session")})
    assert proc.returncode == 2 and "unknown stage 'no-such-stage'" in proc.stderr
    assert not (tmp_path / "session").exists()   # a refused call leaves no folder behind


def _race_dense_products(examples: int) -> float:
    """The oracle of the dense solve's products per example on race.py's problem: J's nonzero rows (by
    torch.func.jacrev) pulled back one VJP each, plus the 2 JVPs that find them, the VJP that checks them and
    the one that checks J against plain autograd."""
    race = _benchmark_script("race")
    model, x = race.build_problem("mlp", examples, seed=0, device="cpu")
    J = torch.func.vmap(torch.func.jacrev(lambda t: model(t[None]).reshape(-1)))(x).reshape(examples, 784, 784)
    return float(((J.abs().amax(dim=2) > 0).sum(dim=1) + 3 + 1).double().mean())


def test_race_runs_at_toy_size_with_the_dense_default_row(tmp_path):
    proc = run_script("race.py", "--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "2",
                      "--threads", "1", "--no-sweep", "--out", str(tmp_path))
    (path,) = [p for p in tmp_path.glob("race_mlp_cpu_*.json") if not p.name.endswith("_reference.json")]
    r = json.loads(path.read_text())
    assert r["hcrfast_default"]["solver"] == "dense"
    assert r["hcrfast_default"]["products_per_example"] == _race_dense_products(2) < 784
    assert r["hcrfast_input"]["solver"] == "lsqr" and r["hcrfast_current"]["solver"] == "lsqr"
    # the options each row's solves ran with: the dense solve's kernels alone, no LSQR tolerances
    assert r["hcrfast_default"]["lsqr"] == {"kernels": "auto"} and r["hcrfast_input"]["lsqr"]["atol"] > 0
    assert r["reference"]["products_per_example"] > 0 and "median ratio" in proc.stdout
    # rows through the Jacobian: at least what each problem needed (riding along and probes on top)
    for row in ("hcrfast_default", "hcrfast_input", "hcrfast_current"):
        assert r[row]["model_products_per_example"] >= r[row]["products_per_example"], row
    assert "rows/ex" in proc.stdout


def test_race_reference_json_must_come_from_the_same_device_and_threads(tmp_path):
    """A reference row reused by --reference-json is a term of the time ratio: one timed on another device,
    GPU or CPU thread count is refused, naming both values; one from here keeps its own machine info."""
    race = _benchmark_script("race")
    args = race.parse_args(["--model", "digits", "--examples", "3", "--threads", "1"])
    here = dict(torch_threads=1, hostname="here")
    ref = dict(method="reference", seconds=10.0, median=0.5)

    def saved(device="cpu", **machine):
        path = tmp_path / f"ref_{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(dict(args={**vars(args), "device": device}, sigma=0.2, reference=ref,
                                        machine=dict(torch_threads=1, hostname="there", **machine))))
        return path

    with pytest.raises(ValueError, match=r"--device cuda, this run on --device cpu.*rerun the reference here"):
        race.load_reference(saved("cuda", gpu="NVIDIA H100"), args, 0.2, here)
    with pytest.raises(ValueError, match=r"on 1 torch thread\(s\), this run on 2.*rerun the reference here"):
        race.load_reference(saved(), args, 0.2, dict(here, torch_threads=2))
    cuda = race.parse_args(["--model", "digits", "--examples", "3", "--threads", "1", "--device", "cuda"])
    with pytest.raises(ValueError, match=r"'NVIDIA H100', this run on 'NVIDIA H200'"):
        race.load_reference(saved("cuda", gpu="NVIDIA H100"), cuda, 0.2, dict(here, gpu="NVIDIA H200"))
    row, machine = race.load_reference(saved(), args, 0.2, here)
    assert row["seconds"] == 10.0 and "[from ref_" in row["method"] and machine["hostname"] == "there"


def test_machine_info_ties_a_json_to_the_code():
    race = _benchmark_script("race")
    info = race.machine_info("cpu")
    assert info["hcrfast"] == hcrfast.__version__
    commit = info["git_commit"]      # None where this checkout has no .git or no git
    assert commit is None or len(commit.removesuffix("-dirty")) == 40


def test_machine_info_records_no_commit_for_a_tree_without_its_own_git(tmp_path):
    """The GPU machine gets a copy of the working tree that may have no .git: no commit, and no failure."""
    assert _benchmark_script("race").git_commit(tmp_path) is None


def test_gpu_summary_gives_no_race_verdict_for_a_reference_from_another_machine():
    summary = _benchmark_script("gpu_summary")
    best = dict(method="hcrfast defaults", seconds=1.0, median=0.6)
    race = dict(args=dict(model="mlp", examples=32, restarts=2, iterations=10, device="cuda"),
                reference=dict(method="reference", seconds=100.0, median=0.5), time_to_reference_median=best,
                machine=dict(gpu="NVIDIA H200", torch_threads=16),
                reference_machine=dict(gpu="NVIDIA H200", torch_threads=16))
    assert "(>= 50x: met)" in summary.race_line(race)
    race["reference_machine"]["gpu"] = "NVIDIA H100"
    line = summary.race_line(race)
    assert "met" not in line and "no verdict: the reference ran on the GPU 'NVIDIA H100', hcrfast on 'NVIDIA H200'" in line
    del race["reference_machine"]           # a JSON from before reference_machine, its reference reused
    race["reference"]["method"] += " [from race_mlp_cuda_x_reference.json]"
    assert "no verdict: the reference row is an earlier run's" in summary.race_line(race)


def test_race_killed_in_a_row_keeps_the_rows_done(tmp_path, monkeypatch):
    """The H100's race was killed at its time limit in the third row, after the reference and two hcrfast
    rows had printed, and left only the reference's JSON: every finished row is written at once now."""
    race = _benchmark_script("race")
    real, calls = race.run_hcrfast, []

    def dies_third(*args, **kwargs):
        calls.append(kwargs.get("label"))
        if len(calls) == 3:
            raise KeyboardInterrupt("the device tool's time limit")
        return real(*args, **kwargs)

    monkeypatch.setattr(race, "run_hcrfast", dies_third)
    with pytest.raises(KeyboardInterrupt):
        race.main(["--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads", "1",
                   "--no-sweep", "--out", str(tmp_path)])
    (path,) = [p for p in tmp_path.glob("race_mlp_cpu_*.json") if not p.name.endswith("_reference.json")]
    r = json.loads(path.read_text())
    assert r["complete"] is False and r["hcrfast_input"] is None
    assert r["main_rows_done"] == [r["hcrfast_default"]["method"], r["hcrfast_current"]["method"]]
    assert "_std" not in r["reference"] and "fraction_modes_ge_reference" in r["hcrfast_current"]
    assert r["time_to_reference_median"] is None or r["time_to_reference_median"]["method"] in r["main_rows_done"]


def test_race_adds_the_dense_row_where_auto_takes_the_krylov_basis(tmp_path, monkeypatch):
    """On CUDA solver="auto" takes the Krylov basis; the race then also runs the dense solve (the other
    exact solver), so that one lease measures both against the reference. Simulated here on the CPU."""
    race = _benchmark_script("race")
    real, solvers = race.run_hcrfast, []

    def auto_as_krylov(*args, **kwargs):
        if kwargs.get("solver") == "auto":
            kwargs["solver"] = "krylov"
        solvers.append(kwargs.get("solver", "lsqr"))
        return real(*args, **kwargs)

    monkeypatch.setattr(race, "run_hcrfast", auto_as_krylov)
    from hcrfast import dense

    eighs = []
    real_min_norm = dense.min_norm_solver
    monkeypatch.setattr(dense, "min_norm_solver", lambda *a, **k: eighs.append(dense.EIGH_IMPL) or real_min_norm(*a, **k))
    race.main(["--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads", "1",
               "--no-sweep", "--dense-eigh", "lapack, torch", "--out", str(tmp_path)])
    # one dense row per --dense-eigh implementation, each with its own (restored after the row)
    assert solvers == ["krylov", "dense", "dense", "lsqr", "lsqr"]
    assert eighs == ["lapack", "torch"] and dense.EIGH_IMPL == "auto"
    (path,) = [p for p in tmp_path.glob("race_mlp_cpu_*.json") if not p.name.endswith("_reference.json")]
    r = json.loads(path.read_text())
    assert r["hcrfast_default"]["solver"] == "krylov" and r["hcrfast_dense"]["solver"] == "dense"
    assert r["hcrfast_dense"]["dense_eigh"] == "lapack" and r["hcrfast_default"]["dense_eigh"] is None
    (more,) = r["hcrfast_dense_more"]
    assert more["dense_eigh"] == "torch" and more["median"] == pytest.approx(r["hcrfast_dense"]["median"], rel=1e-9)
    assert r["hcrfast_dense"]["products_per_example"] == _race_dense_products(2) < 784
    assert r["main_rows_done"] == "all" and r["complete"] is True
    assert "_std" not in json.dumps(r)
    text = run_script("gpu_summary.py", tmp_path).stdout
    for row in (r["hcrfast_default"], r["hcrfast_dense"], more, r["hcrfast_current"], r["hcrfast_input"]):
        line = row["method"][:60] + f": {row['seconds']:.2f} s, median {row['median']:.5g}"
        assert line in text, row["method"]
    with pytest.raises(SystemExit):
        race.parse_args(["--dense-eigh", "lapack,magma"])
    # An implementation that fails (here: a device one on the CPU) costs its row only, recorded as such.
    for old in tmp_path.glob("race_*.json"):
        old.unlink()
    race.main(["--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads", "1",
               "--no-sweep", "--dense-eigh", "lapack,cusolver", "--out", str(tmp_path)])
    (path,) = [p for p in tmp_path.glob("race_mlp_cpu_*.json") if not p.name.endswith("_reference.json")]
    r = json.loads(path.read_text())
    (failed,) = r["hcrfast_dense_more"]
    assert failed["dense_eigh"] == "cusolver" and "runs on a CUDA device" in failed["error"]
    assert r["hcrfast_dense"]["dense_eigh"] == "lapack" and r["hcrfast_input"] and dense.EIGH_IMPL == "auto"
    summary = run_script("gpu_summary.py", tmp_path).stdout
    assert f"{failed['method'][:60]}: FAILED (ValueError" in summary


def test_race_json_holds_no_bound_arrays_when_auto_takes_lsqr(tmp_path, monkeypatch):
    """Where solver="auto" resolves to LSQR, the defaults row is no main row of its own: its per-mode
    bounds (kept for the paired comparison) were written into the JSON as a truncated array string."""
    race = _benchmark_script("race")
    real = race.run_hcrfast

    def auto_as_lsqr(*args, **kwargs):
        if kwargs.get("solver") == "auto":
            kwargs["solver"] = "lsqr"
        return real(*args, **kwargs)

    monkeypatch.setattr(race, "run_hcrfast", auto_as_lsqr)
    race.main(["--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads", "1",
               "--no-sweep", "--out", str(tmp_path)])
    (path,) = [p for p in tmp_path.glob("race_mlp_cpu_*.json") if not p.name.endswith("_reference.json")]
    r = json.loads(path.read_text())
    assert r["hcrfast_default"]["solver"] == "lsqr" and r["complete"] is True
    assert "_std" not in json.dumps(r)


def test_race_row_counter_counts_each_product_row_and_restores_the_operator():
    race = _benchmark_script("race")
    import torch

    from hcrfast.bindings.jacobian import TorchJacobian

    matvec, rmatvec = TorchJacobian.matvec, TorchJacobian.rmatvec
    op = TorchJacobian(torch.nn.Linear(5, 3).double(), torch.zeros(4, 5, dtype=torch.float64))
    with race.RowCounter() as counter:
        op.matvec(np.ones((4, 5)))
        op.rmatvec(np.ones((4, 3)))
        op.rmatvec(np.ones((4, 3)))
    assert counter.rows == 12
    assert TorchJacobian.matvec is matvec and TorchJacobian.rmatvec is rmatvec


@pytest.mark.parametrize("script, option", [(script, option) for script in ("race", "gpu_targets") for option in
                                             ("--examples", "--restarts", "--iterations", "--threads")]
                         + [("race", "--seed"), ("gpu_targets", "--slices"), ("gpu_targets", "--krylov-steps"),
                            ("gpu_targets", "--chunk-size")])
def test_race_and_gpu_targets_refuse_degenerate_counts_naming_them(script, option, capsys):
    """A count below its least (a seed below 0) is refused by argparse, naming the option and the value: race.py
    failed on --iterations 0 deep in the reference (zero-size array to reduction operation maximum) and on
    --examples 0 with a NaN RMS; gpu_targets.py took --examples 0 as its target's 10,000."""
    module = _benchmark_script(script)
    parse = module.parse_args if script == "race" else module.build_parser().parse_args
    value = "-1" if option == "--seed" else "0"
    with pytest.raises(SystemExit) as exit_:
        parse(([] if script == "race" else ["mnist"]) + [option, value])
    assert exit_.value.code == 2
    assert f"argument {option}: '{value}': pass an integer >= {0 if option == '--seed' else 1}" in capsys.readouterr().err
    if script == "race":
        with pytest.raises(SystemExit):
            module.parse_args(["--sweep-iter-lims", "10,0"])
        assert "--sweep-iter-lims '10,0': '0': pass an integer >= 1" in capsys.readouterr().err


def test_profile_cpu_gives_the_dense_solve_no_lsqr_options(tmp_path, capsys):
    """--solver dense runs no LSQR: no options go to bound() (it warned that atol and btol went unused), the header
    and the JSON name none (they said atol=1e-05), and --tol with it is refused, named."""
    profile_cpu = _benchmark_script("profile_cpu")
    out = tmp_path / "d.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert profile_cpu.main(["--model", "digits", "--solver", "dense", "--examples", "2", "--restarts", "2",
                                 "--iterations", "2", "--threads", "1", "--json", str(out)]) == 0
    assert not [w for w in caught if "go unused" in str(w.message)]
    head = capsys.readouterr().out.splitlines()[0]
    assert "solver dense, every step solved exactly (no LSQR options)" in head and "atol" not in head
    assert json.loads(out.read_text())["lsqr"] is None
    with pytest.raises(SystemExit):
        profile_cpu.main(["--model", "digits", "--solver", "dense", "--tol", "1e-3"])
    assert "--tol 0.001: LSQR's stopping rules, but --solver dense runs no LSQR" in capsys.readouterr().err


def test_profile_cpu_share_of_rows_on_stopped_problems_is_of_the_solves_rows(tmp_path, monkeypatch, capsys):
    """The rows spent on problems that had stopped: the rows the LSQR solves pushed through JVP/VJP (counted here,
    apart from the script's timers) less those the solves needed, from the solver's own iteration counts:
    2·itn + 1 a solve, and A x0 once a warm-started one (every solve of a restart after its first). It counted
    the warm starts' rows and bound's probes as riding along: 11.5% on this run for about 10%."""
    profile_cpu = _benchmark_script("profile_cpu")
    from hcrfast import algorithm
    from hcrfast.bindings.jacobian import TorchJacobian

    count, results = {"rows": 0, "all": 0, "depth": 0}, []

    def counted(method):
        def product(self, arr):
            count["all"] += arr.shape[0]
            count["rows"] += arr.shape[0] if count["depth"] else 0
            return method(self, arr)
        return product

    def solve(*args, **kwargs):
        count["depth"] += 1
        try:
            return real_lsqr(*args, **kwargs)
        finally:
            count["depth"] -= 1

    def bound(*args, **kwargs):
        count.update(rows=0, all=0)   # the timed call's alone, not the warm-up's
        results.append(real_bound(*args, **kwargs))
        return results[-1]

    real_lsqr, real_bound = algorithm.lsqr, hcrfast.bound
    monkeypatch.setattr(TorchJacobian, "matvec", counted(TorchJacobian.matvec))
    monkeypatch.setattr(TorchJacobian, "rmatvec", counted(TorchJacobian.rmatvec))
    monkeypatch.setattr(algorithm, "lsqr", solve)
    monkeypatch.setattr(hcrfast, "bound", bound)
    out = tmp_path / "p.json"
    examples, restarts, iterations = 4, 2, 2
    assert profile_cpu.main(["--model", "digits", "--examples", str(examples), "--restarts", str(restarts),
                             "--iterations", str(iterations), "--threads", "1", "--json", str(out)]) == 0
    assert results[-1].params["warm_start"] and results[-1].params["solver"] == "lsqr"
    itn = results[-1].to_numpy().lsqr_iterations
    needed = int(np.sum(2 * itn + 1)) + examples * restarts * (iterations - 1)
    expected = 1 - needed / count["rows"]
    r = json.loads(out.read_text())
    assert (r["products_needed"], r["rows_in_solves"], r["rows_through_products"]) == (needed, count["rows"],
                                                                                        count["all"])
    assert count["all"] > count["rows"]     # bound's probes, outside the solves: left out
    assert r["stopped_rows_share"] == pytest.approx(expected, abs=1e-12)
    assert f"({expected:.1%} of the solves' product rows went to problems already stopped)" in capsys.readouterr().out


def test_warm_start_script_runs_with_its_dense_row(tmp_path):
    out = tmp_path / "w.json"
    run_script("warm_start.py", "--examples", "1", "--restarts", "1", "--iterations", "2", "--tols", "1e-3",
               "--threads", "1", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["start"] for r in rows] == ["cold", "warm", "dense"]
    assert 3 < rows[-1]["products_per_example"] < 784 and rows[-1]["median"] > 0   # J's nonzero rows + 3 probes


def test_dense_vs_lsqr_script_runs_and_both_solvers_agree_on_digits(tmp_path):
    out = tmp_path / "d.json"
    run_script("dense_vs_lsqr.py", "digits", "--examples", "2", "--restarts", "2", "--iterations", "2",
               "--threads", "1", "--targets", "low:4", "--json", str(out))
    dense, dense_t, lsqr, lsqr_t = json.loads(out.read_text())["rows"]
    assert 3 < dense["products_per_example"] <= 67 and dense["lsqr_istop_counts"] == {"-1": 8}
    assert set(lsqr["lsqr_istop_counts"]) <= {"1", "2"} and lsqr["products_per_example"] > 64
    assert abs(dense["median"] - lsqr["median"]) <= 1e-3 * lsqr["median"]
    # with targets: the dense solve hands its factorization to the targeted modes, LSQR cannot
    assert dense_t["targets"] == "low:4" and dense_t["targeted"]["shared_factorization"]
    assert not lsqr_t["targeted"]["shared_factorization"]
    assert lsqr_t["targeted"]["n_targets"] == 16  # the 4 x 4 low block
    assert dense_t["median"] >= dense["median"] and lsqr_t["median"] >= lsqr["median"]


def test_restarts_cost_script_reports_what_bound_gives_at_each_restart_count(tmp_path):
    import hcrfast

    out = tmp_path / "r.json"
    run_script("restarts_cost.py", "--model", "digits", "--examples", "3", "--restarts", "2,6",
               "--solvers", "dense", "--iterations", "3", "--threads", "1", "--json", str(out))
    saved = json.loads(out.read_text())
    assert [(r["solver"], r["restarts"]) for r in saved["rows"]] == [("dense", 2), ("dense", 6)]
    # J is built once per example whatever R is: the restarts cost no Jacobian product
    assert saved["rows"][0]["products_per_example"] == saved["rows"][1]["products_per_example"] > 3
    model, x = _benchmark_script("race").build_problem("digits", 3, seed=0, device="cpu")
    res = hcrfast.bound(model, x, saved["sigma"], restarts=6, iterations=3, size=saved["size"], solver="dense", seed=0)
    assert saved["rows"][1]["median"] == pytest.approx(float(np.median(res.std)), rel=1e-12)


def test_restart_directions_script_finds_the_exhausted_space_has_no_smallest_ritz_pull():
    """digits (64 inputs): at k = 64 the pilot's space is all of R^64, whose smallest Ritz value is J's
    null direction (~0, never taken by lstsq), so the steps have no part along it; at k = 4 they share it."""
    rows = _benchmark_script("restart_directions").main(["digits", "--depths", "4,64", "--restarts", "3",
                                                         "--iterations", "2", "--threads", "1"])
    assert [r["k"] for r in rows] == [4, 64]
    assert rows[1]["ritz_min"] < 1e-12 and rows[1]["cos_smallest_ritz_median"] < 1e-2   # rounding: 1.3e-4
    assert rows[0]["cos_smallest_ritz_median"] > 0.5 and 0 <= rows[0]["pairwise_cos_min"] <= 1


def test_lsqr_budget_script_caps_the_solves(tmp_path):
    out = tmp_path / "b.json"
    run_script("lsqr_budget.py", "digits", "--examples", "2", "--restarts", "2", "--iterations", "2",
               "--iter-lims", "5,none", "--threads", "1", "--json", str(out))
    capped, full = json.loads(out.read_text())["rows"]
    assert capped["iter_lim"] == 5 and capped["steps_max"] == 5 and capped["istop"] == [7]  # 7: iter_lim reached
    assert full["iter_lim"] is None and full["steps_max"] > 5 and set(full["istop"]) <= {1, 2}
    assert full["median_vs_last"] == 1.0 and capped["median"] > 0


def test_lsqr_budget_script_runs_the_krylov_solver(tmp_path):
    out = tmp_path / "k.json"
    run_script("lsqr_budget.py", "digits", "--solver", "krylov", "--examples", "2", "--restarts", "2",
               "--iterations", "2", "--iter-lims", "5,none", "--targets", "low:2", "--threads", "1", "--json", str(out))
    capped, full = json.loads(out.read_text())["rows"]
    assert capped["solver"] == "krylov" and capped["steps_max"] == 5 and capped["products_per_example"] == 11
    assert full["steps_max"] > 5 and full["krylov"]["rank_median"] > 5
    t = full["targets"]
    assert t["method"] == "krylov" and 0 <= t["modes_lifted_fraction"] <= 1
    assert t["median_with_targets"] >= t["median_algorithm1"]  # a max of valid bounds
    assert t["other_modes"] == 2 * 60 and t["other_median_with_targets"] >= t["other_median_algorithm1"]


@pytest.mark.parametrize("pilots", [1, 2])
def test_krylov_depth_script_truncates_one_build(tmp_path, pilots):
    """Each depth's bound equals a bound(solver='krylov') run with that iter_lim (the basis prefix property),
    with one basis per example and with a basis per restart (``--krylov-pilots``)."""
    import numpy as np
    import torch

    import hcrfast
    from hcrfast import zoo

    out = tmp_path / "d.json"
    run_script("krylov_depth.py", "digits", "--examples", "2", "--restarts", "2", "--iterations", "2",
               "--depths", "4,9", "--krylov-pilots", str(pilots), "--threads", "1", "--json", str(out))
    got = json.loads(out.read_text())
    rows = got["rows"]
    # the machine's CPU generation, as torch dispatches to it (the JSONs of other VMs may round otherwise)
    assert got["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert got["build_redone"] == [0] * (2 * pilots)
    assert [r["depth"] for r in rows] == [4, 9] and rows[0]["products_per_example"] == 9 * pilots
    assert [r["pilots"] for r in rows] == [pilots, pilots] and len(rows[1]["steps"]) == 2 * pilots
    zm = zoo.build("digits")
    model = zm.features.eval()
    x = zm.normalize(torch.rand((2,) + tuple(zm.input_shape), generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), zm.sigma_scale)
    best = None
    for row, k in zip(rows, (4, 9)):
        direct = hcrfast.bound(model, x, sigma, size=zm.size, restarts=2, iterations=2, solver="krylov",
                               krylov_pilots=pilots, lsqr=hcrfast.LSQROptions(atol=0, btol=0, conlim=0, iter_lim=k),
                               singular_steps=0)   # the script's: the bases' Algorithm 1 alone
        assert direct.params["krylov"]["pilots"] == pilots
        assert abs(float(np.median(direct.std)) - row["median"]) <= 1e-6 * row["median"]
        # the element-wise max of the depths' bounds so far (each certified, so is their max)
        best = direct.std if best is None else np.maximum(best, direct.std)
        assert abs(float(np.median(best)) - row["median_max_over_depths"]) <= 1e-6 * row["median_max_over_depths"]
    assert rows[1]["median_max_over_depths"] >= max(rows[0]["median"], rows[1]["median"])


def test_krylov_depth_script_refuses_bad_pilots_and_check_every(tmp_path):
    proc = run_script("krylov_depth.py", "digits", "--restarts", "2", "--krylov-pilots", "3", "--depths", "4",
                      check=False)
    assert proc.returncode != 0 and "--krylov-pilots 3" in proc.stderr
    proc = run_script("krylov_depth.py", "digits", "--restarts", "2", "--check-every", "0", "--depths", "4",
                      check=False)
    assert proc.returncode != 0 and "--check-every 0" in proc.stderr


@pytest.mark.parametrize("profile", ["rms", "feature-std"])
def test_sigma_search_script_meets_every_target_and_counts_its_calls(tmp_path, profile):
    out = tmp_path / "s.json"
    run_script("sigma_search.py", "digits", "--examples", "3", "--restarts", "2", "--iterations", "2",
               "--threads", "1", "--profile", profile, "--json", str(out))
    got = json.loads(out.read_text())
    rows = got["searches"]
    assert got["profile"] == profile
    assert len(rows) == 5 and all(r["met"] and r["value"] >= r["target"] for r in rows)
    assert all(r["calls"] == len(r["history"]) >= 1 for r in rows)
    # every call after a search's first takes the factors kept from it, per-feature profiles included
    assert all(h["reused_examples"] == 3 for r in rows for h in r["history"][1:])
    assert any(r["calls"] >= 2 for r in rows)


def test_sigma_search_script_sweep_mode_times_a_sweep_against_plain_calls(tmp_path):
    out = tmp_path / "w.json"
    run_script("sigma_search.py", "digits", "--examples", "3", "--restarts", "2", "--iterations", "2",
               "--sweep", "0.5,1,2", "--json", str(out))
    r = json.loads(out.read_text())
    assert r["scales"] == [0.5, 1.0, 2.0] and r["reused_examples"] == [0, 3, 3]
    assert r["max_relative_difference"] == 0.0  # the dense solve: bitwise the plain calls' bounds
    assert len(r["plain_call_seconds"]) == 3 and r["plain_over_sweep"] > 0


def test_reuse_rounding_script_finds_dense_scalar_reuse_exact_and_the_rest_within_rounding(tmp_path):
    out = tmp_path / "rr.json"
    run_script("reuse_rounding.py", "--json", str(out))
    rows = {(r["dtype"], r["sigma0"], r["solver"]): r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 8 and all(r["calls"] >= 2 and r["reused"][1:] == [8] * (r["calls"] - 1) for r in rows.values())
    for dtype in ("float32", "float64"):  # J's factor does not depend on sigma: bitwise
        assert rows[(dtype, "scalar", "dense")]["max_rel"] == 0.0
    assert all(r["max_rel"] < 1e-9 for k, r in rows.items() if k[0] == "float64")
    assert all(r["max_rel"] < 2e-2 for k, r in rows.items() if k[0] == "float32")


def test_reuse_store_size_script_counts_what_a_search_keeps(tmp_path):
    out = tmp_path / "r.json"
    proc = run_script("reuse_store_size.py", "digits", "--examples", "3", "--solver", "dense", "--json", str(out))
    r = json.loads(out.read_text())
    # the oracle: the dense solve keeps (J⁺)ᵀ on the chunk's most live rows of J (features that move),
    # in float64, for each example; J from torch.func on the script's own inputs
    from hcrfast import zoo

    zm = zoo.build("digits", seed=0)
    x = zm.normalize(torch.rand((3,) + tuple(zm.input_shape), generator=torch.Generator().manual_seed(0)))
    J = torch.func.vmap(torch.func.jacrev(lambda v: zm.features(v[None])[0].reshape(-1)))(x).reshape(3, -1, 64)
    k = int((J.abs().amax(dim=2) > 0).sum(dim=1).max())
    matrix = 8 * 3 * k * 64
    # and the 64 smallest right singular vectors with their values (bound's default singular_steps="auto")
    matrix += 8 * 3 * 64 * (64 + 1)
    assert r["solver"] == "dense" and r["store_bytes"] == 3 * r["bytes_per_example"]
    assert matrix <= r["store_bytes"] <= matrix + 16 * 3 * k + 1024  # + its row indices and ranks
    assert "MB kept per example" in proc.stdout


def test_checkpoint_cost_script_times_three_calls_with_equal_bounds(tmp_path):
    out = tmp_path / "ck.json"
    proc = run_script("checkpoint_cost.py", "--model", "digits", "--examples", "5", "--restarts", "2",
                      "--iterations", "2", "--chunk-size", "2", "--repeats", "1", "--threads", "1", "--json", out)
    r = json.loads(out.read_text())
    assert r["chunk_files"] == 3 and r["bytes_written"] > 0 and r["bounds_equal"]
    assert r["best"]["read_back"] < r["best"]["checkpoint"]
    assert "all read back" in proc.stdout


def test_repeat_check_cost_script_times_the_check_beside_the_call(tmp_path):
    out = tmp_path / "rc.json"
    proc = run_script("repeat_check_cost.py", "--model", "digits", "--examples", "5", "--restarts", "2",
                      "--iterations", "2", "--repeats", "1", "--threads", "1", "--json", out)
    r = json.loads(out.read_text())
    assert 0 < r["check_seconds"] < r["bound_seconds"] and r["share"] == r["check_seconds"] / r["bound_seconds"]
    assert "check_repeatable" in proc.stdout


def _session(tmp_path, *stages, **env):
    """Run gpu_session.sh with its folder and $OUT under tmp_path; (CompletedProcess, ledger rows, seconds)."""
    import time
    dest, out = tmp_path / "session", tmp_path / "out"
    out.mkdir(exist_ok=True)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), *stages], capture_output=True,
                          text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "GPU_SESSION_DEST": str(dest), "OUT": str(out),
                               # no carried wheels: a checkout's .whl/ (fetch_wheels.sh) adds an install row
                               "WHEELS": str(tmp_path / "no-wheels"),
                               # the machine's warm-up marker: a dry run's successful warm-up left /tmp's
                               "WARM_MARK": str(tmp_path / "warm.done"),
                               **{k: str(v) for k, v in env.items()}})
    ledger = [line.split("\t") for line in (dest / "ledger.tsv").read_text().splitlines()]
    return proc, ledger, time.monotonic() - t0


def test_gpu_session_with_no_lease_left_starts_nothing_and_says_so(tmp_path):
    proc, ledger, _ = _session(tmp_path, "lease", LEASE_S=0)
    assert proc.returncode == 0, proc.stderr
    # The preset's stages in order, every command recorded as skipped, none started.
    assert [row[0] for row in ledger] == ["setup"] * 3 + ["mnist", "race", "warm-up", "tests"]
    assert {row[1] for row in ledger} == {"skipped"}
    assert "FutureWarning" not in proc.stdout and "passed" not in proc.stdout
    # The summary is the call's last output (the device tool returns only the tail), and it is packed.
    tail = proc.stdout[proc.stdout.index("== hcrfast GPU session summary"):]
    assert tail.count("skipped") == 5 and "(no pytest output)" in tail
    assert (tmp_path / "out" / "gpu_session.tgz").stat().st_size > 0
    assert (tmp_path / "out" / "gpu_session.log").read_text().endswith(tail)


def test_gpu_session_ledger_tells_two_calls_on_one_machine_apart(tmp_path):
    """Both presets run setup; their rows share the folder (a warm machine), and the summary shows each
    call's stages under its own line instead of merging the two setups."""
    _session(tmp_path, "lease", LEASE_S=0)
    proc, ledger, _ = _session(tmp_path, "lease2", LEASE_S=0)
    calls = [row[4] for row in ledger]
    assert len(set(calls)) == 2 and all(c.endswith(" lease") for c in calls[:7])   # lease: 7 commands
    assert all(c.endswith(" lease2") for c in calls[7:]) and [row[0] for row in ledger[7:11]] == ["setup"] * 3 + [
        "resnet18-krylov"]   # no warm-up: no tests stage follows
    tail = proc.stdout[proc.stdout.index("== hcrfast GPU session summary"):]
    heads = [line for line in tail.splitlines() if line.startswith("-- call ")]
    assert [h.split()[-1] for h in heads] == ["lease", "lease2"]
    setups = [line.split() for line in tail.splitlines() if line.startswith("setup ")]
    assert [row[1] for row in setups] == ["3", "3"]          # each call's 3 setup commands, not 6 in one line


def test_gpu_session_cuts_a_command_to_the_lease_and_skips_what_no_longer_fits(tmp_path):
    # A stand-in interpreter that hangs on any work; the install check and the summary use the real one.
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\ncase "$1" in -c|benchmarks/gpu_summary.py) exec {sys.executable} "$@";; esac\n'
                    "sleep 100\n")
    fake.chmod(0o755)
    lease = 20
    proc, ledger, wall = _session(tmp_path, "tests", "mnist", PYTHON=fake, LEASE_S=lease, RESERVE_S=2, MIN_RUN_S=5,
                                  WARM_UP=0)
    assert proc.returncode == 0, proc.stderr
    (tests, mnist) = ledger
    assert tests[:2] == ["tests", "timeout"] and 5 <= int(tests[2]) <= lease   # started, cut at what was left
    assert mnist[:2] == ["mnist", "skipped"]                                     # nothing left for it
    assert wall < lease + 10        # the call kept to its lease (timeout's TERM, not the 10-s KILL grace)
    assert "TIMEOUT after" in proc.stdout and "SKIPPED" in proc.stdout
    assert "(pytest printed no closing line: killed or crashed)" in proc.stdout


def test_gpu_session_packs_while_a_command_runs_and_leaves_nothing_holding_its_output(tmp_path):
    """A command's files reach $OUT's tarball while it runs (a call the device tool kills keeps them), and the
    packer, ended with the command, leaves no sleep holding the script's stdout: a reader waiting for the
    output to close (as the device tool may) waited up to PACK_EVERY_S more per command."""
    import tarfile
    import time

    fake = tmp_path / "python"   # the race's command: writes a JSON, then works on
    fake.write_text(f'#!/bin/bash\ncase "$1" in -c|benchmarks/gpu_summary.py) exec {sys.executable} "$@";; esac\n'
                    f'echo "{{}}" > "$GPU_SESSION_DEST/race_partial.json"; sleep 4\n')
    fake.chmod(0o755)
    for every in (1, 30):
        dest, out = tmp_path / f"session{every}", tmp_path / f"out{every}"
        out.mkdir()
        env = {**os.environ, "GPU_SESSION_DEST": str(dest), "OUT": str(out), "WHEELS": str(tmp_path / "no-wheels"),
               "PYTHON": str(fake), "LEASE_S": "120", "PACK_EVERY_S": str(every)}
        t0 = time.monotonic()
        proc = subprocess.Popen(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), "race"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT, env=env)
        first = None
        while proc.poll() is None:   # the tarball as the device tool would find it if it killed the call now
            time.sleep(0.25)
            try:
                with tarfile.open(out / "gpu_session.tgz") as tar:
                    if first is None and "./race_partial.json" in tar.getnames():
                        first = time.monotonic() - t0
            except (OSError, tarfile.TarError):
                pass
        exited = time.monotonic() - t0
        proc.communicate()
        closed = time.monotonic() - t0
        assert proc.returncode == 0 and not list(out.glob(".*.part"))
        if every == 1:
            assert first is not None and first < exited - 2   # packed seconds before the command (4 s) ended
        else:
            assert closed - exited < 5                        # no 30-s sleep left holding the output


def test_gpu_summary_lists_the_kernels_and_the_models_products_from_their_own_files(tmp_path):
    """gpu_session.sh kernels writes three pytest-benchmark JSONs (one timeout loses one part); the summary
    prints each one's medians under its name."""
    for name, bench, median in (("bench_gpu_kernels.json", "test_dct2_gpu[numba]", 0.0012),
                                ("bench_gpu_products.json", "test_zoo_product_gpu[jvp-reverse-resnet18-8]", 0.0203),
                                ("bench_gpu_attention.json", "test_attention_product_gpu[jvp-reverse]", 0.0311)):
        (tmp_path / name).write_text(json.dumps({"benchmarks": [{"name": bench, "group": None,
                                                                 "stats": {"median": median}}]}))
    text = run_script("gpu_summary.py", tmp_path).stdout
    kernels, products = text.index("bench_gpu_kernels.json:"), text.index("bench_gpu_products.json:")
    attention = text.index("bench_gpu_attention.json:")
    assert (kernels < text.index("test_dct2_gpu[numba]") < products < text.index("test_zoo_product_gpu[jvp-reverse")
            < attention < text.index("test_attention_product_gpu[jvp-reverse]"))
    assert "median     20.300 ms" in text and "median      1.200 ms" in text and "median     31.100 ms" in text


def test_gpu_summary_reports_each_runs_figures_and_the_issues_verdicts(tmp_path):
    folder = tmp_path / "session"
    run_script("race.py", "--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads",
               "1", "--no-sweep", "--out", folder)
    run_script("gpu_targets.py", "mnist", "--device", "cpu", "--examples", "3", "--restarts", "2", "--iterations",
               "1", "--threads", "1", "--solver", "dense", "--dense-eigh", "lapack", "--slices", "3", "--time-budget",
               "0", "--out", folder)
    (race_path,) = [p for p in folder.glob("race_*.json") if not p.stem.endswith("_reference")]
    (target_path,) = folder.glob("gpu_targets_*.json")
    race, target = json.loads(race_path.read_text()), json.loads(target_path.read_text())
    (folder / "ledger.tsv").write_text("tests\tok\t95\tpytest\nmnist\ttimeout\t150\tgpu_targets.py mnist\n")
    (folder / "tests.out").write_text("....\n=== 32 passed in 95.10s ===\n")

    def summary():
        return run_script("gpu_summary.py", folder).stdout

    text = summary()
    assert "32 passed in 95.10s" in text and "1 timeout" in text
    best, ref = race["time_to_reference_median"], race["reference"]
    assert f"{ref['seconds'] / best['seconds']:.1f}x" in text
    assert "[cpu]" in text and ">= 50x" not in text               # no GPU verdict for a CPU race
    assert "extrapolated from 1/3" in text and f"{target['extrapolated_seconds']:.0f} s" in text
    assert "solver=dense eigh=lapack" in text                     # how its Gram matrices were decomposed
    assert "(< 60 s" not in text                                  # not the issue's size, not on a GPU

    # The issue's verdicts, on the GPU at the full size: 60 s and 85% for MNIST, 50x for the race.
    target.update(device="cuda:0", at_target_size=True, complete=True, examples_done=target["examples"])
    race["args"]["device"] = "cuda"
    best["seconds"] = race["time_to_reference_median"]["seconds"] = 0.5   # ratios exact in binary
    for seconds, share, ratio, verdicts in ((59.0, 0.85, 50.0, ("met", "met", "met")),
                                            (61.0, 0.84, 49.0, ("MISSED", "MISSED", "MISSED"))):
        # a dense run: issue #5's share counts building J (the model's vmapped products) beside the operator's
        target.update(seconds=seconds, extrapolated_seconds=seconds, jvp_vjp_share=0.05, model_products_share=share)
        race["reference"]["seconds"] = ratio * best["seconds"]
        target_path.write_text(json.dumps(target))
        race_path.write_text(json.dumps(race))
        text = summary()
        assert f"{seconds:.1f} s (< 60 s: {verdicts[0]})" in text
        assert f"(>= 85%: {verdicts[1]})" in text and f"the model's JVP/VJP {share:.1%}" in text
        assert f"{ratio:.1f}x (>= 50x: {verdicts[2]})" in text

    # A reference row whose hcrfast rows never finished is named, not dropped.
    race_path.unlink()
    assert "reference only" in summary()


def test_unpack_gpu_session_files_a_lease_under_its_device_and_summarizes_it(tmp_path):
    """What a lease brings back (gpu_session.tgz + the log) lands in gpu_<device>_<date>/, named from
    the JSONs' machine info, and its summary is printed."""
    import tarfile

    session = tmp_path / "session"
    session.mkdir()
    run = {"workload": "mnist", "examples": 10000, "examples_done": 10000, "complete": True, "restarts": 25,
           "iterations": 10, "device": "cuda:0", "seconds": 41.5, "extrapolated_seconds": 41.5,
           "jvp_vjp_share": 0.9, "jvp_vjp_target": 0.85, "target_seconds": 60.0, "at_target_size": True,
           "products_per_example": 774.0, "solver": "krylov", "bound": {"median": 0.45},
           "machine": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}}
    (session / "gpu_targets_mnist_cuda_20261126T120000.json").write_text(json.dumps(run))
    (session / "ledger.tsv").write_text("mnist\tok\t50\tgpu_targets.py mnist\n")
    back = tmp_path / "back"
    back.mkdir()
    with tarfile.open(back / "gpu_session.tgz", "w:gz") as tar:
        tar.add(session, arcname=".")
    (back / "gpu_session.log").write_text("=== gpu_session: mnist\n")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "unpack_gpu_session.sh"), str(back / "gpu_session.tgz")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "RESULTS_DIR": str(tmp_path / "r")})
    assert proc.returncode == 0, proc.stderr
    (dest,) = (tmp_path / "r").glob("gpu_nvidia-h100-80gb-hbm3_*")
    assert dest.name.endswith("_20261126")        # the session's day, from its JSON's stamp, not the unpacking's
    assert sorted(p.name for p in dest.iterdir()) == ["gpu_session.log", "gpu_targets_mnist_cuda_20261126T120000.json",
                                                     "ledger.tsv"]
    assert "41.5 s (< 60 s: met)" in proc.stdout and "NVIDIA H100 80GB HBM3" in proc.stdout


def test_unpack_gpu_session_keeps_both_calls_of_a_lease_that_went_cold_between_them(tmp_path):
    """A cold second call starts a fresh folder: its tarball holds its own setup and stages only. Unpacked
    after the first into one folder, nothing of the first is lost: the ledgers' rows merged (a row both
    hold, once), a .out and a log that differ kept beside the first ones, identical files once."""
    import tarfile

    machine = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130"}
    calls = []
    for i, (rows, setup_out) in enumerate((("setup\tok\t3\tnvidia-smi\tcall1\nmnist\tok\t50\tmnist\tcall1\n", "one\n"),
                                          ("setup\tok\t3\tnvidia-smi\tcall1\nsetup\tok\t4\tnvidia-smi\tcall2\n", "two\n"))):
        session, back = tmp_path / f"session{i}", tmp_path / f"back{i}"
        session.mkdir(), back.mkdir()
        (session / "ledger.tsv").write_text(rows)
        (session / "setup.out").write_text(setup_out)
        (session / f"race_cuda_20261126T12{i}000.json").write_text(json.dumps({"machine": machine}))
        (session / "same.json").write_text(json.dumps({"machine": machine}))
        with tarfile.open(back / "gpu_session.tgz", "w:gz") as tar:
            tar.add(session, arcname=".")
        (back / "gpu_session.log").write_text(f"=== call {i + 1}\n")
        calls.append(back)
    for back in calls:   # relative paths, from another folder: the script changes to the repository first
        proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "unpack_gpu_session.sh"),
                               os.path.relpath(back / "gpu_session.tgz", tmp_path)], capture_output=True, text=True,
                              cwd=tmp_path, env={**os.environ, "RESULTS_DIR": str(tmp_path / "r")})
        assert proc.returncode == 0, proc.stderr
    (dest,) = (tmp_path / "r").glob("gpu_nvidia-h200_*")
    assert (dest / "ledger.tsv").read_text().splitlines() == ["setup\tok\t3\tnvidia-smi\tcall1",
                                                              "mnist\tok\t50\tmnist\tcall1",
                                                              "setup\tok\t4\tnvidia-smi\tcall2"]
    assert (dest / "setup.out").read_text() == "one\n" and (dest / "setup.2.out").read_text() == "two\n"
    assert (dest / "gpu_session.log").read_text() == "=== call 1\n"
    assert (dest / "gpu_session.2.log").read_text() == "=== call 2\n"
    assert not (dest / "same.2.json").exists()


def test_accuracy_tradeoff_script_bounds_where_the_accuracy_just_holds(tmp_path):
    out = tmp_path / "a.json"
    run_script("accuracy_tradeoff.py", "--targets", "0.95,0.8", "--examples", "40", "--draws", "4", "--restarts",
               "2", "--iterations", "2", "--json", str(out))
    r = json.loads(out.read_text())
    assert [row["target"] for row in r["rows"]] == [0.95, 0.8] and r["examples"] == 40
    for row in r["rows"]:   # met at the sigma found, missed just above it (the bracket: 1% apart)
        assert row["accuracy"] >= row["target"] > row["above_accuracy"]
        assert row["scale"] < row["above_scale"] <= row["scale"] * 1.01
        assert row["sigma"] == pytest.approx(row["scale"] * row["rms"], rel=1e-12)
    low, high = r["rows"]     # a lower target lets more noise through, and the bounds grow with it
    assert low["scale"] < high["scale"] and low["median_bound"] < high["median_bound"]


def test_accuracy_tradeoff_script_keeps_the_features_cosine_without_a_head(tmp_path):
    out = tmp_path / "c.json"
    run_script("accuracy_tradeoff.py", "--metric", "cosine", "--targets", "0.95,0.8", "--examples", "30", "--draws",
               "3", "--restarts", "2", "--iterations", "2", "--json", str(out))
    r = json.loads(out.read_text())
    assert r["metric"] == "cosine" and r["clean_accuracy"] == pytest.approx(1.0, abs=1e-12)
    for row in r["rows"]:
        assert row["accuracy"] >= row["target"] > row["above_accuracy"]
    assert r["rows"][0]["scale"] < r["rows"][1]["scale"]


def test_lean_zoo_compares_the_lean_graph_with_torchs_or_with_forward_mode_where_torchs_fails(tmp_path):
    """benchmarks/lean_zoo.py: RegNet's products through both graphs agree to float32 rounding; MobileNetV3's
    hardsigmoid fails torch's double backward, so its lean products are checked against forward mode."""
    out = tmp_path / "zoo.json"
    run_script("lean_zoo.py", "--models", "mobilenet_v3_small", "regnet_y_400mf", "--size", "64", "--repeats", "1",
               "--json", out)
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    regnet, mobilenet = rows["regnet_y_400mf"], rows["mobilenet_v3_small"]
    assert regnet["jv_rel_diff"] < 1e-4 and regnet["jtu_rel_diff"] < 1e-4 and regnet["jvp_speedup"] > 0
    assert "hardsigmoid_backward" in mobilenet["torch"]["error"] and mobilenet["oracle"].startswith("forward mode")
    assert mobilenet["jv_rel_diff"] < 1e-4 and mobilenet["jtu_rel_diff"] < 1e-4 and mobilenet["lean"]["jvp_ms"] > 0


def test_lean_end_to_end_runs_both_graphs_and_records_where_torchs_fails(tmp_path):
    """benchmarks/lean_end_to_end.py: EfficientNet-B0's trunk gives the same bounds through both graphs (the
    same J) with the JVPs counted apart; MobileNetV3's runs through the lean graph only, torch's refusal kept."""
    for name in ("efficientnet_b0", "mobilenet_v3_small"):
        out = tmp_path / f"{name}.json"
        run_script("lean_end_to_end.py", name, "--size", "32", "--restarts", "2", "--iterations", "1", "--json", out)
        runs = json.loads(out.read_text())["runs"]
        assert runs["lean"]["jvp_rows"] > 0 and runs["lean"]["jvp_s"] > 0 and runs["lean"]["median_bound"] > 0
        if name == "efficientnet_b0":
            assert runs["torch"]["jvp_rows"] == runs["lean"]["jvp_rows"]
            np.testing.assert_allclose(runs["lean"]["median_bound"], runs["torch"]["median_bound"], rtol=1e-4)
        else:
            assert "hardsigmoid_backward" in runs["torch"]["error"]


def test_small_transformer_runs_at_toy_size_and_its_solvers_agree(tmp_path):
    """The default (dense, its J in forward mode through the MATH backend's attention) and the Krylov basis on
    a 2-layer transformer: both run, and their medians agree (both solve the same steps exactly here)."""
    out = tmp_path / "small.json"
    run_script("small_transformer.py", "--examples", "1", "--solvers", "dense", "krylov", "--json", out)
    r = json.loads(out.read_text())
    assert set(r["jacobian_seconds"]) == {"forward", "reverse"}
    assert r["bound"]["dense"]["solver"] == "dense" and r["bound"]["krylov"]["solver"] == "krylov"
    assert r["bound"]["dense"]["median"] == pytest.approx(r["bound"]["krylov"]["median"], rel=1e-3)


def test_dense_check_cost_runs_at_toy_size():
    proc = run_script("dense_check_cost.py", "--examples", "2", "--repeats", "1")
    assert "the check alone" in proc.stdout and "without" in proc.stdout


@pytest.mark.parametrize("bits, oracle", [(7, torch.bfloat16), (10, torch.float16)])
def test_tf32_emulation_rounds_like_torchs_own_narrow_floats(bits, oracle):
    """The emulation's rounding to 7 / 10 mantissa bits (nearest, ties to even) is torch's own conversion to
    bfloat16 / float16 (inside float16's normal range, where both keep 10 bits), ties and carries into the
    exponent included; non-float32 tensors and infinities pass as they are."""
    emu = _benchmark_script("tf32_cost")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, generator=g) * torch.exp(torch.randn(20_000, generator=g) * 3)
    x = x[(x.abs() > 1e-4) & (x.abs() < 6e4)]
    ties = torch.tensor([1 + 2.0**-bits / 2, 1 + 3 * 2.0**-bits / 2, -(1 + 2.0**-bits / 2), 2 - 2.0**-bits / 4])
    x = torch.cat([x, ties])
    got = emu.round_mantissa(x, bits)
    assert torch.equal(got, x.to(oracle).float())
    assert not torch.equal(got, x)                       # it did round
    special = torch.tensor([float("inf"), -float("inf"), 0.0])
    assert torch.equal(emu.round_mantissa(special, bits), special)
    assert emu.round_mantissa(x.double(), bits).dtype == torch.float64   # float64 (the certification) untouched


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch.backends.*.fp32_precision, which the emulation sets, needs torch >= 2.8")
def test_tf32_emulation_follows_torchs_settings_and_leaves_hcrfasts_ieee_blocks_exact():
    """Entered, the emulation switches TF32 on as a GPU run would and rounds matmuls and convolutions; inside
    hcrfast's ``ieee_float32`` (the Krylov basis' Gram-Schmidt) it rounds nothing, as the hardware would not;
    on exit torch's settings are back as they were."""
    from hcrfast.bindings import ieee_float32

    emu = _benchmark_script("tf32_cost")
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    w, x = torch.randn(4, 3, 3, 3, generator=g), torch.randn(2, 3, 9, 9, generator=g)
    exact_mm, exact_conv = a @ b, torch.nn.functional.conv2d(x, w)
    rounded_mm = emu.round_mantissa(a, 7).double() @ emu.round_mantissa(b, 7).double()
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    with emu.ReducedProducts(7):
        got_mm, got_conv = a @ b, torch.nn.functional.conv2d(x, w)
        with ieee_float32(True):
            ieee_mm, ieee_conv = a @ b, torch.nn.functional.conv2d(x, w)
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    assert torch.allclose(got_mm.double(), rounded_mm, rtol=1e-5, atol=1e-4)   # the rounded operands' product
    assert (got_mm - exact_mm).abs().max() > 1e-3 and (got_conv - exact_conv).abs().max() > 1e-3
    assert torch.equal(ieee_mm, exact_mm) and torch.equal(ieee_conv, exact_conv)


@pytest.mark.parametrize("scope", ["products", "forwards"])
def test_tf32_emulation_scopes_round_the_products_or_the_forwards_alone(scope):
    """``--scope products`` rounds inside the model's J v (and Jᵀu, and the dense J) and leaves a forward pass
    exact; ``--scope forwards`` the reverse; the patched methods are restored on exit."""
    from hcrfast.bindings import TorchJacobian, from_torch, to_torch

    emu = _benchmark_script("tf32_cost")
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))
    x, v = torch.randn(3, 32, generator=g), torch.randn(3, 32, generator=g)
    with torch.no_grad():
        y = model(x)
    jv = to_torch(TorchJacobian(model, x).matvec(from_torch(v)))
    originals = (TorchJacobian.matvec, TorchJacobian.rmatvec, emu.dense.jacobian)
    with emu.scoped("emulated", 7, scope):
        with torch.no_grad():
            y_in = model(x)
        jv_in = to_torch(TorchJacobian(model, x).matvec(from_torch(v)))
    assert (TorchJacobian.matvec, TorchJacobian.rmatvec, emu.dense.jacobian) == originals
    forward_exact, product_exact = torch.equal(y_in, y), torch.equal(jv_in, jv)
    assert (forward_exact, product_exact) == ((True, False) if scope == "products" else (False, True))


def test_tf32_cost_script_runs_both_modes_over_seeds(tmp_path):
    """Both modes at toy size over two seeds: the emulated products differ from IEEE by rounding (not 0, not
    more than a few percent on the MLP), and every row is a finite, certified median. Without a GPU,
    ``--device cuda`` is refused by name."""
    out = tmp_path / "tf32_cost_mnist_cpu.json"
    run_script("tf32_cost.py", "mnist", "--examples", "2", "--restarts", "3", "--iterations", "2",
               "--seeds", "2", "--mode", "both", "--threads", "1", "--json", out)
    r = json.loads(out.read_text())
    assert [(row["seed"], row["mode"]) for row in r["rows"]] == [(0, "ieee"), (0, "tf32"), (1, "ieee"), (1, "tf32")]
    assert {row["kind"] for row in r["rows"]} == {"ieee", "emulated"}
    assert all(np.isfinite(row["median"]) and row["median"] > 0 for row in r["rows"])
    assert set(r["errors"]) == {"emulated"}
    assert all(0 < r["errors"]["emulated"][k] < 1e-2 for k in ("forward", "jvp", "vjp"))
    assert len(r["summary"]["tf32_over_ieee"]["per_seed"]) == 2 and r["complete"] is True
    text = run_script("gpu_summary.py", tmp_path).stdout          # the lease's summary reads it
    assert "tf32_cost.py:" in text and "emulated J v error" in text and "tf32 / ieee: median x" in text
    assert "unreadable" not in text and "incomplete" not in text
    # the file as a run killed after its first row leaves it (written after every row)
    partial = dict(r, rows=r["rows"][:1], summary={}, complete=False)
    assert "incomplete: the run stopped after 1 row(s)" in _benchmark_script("gpu_summary").tf32_lines(partial)
    if not torch.cuda.is_available():
        proc = run_script("tf32_cost.py", "mnist", "--device", "cuda", "--mode", "errors", check=False)
        assert proc.returncode == 2 and "--device cuda" in proc.stderr


def test_targets_gain_checks_every_targeted_bound_with_its_own_passes(tmp_path, monkeypatch):
    """The script's rows at toy size, and its independent check: targeted bounds the engine reported 1%
    too high (or Algorithm 1's lowered) stop the run."""
    out = tmp_path / "tg.json"
    args = ["mnist", "--examples", "2", "--restarts", "3", "--iterations", "2", "--targets", "low:1,low:2",
            "--json", out]
    run_script("targets_gain.py", *args)
    rows = json.loads(out.read_text())["rows"]
    assert [r["targets"] for r in rows] == [None, "low:1", "low:2"]
    assert [r.get("n_targets") for r in rows[1:]] == [1, 4]
    for r in rows[1:]:
        assert r["independent_check"] < 1e-9 and r["median"] >= rows[0]["median"]
        assert 0 < r["lifted_fraction"] <= 1 and r["targeted_timings"]["certify"] > 0

    script = _benchmark_script("targets_gain")
    import hcrfast
    real = hcrfast.bound

    def inflated(*a, **k):
        res = real(*a, **k)
        if k.get("targets"):
            res.std *= 1.01
        return res

    monkeypatch.setattr(hcrfast, "bound", inflated)
    with pytest.raises(SystemExit, match="differ"):
        script.main([str(a) for a in args[:-2]])


def test_rank_rule_script_compares_both_tolerances_and_restores_the_default(tmp_path):
    out = tmp_path / "rr.json"
    proc = run_script("rank_rule.py", "digits", "--examples", "3", "--restarts", "2", "--iterations", "2",
                      "--threads", "1", "--json", out)
    r = json.loads(out.read_text())
    assert set(r["rules"]) == {"max", "sqrt"} and len(r["ratio"]) == 3
    assert np.allclose(r["ratio"], np.asarray(r["rules"]["sqrt"]["per_example"]) / r["rules"]["max"]["per_example"])
    assert "examples changed" in proc.stdout
    from hcrfast import dense
    assert dense._checked(torch.zeros(1, 4, 9, dtype=torch.float32), None, "auto") == 3 * torch.finfo(torch.float32).eps


def test_float32_drift_script_warns_where_float32_scaling_breaks(tmp_path):
    out = tmp_path / "drift.json"
    run_script("float32_drift.py", "--scales", "1,1e-4", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    warned = {(r["dtype"], r["solver"], r["scale"]): r["warned"] for r in rows}
    assert warned[("float32", "dense", 1e-4)] and not warned[("float32", "dense", 1.0)]
    assert not any(w for (dtype, solver, _), w in warned.items() if dtype == "float64" or solver == "defaults")


def test_result_file_size_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "size.json"
    run_script("result_file_size.py", "--examples", "8", "--json", out)
    small, tiny = json.loads(out.read_text())["rows"]
    assert small["reasons"] == 0 and tiny["reasons"] == 200
    assert tiny["bounds_npz"] < tiny["as_np_savez"]


def test_entry_overhead_script_runs_at_toy_size(tmp_path):
    out = tmp_path / "overhead.json"
    run_script("entry_overhead.py", "--models", "mobilenet_v3_small", "--sizes", "32", "--batch", "2", "--json", out)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["rows"] == 2 and row["input"] == [2, 3, 32, 32]
    assert row["forward_seconds"] > 0 and row["end_check_seconds"] > 0 and 0 < row["buffer_megabytes"] < 1


def test_gpu_session_refuses_retest_without_retest_before_any_work(tmp_path):
    """`setup retest profile` with RETEST unset ran setup and the warm-up (47 s on the H100), then died at the
    retest stage's ${RETEST:?}: rc 1, profile never started, no summary packed. It is refused up front now, as
    an unknown stage is, leaving nothing behind."""
    dest = tmp_path / "session"
    env = {k: v for k, v in os.environ.items() if k != "RETEST"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), "setup", "retest", "profile"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**env, "GPU_SESSION_DEST": str(dest), "OUT": str(tmp_path)})
    assert proc.returncode == 2 and "retest needs RETEST" in proc.stderr
    assert not dest.exists() and proc.stdout == ""


def test_gpu_session_skips_the_warm_up_where_the_tests_would_get_nothing_after_it(tmp_path):
    """The warm-up (up to 75 s) ran whatever the call had left: with 70 s left it took 47 and the tests were
    skipped. With less than its cap plus what the tests need it is skipped, and the tests run."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\ncase "$1" in -c|benchmarks/gpu_summary.py) exec {sys.executable} "$@";; esac\n'
                    "sleep 100\n")
    fake.chmod(0o755)
    proc, ledger, wall = _session(tmp_path, "tests", PYTHON=fake, LEASE_S=30, RESERVE_S=2, MIN_RUN_S=5)
    assert proc.returncode == 0, proc.stderr
    assert [row[:2] for row in ledger] == [["warm-up", "skipped"], ["tests", "timeout"]]
    assert "warm-up: skipped (" in proc.stdout and wall < 45


def test_unpack_names_the_device_from_setup_out_where_a_call_wrote_no_json(tmp_path):
    """A call that ran setup alone (or setup and the warm-up) was filed as gpu_unknown-gpu_<date>, apart from the
    other call's folder, though setup.out holds nvidia-smi's name of the device."""
    import tarfile

    session, back = tmp_path / "session", tmp_path / "back"
    session.mkdir(), back.mkdir()
    (session / "setup.out").write_text("name, memory.total [MiB], driver_version, clocks.max.sm [MHz]\n"
                                       "NVIDIA H200, 143771 MiB, 580.95.05, 1980 MHz\n")
    (session / "ledger.tsv").write_text("setup\tok\t1\tnvidia-smi\tcall1\n")
    with tarfile.open(back / "gpu_session.tgz", "w:gz") as tar:
        tar.add(session, arcname=".")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "unpack_gpu_session.sh"), str(back / "gpu_session.tgz")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "RESULTS_DIR": str(tmp_path / "r")})
    assert proc.returncode == 0, proc.stderr
    assert [p.name.rsplit("_", 1)[0] for p in (tmp_path / "r").iterdir()] == ["gpu_nvidia-h200"]


def test_race_skips_its_lsqr_rows_when_asked(tmp_path):
    """The lease's race (120 s) ran its two LSQR rows (~45 s each on the H100) after the reference's ~51 s and was
    killed in the second; --no-lsqr-rows leaves them out, and the JSON says the race is complete without them."""
    race = _benchmark_script("race")
    race.main(["--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads", "1",
               "--no-sweep", "--no-lsqr-rows", "--out", str(tmp_path)])
    (path,) = [p for p in tmp_path.glob("race_mlp_cpu_*.json") if not p.name.endswith("_reference.json")]
    r = json.loads(path.read_text())
    assert r["complete"] is True and r["hcrfast_current"] is None and r["hcrfast_input"] is None
    assert r["args"]["no_lsqr_rows"] is True and r["hcrfast_default"] is not None


def test_every_test_that_skips_without_cuda_carries_the_gpu_mark():
    """The lease's tests stage runs `pytest -m gpu` on the files that hold the mark: a test skipped without CUDA
    but not marked ran on no machine (test_validation's buffers-to-host test, found 2026-12-02)."""
    import ast

    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_marked = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark"
                                                                 for t in node.targets)
                            and "gpu" in ast.unparse(node.value) for node in tree.body)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            marks = [ast.unparse(d) for d in node.decorator_list]
            needs_cuda = any("skipif" in m and ("cuda.is_available" in m or "cuda_available" in m) for m in marks)
            if needs_cuda and not module_marked and "pytest.mark.gpu" not in marks:
                unmarked.append(f"{path.name}::{node.name}")
    assert unmarked == []


def test_refused_benchmark_arguments_end_with_a_message_not_a_traceback(tmp_path, capsys):
    """race.py --reference-json of another problem and restart_directions.py --restarts 1 ended in tracebacks
    (ValueError, "zero-size array to reduction operation minimum"): each says what is wrong and exits 2."""
    race = _benchmark_script("race")
    args = race.parse_args(["--model", "mlp", "--examples", "2", "--threads", "1"])
    other = tmp_path / "ref.json"
    other.write_text(json.dumps(dict(args={**vars(args), "examples": 3}, sigma=0.2, machine={},
                                     reference=dict(method="reference", seconds=1.0, median=0.5))))
    assert race.main(["--model", "mlp", "--examples", "2", "--restarts", "1", "--iterations", "1", "--threads", "1",
                      "--no-sweep", "--reference-json", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"race: --reference-json {other} is another problem: (saved, now) = {{'examples': (3, 2),")
    assert "Traceback" not in err
    directions = _benchmark_script("restart_directions")
    with pytest.raises(SystemExit) as exc:
        directions.main(["digits", "--restarts", "1"])
    assert exc.value.code == 2 and "--restarts 1: the restarts' pairwise directions need at least 2" in \
        capsys.readouterr().err


def test_forward_pieces_measures_both_ways_in_fresh_processes(tmp_path):
    """benchmarks/forward_pieces.py (the memory figures of the CPU's budgets for activations) runs at toy size: one
    row without the budgets and one with them, each in its own process, the same bounds to rounding. The budgets
    are set small enough to bind (the LSQR chunk of 4 examples x 2 restarts held to one example: 2 channels of
    28 x 28 float32 per row from each convolution and ReLU, 6 of them, twice over, is ~75 KB a row)."""
    out = tmp_path / "pieces.json"
    proc = run_script("forward_pieces.py", "--examples", "4", "--channels", "2", "--restarts", "2", "--iterations",
                      "1", "--solver", "lsqr", "--lsqr-iter-lim", "3", "--graph-bytes", "200000", "--json", out)
    r = json.loads(out.read_text())
    whole, pieces = r["rows"]
    assert (whole["pieces"], pieces["pieces"]) == (False, True) and whole["piece_bytes"] == whole["graph_bytes"] == 2**62
    assert (pieces["piece_bytes"], pieces["graph_bytes"]) == (hcrfast.algorithm.FORWARD_PIECE_BYTES, 200000)
    assert (whole["chunk_size"], pieces["chunk_size"]) == (4, 1)
    assert whole["peak_mib_over_base"] > 0 and pieces["seconds"] > 0
    assert pieces["median_bound"] == pytest.approx(whole["median_bound"], rel=1e-3)   # (LSQR by chunk: rounding)
    assert "less memory" in proc.stdout


def test_head_pieces_measures_both_ways_in_fresh_processes(tmp_path):
    """benchmarks/head_pieces.py (the memory figures of dithered_accuracy's head in pieces) runs at toy size: one
    row with the head on every copy at once and one in pieces, each in its own process, the same accuracies."""
    out = tmp_path / "head.json"
    proc = run_script("head_pieces.py", "--examples", "300", "--width", "16", "--draws", "3", "--json", out)
    r = json.loads(out.read_text())
    whole, pieces = r["rows"]
    assert (whole["pieces"], pieces["pieces"]) == (False, True) and whole["piece_bytes"] == 2**62
    assert pieces["piece_bytes"] == hcrfast.algorithm.FORWARD_PIECE_BYTES
    assert (whole["clean"], whole["dithered"]) == (pieces["clean"], pieces["dithered"]) and whole["clean"] == 1.0
    assert r["examples"] == 300 and "less memory" in proc.stdout
    proc = run_script("head_pieces.py", "--model", "cnn", "--examples", "40", "--draws", "1", "--json", out)
    r = json.loads(out.read_text())
    whole, pieces = r["rows"]
    assert r["model"] == "cnn" and whole["clean"] == pieces["clean"] == 1.0   # (the cosine of the clean features)
    assert whole["dithered"] == pytest.approx(pieces["dithered"], rel=1e-6)   # (the model's features in pieces)



def test_conv_columns_measures_both_ways_in_fresh_processes(tmp_path):
    """benchmarks/conv_columns.py (float64 convolutions' column buffers counted or not) runs at toy size: for each
    call a row with the columns not counted and one counted, each in its own process, the same bounds bit for bit."""
    out = tmp_path / "columns.json"
    proc = run_script("conv_columns.py", "--examples", "4", "--examples-targeted", "1", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["call"], r["columns_counted"]) for r in rows] == [("targeted", False), ("targeted", True),
                                                                ("bound", False), ("bound", True)]
    for before, now in (rows[:2], rows[2:]):
        assert before["std_sha256"] == now["std_sha256"] and now["peak_mib_over_base"] > 0 and now["seconds"] > 0
    assert proc.stdout.count("same bounds: True") == 2


def test_screen_sample_times_the_three_screens_in_fresh_processes(tmp_path):
    """benchmarks/screen_sample.py (the screen on every example, sampled, none) runs at toy size: three rows, one
    a process, the same median bound; no screen certifies every earlier step."""
    out = tmp_path / "screen.json"
    proc = run_script("screen_sample.py", "--model", "digits", "--examples", "4", "--repeat", "1", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["every", "sampled", "none"]
    assert len({r["median_bound"] for r in rows}) == 1 and rows[2]["certified"] == rows[2]["steps"] > 0
    assert "the speed of screening every example" in proc.stdout
