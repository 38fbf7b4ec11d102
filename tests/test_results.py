"""Bounds.save / Bounds.load: every field survives the round trip, and foreign files are refused."""
import dataclasses
import json
import re

import numpy as np
import pytest
import torch

import hcrfast


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).double().eval()


class Frozen(torch.nn.Module):
    """Features that do not move although the Jacobian says they do: D = 0, infinite bounds."""

    def forward(self, x):
        flat = x.flatten(1)
        return flat - flat.detach() + 1.0


def assert_same(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x) or dataclasses.is_dataclass(y):
            assert dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y), f.name
            assert_same(x, y)
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray), f.name
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


@pytest.mark.parametrize("case", ["plain", "targets", "infinite", "krylov", "lsqr"])
def test_save_then_load_gives_back_every_field(case, tmp_path):
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((3, 1, 4, 4)))
    model, kw = mlp(), dict(iterations=2, restarts=3)
    if case == "targets":
        kw["targets"] = "low:2"
    if case == "infinite":
        model = Frozen().eval()
    if case in ("krylov", "lsqr"):
        kw["solver"] = case
    res = hcrfast.bound(model, x, 0.2, **kw).to_numpy()
    assert (res.targeted is not None) == (case == "targets")
    assert (len(res.infinite_reasons) > 0) == (case == "infinite")
    path = tmp_path / "bounds"  # no .npz suffix: the file is written under exactly this name
    res.save(path)
    assert path.is_file()
    back = hcrfast.Bounds.load(path)
    assert_same(back, res)
    assert back == res and not back != res      # == compares every field bitwise, wall times aside
    assert back.summary() == res.summary()
    back.seconds += 1.0
    assert back == res
    back.std.flat[-1] = -1.0                     # no bound is negative: a change in every case
    assert back != res
    with np.load(path) as z:  # readable without hcrfast
        np.testing.assert_array_equal(z["std"], res.std)


def test_equality_is_by_value_and_takes_nan_where_the_other_has_nan():
    """== on results: bitwise arrays (NaN equal to NaN at the same place), lists, params (tuples equal to
    the lists JSON gives back), not the wall times; never NumPy's 'truth value is ambiguous'."""
    a = bounds_with_std([[1.0, np.nan, np.inf], [0.5, 0.25, 0.0]])
    b = bounds_with_std([[1.0, np.nan, np.inf], [0.5, 0.25, 0.0]])
    a.params, b.params = {"sigma": 0.1, "shape": (3,), "timings": {"x": 1.0}}, {"sigma": 0.1, "shape": [3]}
    assert a == b and not (a != b) and a in [b] and [a].index(b) == 0
    b.std[0, 1] = 0.0
    assert a != b
    b.std[0, 1] = np.nan
    b.params["sigma"] = 0.2
    assert a != b and a != "bounds" and a != None  # noqa: E711
    b.params["sigma"] = 0.1
    b.std = b.std.astype(np.float32)
    assert a != b                                    # a dtype is part of the result
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)


def test_load_refuses_files_it_did_not_write(tmp_path):
    other = tmp_path / "other.npz"
    np.savez(other, std=np.zeros(3))
    with pytest.raises(ValueError, match="not a file written by Bounds.save"):
        hcrfast.Bounds.load(other)
    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a file written by Bounds.save"):
        hcrfast.Bounds.load(text)


def bounds_with_std(std):
    """A Bounds of 2 examples x 3 modes whose std is ``std``, the rest plain numbers: what summary() reads."""
    std = np.asarray(std, dtype=np.float64)
    return hcrfast.Bounds(std=std, mse=np.ones(2), eps=np.zeros((2, 3)), z=np.zeros((2, 4)),
                          divergence=np.ones((2, 1)), best_restart=np.zeros(2, int),
                          lsqr_iterations=np.ones((2, 1, 1), int), lsqr_istop=np.ones((2, 1, 1), int),
                          params=dict(basis="pixel", size=1.0, iterations=1, restarts=1))


@pytest.mark.parametrize("std,line", [
    ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], "  std bound quantiles 10/50/90%: 1.5 / 3.5 / 5.5"),
    ([[1.0, np.inf, 3.0], [np.inf, 5.0, np.inf]], "  std bound quantiles 10/50/90%: 1.4 / 3 / 4.6 (3 finite of 6)"),
    ([[np.inf] * 3] * 2, "  std bounds: all +inf"),
    ([[0.0, np.inf, 3.0], [0.0, 5.0, 1.0]],
     "  std bound quantiles 10/50/90%: 0 / 1 / 4.2 (5 finite of 6; 2 of 6 are 0, which bounds nothing)"),
])
def test_summary_quantiles_skip_infinite_bounds(std, line):
    """The quantiles are those of the finite bounds; +inf ones are counted, not averaged into nan. The line
    is the one TargetedBounds.summary() prints for its own bounds."""
    assert hcrfast.results.quantile_line(np.asarray(std)) == line
    text = bounds_with_std(std).summary()
    assert text.splitlines()[1] == line and "nan" not in text
    # the units next to them (a user read the quantiles without them: the README alone said so)
    assert text.splitlines()[2] == "  (bounds in the units of the batch given: normalized units for a batch of " \
                                   "normalized images)"


def test_summary_mse_medians_follow_the_quantiles_rule():
    """The summary's MSE medians are those of the finite bounds with the +inf ones counted apart, as its
    quantile line and summary.json's quantiles are (numpy's median of the finite values is the oracle): a
    median over +inf values said neither, and disagreed with the report of the same run."""
    res = bounds_with_std([[1.0, np.inf, 3.0], [np.inf, 5.0, np.inf]])
    res.mse = np.array([0.25, np.inf])
    line = res.summary().splitlines()[3]   # (after the quantiles and their units)
    assert line.startswith("  mse bound per example (eq. 6, one eps): median 0.25, min 0.25, max 0.25 "
                           "(of the 1 finite; 1 +inf); from the per-mode bounds (.mse_from_modes): ")
    assert "inf (" not in line.replace("+inf", "") and "nan" not in line
    res.mse = np.array([np.inf, np.inf])
    assert "(eq. 6, one eps): all +inf;" in res.summary()
    res.mse = np.array([0.0, 0.5])
    assert "median 0.25, min 0, max 0.5;" in res.summary() and "finite" not in res.summary().splitlines()[3]


def test_summary_divergence_leaves_out_the_restarts_that_bound_nothing():
    """A restart listed in params['zero_step_reasons'] (eps = 0, J = 0, a shift float64 cannot resolve) holds
    D = 0 without the features' D = 0 that makes bounds +inf: the median D is over the others, and says so."""
    res = bounds_with_std([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    res.divergence = np.array([[0.0, 0.0], [0.0, 4e-5]])   # example 1's D = 0: a real one, its bounds +inf
    res.params["restarts"] = 2
    assert "  divergence D: median 0  (certified" in res.summary()
    res.params["zero_step_reasons"] = ["example 0, restart 0: J = 0 at this example, ...",
                                      "example 0, restart 1: J = 0 at this example, ..."]
    line = next(x for x in res.summary().splitlines() if "divergence D" in x)
    assert line.startswith(f"  divergence D: median {np.median([0.0, 4e-5]):.4g} over the restarts that bound "
                           f"something (2 that bound nothing left out)")
    res.params["zero_step_reasons"] += ["example 1, restart 0: eps came out 0", "example 1, restart 1: eps came out 0"]
    assert "divergence D: none: every restart bounds nothing (4," in res.summary()


def test_summary_medians_of_counts_show_their_halves():
    """A median of an even number of counts is often k + 1/2, and ``:.0f`` printed it rounded half to even:
    LSQR iterations 3 and 4 read "median 4" where numpy's median (the oracle) is 3.5. Every median of counts
    the summary prints now shows its .5, and a large count keeps every digit."""
    res = bounds_with_std([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    for its, text in (([3, 4], "3.5"), ([4, 4], "4"), ([1234567, 1234568], "1234567.5"), ([2, 5], "3.5")):
        res.lsqr_iterations = np.array(its).reshape(2, 1, 1)
        assert np.median(its) == float(text)                                # numpy's median, every digit
        assert f"  LSQR iterations per solve: median {text}, max {max(its)};" in res.summary()
    res.params = dict(res.params, solver="dense",
                      dense=dict(jacobian_products=9.0, rank_median=float(np.median([4, 5])), rank_min=4))
    assert "× the largest) median 4.5, min 4; every step exact" in res.summary()
    res.params = dict(res.params, solver="krylov",
                      krylov=dict(pilots=1, steps_median=float(np.median([160, 161, 162, 163])), steps_max=163,
                                  products_per_example=330.0, rank_median=float(np.median([2, 3])), rank_min=2))
    line = next(x for x in res.summary().splitlines() if "Krylov basis" in x)
    assert "median 161.5 steps, max 163, 330 products per example" in line and line.endswith("; rank median 2.5")


def test_repr_is_the_summary_head_not_the_arrays():
    """A result printed in a notebook shows what was bounded and the quantiles (numpy's, here the oracle),
    not numpy's dump of eps and z; a Bounds whose fields make no summary still has a repr."""
    std = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    res = bounds_with_std(std)
    res.eps = np.arange(3e4).reshape(2, -1)  # numpy would print a summarized dump of it
    text = repr(res)
    q = np.quantile(std, [0.1, 0.5, 0.9])
    assert text.startswith("<Bounds: HCR bounds for 2 examples") and "restarts=1" in text
    assert f"{q[0]:.4g} / {q[1]:.4g} / {q[2]:.4g}" in text and "\n" not in text and len(text) < 300
    assert "array" not in text and "29999" not in text
    assert repr(hcrfast.Bounds(*[None] * 8)).startswith("<Bounds (no summary: ")


def test_summary_counts_read_as_english():
    from hcrfast.results import counted

    assert [counted(1, "example"), counted(2, "example"), counted(0, "dct mode")] == ["1 example", "2 examples",
                                                                                     "0 dct modes"]
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3), torch.nn.Tanh()).double()
    res = hcrfast.bound(net, torch.ones(1, 1, 2, 2, dtype=torch.float64), 0.1, restarts=1, iterations=1)
    assert res.summary().startswith("HCR bounds for 1 example x 4 dct modes (")


class Quantized(torch.nn.Module):
    """A straight-through quantizer: the Jacobian is the linear layer's, the features move in steps of
    1/4, so small perturbations leave them exactly unchanged (D = 0, +inf bounds)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 20).double()

    def forward(self, x):
        h = self.lin(x.flatten(1))
        return h + (torch.round(h * 4) / 4 - h).detach()


def test_summary_names_what_gave_each_infinite_and_zero_bound():
    """+inf bounds: the restarts and the targeted steps counted apart (it said '14 restarts' for 6 restarts
    and 8 targeted pairs). Zeros: a restart zeroed by float64's rounding is named as such (it said 'no
    restart moved them'), and so is a Monte Carlo law's confidence (it was cut off)."""
    import warnings

    x = torch.as_tensor(np.random.default_rng(0).standard_normal((2, 1, 4, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = hcrfast.bound(Quantized().eval(), x, 0.1, restarts=3, iterations=2, targets="low:2", singular_steps=0)
    n_restarts = int((res.divergence == 0).sum())
    n_targeted = int(res.targeted.infinite.sum())
    assert n_restarts and n_targeted and len(res.infinite_reasons) == n_restarts + n_targeted
    assert all("the step aimed at this mode leaves" in r for r in res.targeted.infinite_reasons)  # no null probe
    assert (f"{int(np.isinf(res.std).sum())} coordinates have bound +inf (D = 0): {n_restarts} restarts and "
            f"{n_targeted} targeted (example, mode) steps left the features unchanged in float64") in res.summary()

    net = mlp()
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(net(x), 1e-13)  # every step's shift below float64's resolution, or too coarse
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny = hcrfast.bound(net, x, sigma, restarts=3, iterations=2, singular_steps=0)
    text = tiny.summary()
    assert np.all(tiny.std == 0) and "no restart moved them" not in text
    assert "(32 of 32 are 0, which bounds nothing)" in text
    assert "6 restarts bound nothing (0): " in text and "sigma * size is too small next to the features" in text
    assert "32 coordinates have bound 0 because every restart of their 2 examples bound nothing" in text

    import scipy.stats

    law = hcrfast.MonteCarlo(scipy.stats.norm(scale=0.5).logpdf, lambda rng, shape: 0.5 * rng.standard_normal(shape),
                             name="norm", n_samples=2000, confidence=0.95)
    mc = hcrfast.bound(net, x, law, restarts=2, iterations=2)
    assert "noise=MonteCarlo(norm), bounds at 0.95 confidence, size=" in mc.summary()  # as asked
    # each step's D at 1 - 0.05 / (2 restarts x 2 iterates), so that their max holds at it
    assert "0.9875-confidence" in mc.params["noise"]


@pytest.mark.parametrize("kw, hint", [({}, True), (dict(targets="low:1"), False), (dict(solver="lsqr"), False),
                                      (dict(sigma=hcrfast.Laplace(0.1)), False), (dict(basis="pixel"), False),
                                      (dict(sigma=torch.full((20,), 0.1)), True),
                                      (dict(singular_steps="auto"), False)])
def test_summary_points_to_targets_only_where_the_solve_gives_them_cheaply(kw, hint):
    """With singular_steps=0, the hint names targets= and the default singular steps where they are free of
    model products (the dense solve's or the Krylov basis' factorization) and possible (Gaussian noise);
    not once they ran (the default runs the singular steps), nor under LSQR or Laplace noise. Where it
    shows, either raises some bounds and lowers none (the promise it makes)."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).eval()
    x = torch.randn(2, 1, 4, 4)
    kw = dict(singular_steps=0) | kw
    sigma = kw.pop("sigma", 0.1)
    res = hcrfast.bound(model, x, sigma, restarts=2, iterations=2, **kw)
    assert ("no extra steps: targets='low:4' (hcrfast bound --targets low:4" in res.summary()) == hint
    if hint:  # (4x4 inputs: K of low:K at most 4)
        for extra in (dict(targets="low:4"), dict(singular_steps="auto")):
            more = hcrfast.bound(model, x, sigma, restarts=2, iterations=2, **(kw | extra))
            assert np.all(more.std >= res.std) and np.any(more.std > res.std)
            assert "no extra steps" not in more.summary()


def test_the_no_extra_steps_hint_states_what_auto_would_take_and_cost():
    """The hint under singular_steps=0 said "64 steps" at "one forward pass a step": auto takes at most
    min(features, inputs) directions (16 here), each certified with both signs (two forward passes)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).double().eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    text = hcrfast.bound(model, x, 0.1, restarts=1, iterations=1, singular_steps=0).summary()
    assert "singular_steps='auto' (16 of J's smallest singular directions" in text
    assert "two forward passes a direction" in text and "(64" not in text


def test_result_file_errors_name_the_users_path_and_what_is_wrong(tmp_path):
    """Bounds.save onto a folder raised IsADirectoryError naming the internal '.NAME.PID.tmp'; loading a text
    file advised allow_pickle; an npz whose meta lacked fields raised KeyError: 'targeted', and one whose
    meta was a JSON list AttributeError: 'list' object has no attribute 'get'."""
    res = hcrfast.bound(mlp(), torch.randn(2, 1, 4, 4, dtype=torch.float64), 0.1, restarts=2, iterations=2,
                        targets=[0, 1])
    folder = tmp_path / "results"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=f"cannot write {re.escape(str(folder))}: it is a folder") as exc:
        res.save(folder)
    assert ".tmp" not in str(exc.value) and sorted(p.name for p in tmp_path.iterdir()) == ["results"]

    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(ValueError, match=r"is not a file written by Bounds\.save: it is not an hcrfast results "
                                         r"file") as exc:
        hcrfast.Bounds.load(text)
    assert "pickle" not in str(exc.value)
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"it holds one NumPy array \(\.npy\), not an hcrfast results file"):
        hcrfast.Bounds.load(tmp_path / "one.npy")

    res.save(tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
    for meta, said in (({"format": "hcrfast.Bounds/1"}, r"is a malformed hcrfast\.Bounds/1 file \(its meta header "
                                                         r"lacks 'infinite_reasons', 'params', 'seconds', 'targeted'\)"),
                       (["hcrfast.Bounds/1"], r"is not a file written by Bounds\.save: its meta header is a JSON "
                                              r"list, not the object of an hcrfast results file")):
        bad = tmp_path / "bad.npz"
        np.savez(bad, meta=np.array(json.dumps(meta)), **arrays)
        with pytest.raises(ValueError, match=re.escape(str(bad)) + " " + said):
            hcrfast.Bounds.load(bad)
    # the arrays too, and the targeted bounds' own fields
    full = json.loads(str(np.load(tmp_path / "good.npz")["meta"]))
    np.savez(bad, meta=np.array(json.dumps(full)), **{k: v for k, v in arrays.items() if k != "mse"})
    with pytest.raises(ValueError, match=r"malformed hcrfast\.Bounds/1 file \(its arrays lack 'mse'\)"):
        hcrfast.Bounds.load(bad)
    np.savez(bad, meta=np.array(json.dumps(full)), **{k: v for k, v in arrays.items() if k != "targeted.std"})
    with pytest.raises(ValueError, match=r"malformed hcrfast\.Bounds/1 file \(its targeted arrays lack 'std'\)"):
        hcrfast.Bounds.load(bad)
    res.targeted.save(tmp_path / "targeted.npz")
    with np.load(tmp_path / "targeted.npz") as z:
        t_arrays = {k: z[k] for k in z.files if k != "meta"}
    np.savez(bad, meta=np.array(json.dumps({"format": "hcrfast.TargetedBounds/1", "method": "dense", "size": 1})),
             **t_arrays)
    with pytest.raises(ValueError, match=r"malformed hcrfast\.TargetedBounds/1 file \(its meta header holds entries "
                                         r"that are not fields of TargetedBounds: 'size'\)"):
        hcrfast.TargetedBounds.load(bad)
    assert hcrfast.Bounds.load(tmp_path / "good.npz") == res    # what save wrote still reads back
    assert hcrfast.TargetedBounds.load(tmp_path / "targeted.npz") == res.targeted


def test_results_under_the_home_folder_are_written_and_read_there(tmp_path, monkeypatch):
    """Bounds.save('~/b.npz') wrote into a folder named '~' in the current directory (and load looked there)."""
    from test_checkpoint import at_home

    home, work = at_home(tmp_path, monkeypatch)
    res = hcrfast.bound(mlp(), torch.randn(2, 1, 4, 4, dtype=torch.float64), 0.1, restarts=2, iterations=2)
    res.save("~/b.npz")
    assert (home / "b.npz").is_file() and list(work.iterdir()) == []
    assert hcrfast.Bounds.load("~/b.npz") == res
    sweep = hcrfast.sweep_sigma(mlp(), torch.randn(2, 1, 4, 4, dtype=torch.float64), [1.0],
                                sigma0=np.linspace(0.1, 1, 20), restarts=2, iterations=2)
    sweep.save("~/sweep")
    assert (home / "sweep" / "sweep.json").is_file() and (home / "sweep" / "sigma0.npy").is_file()
    assert list(work.iterdir()) == []
    np.testing.assert_array_equal(hcrfast.SigmaSweep.load("~/sweep").sigma0, sweep.sigma0)


def test_a_failed_result_write_names_the_users_path_and_what_is_wrong(tmp_path, monkeypatch):
    """A full disk while Bounds.save wrote gave only "[Errno 28] No space left on device"; a path under a file
    said "the folder ... does not exist; create it first"."""
    import errno
    import os

    res = hcrfast.bound(mlp(), torch.randn(2, 1, 4, 4, dtype=torch.float64), 0.1, restarts=2, iterations=2)
    (tmp_path / "afile").write_text("")
    with pytest.raises(NotADirectoryError) as exc:
        res.save(tmp_path / "afile" / "b.npz")
    assert str(exc.value) == (f"cannot write {tmp_path / 'afile' / 'b.npz'}: {tmp_path / 'afile'} is a file, not a "
                              f"folder; pass a path inside a folder")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as exc:
        res.save(tmp_path / "b.npz")
    assert exc.value.errno == errno.ENOSPC
    assert str(exc.value) == f"[Errno 28] cannot write {tmp_path / 'b.npz'} ({os.strerror(errno.ENOSPC)})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_the_reasons_of_restarts_that_bound_nothing_are_stored_compactly(tmp_path):
    """A sigma too small gives every restart its zero-step reason, one sentence each, which np.savez stored 4
    bytes a character, padded: 1,000 examples at R = 25 made a 23 MB bounds.npz of 2.2 MB of numbers, the
    chunk files as much again. The text members are deflated now (numbers stored as they are); numpy.load and
    Bounds.load read them back unchanged."""
    import warnings
    import zipfile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).eval()
    x = torch.rand(40, 1, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = hcrfast.bound(model, x, 1e-14, restarts=25, iterations=1, checkpoint=tmp_path / "ck")
    assert len(res.params["zero_step_reasons"]) == 1000
    res.save(tmp_path / "b.npz")
    with zipfile.ZipFile(tmp_path / "b.npz") as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
        numbers = sum(i.file_size for i in z.infolist() if i.filename != "meta.npy")
    assert kinds.pop("meta.npy") == zipfile.ZIP_DEFLATED and set(kinds.values()) == {zipfile.ZIP_STORED}
    with np.load(tmp_path / "b.npz") as z:   # as np.savez would have written it
        np.savez(tmp_path / "plain.npz", **{k: z[k] for k in z.files})
    assert (tmp_path / "b.npz").stat().st_size < numbers + 0.1 * ((tmp_path / "plain.npz").stat().st_size - numbers)
    assert hcrfast.Bounds.load(tmp_path / "b.npz") == res
    chunk = next((tmp_path / "ck").glob("chunk_*.npz"))
    with zipfile.ZipFile(chunk) as z:
        assert z.getinfo("zero_reasons.npy").compress_type == zipfile.ZIP_DEFLATED
    again = hcrfast.bound(model, x, 1e-14, restarts=25, iterations=1, checkpoint=tmp_path / "ck")
    assert again.params["checkpoint"]["examples_read_back"] == 40 and again == res


def test_a_damaged_deflated_member_is_refused_as_damaged_and_a_chunk_computed_again(tmp_path):
    """The deflated text members raised zlib.error where damaged (a stored member gave BadZipFile, which the
    readers take): Bounds.load now says the archive is damaged, and a damaged chunk is set aside and computed
    again."""
    import struct
    import warnings
    import zipfile

    def damage(path, member):
        info = zipfile.ZipFile(path).getinfo(member)
        data = bytearray(path.read_bytes())
        n, e = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
        start = info.header_offset + 30 + n + e
        for k in range(start + 2, start + min(40, info.compress_size - 1)):
            data[k] ^= 0xFF
        path.write_bytes(bytes(data))

    model, x = mlp(), torch.randn(4, 1, 4, 4, dtype=torch.float64)
    res = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, chunk_size=2, checkpoint=tmp_path / "ck")
    res.save(tmp_path / "b.npz")
    damage(tmp_path / "b.npz", "meta.npy")
    with pytest.raises(ValueError, match="damaged or foreign .npz archive"):
        hcrfast.Bounds.load(tmp_path / "b.npz")
    chunk = sorted((tmp_path / "ck").glob("chunk_*.npz"))[0]
    damage(chunk, "key_sha256.npy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, chunk_size=2, checkpoint=tmp_path / "ck")
    assert any("unreadable" in str(w.message) for w in caught)
    assert again.params["checkpoint"]["examples_read_back"] == 2 and again == res


def _rewrite_meta(src, dst, change):
    """The result file ``src`` written again to ``dst`` with its meta header changed by ``change(meta)``."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")))
    change(meta)
    np.savez(dst, meta=np.array(json.dumps(meta)), **arrays)
    return dst


def _three_results(tmp_path):
    """A Bounds (with targeted bounds), a TargetedBounds and an AttackResult, each saved: their paths by class."""
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((2, 1, 4, 4)))
    res = hcrfast.bound(mlp(), x, 0.2, restarts=2, iterations=2, targets="low:2", singular_steps=0)
    attack = hcrfast.gauss_newton_attack(mlp(), x, 0.2, draws=2, steps=2)
    made = {hcrfast.Bounds: res, hcrfast.TargetedBounds: res.targeted, hcrfast.AttackResult: attack}
    for cls, result in made.items():
        result.save(tmp_path / f"{cls.__name__}.npz")
    return made


def test_a_result_file_of_a_newer_format_says_to_upgrade_hcrfast(tmp_path):
    """A file of "hcrfast.Bounds/2" was called 'not a file written by Bounds.save ... read it with numpy.load'."""
    _three_results(tmp_path)
    for cls in (hcrfast.Bounds, hcrfast.TargetedBounds, hcrfast.AttackResult):
        name = cls.__name__
        newer = _rewrite_meta(tmp_path / f"{name}.npz", tmp_path / f"{name}_2.npz",
                              lambda meta: meta.update(format=f"hcrfast.{name}/2"))
        with pytest.raises(ValueError, match=re.escape(f"{newer} was written by {name}.save of a newer hcrfast "
                                                       f"(format 'hcrfast.{name}/2'); this version reads "
                                                       f"'hcrfast.{name}/1': upgrade hcrfast")
                           + ".*numpy.load reads its arrays meanwhile"):
            cls.load(newer)
        with np.load(newer) as z:   # which numpy.load does
            assert "std" in z.files
    # a newer file of another kind: its own reader, of a newer hcrfast
    with pytest.raises(ValueError, match=r"its format is 'hcrfast\.TargetedBounds/2', not 'hcrfast\.Bounds/1'\); read "
                                         r"it with hcrfast\.TargetedBounds\.load of a newer hcrfast"):
        hcrfast.Bounds.load(tmp_path / "TargetedBounds_2.npz")
    # an older or foreign one is still not ours
    foreign = _rewrite_meta(tmp_path / "Bounds.npz", tmp_path / "foreign.npz", lambda meta: meta.update(format="x/2"))
    with pytest.raises(ValueError, match=r"not a file written by Bounds\.save .*read it with numpy\.load$"):
        hcrfast.Bounds.load(foreign)


@pytest.fixture(scope="module")
def saved_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    return folder, _three_results(folder)


@pytest.mark.parametrize("cls, entry, value, kind", [
    (hcrfast.Bounds, "params", "oops", "a JSON object"),
    (hcrfast.Bounds, "seconds", "1.5", "a number"),
    (hcrfast.Bounds, "infinite_reasons", "example 0", "a list of strings"),
    (hcrfast.Bounds, "infinite_reasons", [1, 2], "a list of strings"),
    (hcrfast.Bounds, "targeted.params", [], "a JSON object"),
    (hcrfast.TargetedBounds, "params", "oops", "a JSON object"),
    (hcrfast.TargetedBounds, "timings", 3.0, "a JSON object"),
    (hcrfast.TargetedBounds, "method", 1, "a string"),
    (hcrfast.AttackResult, "params", None, "a JSON object"),
    (hcrfast.AttackResult, "seconds", None, "a number"),
])
def test_a_meta_entry_of_another_type_is_refused_at_load(cls, entry, value, kind, tmp_path, saved_results):
    """A file whose meta params was the string "oops" loaded, and its summary() raised AttributeError ('str'
    object has no attribute 'get'; its repr "(no summary: AttributeError ...)"): refused at load, as a file
    lacking params is, naming the entry and the path."""
    folder, made = saved_results
    name = cls.__name__
    outer, _, inner = entry.rpartition(".")
    bad = _rewrite_meta(folder / f"{name}.npz", tmp_path / "bad.npz",
                        lambda meta: (meta[outer] if outer else meta).update({inner: value}))
    where = f"{outer} " if outer else ""
    with pytest.raises(ValueError, match=re.escape(f"{bad} is a malformed hcrfast.{name}/1 file (its {where}meta entry "
                                                   f"{inner!r} is {value!r}, not {kind})")):
        cls.load(bad)
    assert cls.load(folder / f"{name}.npz") == made[cls]   # what save wrote still loads


def test_a_result_records_the_revision_that_computed_it_and_an_older_ones_summary_says_so(tmp_path):
    """Result files recorded nothing of the algorithm that computed them ("hcrfast.Bounds/1" did not change while
    the numbers did): an old file loaded and its summary described today's method as the one that computed it."""
    made = _three_results(tmp_path)
    revisions = {hcrfast.Bounds: hcrfast.checkpoint.FORMAT,
                 hcrfast.TargetedBounds: hcrfast.targeted.CHECKPOINT_FORMAT,
                 hcrfast.AttackResult: hcrfast.attack.CHECKPOINT_FORMAT}
    for cls, result in made.items():
        name, path = cls.__name__, tmp_path / f"{cls.__name__}.npz"
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
        assert meta["params"]["revision"] == revisions[cls]          # recorded, in params: old readers ignore it
        assert meta["format"] == f"hcrfast.{name}/1"
        back = cls.load(path)
        assert back == result and "NOTE" not in repr(back) and "revision" not in back.params
        assert back.summary() == result.summary()
        # a file from before 2026-12-01 (no revision), and one of another revision: they load, and say so first
        for recorded, said in ((None, "NOTE: computed by an hcrfast from before 2026-12-01 (it recorded no revision)"),
                               ("hcrfast.x checkpoint/1", "NOTE: computed by another revision of hcrfast "
                                                          "(hcrfast.x checkpoint/1)")):
            other = _rewrite_meta(path, tmp_path / "other.npz", lambda meta: (
                meta["params"].pop("revision") if recorded is None else meta["params"].update(revision=recorded)))
            old = cls.load(other)
            assert old.params["revision"] == recorded
            np.testing.assert_array_equal(old.std, result.to_numpy().std)
            assert repr(old).startswith(f"<{name}: {said}: the method described below is this version's, maybe not "
                                        f"the one that computed it; ")
            assert repr(old).split("; ")[1:3] == repr(result)[len(name) + 3:].split("; ")[:2]   # and the usual head
            assert old.summary().split("\n", 1) == [repr(old)[len(name) + 3:].split("; ")[0], result.summary()]
            old.save(tmp_path / "again.npz")      # saved again, it keeps the revision that computed it
            assert cls.load(tmp_path / "again.npz").params["revision"] == recorded


def test_the_targeted_bounds_of_an_older_bounds_file_say_its_revision_too(tmp_path):
    """Bounds.load kept an older file's revision on the Bounds, but its targeted bounds (computed in the same call)
    had none: their summary had no note, and saved alone they recorded today's revision."""
    _three_results(tmp_path)
    old = _rewrite_meta(tmp_path / "Bounds.npz", tmp_path / "old.npz",
                        lambda meta: meta["params"].update(revision="hcrfast.bound checkpoint/5"))
    loaded = hcrfast.Bounds.load(old)
    assert loaded.targeted.params["revision"] == "hcrfast.bound checkpoint/5"
    assert loaded.targeted.summary().startswith("NOTE: computed by another revision of hcrfast "
                                                "(hcrfast.bound checkpoint/5)")
    loaded.targeted.save(tmp_path / "alone.npz")
    assert hcrfast.TargetedBounds.load(tmp_path / "alone.npz").params["revision"] == "hcrfast.bound checkpoint/5"
    current = hcrfast.Bounds.load(tmp_path / "Bounds.npz")   # this revision's: no note on either
    assert "revision" not in current.targeted.params and not current.targeted.summary().startswith("NOTE")


def test_nan_is_said_as_nan_never_as_inf_and_a_folder_is_named(tmp_path):
    """A Bounds holding a NaN (made or edited by hand: no bound hcrfast computes) was summarized as '47 finite of 48'
    and its MSE as '(of the 2 finite; 1 +inf)'; Bounds.load of a folder (OUT/sweep) raised a bare IsADirectoryError."""
    from hcrfast.results import finite_stats, quantile_line

    assert finite_stats([1.0, 2.0, np.inf, np.nan]) == "median 1.5, min 1, max 2 (of the 2 finite; 1 +inf, 1 NaN)"
    assert finite_stats([1.0, np.nan]) == "median 1, min 1, max 1 (of the 1 finite; 1 NaN)"
    assert finite_stats([np.nan, np.inf]) == "none finite (1 +inf, 1 NaN)" and finite_stats([np.inf]) == "all +inf"
    assert quantile_line(np.array([1.0, 2.0, np.inf, np.nan])).endswith("(2 finite of 4; 1 NaN, which is no bound)")
    assert quantile_line(np.array([np.nan, np.inf])) == "  std bounds: none finite (1 NaN, 1 +inf)"
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text("{}")
    with pytest.raises(ValueError, match=r"sweep is a folder, not a results file; it holds a sigma sweep \(sweep\.json\)"
                                         r": read it with hcrfast\.SigmaSweep\.load"):
        hcrfast.Bounds.load(tmp_path / "sweep")
    with pytest.raises(ValueError, match=r"is a folder, not a results file; pass the \.npz file TargetedBounds\.save"):
        hcrfast.TargetedBounds.load(tmp_path)


def test_the_fields_hold_the_steps_their_docstrings_say():
    # Bounds' docstring: std takes the singular and targeted steps too, mse Algorithm 1's steps alone; with
    # several Krylov pilots each pilot's basis is at lsqr_iterations[b, r, 0], r < pilots
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((3, 1, 4, 4)))
    kw = dict(iterations=3, restarts=4, solver="dense")
    alone = hcrfast.bound(mlp(), x, 0.2, singular_steps=0, **kw)
    singular = hcrfast.bound(mlp(), x, 0.2, **kw)
    targeted = hcrfast.bound(mlp(), x, 0.2, targets="all", **kw)
    assert alone.params["singular_steps"] is None and singular.params["singular_steps"]["count"] > 0
    np.testing.assert_array_equal(singular.mse, alone.mse)
    np.testing.assert_array_equal(targeted.mse, alone.mse)
    assert np.all(singular.std >= alone.std) and np.any(singular.std > alone.std)
    np.testing.assert_array_equal(targeted.std_algorithm1, singular.std)
    assert np.all(targeted.std >= singular.std)
    assert np.all(singular.mse_from_modes >= singular.mse)
    krylov = hcrfast.bound(mlp(), x, 0.2, iterations=2, restarts=4, solver="krylov", krylov_pilots=2)
    assert krylov.params["krylov"]["pilots"] == 2
    assert np.all(krylov.lsqr_iterations[:, :2, 0] > 0) and np.all(krylov.lsqr_istop[:, :2, 0] >= 0)
    assert np.all(krylov.lsqr_iterations[:, 2:, 0] == 0) and np.all(krylov.lsqr_istop[:, 2:, 0] == -2)
    assert np.all(krylov.lsqr_istop[:, :, 1:] == -2)


def test_the_run_record_survives_save_and_load_and_an_older_file_without_it_loads(tmp_path):
    """params["run"] (example ids, chunk size, torch threads, versions) is written to the file and read back
    as it was; == leaves it out (recorded, not compared), so a file written before it was recorded loads and
    equals the result it holds."""
    made = _three_results(tmp_path)
    for cls, result in made.items():
        path = tmp_path / f"{cls.__name__}.npz"
        if cls is hcrfast.TargetedBounds:
            continue   # (targeted_bound's params do not record it)
        run = result.params["run"]
        assert run["example_ids"]["ids"] == [0, 1] and run["torch_threads"] == torch.get_num_threads()
        assert run["versions"]["torch"] == torch.__version__ and run["chunk_size"] == 2
        with np.load(path) as z:   # in the file's own meta, for a reader without hcrfast
            assert json.loads(str(z["meta"]))["params"]["run"] == run
        back = cls.load(path)
        assert back.params["run"] == run and back == result and back.summary() == result.summary()
        older = cls.load(_rewrite_meta(path, tmp_path / "older.npz", lambda meta: meta["params"].pop("run")))
        assert "run" not in older.params and older == result and older.summary() == result.summary()
        other = cls.load(_rewrite_meta(path, tmp_path / "other.npz", lambda meta: meta["params"]["run"].update(
            torch_threads=64, versions={"torch": "0.0"})))
        assert other == result   # other threads or versions, the same bits: equal


def _relu_mlp(inputs=64, hidden=64, features=32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(inputs, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, features))


def test_the_summary_says_where_j_has_a_null_space_these_bounds_do_not_probe():
    """A ReLU MLP of 64 inputs and 32 features has J of rank <= 32: steps along its null space leave the
    features unchanged to first order, and targeted_bound's null-space probes certify bounds millions of
    times those of bound, whose steps all lie in J's row space. Its summary said only 'numerical rank of J
    median 26.5', nothing of what the bounds left out."""
    model, x = _relu_mlp(), torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), 1.0)
    res = hcrfast.bound(model, x, sigma, restarts=2, iterations=2)
    rank = res.params["dense"]["rank_median"]
    line = [t for t in res.summary().splitlines() if "null space" in t]
    assert len(line) == 1 and line[0].startswith(f"  J's local null space: {64 - rank:g} of its 64 input directions "
                                                 f"at the median example (up to {64 - res.params['dense']['rank_min']})")
    assert "hcrfast.targeted_bound(..., null_probes=True) certifies steps there" in line[0]
    # what the line says: the null-space probes bound the modes far above these bounds (certified either way)
    probed = hcrfast.targeted_bound(model, x, sigma, targets="all")
    assert np.median(probed.std) > 1e3 * np.median(res.std)
    # matrix-free solvers have no rank: fewer features than inputs is a null space all the same
    lsqr = hcrfast.bound(model, x, sigma, restarts=2, iterations=2, solver="lsqr")
    assert "  J's local null space: at least 32 of its 64 input directions (32 features). Every step" in lsqr.summary()
    # linearized at theta + eps(j-1), the steps are not in J(theta)'s row space (a review measured 52% of a step's
    # norm in J(theta)'s null space): the line, whose text says they are, is left out
    current = hcrfast.bound(model, x, sigma, restarts=2, iterations=2, solver="lsqr", linearize_at="current")
    assert "null space" not in current.summary()


def test_the_summary_has_no_null_space_line_where_j_has_full_column_rank():
    model, x = _relu_mlp(inputs=16, hidden=64, features=48), torch.rand(2, 1, 4, 4)
    res = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2)
    assert res.params["dense"]["rank_min"] == 16
    assert "null space" not in res.summary()
