"""hcrfast.bound(..., checkpoint=DIR): a call killed after some chunks and made again ends with the
bounds of an uninterrupted call, computing only the examples that were missing."""
import json
import os
import pathlib
import re
import warnings

import numpy as np
import pytest
import torch

import hcrfast
from hcrfast import algorithm
from hcrfast.checkpoint import CheckpointMismatchError, gaps

FAST = hcrfast.LSQROptions(atol=1e-8, btol=1e-8, iter_lim=200)
REAL_CERTIFY = algorithm._certified_shift
ARRAYS = ("std", "mse", "eps", "z", "divergence", "best_restart", "lsqr_iterations", "lsqr_istop")


def relu_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.ReLU(),
                               torch.nn.Linear(24, 12)).double().eval()


class Frozen(torch.nn.Module):
    """Rows whose first pixel is negative give features that do not move although the Jacobian says
    they do (D = 0, infinite bounds); the other rows are the identity."""

    def forward(self, x):
        flat = x.flatten(1)
        frozen = flat[:, :1].detach() < 0
        return torch.where(frozen, flat - flat.detach() + 1.0, flat)


def batch(B=7, seed=1):
    return torch.as_tensor(np.random.default_rng(seed).standard_normal((B, 1, 4, 4)))


class Crash(Exception):
    pass


def crash_after(monkeypatch, chunks):
    """Make the certification (one call per chunk) raise once ``chunks`` chunks have been certified;
    return the list of the row counts certified."""
    calls = []

    def certify(model64, x, eps):
        if len(calls) == chunks:
            raise Crash
        calls.append(x.shape[0])
        return REAL_CERTIFY(model64, x, eps)

    monkeypatch.setattr(algorithm, "_certified_shift", certify)
    return calls


def kw(solver):
    return dict(iterations=3, restarts=3, size=0.01, chunk_size=2, solver=solver,
                lsqr=None if solver != "lsqr" else FAST)


def assert_same(a, b):
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.infinite_reasons == b.infinite_reasons
    for key in ("dense", "krylov", "solver"):
        assert a.params[key] == b.params[key]
    assert (a.targeted is None) == (b.targeted is None)
    if a.targeted is not None:
        np.testing.assert_array_equal(a.std_algorithm1, b.std_algorithm1)
        ta, tb = a.targeted.to_numpy(), b.targeted.to_numpy()
        for name in ta._PER_EXAMPLE + ("targeted", "modes"):
            x, y = getattr(ta, name), getattr(tb, name)
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=f"targeted.{name}")
        assert ta.infinite_reasons == tb.infinite_reasons and ta.method == tb.method


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
def test_killed_call_made_again_ends_with_the_uninterrupted_bounds(solver, tmp_path, monkeypatch):
    model, x = relu_mlp(), batch()
    whole = hcrfast.bound(model, x, 0.3, **kw(solver))
    calls = crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw(solver))
    assert calls == [6, 6]  # two chunks of 2 examples × 3 restarts finished before the crash
    assert len(list((tmp_path / "ck").glob("chunk_*.npz"))) == 2

    calls = crash_after(monkeypatch, None)
    again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw(solver))
    assert calls == [6, 3]  # only examples 4..6 were computed
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert_same(again, whole)

    # Everything finished: a third call reads it all back and computes nothing.
    calls = crash_after(monkeypatch, 0)
    third = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw(solver))
    assert third.params["checkpoint"]["examples_read_back"] == 7
    assert_same(third, whole)
    # its summary says its wall time is this call's, beside seconds summed over chunks an earlier call timed
    assert ("(this call's: 7 of 7 examples read back from the checkpoint, whose seconds above were timed by the "
            "call that computed them)") in third.summary()
    assert "(this call's: 4 of 7 examples read back" in again.summary() and "read back" not in whole.summary()


def test_a_resume_with_another_thread_count_says_its_bounds_are_not_bitwise(tmp_path, monkeypatch):
    """Each chunk records the arithmetic it was computed with (the CPU's torch thread count: BLAS splits
    its sums by thread, and LSQR carries the last bits far); a result merged from chunks of different
    arithmetic warns, as hcrfast reproduce does. The same thread count resumes without a word."""
    model, x = relu_mlp(), batch()
    saved_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        crash_after(monkeypatch, 2)
        with pytest.raises(Crash):
            hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("lsqr"))
        for f in (tmp_path / "ck").glob("chunk_*.npz"):
            with np.load(f) as z:
                assert str(z["arithmetic"]).endswith("torch threads 1)")
        crash_after(monkeypatch, None)
        with warnings.catch_warnings(record=True) as same:
            warnings.simplefilter("always")
            hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "same", **kw("lsqr"))
            hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "same", **kw("lsqr"))   # all read back
        assert not [w for w in same if "different arithmetic" in str(w.message)]
        torch.set_num_threads(2)
        with pytest.warns(UserWarning, match=r"ck's chunks were computed with different arithmetic \(CPU .*torch "
                                             r"threads 1\); CPU .*torch threads 2\)\): the results \(bounds, or attack estimates\) agree up to "
                                             r"rounding, but are not bitwise .*torch.set_num_threads"):
            hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("lsqr"))
    finally:
        torch.set_num_threads(saved_threads)
    # a chunk written before chunks recorded their arithmetic
    first = sorted((tmp_path / "ck").glob("chunk_*.npz"))[0]
    with np.load(first) as z:
        arrays = {k: z[k] for k in z.files if k != "arithmetic"}
    np.savez(first, **arrays)
    with pytest.warns(UserWarning, match=r"different arithmetic \(CPU .*; not recorded\)"):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("lsqr"))


def test_a_dense_checkpoint_from_before_the_product_count_resumes_with_every_row_counted(tmp_path):
    """Chunk files written before the dense solve counted its J's products hold 0 there (the old build
    pulled back every row: min(n, p) products), and their arithmetic has no "dense J by nonzero rows":
    a resume reports min(n, p) for them, not 0, and says its last bits may differ from one run's."""
    model, x = relu_mlp(), batch()
    fresh = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("dense"))
    n, p = fresh.params["n_features"], fresh.params["n_inputs"]
    assert fresh.params["dense"]["jacobian_products"] not in (0, min(n, p))   # nonzero rows + 3 probes
    files = sorted((tmp_path / "ck").glob("chunk_*.npz"))
    assert len(files) > 1
    counts = []
    for i, f in enumerate(files):
        with np.load(f) as z:
            assert str(z["arithmetic"]).endswith("; dense J by nonzero rows")
            arrays = {k: z[k] for k in z.files}
        if i == 0:   # as an old version wrote it
            arrays["passes"] = np.zeros_like(arrays["passes"])
            arrays["arithmetic"] = np.array(str(arrays["arithmetic"]).replace("; dense J by nonzero rows", ""))
            np.savez(f, **arrays)
            counts += [min(n, p)] * len(arrays["passes"])
        else:
            counts += list(arrays["passes"][:, 0])
    with pytest.warns(UserWarning, match=r"different arithmetic \(CPU [^;]*; CPU .*; dense J by nonzero rows\)"):
        again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("dense"))
    assert again.params["checkpoint"]["examples_read_back"] == len(x)
    assert again.params["dense"]["jacobian_products"] == pytest.approx(np.mean(counts))
    assert min(counts) == min(n, p) != max(counts)
    np.testing.assert_array_equal(again.std, fresh.std)


@pytest.mark.parametrize("entry", ["gauss_newton_attack", "targeted_bound"])
def test_the_attack_and_targeted_bound_say_so_too(entry, tmp_path):
    """The attack's and targeted_bound's checkpoints record each chunk's arithmetic alike: a chunk lost and
    computed again with another thread count warns."""
    model, x = relu_mlp(), batch(4)
    call = {"gauss_newton_attack": lambda: hcrfast.gauss_newton_attack(model, x, 0.3, draws=3, steps=2, chunk_size=2,
                                                                       checkpoint=tmp_path / "ck"),
            "targeted_bound": lambda: hcrfast.targeted_bound(model, x, 0.3, targets="low:2", chunk_size=2,
                                                             checkpoint=tmp_path / "ck")}[entry]
    saved_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        call()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*different arithmetic")
            call()   # all read back, all one arithmetic: no word
        chunks = sorted((tmp_path / "ck").glob("chunk_*.npz"))   # (targeted_bound writes one per example)
        assert len(chunks) >= 2
        chunks[-1].unlink()
        torch.set_num_threads(2)
        with pytest.warns(UserWarning, match=r"torch threads 1\); CPU .*torch threads 2\)\): the results \(bounds, or attack estimates\) agree up to "
                                             r"rounding"):
            call()
    finally:
        torch.set_num_threads(saved_threads)


@pytest.mark.parametrize("solver, method", [("dense", "auto"), ("krylov", "auto"), ("lsqr", "lsqr")])
def test_targeted_bounds_resume_too(solver, method, tmp_path, monkeypatch):
    model, x = relu_mlp(), batch()
    args = dict(targets="low:2", targeted_method=method, **kw(solver))
    whole = hcrfast.bound(model, x, 0.3, **args)
    assert whole.targeted.method == ("lsqr" if method == "lsqr" else solver)
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **args)
    crash_after(monkeypatch, None)
    again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **args)
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert_same(again, whole)
    assert again.params["targeted"]["n_targets"] == 4


def test_infinite_bounds_and_their_reasons_survive_a_resume_in_example_order(tmp_path, monkeypatch):
    x = batch(6, seed=4)
    x[:, 0, 0, 0] = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0])  # rows 1 and 3 frozen
    whole = hcrfast.bound(Frozen().eval(), x, 0.5, **kw("lsqr"))
    assert np.isinf(whole.mse[[1, 3]]).all() and np.isfinite(whole.mse[[0, 2, 4, 5]]).all()
    assert [r.split(",")[0] for r in whole.infinite_reasons] == ["example 1"] * 3 + ["example 3"] * 3

    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        hcrfast.bound(Frozen().eval(), x, 0.5, checkpoint=tmp_path, **kw("lsqr"))
    (tmp_path / "chunk_000000000_000000002.npz").unlink()  # rows 2..3 read back, 0..1 and 4..5 computed
    crash_after(monkeypatch, None)
    with pytest.warns(UserWarning, match=r"computed in chunks of different sizes \(2, 4 examples\).*not bitwise"):
        again = hcrfast.bound(Frozen().eval(), x, 0.5, checkpoint=tmp_path, chunk_size=4, iterations=3, restarts=3,
                              size=0.01, solver="lsqr", lsqr=FAST)  # another chunk size on the second call
    assert again.params["checkpoint"]["examples_read_back"] == 2
    assert again.infinite_reasons == whole.infinite_reasons
    for name in ARRAYS:
        np.testing.assert_allclose(getattr(again, name), getattr(whole, name), rtol=1e-10, atol=0, err_msg=name)


def test_progress_counts_read_back_examples_and_gives_an_eta(tmp_path, monkeypatch, capsys):
    model, x = relu_mlp(), batch()
    crash_after(monkeypatch, 1)
    with pytest.raises(Crash):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    crash_after(monkeypatch, None)
    capsys.readouterr()
    hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, progress=True, **kw("dense"))
    lines = capsys.readouterr().err.splitlines()
    assert lines.pop(0).startswith("hcrfast.bound: 7 examples x ")   # (the plan)
    assert lines[0] == f"hcrfast.bound: 2 of 7 examples read back from {tmp_path}"
    assert [line.split(" done")[0] for line in lines[1:]] == [f"hcrfast.bound: examples {k}/7" for k in (4, 6, 7)]
    assert all("ETA" in line for line in lines[1:-1]) and "ETA" not in lines[-1]


def test_unreadable_chunk_is_computed_again_with_a_warning(tmp_path):
    model, x = relu_mlp(), batch()
    whole = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    broken = sorted(tmp_path.glob("chunk_*.npz"))[1]
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.warns(UserWarning, match="unreadable"):
        again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    assert again.params["checkpoint"]["examples_read_back"] == 5
    assert_same(again, whole)
    assert (tmp_path / f".{broken.name}.unreadable").is_file() and broken.is_file()  # set aside, then rewritten


@pytest.mark.parametrize("change, named", [
    (dict(sigma=0.31), "noise"),
    (dict(model=relu_mlp(seed=1)), "model"),
    (dict(x=batch(seed=2)), "batch"),
    (dict(iterations=4), "iterations"),
    (dict(size=0.02), "size"),
    (dict(warm_start=False), "warm_start"),
    (dict(solver="lsqr"), "solver"),
    (dict(example_ids=np.arange(10, 17)), "example_ids"),
])
def test_a_different_call_is_refused_naming_what_differs(tmp_path, change, named):
    args = dict(model=relu_mlp(), x=batch(), sigma=0.3, **kw("dense"))
    hcrfast.bound(args.pop("model"), args.pop("x"), args.pop("sigma"), checkpoint=tmp_path, **args)
    args = dict(model=relu_mlp(), x=batch(), sigma=0.3, **kw("dense"))
    args.update(change)
    if args["solver"] == "lsqr":
        args["lsqr"] = FAST
    with pytest.raises(CheckpointMismatchError, match=rf"{named}: .* -> ") as err:
        hcrfast.bound(args.pop("model"), args.pop("x"), args.pop("sigma"), checkpoint=tmp_path, **args)
    assert "to resume it" in str(err.value) and str(tmp_path) in str(err.value)
    assert json.loads((tmp_path / "key.json").read_text())["iterations"] == 3  # the first call's key is kept


def _laplace_law(scale, **kw):
    from scipy import stats

    law = stats.laplace(scale=scale)
    return hcrfast.MonteCarlo(law.logpdf, lambda rng, shape: law.rvs(size=shape, random_state=rng),
                              n_samples=500, **kw)


def _scipy_law(scale):
    from scipy import stats

    return hcrfast.MonteCarlo.from_scipy(stats.laplace(scale=scale), n_samples=500)


@pytest.mark.parametrize("first, other", [
    (lambda: _laplace_law(0.3), lambda: _laplace_law(3.0)),  # one default name, "custom density"
    (lambda: _scipy_law(0.3), lambda: _scipy_law(0.3000004)),  # names that round alike (:g)
], ids=["same-name", "name-rounds-alike"])
def test_another_monte_carlo_law_of_the_same_name_is_refused(tmp_path, first, other):
    # Its repr was its name and settings alone: a resume (or another rank) with another law mixed
    # the two laws' bounds in one result.
    assert first().name == other().name
    args = dict(iterations=1, restarts=1, size=0.01, chunk_size=2, solver="dense")
    hcrfast.bound(relu_mlp(), batch(B=3), first(), checkpoint=tmp_path, **args)
    with pytest.raises(CheckpointMismatchError, match=r"noise: .*sha256=.* -> "):
        hcrfast.bound(relu_mlp(), batch(B=3), other(), checkpoint=tmp_path, **args)
    again = hcrfast.bound(relu_mlp(), batch(B=3), first(), checkpoint=tmp_path, **args)  # the same law resumes
    assert again.params["checkpoint"]["examples_read_back"] == 3


def test_the_same_example_ids_in_another_dtype_resume(tmp_path):
    args = dict(sigma=0.3, checkpoint=tmp_path, **kw("dense"))
    whole = hcrfast.bound(relu_mlp(), batch(), example_ids=np.arange(5, 12, dtype=np.int64), **args)
    again = hcrfast.bound(relu_mlp(), batch(), example_ids=np.arange(5, 12, dtype=np.int32), **args)
    assert again.params["checkpoint"]["examples_read_back"] == 7
    assert_same(again, whole)


@pytest.mark.parametrize("first, then, named", [
    (None, "low:2", "targets"),             # a KeyError on the missing targeted rows, before they were keyed
    ("low:2", [0, 1, 2], "targets"),        # other modes would have been mixed into the kept chunks
    ("low:2", None, "targets"),
    (("low:2", "dense"), ("low:2", "lsqr"), "targeted_method"),
])
def test_other_targets_are_refused_and_the_same_ones_resume(tmp_path, first, then, named):
    def call(targets):
        targets, method = targets if isinstance(targets, tuple) else (targets, "auto")
        return hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path, targets=targets, targeted_method=method,
                             **kw("dense"))

    made = call(first)
    with pytest.raises(CheckpointMismatchError, match=rf"{named}: .* -> "):
        call(then)
    assert_same(call(first), made)


def test_bad_checkpoint_arguments(tmp_path):
    model, x = relu_mlp(), batch()
    with pytest.raises(TypeError, match="checkpoint must be a folder path"):
        hcrfast.bound(model, x, 0.3, checkpoint=3)
    for empty in ("", "  "):  # Path("") is the current directory: not what an empty setting meant
        with pytest.raises(ValueError, match=rf"checkpoint='{empty}' names no folder .*pass a folder"):
            hcrfast.bound(model, x, 0.3, checkpoint=empty)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="pass a folder"):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "file")
    assert not list(tmp_path.glob("key.json"))  # refused before anything was written
    with pytest.raises(OSError, match="the checkpoint folder .*sub cannot be created .*pass a folder you can write to"):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "file" / "sub")


def test_gaps():
    assert gaps(10, []) == [(0, 10)]
    assert gaps(10, [(0, 3, {}), (5, 7, {}), (7, 10, {})]) == [(3, 5)]
    assert gaps(10, [(2, 4, {})]) == [(0, 2), (4, 10)]
    assert gaps(4, [(0, 4, {})]) == []


def test_the_features_check_is_relative_to_the_largest_magnitude_and_refuses_nan(tmp_path):
    """FEATURES_RTOL = 1e-4 of the largest |feature|: negative features of magnitude up to 2000 moved by
    1e-7 of it (another device's rounding) resume; moved by 1e-3 of it, or NaN, they are another model."""
    from hcrfast.checkpoint import Checkpoint

    ids = np.arange(3)
    f = -np.linspace(1.0, 2000.0, 12).reshape(3, 4)
    Checkpoint(tmp_path, {"a": 1}, ids, f)
    Checkpoint(tmp_path, {"a": 1}, ids, f * (1 + 1e-7))
    for other in (f + 2.0, np.where(f < -1000, np.nan, f)):
        with pytest.raises(CheckpointMismatchError, match="a model that gave other features"):
            Checkpoint(tmp_path, {"a": 1}, ids, other)
    with pytest.raises(CheckpointMismatchError, match=r"features of shape \(3, 4\), this call's model gives \(4, 3\)"):
        Checkpoint(tmp_path, {"a": 1}, ids, f.reshape(4, 3))


def test_a_key_with_an_entry_more_or_less_is_refused_naming_it(tmp_path):
    from hcrfast.checkpoint import Checkpoint

    Checkpoint(tmp_path, {"a": 1, "t": (1, 2)}, np.arange(2))
    Checkpoint(tmp_path, {"a": 1, "t": (1, 2)}, np.arange(2))  # a tuple reads back as the list it was stored as
    with pytest.raises(CheckpointMismatchError, match=r"b: '\(absent\)' -> 2"):
        Checkpoint(tmp_path, {"a": 1, "t": (1, 2), "b": 2}, np.arange(2))
    with pytest.raises(CheckpointMismatchError, match=r"t: \[1, 2\] -> '\(absent\)'"):
        Checkpoint(tmp_path, {"a": 1}, np.arange(2))
    # entries bound() leaves out at a value (so that keys from before them still match) are named by it
    Checkpoint(tmp_path / "k", {"a": 1, "iterates": "all", "singular_steps": 16}, np.arange(2))
    with pytest.raises(CheckpointMismatchError, match=r"iterates: 'all' -> 'last'; singular_steps: 16 -> 0\)"):
        Checkpoint(tmp_path / "k", {"a": 1}, np.arange(2))


def test_fingerprints_see_shapes_names_and_dtypes_not_only_the_bytes():
    """The same bytes in another shape (or under another parameter name) are another model or batch."""
    from hcrfast.checkpoint import batch_fingerprint, model_fingerprint

    values = torch.arange(6, dtype=torch.float32)
    assert batch_fingerprint(values.reshape(2, 3)) != batch_fingerprint(values.reshape(3, 2))
    assert batch_fingerprint(values) != batch_fingerprint(values.view(torch.int32))

    class Holder(torch.nn.Module):
        def __init__(self, name, shape):
            super().__init__()
            self.register_buffer(name, values.reshape(shape))

    fingerprints = {model_fingerprint(Holder(name, shape)) for name in ("w", "v") for shape in ((2, 3), (3, 2))}
    assert len(fingerprints) == 4


def test_chunk_files_are_checked_on_reading_rows_ids_and_overlaps(tmp_path):
    """Each chunk file holds its example ids, checked against the call's at its rows; of chunks that share
    rows (two calls with other chunk sizes made into one folder at once) one cover is read and the others set
    aside, with a warning. gaps() against the rows a set of any (start, stop) leaves uncovered."""
    from hcrfast.checkpoint import Checkpoint

    ck = Checkpoint(tmp_path / "a", {"k": 1}, np.arange(4))
    ck.save(0, 2, value=np.zeros(2))
    other = Checkpoint(tmp_path / "a", {"k": 1}, np.arange(10, 14))
    with pytest.raises(CheckpointMismatchError, match=r"holds examples \[0 1\] at rows 0:2"):
        other.finished()
    ck = Checkpoint(tmp_path / "b", {"k": 1}, np.arange(4))
    ck.save(0, 3, value=np.zeros(3))
    ck.save(2, 4, value=np.zeros(2))
    ck.save(0, 2, value=np.zeros(2))
    with pytest.warns(UserWarning) as caught:
        assert [(a, b) for a, b, _ in ck.finished()] == [(0, 3)]
    assert sorted(str(w.message).split(" overlaps ")[1].split(";")[0] for w in caught) == [
        "rows 0..1 of another chunk", "rows 2..2 of another chunk"]
    assert sorted(f.name for f in (tmp_path / "b").iterdir()) == [
        ".chunk_000000000_000000002.npz.overlap", ".chunk_000000002_000000004.npz.overlap",
        "chunk_000000000_000000003.npz", "key.json"]
    assert [(a, b) for a, b, _ in ck.finished()] == [(0, 3)]     # once set aside, read without a word
    for finished in ([(0, 5), (1, 3)], [(2, 4), (3, 9)], [(1, 2), (4, 6), (5, 7)]):
        covered = np.zeros(10, dtype=bool)
        for a, b in finished:
            covered[a:b] = True
        free = np.flatnonzero(~covered)
        want = [(int(r[0]), int(r[-1]) + 1) for r in np.split(free, np.flatnonzero(np.diff(free) > 1) + 1) if r.size]
        assert gaps(10, finished) == want, finished


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    """The write goes to .NAME.PID.tmp beside the file (the PID is what tidy() reads), then os.replace; a
    write that raises leaves the old content and removes its temporary file."""
    from hcrfast.checkpoint import atomic_write_bytes

    path = tmp_path / "chunk_000000000_000000002.npz"
    path.write_bytes(b"old")
    seen = []

    def failing(fh):
        fh.write(b"half")
        seen.extend(p.name for p in tmp_path.iterdir())
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError, match="killed while writing"):
        atomic_write_bytes(path, failing)
    assert f".{path.name}.{os.getpid()}.tmp" in seen
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


SHARD_SCRIPT = """
import os, sys
import torch
sys.path.insert(0, {tests!r})
import hcrfast
from test_checkpoint import batch, kw, relu_mlp

torch.set_num_threads(1)
res = hcrfast.bound(relu_mlp(), batch(), {sigma!r}, checkpoint={ck!r}, shard=True, progress=True,
                    targets={targets!r}, **kw({solver!r}))
res.save(os.path.join({out!r}, "rank%s.npz" % os.environ["RANK"]))
"""


def torchrun_shard(tmp_path, solver, sigma, targets=None):
    """Two processes under torchrun (gloo), each saving its result to tmp_path/rank<r>.npz."""
    import subprocess
    import sys
    from pathlib import Path

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    script = tmp_path / "shard.py"
    script.write_text(SHARD_SCRIPT.format(tests=str(Path(__file__).parent), ck=str(tmp_path / "ck"),
                                          solver=solver, out=str(tmp_path), sigma=sigma, targets=targets))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("solver", ["dense", "lsqr"])
def test_torchrun_processes_share_the_pieces_and_each_returns_the_whole_result(solver, tmp_path, monkeypatch):
    targets = "low:2" if solver == "dense" else None
    whole = hcrfast.bound(relu_mlp(), batch(), 0.3, targets=targets, **kw(solver))
    crash_after(monkeypatch, 1)  # a killed single-process run left examples 0..1 in the folder
    with pytest.raises(Crash):
        hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path / "ck", targets=targets, **kw(solver))

    proc = torchrun_shard(tmp_path, solver, 0.3, targets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [hcrfast.Bounds.load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    # examples 2..6 cut in pieces of 2: (2, 4) and (6, 7) for rank 0, (4, 6) for rank 1
    assert [r.params["shard"] for r in ranks] == [dict(rank=0, world_size=2, examples_computed=3),
                                                 dict(rank=1, world_size=2, examples_computed=2)]
    assert all(r.params["checkpoint"]["examples_read_back"] == 2 for r in ranks)
    assert "[rank 1/2]: 2/2 of this process's examples done" in proc.stderr
    assert "hcrfast.bound [rank 0/2]: this process's pieces are done; waiting for the others" in proc.stderr
    for r in ranks:
        assert r.infinite_reasons == whole.infinite_reasons
        for name in ARRAYS:
            np.testing.assert_allclose(getattr(r, name), getattr(whole, name), rtol=1e-10, atol=0, err_msg=name)
        if targets is not None:
            np.testing.assert_allclose(r.targeted.std, whole.targeted.std, rtol=1e-10, atol=0)
            np.testing.assert_allclose(r.std_algorithm1, whole.std_algorithm1, rtol=1e-10, atol=0)
    for name in ARRAYS:  # both processes return the same bytes
        np.testing.assert_array_equal(getattr(ranks[0], name), getattr(ranks[1], name), err_msg=name)


def test_torchrun_processes_all_stop_when_rank_0_finds_another_run_in_the_folder(tmp_path):
    hcrfast.bound(relu_mlp(), batch(), 0.5, checkpoint=tmp_path / "ck", **kw("dense"))
    proc = torchrun_shard(tmp_path, "dense", 0.3)
    assert proc.returncode != 0
    # rank 1 raises rank 0's error (torchrun may stop rank 0 before its own traceback is printed)
    assert ("stopped on rank 1 because another process failed: rank 0: CheckpointMismatchError: "
            in proc.stderr), proc.stderr[-3000:]
    assert "noise: 'Gaussian(sigma=0.5)' -> 'Gaussian(sigma=0.3)'" in proc.stderr  # what differs


def test_processes_refused_for_making_different_calls_leave_the_folder_as_it_was(tmp_path):
    """Rank 1 at another sigma: every process refuses before anything is written, so the corrected call
    runs in that folder (rank 0 used to write its key first, which then refused the corrected call)."""
    import subprocess
    import sys
    from pathlib import Path

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    script = tmp_path / "shard.py"
    script.write_text(SHARD_SCRIPT.format(tests=str(Path(__file__).parent), ck=str(tmp_path / "ck"), solver="dense",
                                          out=str(tmp_path), sigma=0.3, targets=None)
                      .replace("0.3, checkpoint=", "0.3 + 0.1 * int(os.environ['RANK']), checkpoint="))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "the processes do not make the same call" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())
    res = hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path / "ck", **kw("dense"))
    np.testing.assert_array_equal(res.std, hcrfast.bound(relu_mlp(), batch(), 0.3, **kw("dense")).std)


MISUSE_SCRIPT = """
import json, os, sys, time
import numpy as np
import torch
sys.path.insert(0, {tests!r})
import hcrfast
from test_checkpoint import batch, kw, relu_mlp

torch.set_num_threads(1)
rank = int(os.environ["RANK"])
got = {{}}


def attempt(name, **given):
    args = dict(kw("dense"), sigma=0.3, checkpoint=os.path.join({root!r}, name), shard=True)
    args.update(given)
    try:
        got[name] = hcrfast.bound(relu_mlp(), batch(), args.pop("sigma"), **args).std.tolist()
    except Exception as exc:  # caught, as a notebook or a sweep would: the others must not hang
        got[name] = "%s: %s" % (type(exc).__name__, exc)


attempt("first")
attempt("second")  # the process group hcrfast made for the first call serves this one
attempt("sigma", sigma=0.3 if rank == 0 else 0.5)
attempt("invalid", size=1 / 200 if rank == 0 else -1.0)  # rank 1 fails before any step
attempt("folders", checkpoint=os.path.join({root!r}, "folder%d" % rank))
attempt("absent", shard=rank == 0)  # rank 1 never joins; rank 0 gives up after HCRFAST_SHARD_TIMEOUT
given_up = os.path.join({root!r}, "given_up")
if rank == 0:
    open(given_up, "w").close()
while not os.path.exists(given_up):  # else rank 1's next call is the one rank 0 still waits for, rightly
    time.sleep(0.05)
attempt("after_absent")  # rank 1 skips the call rank 0 gave up on; the two meet again
n = relu_mlp()(batch()).shape[1]
attempt("stds", sigma=np.full(n, 0.3) if rank == 0 else np.r_[-1.0, np.full(n - 1, 0.3)])  # refused before bound
attempt("targets", targets="low:2" if rank == 0 else None)
attempt("last")
with open(os.path.join({root!r}, "rank%d.json" % rank), "w") as fh:
    json.dump(got, fh)
"""


KILLED_SCRIPT = """
import os, signal, sys
import torch
sys.path.insert(0, {tests!r})
import hcrfast
import hcrfast.distributed
from hcrfast import algorithm
from test_checkpoint import batch, kw, relu_mlp

hcrfast.distributed._SILENT = 3.0  # a minute by default
torch.set_num_threads(1)
if os.environ["RANK"] == {killed!r}:
    def certify(model64, x, eps):  # killed in its first piece, as the kernel's OOM killer would: no error posted
        os.kill(os.getpid(), signal.SIGKILL)
    algorithm._certified_shift = certify
try:
    hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint={ck!r}, shard=True, **kw("dense"))
except hcrfast.ShardError as exc:
    print("ShardError:", exc)
"""


def _gloo_ranks(script, *, ranks=(0, 1), world=2, extra_env=None):
    """``script`` started as the given ranks of a process group of ``world`` launched by hand (gloo on a free
    local port): their Popen objects, stdout and stderr piped (skipped where torch has no gloo)."""
    import socket
    import subprocess
    import sys

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
           **(extra_env or {})}
    return [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ranks]


def _killed_rank(tmp_path, *, killed: int):
    """KILLED_SCRIPT as 2 ranks launched by hand, rank ``killed`` killed in its first piece: the processes, and the
    other rank's stdout and stderr."""
    from pathlib import Path

    script = tmp_path / "killed.py"
    script.write_text(KILLED_SCRIPT.format(tests=str(Path(__file__).parent), ck=str(tmp_path / "ck"),
                                           killed=str(killed)))
    procs = _gloo_ranks(script)
    try:
        out, err = procs[1 - killed].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
    return procs, out, err


def test_a_killed_process_of_a_group_launched_by_hand_is_named_not_waited_for(tmp_path):
    """Without torchrun's agent nobody stops the others when one dies: they find it silent (its beat
    stops) and raise, and the pieces finished stay for the resumed call."""
    procs, out, err = _killed_rank(tmp_path, killed=1)
    assert procs[0].returncode == 0, err[-3000:]
    assert ("ShardError: hcrfast.bound(shard=True): rank 1 of 2 stopped answering (3 s without a sign of life: "
            "killed, out of memory, or its machine lost) while rank 0 waited at step 'done'") in out, out + err
    assert procs[1].wait() == -9
    whole = hcrfast.bound(relu_mlp(), batch(), 0.3, **kw("dense"))
    again = hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path / "ck", **kw("dense"))
    assert again.params["checkpoint"]["examples_read_back"] == 4  # rank 0's pieces: examples 0-1 and 4-5
    assert_same(again, whole)


def test_a_killed_rank_0_of_a_group_launched_by_hand_is_named_by_the_others(tmp_path):
    """Rank 0 holds the group's store where the processes were started by hand: killed, the others raised torch's
    bare DistNetworkError ("Broken pipe") at their next step, and their beats logged a C++ trace every 2 s until
    then. They now raise a ShardError naming the store and rank 0, and stop beating after 3 failed beats."""
    procs, out, err = _killed_rank(tmp_path, killed=0)
    assert procs[1].returncode == 0, err[-3000:]
    assert re.search(r"ShardError: hcrfast.bound\(shard=True\): the process group's store at 127.0.0.1:\d+ stopped "
                     r"answering while rank 1 of 2 was at step '\w+' \(torch: \w+.*\): rank 0 holds it where the "
                     r"processes were started by hand", out), out + err
    assert "run the same call again on every process to resume" in out
    assert procs[0].wait() == -9
    assert err.count("Broken pipe") <= 2 * (1 + hcrfast.distributed._FAILED_BEATS), err[-3000:]


def test_torchrun_misuse_is_an_error_on_every_process_not_a_hang(tmp_path):
    """Each process catches its exception and goes on: none waits on a process that failed, asked
    for something else, looked in another folder or never came, and the two calls made right
    share the work and match one process's result."""
    import subprocess
    import sys
    from pathlib import Path

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    script = tmp_path / "misuse.py"
    script.write_text(MISUSE_SCRIPT.format(tests=str(Path(__file__).parent), root=str(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HCRFAST_SHARD_TIMEOUT": "10"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    whole = hcrfast.bound(relu_mlp(), batch(), 0.3, **kw("dense")).std
    for name in ("first", "second"):
        for r in (0, 1):
            np.testing.assert_allclose(np.array(got[r][name]), whole, rtol=1e-10, atol=0, err_msg=f"{name} rank {r}")
    for r in (0, 1):  # both name the field and both values
        assert got[r]["sigma"].startswith("ShardError: hcrfast.bound(shard=True): the processes do not make the "
                                          "same call: rank 1 differs in noise ('Gaussian(sigma=0.3)' on rank 0, "
                                          "'Gaussian(sigma=0.5)' on rank 1)"), got[r]["sigma"]
    assert got[1]["invalid"].startswith("ValueError: size must be")
    assert got[0]["invalid"].startswith("ShardError: hcrfast.bound(shard=True) stopped on rank 0 because another "
                                        "process failed: rank 1: ValueError: size must be"), got[0]["invalid"]
    for r in (0, 1):  # both name both folders
        assert re.match(r"ShardError: hcrfast.bound\(shard=True\): checkpoint '.*folder0' on rank 0, but rank 1's "
                        r"'.*folder1' is not that folder \(rank 0's file \.shard-[0-9a-f]+ is not in it\)",
                        got[r]["folders"]), got[r]["folders"]
    assert not list((tmp_path / "folder0").glob(".shard-*"))  # rank 0 took its file back
    np.testing.assert_allclose(np.array(got[1]["absent"]), whole, rtol=1e-10, atol=0)  # alone, unsharded
    assert got[0]["absent"] == ("ShardError: hcrfast.bound(shard=True): rank 1 of 2 did not come within 10 s; every "
                                "process of the job must make the same call (set HCRFAST_SHARD_TIMEOUT=SECONDS to "
                                "wait longer for a slow start)")
    for r in (0, 1):  # the processes meet again after the call rank 0 gave up on, and after each error
        for name in ("after_absent", "last"):
            np.testing.assert_allclose(np.array(got[r][name]), whole, rtol=1e-10, atol=0, err_msg=f"{name} rank {r}")
        # other targets: named, on both (they were in no key: one process returned, the other died on a KeyError)
        assert got[r]["targets"].startswith("ShardError: hcrfast.bound(shard=True): the processes do not make the "
                                            "same call: rank 1 differs in targeted_method ('auto' on rank 0, None "
                                            "on rank 1), targets ('4 modes sha256:"), got[r]["targets"]
    # a per-feature sigma refused on rank 1 before bound's own checks is told to rank 0 at once
    assert got[1]["stds"].startswith("ValueError: sigma as one std per feature"), got[1]["stds"]
    assert got[0]["stds"].startswith("ShardError: hcrfast.bound(shard=True) stopped on rank 0 because another "
                                     "process failed: rank 1: ValueError: sigma as one std per feature"), got[0]["stds"]


def test_shard_is_bounds_alone_and_a_stray_keyword_names_the_function():
    with pytest.raises(TypeError, match=r"^hcrfast\.targeted_bound\(\): got an unexpected keyword argument 'shard'; "
                                        r"its arguments are model, batch, sigma, targets, "):
        hcrfast.targeted_bound(relu_mlp(), batch(), 0.3, targets="low:2", shard=True)
    with pytest.raises(TypeError, match=r"^hcrfast\.bound\(\): missing a required argument: 'sigma'"):
        hcrfast.bound(relu_mlp(), batch())


def test_the_shard_timeout_is_read_from_the_environment_and_checked(monkeypatch):
    from hcrfast.distributed import join_timeout

    monkeypatch.delenv("HCRFAST_SHARD_TIMEOUT", raising=False)
    assert join_timeout() == 1800
    monkeypatch.setenv("HCRFAST_SHARD_TIMEOUT", "2.5")
    assert join_timeout() == 2.5
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv("HCRFAST_SHARD_TIMEOUT", bad)
        with pytest.raises(ValueError, match=rf"HCRFAST_SHARD_TIMEOUT='{bad}' is not a positive number of seconds"):
            join_timeout()


def test_shard_needs_a_checkpoint_folder():
    with pytest.raises(ValueError, match="pass checkpoint=DIR"):
        hcrfast.bound(relu_mlp(), batch(), 0.3, shard=True)
    with pytest.raises(TypeError, match="shard must be True or False"):
        hcrfast.bound(relu_mlp(), batch(), 0.3, shard="yes", checkpoint="x")


def test_shard_in_a_single_process_is_a_plain_checkpointed_call(tmp_path):
    whole = hcrfast.bound(relu_mlp(), batch(), 0.3, **kw("dense"))
    with pytest.warns(UserWarning, match="shard=True, but this process is alone"):
        res = hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path, shard=True, **kw("dense"))
    assert res.params["shard"] == dict(rank=0, world_size=1, examples_computed=7)
    assert_same(res, whole)


def tanh_mlp():
    """J has full column rank (16 inputs, 20 features): Cramér–Rao directions only, no null-space probes."""
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 20)).double().eval()


def assert_same_targeted(a, b):
    a, b = a.to_numpy(), b.to_numpy()
    for name in a._PER_EXAMPLE + ("targeted", "modes"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.infinite_reasons == b.infinite_reasons and a.method == b.method


@pytest.mark.parametrize("method", ["dense", "lsqr"])
@pytest.mark.parametrize("net", [tanh_mlp, Frozen])
def test_standalone_targeted_bound_resumes_after_a_crash(method, net, tmp_path, monkeypatch, capsys):
    """targeted_bound(checkpoint=DIR), killed after two pieces and called again, computes only the
    missing examples and ends with the bounds of one uninterrupted call over the whole batch
    (Frozen: the infinite bounds' reasons keep their examples' numbers)."""
    from hcrfast import targeted

    x = batch()
    kw_t = dict(targets=[0, 3, 5], size=0.01, method=method, chunk_size=6, lsqr=FAST if method == "lsqr" else None)
    whole = hcrfast.targeted_bound(net().eval(), x, 0.3, **kw_t)            # one piece: the whole batch
    if net is Frozen:  # examples 2 and 6 are frozen; 6 is in the last piece
        assert {r.split(",")[0] for r in whole.infinite_reasons} == {"example 2", "example 6"}
    real, calls = targeted._targeted_piece, []

    def piece(model, model64, rows, *args, **kwargs):
        if len(calls) == crash_at[0]:
            raise Crash
        calls.append(rows.shape[0])
        return real(model, model64, rows, *args, **kwargs)

    monkeypatch.setattr(targeted, "_targeted_piece", piece)
    crash_at = [2]
    with pytest.raises(Crash):
        hcrfast.targeted_bound(net().eval(), x, 0.3, checkpoint=tmp_path, **kw_t)
    assert calls == [2, 2]  # 6 rows a pass, 3 modes an example: pieces of 2 examples
    assert len(list(tmp_path.glob("chunk_*.npz"))) == 2

    calls.clear()
    crash_at = [None]
    capsys.readouterr()
    again = hcrfast.targeted_bound(net().eval(), x, 0.3, checkpoint=tmp_path, progress=True, **kw_t)
    assert calls == [2, 1]  # examples 4..6 only
    err = capsys.readouterr().err
    assert "hcrfast.targeted_bound: 4 of 7 examples read back from" in err
    assert "hcrfast.targeted_bound: examples 6/7 done" in err and "ETA" in err
    assert "hcrfast.targeted_bound: examples 7/7 done" in err
    assert again.params["checkpoint"] == dict(path=str(tmp_path), examples_read_back=4)
    assert_same_targeted(again, whole)  # the same pieces with or without a checkpoint: the same bits

    calls.clear()
    third = hcrfast.targeted_bound(net().eval(), x, 0.3, checkpoint=tmp_path, **kw_t)
    assert calls == []  # everything read back, the same numbers bit for bit
    assert_same_targeted(third, again)
    with pytest.raises(CheckpointMismatchError, match=r"noise: 'Gaussian\(sigma=0.3\)' -> 'Gaussian\(sigma=0.31\)'"):
        hcrfast.targeted_bound(net().eval(), x, 0.31, checkpoint=tmp_path, **kw_t)
    with pytest.raises(CheckpointMismatchError, match="modes: "):
        hcrfast.targeted_bound(net().eval(), x, 0.3, checkpoint=tmp_path, **dict(kw_t, targets=[0, 3]))


def test_targeted_bound_progress_alone_gives_the_same_bounds(capsys):
    """Bit for bit, even for the null-space probes of a ReLU model (whose huge bounds come from rounding-level
    feature changes and so depend on how rows are grouped): the pieces are the same either way."""
    x = batch()
    kw_t = dict(targets="low:2", size=0.01, chunk_size=8)
    whole = hcrfast.targeted_bound(relu_mlp(), x, 0.3, **kw_t)
    pieces = hcrfast.targeted_bound(relu_mlp(), x, 0.3, progress=True, **kw_t)
    err = capsys.readouterr().err
    assert [line.split(" done")[0] for line in err.splitlines()] == [
        f"hcrfast.targeted_bound: examples {k}/7" for k in (2, 4, 6, 7)]
    assert pieces.params["checkpoint"] is None
    assert whole.from_null_space.any()  # the probes did run
    assert_same_targeted(pieces, whole)


def test_targeted_bound_checkpoint_arguments(tmp_path):
    with pytest.raises(TypeError, match="checkpoint must be a folder path"):
        hcrfast.targeted_bound(relu_mlp(), batch(), 0.3, checkpoint=3)
    with pytest.raises(ValueError, match="drop directions="):
        hcrfast.targeted_bound(relu_mlp(), batch(), 0.3, progress=True, directions=object())
    with pytest.raises(TypeError, match="progress must be True or False"):
        hcrfast.targeted_bound(relu_mlp(), batch(), 0.3, progress="yes")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="pass a folder"):
        hcrfast.targeted_bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path / "file")


class Tempered(torch.nn.Module):
    """Its temperature is a plain attribute: not in the state_dict, so not in the model's fingerprint."""

    def __init__(self, T):
        super().__init__()
        self.net, self.T = relu_mlp(), T

    def forward(self, x):
        return self.net(x) / self.T


@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_a_model_change_its_fingerprint_misses_is_refused_by_the_features(entry, tmp_path):
    """A function's closure, or a module attribute outside the state_dict, escapes the fingerprint; the
    stored clean features catch it, and the same model resumes."""
    call = getattr(hcrfast, entry)
    kw_e = kw("dense") if entry == "bound" else dict(targets=[0, 1], chunk_size=4)
    a, b = relu_mlp(0), relu_mlp(5)
    call(lambda t: a(t), batch(), 0.3, checkpoint=tmp_path / "fn", certify=False, **kw_e)
    with pytest.raises(CheckpointMismatchError, match="other features for this batch .* plain function closes over"):
        call(lambda t: b(t), batch(), 0.3, checkpoint=tmp_path / "fn", certify=False, **kw_e)
    call(lambda t: a(t), batch(), 0.3, checkpoint=tmp_path / "fn", certify=False, **kw_e)  # the same: resumes

    call(Tempered(1.0).eval(), batch(), 0.3, checkpoint=tmp_path / "T", **kw_e)
    with pytest.raises(CheckpointMismatchError, match=r"largest difference .*, 0.9 of the largest feature"):
        call(Tempered(10.0).eval(), batch(), 0.3, checkpoint=tmp_path / "T", **kw_e)
    assert (tmp_path / "T" / "features.npy").is_file()


def test_per_feature_sigma_resumes_and_other_stds_are_refused(tmp_path):
    stds = np.linspace(0.2, 0.4, 12)
    whole = hcrfast.bound(relu_mlp(), batch(), stds, **kw("dense"))
    hcrfast.bound(relu_mlp(), batch(), stds, checkpoint=tmp_path, **kw("dense"))
    again = hcrfast.bound(relu_mlp(), batch(), stds, checkpoint=tmp_path, **kw("dense"))
    assert again.params["checkpoint"]["examples_read_back"] == 7
    assert_same(again, whole)
    np.testing.assert_array_equal(again.z, whole.z)
    with pytest.raises(CheckpointMismatchError, match="model: "):
        hcrfast.bound(relu_mlp(), batch(), stds * 1.01, checkpoint=tmp_path, **kw("dense"))


class HalfBlind(torch.nn.Module):
    """Rows whose first pixel is negative give features that ignore the input (J = 0 there: their
    restarts' ε is 0 and bounds nothing); the other rows are a steep tanh layer, whose D overflows
    at a large step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 12).double()

    def forward(self, x):
        flat = x.flatten(1)
        seen = (flat[:, :1] >= 0).to(flat.dtype)
        return torch.tanh(self.lin(flat * seen))


def test_a_resumed_call_warns_and_explains_as_the_uninterrupted_one(tmp_path, monkeypatch):
    """The zero-step and overflow warnings count the chunks read back too (they used to count only
    the ones computed by the call, so a resumed run fell silent on them)."""
    x = batch(6, seed=4)
    x[:, 0, 0, 0] = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0])  # rows 1 and 4 blind
    call = dict(iterations=2, restarts=3, size=0.01, chunk_size=2, solver="dense")

    def warned(**extra):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = hcrfast.bound(HalfBlind().eval(), x, 0.5, **call, **extra)
        return res, sorted(str(w.message) for w in caught)

    whole, messages = warned()
    assert any(m.startswith("6 restarts found J = 0") for m in messages)  # 2 blind rows × 3 restarts
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        hcrfast.bound(HalfBlind().eval(), x, 0.5, checkpoint=tmp_path, **call)  # rows 0..3 saved, 1 blind
    crash_after(monkeypatch, None)
    again, messages_again = warned(checkpoint=tmp_path)
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert messages_again == messages
    assert again.params["zero_step_reasons"] == whole.params["zero_step_reasons"]

    # A step of 2e4 σ: D overflows for every seeing row's restarts, read back or not.
    big = dict(call, size=2e4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hcrfast.bound(HalfBlind().eval(), x, 0.01, checkpoint=tmp_path / "big", **big)
    first = sorted(str(w.message) for w in caught if "overflowed" in str(w.message))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = hcrfast.bound(HalfBlind().eval(), x, 0.01, checkpoint=tmp_path / "big", **big)
    assert res.params["checkpoint"]["examples_read_back"] == 6
    assert sorted(str(w.message) for w in caught if "overflowed" in str(w.message)) == first != []


def test_a_finished_call_removes_what_killed_writers_left(tmp_path):
    import subprocess
    import sys

    hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path, **kw("dense"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID no process holds now
    stale = tmp_path / f".chunk_000000002_000000004.npz.{dead.pid}.tmp"
    live = tmp_path / f".chunk_000000002_000000004.npz.{os.getppid()}.tmp"  # a live writer's: kept
    for f in (stale, live):
        f.write_bytes(b"PK\x03\x04 half written")
    hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path, **kw("dense"))
    assert not stale.exists() and live.exists()


class Biased(torch.nn.Module):
    """W x + b in float64, with b of order 1e4: at σ = 1e-12 the steps' feature shifts are at or below
    float64's resolution of the features."""

    def __init__(self, W, b):
        super().__init__()
        self.W, self.b = torch.as_tensor(W), torch.as_tensor(b)

    def forward(self, x):
        return x.flatten(1) @ self.W.T + self.b


def test_rounding_warnings_count_every_chunk_once_read_back_or_not(tmp_path, monkeypatch):
    """The warnings of steps that float64's rounding decided, Algorithm 1's and the targeted ones, come
    once per call and count every chunk, those read back from a checkpoint included: a resumed call
    warns as the uninterrupted one. (The targeted ones came once per chunk, and not at all for the
    chunks read back.) Every targeted step they count bounds nothing: the counts are the zero bounds."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((24, 20))
    model = Biased(W, 1e4 * rng.standard_normal(24)).eval()
    x = torch.as_tensor(rng.standard_normal((5, 1, 4, 5)))
    modes = [0, 7]
    call = dict(iterations=2, restarts=2, basis="pixel", solver="dense", targets=modes, chunk_size=2)

    def warned(**extra):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = hcrfast.bound(model, x, 1e-12, **call, **extra)
        return res, sorted(str(w.message) for w in caught)

    whole, messages = warned()
    targeted = [m for m in messages if "targeted steps" in m]
    kinds = [m.split(" ", 1)[1][:40] for m in targeted]
    assert targeted and len(kinds) == len(set(kinds))  # one warning of each kind for the call
    zeros = int((whole.targeted.std.reshape(5, -1)[:, modes] == 0).sum())
    assert sum(int(m.split()[0]) for m in targeted if "bound nothing" in m) == zeros > 2  # beyond one chunk's
    assert whole.targeted.rounding["rounded"] + whole.targeted.rounding["coarse"] == zeros
    assert f"{zeros} targeted steps bound nothing (0)" in whole.targeted.summary()

    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        hcrfast.bound(model, x, 1e-12, checkpoint=tmp_path, **call)  # rows 0..3 saved
    crash_after(monkeypatch, None)
    again, messages_again = warned(checkpoint=tmp_path)
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert messages_again == messages and again.targeted.rounding == whole.targeted.rounding

    # targeted_bound alone, in pieces of one example (its chunk_size counts example x mode rows)
    alone = dict(targets=modes, basis="pixel", method="dense", chunk_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tb = hcrfast.targeted_bound(model, x, 1e-12, **alone)
    first = sorted(str(w.message) for w in caught if "targeted steps" in str(w.message))
    assert [m.split(" ", 1)[1] for m in first] == [m.split(" ", 1)[1] for m in targeted]
    assert sum(int(m.split()[0]) for m in first if "bound nothing" in m) == int((tb.std.reshape(5, -1)[:, modes] == 0).sum())
    from hcrfast import targeted as targeted_module
    real, done = targeted_module._targeted_piece, []

    def piece(*args, **kwargs):
        if len(done) == 3:
            raise Crash
        done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(targeted_module, "_targeted_piece", piece)
    with pytest.raises(Crash), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hcrfast.targeted_bound(model, x, 1e-12, checkpoint=tmp_path / "t", **alone)
    monkeypatch.setattr(targeted_module, "_targeted_piece", real)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = hcrfast.targeted_bound(model, x, 1e-12, checkpoint=tmp_path / "t", **alone)
    assert resumed.params["checkpoint"]["examples_read_back"] == 3
    assert sorted(str(w.message) for w in caught if "targeted steps" in str(w.message)) == first


def test_krylov_chunks_written_before_passes_were_counted_read_back_with_the_needed_products(tmp_path):
    """A chunk file without ``passes`` (written before the rows riding along were counted) still resumes:
    its examples count the products their bases needed, 2 (steps + redone) + 1, and the rest of the
    Krylov params are unchanged."""
    model, x = relu_mlp(), batch()
    whole = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("krylov"))
    k = whole.params["krylov"]
    assert k["products_per_example"] > k["products_needed_per_example"]   # some rode along in their chunk
    for path in (tmp_path / "ck").glob("chunk_*.npz"):
        with np.load(path) as z:
            arrays = {name: z[name] for name in z.files if name != "passes"}
        np.savez(path, **arrays)
    again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("krylov"))
    assert again.params["checkpoint"]["examples_read_back"] == 7
    np.testing.assert_array_equal(again.std, whole.std)
    got = again.params["krylov"]
    assert got["products_per_example"] == got["products_needed_per_example"] == k["products_needed_per_example"]
    assert {key: v for key, v in got.items() if not key.startswith("products")} == \
        {key: v for key, v in k.items() if not key.startswith("products")}


def test_one_foreign_chunk_is_refused_with_the_fix_that_keeps_the_other_chunks(tmp_path):
    """Another call's chunk copied over one of this call's was refused, naming it, with one fix: delete the whole
    folder, finished chunks included. Moving that one file out is the fix that keeps them: the call then computes
    its rows again and reads the others back, to the bounds of an uninterrupted call."""
    x = batch(6)
    kw = dict(restarts=2, iterations=2, chunk_size=2)
    whole = hcrfast.bound(tanh_mlp(), x, 0.5, **kw)
    hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path / "mine", **kw)
    hcrfast.bound(tanh_mlp(), x, 0.3, checkpoint=tmp_path / "other", **kw)
    name = "chunk_000000002_000000004.npz"
    (tmp_path / "mine" / name).write_bytes((tmp_path / "other" / name).read_bytes())
    with pytest.raises(CheckpointMismatchError, match=rf"{name} was written by another call.*move that one file out "
                                                      rf"of the folder, and this call computes its examples again"):
        hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path / "mine", **kw)
    (tmp_path / "mine" / name).rename(tmp_path / name)
    again = hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path / "mine", **kw)
    assert again.params["checkpoint"]["examples_read_back"] == 4
    np.testing.assert_array_equal(again.std, whole.std)
    # chunk 0:2's file renamed to rows 2:4: its example ids are not this call's there
    (tmp_path / "mine" / name).unlink()
    (tmp_path / "mine" / "chunk_000000000_000000002.npz").rename(tmp_path / "mine" / name)
    with pytest.raises(CheckpointMismatchError, match=r"does not have there; move that one file out of the folder"):
        hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path / "mine", **kw)


def test_a_chunk_written_by_another_call_is_refused_whatever_key_json_says(tmp_path):
    """Each chunk file holds its call's key (a hash): with key.json removed (a partial copy, or deleted to get
    past a mismatch) the chunks of a call at sigma 0.5 were read back as a call's at 0.05, whose bounds are
    10x lower. Now refused; a folder whose key.json is gone and whose chunks hold no key is refused too."""
    from hcrfast.checkpoint import Checkpoint

    x = batch(4)
    kw = dict(restarts=2, iterations=2, chunk_size=2)
    hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw)
    (tmp_path / "key.json").unlink()
    (tmp_path / "features.npy").unlink()
    with pytest.raises(CheckpointMismatchError, match=r"chunk_000000000_000000002.npz was written by another call"):
        hcrfast.bound(tanh_mlp(), x, 0.05, checkpoint=tmp_path, seed=7, **kw)
    (tmp_path / "key.json").unlink()                # the refused call wrote its own
    again = hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw)   # the call that made them: read back
    assert again.params["checkpoint"]["examples_read_back"] == 4
    Checkpoint(tmp_path / "old", {"k": 1}, np.arange(2))
    np.savez(tmp_path / "old" / "chunk_000000000_000000002.npz", example_ids=np.arange(2), value=np.zeros(2))
    old = Checkpoint(tmp_path / "old", {"k": 1}, np.arange(2))   # a later call finds its key.json
    assert len(old.finished()) == 1                 # a chunk from before keys per chunk, under its key.json: read
    (tmp_path / "old" / "key.json").unlink()
    with pytest.raises(CheckpointMismatchError, match=r"holds no key of its own .*cannot be checked"):
        Checkpoint(tmp_path / "old", {"k": 2}, np.arange(2)).finished()


def test_a_chunk_file_without_its_arrays_is_computed_again(tmp_path):
    """A chunk that is a valid npz but lacks arrays (rewritten by hand, or by another tool) is set aside and its
    examples computed again, as an unreadable one is; it raised a bare KeyError: 'std'."""
    x = batch(4)
    kw = dict(restarts=2, iterations=2, chunk_size=2)
    whole = hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw)
    path = tmp_path / "chunk_000000002_000000004.npz"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "std"}
    np.savez(path, **arrays)
    with pytest.warns(UserWarning, match=r"chunk_000000002_000000004.npz lacks the arrays std; computing"):
        again = hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw)
    assert again == whole and again.params["checkpoint"]["examples_read_back"] == 2


def test_a_folder_that_cannot_be_written_is_refused_before_a_chunk_is_computed(tmp_path, monkeypatch):
    """A read-only checkpoint with examples left: refused before any is computed (the error named the
    temporary file, after a whole chunk's work); one that holds every chunk is still read."""
    from hcrfast import checkpoint

    x = batch(4)
    kw = dict(restarts=2, iterations=2, chunk_size=2)
    whole = hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw)
    real = os.open

    def read_only(path, flags, *args, **kwargs):   # (the folder made read-only: root ignores chmod)
        if pathlib.Path(path).parent == tmp_path and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw) == whole     # nothing left to write
    (tmp_path / "chunk_000000002_000000004.npz").unlink()
    computed = []
    monkeypatch.setattr(checkpoint.Checkpoint, "save", lambda self, *a, **k: computed.append(a))
    with pytest.raises(PermissionError, match=r"the folder cannot be written \(Permission denied\), and this call "
                                              r"has examples left to compute"):
        hcrfast.bound(tanh_mlp(), x, 0.5, checkpoint=tmp_path, **kw)
    assert computed == []


@pytest.mark.parametrize("old", ["hcrfast.bound checkpoint/4", "hcrfast.bound checkpoint/5",
                                 "hcrfast.bound checkpoint/6"])
def test_chunks_from_before_outward_rounding_are_refused(tmp_path, monkeypatch, old):
    """Chunks written before bounds were rounded outward (checkpoint/4), or before D was taken past float64's
    rounding of the passes (/5), hold bounds an ulp or a few (at σ tiny or steps huge, far more) above their
    step's exact one; a resume merged them silently with fresh ones. Chunks of /6 may be from before the dense
    rank rule changed (2026-11-30, no bump then), their rows up to 30x off the new ones. The format in the key is
    now /7, so such a folder is refused by name, as the 2026-11-25 guards' folders were."""
    model, x = relu_mlp(), batch()
    monkeypatch.setattr(algorithm, "CHECKPOINT_FORMAT", old)
    hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("dense"))
    monkeypatch.undo()
    with pytest.raises(CheckpointMismatchError, match=rf"another version of hcrfast \(format: {old} -> "):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "ck", **kw("dense"))


def test_targeted_pieces_from_before_the_dense_rank_rule_are_refused(tmp_path, monkeypatch):
    """targeted_bound's checkpoint/6 pieces may be from before the dense rank rule changed (2026-11-30, no bump
    then): a resume mixed their rows with new ones. Its format is now /7, and such a folder is refused."""
    from hcrfast import targeted

    model, x = tanh_mlp(), batch(B=2)
    old = "hcrfast.targeted_bound checkpoint/6"
    monkeypatch.setattr(targeted, "CHECKPOINT_FORMAT", old)
    hcrfast.targeted_bound(model, x, 0.3, targets=[0, 1], method="dense", checkpoint=tmp_path)
    monkeypatch.undo()
    with pytest.raises(CheckpointMismatchError, match=rf"another version of hcrfast \(format: {old} -> "):
        hcrfast.targeted_bound(model, x, 0.3, targets=[0, 1], method="dense", checkpoint=tmp_path)


def test_chunks_after_an_out_of_memory_halving_record_the_size_they_were_computed_in(tmp_path, monkeypatch):
    """A chunk that runs out of memory is halved and the call goes on in smaller chunks; the files recorded
    the size first planned, so a resume in chunks of that size mixed the two with no warning (its results
    matched neither uninterrupted run, 1e-3 apart). Each file now records the size it was computed in, and
    such a resume says its results agree to rounding only."""
    model, x = relu_mlp(), batch(B=8)
    args = dict(iterations=2, restarts=3, size=0.01, solver="lsqr", lsqr=FAST, chunk_size=4)
    real_is_oom, real_nonfinite = algorithm._is_oom, algorithm._nonfinite_derivative

    class FakeOOM(RuntimeError):
        pass

    def nonfinite(m, rows):
        if len(rows) > 2:
            raise FakeOOM("CUDA out of memory (simulated)")
        return real_nonfinite(m, rows)

    with monkeypatch.context() as mp:
        mp.setattr(algorithm, "_is_oom", lambda exc: isinstance(exc, FakeOOM) or real_is_oom(exc))
        mp.setattr(algorithm, "_nonfinite_derivative", nonfinite)
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **args)
    files = sorted(tmp_path.glob("chunk_*.npz"))
    assert len(files) == 4 and all(int(np.load(f)["chunk_size"]) == 2 for f in files)
    for f in files[2:]:   # a crash lost the last two
        f.unlink()
    with pytest.warns(UserWarning, match=r"chunks of different sizes \(2, 4 examples\)"):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **args)


def test_a_chunk_size_above_the_call_is_recorded_as_the_call(tmp_path):
    """An automatic chunk size (tens of thousands of examples) over a call of 7 computes one chunk of 7: that
    is its size, and a resume in chunks of 2 names 7, not the size no chunk had."""
    model, x = relu_mlp(), batch()
    hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **dict(kw("dense"), chunk_size=50_000))
    assert [int(np.load(f)["chunk_size"]) for f in tmp_path.glob("chunk_*.npz")] == [7]


def test_a_chunk_file_holding_one_npy_array_is_set_aside_not_a_crash(tmp_path):
    """``np.load`` reads an ``.npy`` payload as a plain array, which has no ``.files``: a chunk file that held
    one crashed the resume with a TypeError; it is now set aside and its examples computed again, as any other
    unreadable chunk file, and no file handle is left open."""
    model, x = relu_mlp(), batch(B=4)
    first = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    victim = sorted(tmp_path.glob("chunk_*.npz"))[0]
    with open(victim, "wb") as fh:
        np.save(fh, np.zeros(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    said = [str(w.message) for w in caught]
    assert any("is unreadable (not an .npz archive of arrays)" in m for m in said), said
    assert not any(issubclass(w.category, ResourceWarning) for w in caught)
    assert_same(again, first)


def test_an_unreadable_features_file_names_the_way_out(tmp_path):
    """A damaged features.npy was refused with "make the same call to resume it", which fails again the same
    way; the message now says to delete that file (the call writes it again) or the folder."""
    model, x = relu_mlp(), batch(B=4)
    hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    (tmp_path / "features.npy").write_bytes(b"")
    with pytest.raises(CheckpointMismatchError, match=r"features.npy is unreadable .*Delete that file"):
        hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    (tmp_path / "features.npy").unlink()
    hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))


def test_a_chunk_computed_again_in_a_gap_records_the_rows_it_was_computed_with(tmp_path):
    """A chunk of 2 examples set aside and computed again by a call in chunks of 3 is computed with those 2
    rows alone, as the first call did: bitwise the same, so no "chunks of different sizes" warning (it said
    (2, 3) before); a call's short last chunk keeps the size it was planned in."""
    model, x = relu_mlp(), batch(B=5)
    first = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **kw("dense"))
    victim = tmp_path / "chunk_000000000_000000002.npz"
    with open(victim, "wb") as fh:
        np.save(fh, np.arange(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = hcrfast.bound(model, x, 0.3, checkpoint=tmp_path, **dict(kw("dense"), chunk_size=3))
    said = [str(w.message) for w in caught]
    assert not any("chunks of different sizes" in m for m in said), said
    assert_same(again, first)
    assert int(np.load(tmp_path / "chunk_000000004_000000005.npz")["chunk_size"]) == 2


def test_a_folder_of_another_kind_of_call_is_refused_as_that(tmp_path):
    """A hcrfast.bound checkpoint folder given to gauss_newton_attack was refused with ~20 differences of the
    two calls' keys (iterates: 'all' -> 'last', ...) and "Make the same call ... to resume it", though no
    attack call can resume it. Every pair of the three kinds of checkpointed call now says which kind the
    folder holds and to pass another folder."""
    model, x = relu_mlp(), batch(B=2)
    calls = {
        "bound": lambda ck: hcrfast.bound(model, x, 0.3, checkpoint=ck, iterations=1, restarts=1),
        "targeted_bound": lambda ck: hcrfast.targeted_bound(model, x, 0.3, targets=[0, 1], checkpoint=ck),
        "gauss_newton_attack": lambda ck: hcrfast.gauss_newton_attack(model, x, 0.3, draws=2, steps=1,
                                                                      checkpoint=ck),
    }
    for first, make in calls.items():
        make(tmp_path / first)
        for second, other in calls.items():
            if second == first:
                continue
            with pytest.raises(CheckpointMismatchError) as exc:
                other(tmp_path / first)
            said = str(exc.value)
            assert said == (f"{tmp_path / first} holds an hcrfast.{first} checkpoint, which no hcrfast.{second} "
                            f"call can resume; pass another checkpoint folder for this hcrfast.{second} call (or "
                            f"delete {tmp_path / first} to start anew)"), said
        make(tmp_path / first)   # the refusals left the folder to its own call, which still resumes it


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    """The temporary name .NAME.PID.tmp is predictable: a link planted there was followed (the file it named
    overwritten, and NAME left a link to it). It is now created exclusively, never through a link; a regular
    file there (left by a killed process that had this PID) is replaced."""
    from hcrfast.checkpoint import atomic_write_bytes

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "d"
    folder.mkdir()
    tmp = folder / f".b.npz.{os.getpid()}.tmp"
    os.symlink(victim, tmp)
    with pytest.raises(FileExistsError, match=f"cannot write {re.escape(str(folder / 'b.npz'))}: its temporary "
                                              f"name .* is taken .*; remove it"):
        atomic_write_bytes(folder / "b.npz", lambda fh: fh.write(b"new"))
    assert victim.read_text() == "precious" and not os.path.lexists(folder / "b.npz") and tmp.is_symlink()
    tmp.unlink()
    tmp.write_bytes(b"left by a killed writer")
    atomic_write_bytes(folder / "b.npz", lambda fh: fh.write(b"new"))
    assert (folder / "b.npz").read_bytes() == b"new" and sorted(p.name for p in folder.iterdir()) == ["b.npz"]


def test_a_call_that_fails_before_its_first_chunk_takes_back_the_key_it_wrote(tmp_path, monkeypatch):
    """bound(size=1e30) in float32 overflows after writing key.json and features.npy: the corrected call was
    refused ("holds work made with other arguments (size: 1e+30 -> 0.005)") for work the folder never held.
    Now a call that wrote the key takes it back when it fails before any chunk; a key that was there before,
    or one with chunks beside it, stays."""
    model, x = relu_mlp().float(), batch(B=3).float()
    small = dict(iterations=2, restarts=2)
    with pytest.raises(ValueError, match="float32 cannot hold"):
        hcrfast.bound(model, x, 0.1, size=1e30, checkpoint=tmp_path / "made", **small)
    assert not (tmp_path / "made").exists()   # made by the failed call: taken back whole
    (tmp_path / "given").mkdir()
    with pytest.raises(ValueError, match="float32 cannot hold"):
        hcrfast.bound(model, x, 0.1, size=1e30, checkpoint=tmp_path / "given", **small)
    assert list((tmp_path / "given").iterdir()) == []   # given by the user: emptied, kept
    good = hcrfast.bound(model, x, 0.1, size=0.005, checkpoint=tmp_path / "given", **small)
    assert good.params["checkpoint"]["examples_read_back"] == 0

    # a failure after a chunk keeps everything; so does one on a folder whose key was there before
    ck, ck_kw = tmp_path / "chunked", kw("dense")
    crash_after(monkeypatch, 1)
    with pytest.raises(Crash):
        hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=ck, **ck_kw)
    assert sorted(p.name for p in ck.iterdir()) == ["chunk_000000000_000000002.npz", "features.npy", "key.json"]
    (ck / "chunk_000000000_000000002.npz").unlink()
    crash_after(monkeypatch, 0)
    with pytest.raises(Crash):
        hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=ck, **ck_kw)
    assert sorted(p.name for p in ck.iterdir()) == ["features.npy", "key.json"]


def test_a_first_save_that_fails_takes_back_the_key_as_a_failure_before_it_does(tmp_path, monkeypatch):
    """The call counted as having saved a chunk from the start of its first save: a full disk (or an interrupt)
    there left key.json and features.npy in a folder with no chunk, and the corrected call (another sigma) was
    refused for work the folder never held. The save counts once its file is there."""
    import errno

    from hcrfast import checkpoint

    real = checkpoint.atomic_savez

    def full(path, **kwargs):
        if pathlib.Path(path).name.startswith("chunk_"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(checkpoint, "atomic_savez", full)
    with pytest.raises(OSError, match="No space left on device"):
        hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path / "full", **kw("dense"))
    assert not (tmp_path / "full").exists()
    monkeypatch.setattr(checkpoint, "atomic_savez", real)
    got = hcrfast.bound(relu_mlp(), batch(), 0.35, checkpoint=tmp_path / "full", **kw("dense"))
    np.testing.assert_array_equal(got.std, hcrfast.bound(relu_mlp(), batch(), 0.35, **kw("dense")).std)


@pytest.mark.parametrize("entry", ["targeted_bound", "gauss_newton_attack"])
def test_the_other_checkpointed_calls_take_back_their_key_too(entry, tmp_path, monkeypatch):
    from hcrfast import attack, targeted

    model, x = relu_mlp(), batch(B=2)
    calls = {"targeted_bound": lambda ck, s: hcrfast.targeted_bound(model, x, s, targets=[0, 1], checkpoint=ck),
             "gauss_newton_attack": lambda ck, s: hcrfast.gauss_newton_attack(model, x, s, draws=2, steps=1,
                                                                              checkpoint=ck)}
    where = {"targeted_bound": (targeted, "_targeted_piece"), "gauss_newton_attack": (attack, "_gauss_newton")}[entry]

    def crash(*args, **kwargs):
        raise Crash

    with monkeypatch.context() as m:
        m.setattr(*where, crash)
        with pytest.raises(Crash):
            calls[entry](tmp_path / "ck", 0.3)
    assert not (tmp_path / "ck").exists()
    calls[entry](tmp_path / "ck", 0.31)   # another sigma: not refused for the failed call's
    assert (tmp_path / "ck" / "key.json").is_file()


@pytest.mark.parametrize("text", ["null", '"abc"', "[1, 2]", "3"])
def test_a_key_json_that_is_not_an_object_is_refused_as_unreadable(text, tmp_path):
    """Valid JSON that is not an object raised TypeError ('NoneType' object is not iterable, '<' not supported)
    or AttributeError from inside the key check."""
    hcrfast.bound(relu_mlp(), batch(B=2), 0.3, checkpoint=tmp_path, iterations=1, restarts=1)
    (tmp_path / "key.json").write_text(text)
    with pytest.raises(CheckpointMismatchError, match=f"{re.escape(str(tmp_path / 'key.json'))} is unreadable "
                                                      f"\\(it holds the JSON .*, not an object of entries\\); "
                                                      f"delete {re.escape(str(tmp_path))}"):
        hcrfast.bound(relu_mlp(), batch(B=2), 0.3, checkpoint=tmp_path, iterations=1, restarts=1)


def at_home(tmp_path, monkeypatch):
    """``(home, work)``: two fresh folders under ``tmp_path``, $HOME the first and the working directory the second
    (a path with ``~`` must land in the first, nothing in the second)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home, work


def test_a_checkpoint_under_the_home_folder_is_written_there(tmp_path, monkeypatch):
    """checkpoint='~/ck' made a folder named '~' in the current directory."""
    home, work = at_home(tmp_path, monkeypatch)
    res = hcrfast.bound(relu_mlp(), batch(B=2), 0.3, checkpoint="~/ck", iterations=1, restarts=1)
    assert (home / "ck" / "key.json").is_file() and list(work.iterdir()) == []
    assert res.params["checkpoint"]["path"] == str(home / "ck")
    again = hcrfast.targeted_bound(relu_mlp(), batch(B=2), 0.3, targets=[0], checkpoint="~/t")
    assert (home / "t" / "key.json").is_file() and list(work.iterdir()) == []
    assert again.params["checkpoint"]["path"] == str(home / "t")


def test_an_internal_file_become_a_folder_names_the_checkpoint_folder_and_a_full_disk_the_chunk(tmp_path,
                                                                                                 monkeypatch):
    """A folder at key.json or features.npy said "pass the path of a file (a name inside ...)", a path the
    user never passed; a full disk while a chunk was written said only "[Errno 28] No space left on device"."""
    import errno

    (tmp_path / "features.npy").mkdir()
    with pytest.raises(IsADirectoryError) as exc:
        hcrfast.bound(relu_mlp(), batch(B=2), 0.3, checkpoint=tmp_path, iterations=1, restarts=1)
    assert str(exc.value) == (f"cannot write {tmp_path / 'features.npy'}: a folder is there, where hcrfast keeps a "
                              f"file of {tmp_path}; remove that folder, or pass another folder than {tmp_path}")
    (tmp_path / "features.npy").rmdir()

    real = os.fsync

    def full_for_chunks(fd):
        if ".chunk_" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell a chunk's write from the key's")
    monkeypatch.setattr(os, "fsync", full_for_chunks)
    with pytest.raises(OSError) as exc:
        hcrfast.bound(relu_mlp(), batch(B=2), 0.3, checkpoint=tmp_path / "full", iterations=1, restarts=1)
    assert exc.value.errno == errno.ENOSPC
    assert str(exc.value) == (f"[Errno 28] cannot write {tmp_path / 'full' / 'chunk_000000000_000000002.npz'} "
                              f"({os.strerror(errno.ENOSPC)})")
    # the first chunk's save failed: the folder the call made is taken back whole, no temporary file left in it
    assert not (tmp_path / "full").exists()


def test_a_finished_call_removes_every_temporary_file_killed_writers_left(tmp_path):
    """tidy() removed only .chunk_*.tmp: a process killed while writing key.json or probing the folder left
    .key.json.PID.tmp or .write_probe.PID.tmp for good."""
    import subprocess
    import sys

    hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path, **kw("dense"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID no process holds now
    names = (".key.json", ".features.npy", ".write_probe", ".chunk_000000002_000000004.npz")
    stale = [tmp_path / f"{name}.{dead.pid}.tmp" for name in names]
    live = [tmp_path / f"{name}.{os.getppid()}.tmp" for name in names]   # a live writer's: kept
    other = tmp_path / f".notes.{dead.pid}.tmp"   # not a name hcrfast writes: kept
    for f in stale + live + [other]:
        f.write_bytes(b"half written")
    hcrfast.bound(relu_mlp(), batch(), 0.3, checkpoint=tmp_path, **kw("dense"))
    assert not any(f.exists() for f in stale) and all(f.exists() for f in live) and other.exists()


# ----------------------------------------------------------------------------------------
# The numbers a chunk holds, pinned to the format that names them

#: The singular values of the diagonal linear map pinned below (exactly those of its J: a diagonal J's SVD is exact).
#: 1e-15 lies between the dense solve's rank cut sqrt(8)·eps64 = 6.3e-16 and the max(8, 8)·eps64 = 1.8e-15 of before
#: 2026-11-30, which dropped it (rank 6, its mode's bound 0); 1e-17 lies below both.
PINNED_SINGULAR_VALUES = (1.0, 0.25, 1e-2, 1e-4, 1e-8, 1e-12, 1e-15, 1e-17)


def pinned_diagonal():
    model = torch.nn.Linear(8, 8, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.diag(torch.tensor(PINNED_SINGULAR_VALUES, dtype=torch.float64)))
    return model.eval()


def pinned_tanh():
    rng = np.random.default_rng(3)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh(),
                                torch.nn.Linear(20, 12)).double()
    with torch.no_grad():
        for layer in (model[1], model[3]):
            layer.weight.copy_(torch.as_tensor(rng.standard_normal(tuple(layer.weight.shape))
                                               / np.sqrt(layer.weight.shape[1])))
            layer.bias.copy_(torch.as_tensor(0.1 * rng.standard_normal(tuple(layer.bias.shape))))
    return model.eval()


def pinned_calls():
    """The std of the pinned calls (dense solve, float64), by name."""
    x8 = torch.as_tensor(np.random.default_rng(0).standard_normal((2, 8)))
    x44 = torch.as_tensor(np.random.default_rng(1).standard_normal((2, 1, 4, 4)))
    args = dict(restarts=2, iterations=2, size=0.01, seed=0, solver="dense")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the 1e-12 and 1e-15 modes' steps are near float64's rounding: said)
        diagonal = hcrfast.bound(pinned_diagonal(), x8, 1e-3, basis="pixel", **args)
        return {"bound, diagonal": np.asarray(diagonal.std),
                "bound, tanh": np.asarray(hcrfast.bound(pinned_tanh(), x44, 0.05, basis="dct", **args).std),
                "targeted_bound, diagonal": np.asarray(hcrfast.targeted_bound(
                    pinned_diagonal(), x8, 1e-3, targets=list(range(8)), basis="pixel", method="dense").std),
                "rank": diagonal.params["dense"]["rank_min"]}


#: The formats whose code computed PINNED: pinned_calls()'s std at 12 digits (2026-12-01; the same on 1 and 2
#: threads).
PINNED_FORMATS = ("hcrfast.bound checkpoint/7", "hcrfast.targeted_bound checkpoint/8", 7)
PINNED = {
    "bound, diagonal": [
        [0.000999975000059, 0.00399990000037, 0.0999975000102, 9.99975000104,
         99997.5000104, 999968294.055, 263319438767, 0],
        [0.000999974999854, 0.00399989999997, 0.0999975000102, 9.99975000104,
         99997.5000104, 999968294.055, 263319438767, 0],
    ],
    "bound, tanh": [
        [0.083085429197, 0.243588376792, 0.0986629617942, 0.0871569039803,
         0.136627120428, 0.160532188962, 0.184622584915, 0.232924905531,
         0.210863598262, 0.107340116571, 0.306396012944, 0.184939378283,
         0.0838504596605, 0.208041862062, 0.178330432457, 0.166855870883],
        [0.236182539038, 0.217242368049, 0.11772287805, 0.254305066054,
         0.250203376262, 0.0975399274039, 0.182669998252, 0.261807870599,
         0.157559878384, 0.258530997198, 0.666331745211, 0.262504937832,
         0.174742764475, 0.174778420913, 0.281519403364, 0.163092060411],
    ],
    "targeted_bound, diagonal": [
        [0.000999993749917, 0.00399997499993, 0.0999993750002, 9.99993750006,
         99999.3750006, 999987044.083, 263390614057, 71210178296.5],
        [0.000999993749506, 0.00399997499913, 0.0999993750002, 9.99993750006,
         99999.3750006, 999987044.083, 263390614057, 20422068921.7],
    ],
}


def test_the_numbers_a_chunk_holds_are_those_of_their_format():
    """A guard: the numbers of three small fixed float64 problems (dense solve, fixed seed), computed by the code
    that wrote PINNED_FORMATS, which a resume mixes with its own. The dense rank rule changed on 2026-11-30
    (max(n, p)·eps -> sqrt(max(n, p))·eps) without a bump of "hcrfast.bound checkpoint/6", and a /6 folder written
    before resumed silently, its rows from the old rule beside new ones (bounds up to 30x apart).

    If this fails, the numbers changed: bump hcrfast.checkpoint.FORMAT (and hcrfast.targeted.CHECKPOINT_FORMAT,
    hcrfast.reproduce._FORMAT), saying why beside it, and store the new numbers here with the new formats. It sees
    changes above 1e-9 (relative: other machines' BLAS and libm round otherwise); one below (an ulp-level rounding
    change, as /5's and /6's were) bumps them all the same, by hand."""
    from hcrfast import reproduce, targeted
    from hcrfast.checkpoint import FORMAT

    assert (FORMAT, targeted.CHECKPOINT_FORMAT, reproduce._FORMAT) == PINNED_FORMATS
    got = pinned_calls()
    # the oracle of the rank: the exact singular values above sqrt(8)·eps64 of the largest
    assert got.pop("rank") == sum(s > np.sqrt(8) * np.finfo(np.float64).eps for s in PINNED_SINGULAR_VALUES) == 7
    for name, want in PINNED.items():
        np.testing.assert_allclose(got[name], np.reshape(want, got[name].shape), rtol=1e-9, atol=0, err_msg=name)
    # honest numbers of a linear model: no bound above its exact least-squares std σ/s (Cramér–Rao)
    for name in ("bound, diagonal", "targeted_bound, diagonal"):
        assert np.all(got[name] <= 1e-3 / np.array(PINNED_SINGULAR_VALUES)), name


# ----------------------------------------------------------------------------------------
# A folder written by another version of hcrfast

_ABSENT = object()


def _as_another_version(folder, fmt, *, drop=()):
    """``folder``'s key.json as another version of hcrfast wrote it: its ``format`` ``fmt`` (none where _ABSENT),
    and without the entries of ``drop`` (an older one did not record them)."""
    path = folder / "key.json"
    stored = json.loads(path.read_text())
    for name in drop:
        stored.pop(name, None)
    stored.pop("format")
    if fmt is not _ABSENT:
        stored["format"] = fmt
    path.write_text(json.dumps(stored))
    return path.read_text()


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
@pytest.mark.parametrize("fmt, said", [("older", None), ("newer", None), (None, "None"), (7, "7"),
                                       (_ABSENT, "(absent)")], ids=["older", "newer", "null", "7", "absent"])
def test_a_folder_of_another_version_is_refused_as_that_not_as_other_arguments(tmp_path, entry, fmt, said):
    """A folder written by an older hcrfast (checkpoint/4 of 2026-11-26, say) was refused as "work made with other
    arguments (format: ...; iterates: 'last' -> 'all'; singular_steps: 0 -> ...). Make the same call (same model,
    batch, sigma and arguments) to resume it": the defaults that version did not record read as arguments the
    user changed, and no call of this version can resume it. It now says which versions, and the fix."""
    from hcrfast import attack, checkpoint, targeted

    model, x = relu_mlp(), batch(B=2)
    current = {"bound": checkpoint.FORMAT, "targeted_bound": targeted.CHECKPOINT_FORMAT,
               "gauss_newton_attack": attack.CHECKPOINT_FORMAT}[entry]
    call = {
        "bound": lambda ck: hcrfast.bound(model, x, 0.3, checkpoint=ck, iterations=1, restarts=1),
        "targeted_bound": lambda ck: hcrfast.targeted_bound(model, x, 0.3, targets=[0, 1], checkpoint=ck),
        "gauss_newton_attack": lambda ck: hcrfast.gauss_newton_attack(model, x, 0.3, draws=2, steps=1, checkpoint=ck),
    }[entry]
    folder = tmp_path / "ck"
    call(folder)
    kind, number = current.rsplit("/", 1)
    if fmt in ("older", "newer"):
        fmt = f"{kind}/{int(number) - 1 if fmt == 'older' else int(number) + 1}"
        said = fmt
    written = _as_another_version(folder, fmt, drop=checkpoint.ABSENT_MEANS)
    with pytest.raises(CheckpointMismatchError) as exc:
        call(folder)
    assert str(exc.value) == (f"{folder} holds work written by another version of hcrfast (format: {said} -> "
                              f"{current}), whose chunks this version does not mix with its own; pass another "
                              f"checkpoint folder (or delete {folder}) to start anew"), str(exc.value)
    assert (folder / "key.json").read_text() == written   # left as it was
    call(tmp_path / "new")   # the fix it names


CLI_MODEL = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(12, 16, generator=g) / 4)

    def forward(self, x):
        return torch.tanh(x.flatten(1) @ self.a.T)
"""


@pytest.mark.parametrize("sweep", [False, True], ids=["plain", "sweep"])
def test_the_command_line_says_so_for_the_shell(tmp_path, capsys, sweep):
    """`hcrfast bound --out OLD` (and --sweep) on a folder of another version: the refusal names the versions and
    the fix for the shell (another --out, or delete the folder that holds the old work: OUT/chunks, or OUT for a
    sweep, whose every sigma's folder is old), not "Make the same command to resume it"."""
    from hcrfast import checkpoint, cli

    (tmp_path / "net.py").write_text(CLI_MODEL)
    torch.save(torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1)), tmp_path / "x.pt")
    out = tmp_path / "run"

    def argv(out):
        return ["bound", f"{tmp_path / 'net.py'}:Net", str(tmp_path / "x.pt"), "--restarts", "1", "--iterations", "1",
                "--threads", str(torch.get_num_threads()), "--no-progress", "--no-report", "--out", str(out),
                *(["--sweep", "1,2"] if sweep else [])]

    assert cli.main(argv(out)) == 0
    folders = sorted((out / "sweep_chunks").iterdir()) if sweep else [out / "chunks"]
    old = checkpoint.FORMAT.rsplit("/", 1)[0] + "/6"
    for folder in folders:
        _as_another_version(folder, old, drop=checkpoint.ABSENT_MEANS)
    capsys.readouterr()
    assert cli.main(argv(out)) == 2
    err = capsys.readouterr().err
    assert (f"{folders[0]} holds work written by another version of hcrfast (format: {old} -> {checkpoint.FORMAT}), "
            f"whose chunks this version does not mix with its own; pass another --out (or delete "
            f"{out if sweep else out / 'chunks'}) to start anew") in err, err
    assert "to resume it" not in err and "checkpoint folder" not in err and "iterates" not in err
    assert cli.main(argv(tmp_path / "new")) == 0   # the fix it names


class Doubles(torch.nn.Module):
    """relu_mlp, whose features double once ``doubled`` is set (a cache filled, a schedule, during a call): its
    fingerprint (class and state_dict) is the same whatever ``doubled``, so its calls share a checkpoint folder."""

    def __init__(self):
        super().__init__()
        self.net, self.doubled = relu_mlp(), False
        self.eval()

    def forward(self, x):
        return self.net(x) * (2.0 if self.doubled else 1.0)


def doubles_after_saving(monkeypatch, model, chunks=1):
    """Set ``model.doubled`` once this process has saved ``chunks`` chunks: the chunks after are of the doubled
    function, those before of the net."""
    from hcrfast import checkpoint

    real, saved = checkpoint.Checkpoint.save, []

    def save(self, start, stop, **arrays):
        real(self, start, stop, **arrays)
        saved.append((start, stop))
        model.doubled = len(saved) >= chunks

    monkeypatch.setattr(checkpoint.Checkpoint, "save", save)


def test_a_call_refused_for_a_model_that_changed_removes_its_chunks_and_keeps_the_earlier_calls(tmp_path,
                                                                                               monkeypatch):
    """A call whose model changed itself after saving some chunks is refused (algorithm._StillTheSameFunction),
    now before the next chunk's save. Its chunks used to stay in the folder, and the same call made again read them
    all back (nothing left to compute, so nothing checked) and returned bounds of two functions. The refused call
    now removes the chunks it saved, and the key it wrote where no chunk is left; an earlier call's chunks stay, and
    the fixed model's resume gives the uninterrupted bounds bitwise."""
    x, folder = batch(), tmp_path / "ck"
    whole = hcrfast.bound(Doubles(), x, 0.3, **kw("dense"))   # chunks of 2: (0, 2) (2, 4) (4, 6) (6, 7)

    # into a new folder: doubled after (0, 2) is saved, refused before (2, 4) is; (0, 2) goes, and the key it
    # wrote with it: the folder is as before
    model = Doubles()
    doubles_after_saving(monkeypatch, model)
    with pytest.raises(ValueError, match=r"changed during this call: before examples 2\.\.3 were saved") as refused:
        hcrfast.bound(model, x, 0.3, checkpoint=folder, **kw("dense"))
    assert not folder.exists()
    assert (f"the 1 chunk file this call saved in {folder}, of more than one function, was removed: the same call "
            f"made again computes it afresh (with the key this call wrote: the folder is as it was before the "
            f"call)") in str(refused.value)

    # doubled after its last chunk is saved: no chunk of it is of the doubled function, and the check before that
    # save was the call's last forward, so the call returns the net's bounds (no second check at its end)
    model = Doubles()
    doubles_after_saving(monkeypatch, model, chunks=4)
    assert_same(hcrfast.bound(model, x, 0.3, checkpoint=tmp_path / "last", **kw("dense")), whole)
    assert model.doubled

    # after an earlier call killed at its third chunk: that call's two chunks (of the net) stay, this call's go
    monkeypatch.undo()
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        hcrfast.bound(Doubles(), x, 0.3, checkpoint=folder, **kw("dense"))
    monkeypatch.undo()
    earlier = sorted(p.name for p in folder.iterdir())
    assert earlier == ["chunk_000000000_000000002.npz", "chunk_000000002_000000004.npz", "features.npy", "key.json"]
    model = Doubles()
    doubles_after_saving(monkeypatch, model)   # (4, 6) of the net saved, then (6, 7) of the doubled net refused
    with pytest.raises(ValueError, match="changed during this call") as refused:
        hcrfast.bound(model, x, 0.3, checkpoint=folder, **kw("dense"))
    assert sorted(p.name for p in folder.iterdir()) == earlier
    assert re.search(r"the 1 chunk file this call saved in .*, of more than one function, was removed: .*; the "
                     r"2 chunk files of earlier calls there are kept \(each call since 2026-12-01 checks its model "
                     r"before each chunk it saves; an older one checked it at its end only", str(refused.value)), str(refused.value)
    monkeypatch.undo()

    # the same call made again, its model fixed now: it reads the earlier call's chunks back, computes the rest
    again = hcrfast.bound(Doubles(), x, 0.3, checkpoint=folder, **kw("dense"))
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert_same(again, whole)


class Killed(BaseException):
    """The process ended mid-call (a KeyboardInterrupt, a job's time limit): no ``except Exception`` sees it."""


class SwitchesAt(torch.nn.Module):
    """relu_mlp, whose features double from its forward ``switch + 1`` on (a call counter: a cache filled, a
    schedule), and whose forward ``kill + 1`` ends the call (:class:`Killed`)."""

    def __init__(self, switch=10**9, kill=10**9):
        super().__init__()
        self.net, self.calls, self.switch, self.kill = relu_mlp(), 0, switch, kill
        self.eval()

    def forward(self, x):
        self.calls += 1
        if self.calls > self.kill:
            raise Killed
        return self.net(x) * (2.0 if self.calls > self.switch else 1.0)


@pytest.mark.parametrize("entry", ["bound", "targeted"])
def test_a_chunk_computed_after_the_model_changed_is_never_saved_even_in_a_call_killed_before_its_end(entry, tmp_path,
                                                                                                     monkeypatch):
    """A model that changed itself during a checkpointed call was checked once, at the call's end: a call killed
    between the change and that check left in the folder the chunks computed after the change, of the changed
    function, and the same call made again read them back as bounds. The model is now checked before each chunk's
    save: here it doubles its features from the first forward of the second chunk (2, 4) on and the call is killed
    at the first forward after that chunk would have been saved; the call is refused before the save, and it
    removes the chunk (0, 2) it saved before: no chunk of this call is left."""
    from hcrfast import checkpoint

    x = batch()   # chunks (pieces) of 2: (0, 2) (2, 4) (4, 6) (6, 7)

    def call(model, folder):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if entry == "targeted":
                return hcrfast.targeted_bound(model, x, 0.3, targets=[0, 3, 5], size=0.01, method="dense",
                                              chunk_size=6, checkpoint=folder)   # 6 rows: 2 examples x 3 modes
            return hcrfast.bound(model, x, 0.3, checkpoint=folder, **kw("dense"))

    # the forwards a fixed model has run at each save: the switch and the kill are placed by them
    real, at_save = checkpoint.Checkpoint.save, []
    probe = SwitchesAt()

    def save(self, start, stop, **arrays):
        real(self, start, stop, **arrays)
        at_save.append(((start, stop), probe.calls))

    monkeypatch.setattr(checkpoint.Checkpoint, "save", save)
    call(probe, tmp_path / "probe")
    monkeypatch.undo()
    assert [chunk for chunk, _ in at_save] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    first, second = at_save[0][1], at_save[1][1]

    folder = tmp_path / "ck"
    model = SwitchesAt(switch=first, kill=second)
    try:
        call(model, folder)
    except BaseException as exc:   # noqa: BLE001 - Killed is what the call did before
        ended = exc
    else:
        raise AssertionError("the call returned")
    on_disk = sorted(f.name for f in folder.glob("chunk_*")) if folder.exists() else []
    assert "chunk_000000002_000000004.npz" not in on_disk, f"the changed function's chunk was saved: {on_disk}"
    assert isinstance(ended, ValueError), repr(ended)
    assert re.search(r"changed during this call: before examples 2\.\.3 were saved, .* the 1 chunk file this call "
                     r"saved in .*, of more than one function, was removed", str(ended)), str(ended)
    assert model.calls <= second   # (refused before the kill)
    assert on_disk == [] and not folder.exists()   # (the key it wrote taken back with its chunk)


SWITCH_SCRIPT = """
import os, sys
import torch
sys.path.insert(0, {tests!r})
import hcrfast
from hcrfast import checkpoint
from test_checkpoint import Doubles, batch, kw

torch.set_num_threads(1)
model = Doubles()
if os.environ["RANK"] == "1":   # rank 1's model doubles its features once it has saved its first piece
    real = checkpoint.Checkpoint.save

    def save(self, *args, **kwargs):
        real(self, *args, **kwargs)
        model.doubled = True
    checkpoint.Checkpoint.save = save
try:
    hcrfast.bound(model, batch(), 0.3, checkpoint={ck!r}, shard=True, **kw("dense"))
except Exception as exc:
    print("%s: %s" % (type(exc).__name__, exc))
"""


def test_sharded_processes_stop_when_one_is_refused_for_a_model_that_changed_and_it_removes_its_own_chunks(tmp_path):
    """shard=True: rank 1's model changes after its first piece, so rank 1 is refused before its second piece's
    save and removes the piece it saved (rank 0's stay, and so does the key, under which rank 0 may be writing); rank 0 stops on
    rank 1's error, not waiting for it. The resumed call reads rank 0's pieces back and computes rank 1's afresh:
    the uninterrupted bounds, where rank 1's doubled piece used to be read back among them."""
    from pathlib import Path

    script = tmp_path / "switch.py"
    script.write_text(SWITCH_SCRIPT.format(tests=str(Path(__file__).parent), ck=str(tmp_path / "ck")))
    procs = _gloo_ranks(script)
    try:
        outs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], [err[-3000:] for _, err in outs]
    # pieces of 2: (0, 2) and (4, 6) for rank 0, (2, 4) and (6, 7) for rank 1
    assert sorted(p.name for p in (tmp_path / "ck").glob("chunk_*")) == ["chunk_000000000_000000002.npz",
                                                                        "chunk_000000004_000000006.npz"]
    refused = "ValueError: the features of the model that certifies the bounds changed during this call"
    assert re.search(rf"(?m)^{refused}: before example 6 was saved.* the 1 chunk file this call saved in .*, of "
                     rf"more than one function, was removed", outs[1][0]), outs[1]
    assert (f"ShardError: hcrfast.bound(shard=True) stopped on rank 0 because another process failed: rank 1: "
            f"{refused}") in outs[0][0], outs[0]
    whole = hcrfast.bound(Doubles(), batch(), 0.3, **kw("dense"))
    again = hcrfast.bound(Doubles(), batch(), 0.3, checkpoint=tmp_path / "ck", **kw("dense"))
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert_same(again, whole)


def test_a_process_that_never_joins_is_named_after_the_shard_timeout_not_waited_for(tmp_path):
    """The first sharded call creates the process group, whose creation waits for every process to join: one that
    never called (failed before, or skipped the call) was waited for 72 hours, HCRFAST_SHARD_TIMEOUT ignored."""
    import socket
    import subprocess
    import sys
    import time

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    script = tmp_path / "alone.py"
    script.write_text(
        "import sys, torch, hcrfast\n"
        "m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8)).eval()\n"
        "x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))\n"
        "try:\n"
        "    hcrfast.bound(m, x, 0.5, checkpoint=sys.argv[1], shard=True, restarts=2, iterations=2)\n"
        "except hcrfast.ShardError as exc:\n"
        "    print('ShardError:', exc)\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": "0",
           "LOCAL_RANK": "0", "HCRFAST_SHARD_TIMEOUT": "3"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ck")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert ("ShardError: rank 0 of 2: the other processes did not all join within 3 s" in done.stdout
            and "set HCRFAST_SHARD_TIMEOUT=SECONDS to wait longer" in done.stdout), done.stdout + done.stderr[-2000:]
    assert time.monotonic() - t0 < 60



_INTERRUPTED_WRITES = """
import gc, json, pathlib, sys
import numpy as np
from hcrfast.checkpoint import atomic_savez
folder = pathlib.Path(sys.argv[1])
arrays = {"std": np.arange(6.0), "reasons": np.array(["no restart bounded this mode" * 3] * 4)}
target = folder / "chunk.npz"
outcomes, left = {}, []
for n in range(1, 5000, 3):   # every third line: each kind of place is met, in a third of the time
    gc.collect()   # earlier attempts' half-written ZipFiles closed (their __del__) before the trace is set
    count = [0]
    def tracer(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename.replace("\\\\", "/")
            return tracer if name.endswith(("/zipfile.py", "/zipfile/__init__.py", "/format.py")) else None
        if event == "line":
            count[0] += 1
            if count[0] == n:
                raise KeyboardInterrupt
        return tracer
    sys.settrace(tracer)
    try:
        atomic_savez(target, **arrays)
        outcome = "written"
    except KeyboardInterrupt:
        outcome = "interrupted"
    except BaseException as exc:
        outcome = type(exc).__name__ + ": " + str(exc)[:80]
    finally:
        sys.settrace(None)
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if outcome == "written":
        break
    if list(folder.iterdir()):
        left.append(n)
with np.load(target) as got:
    same = all(np.array_equal(got[k], v) for k, v in arrays.items())
print(json.dumps({"outcomes": outcomes, "left": left[:5], "same": same}))
"""


def test_a_ctrl_c_anywhere_in_a_chunk_write_is_a_ctrl_c_and_leaves_no_file(tmp_path):
    """A Ctrl-C landing at each line of zipfile's and NumPy's writing code in turn (a trace function raises it
    there, in a fresh interpreter): where it landed while a member was opened or closed, ZipFile's close raised
    "Can't close the ZIP file while there is an open writing handle" over it, so the CLI printed a ValueError
    instead of "interrupted" and how to resume. Every interrupted write now raises the KeyboardInterrupt and
    leaves no file behind; the first attempt the trace does not reach writes the arrays."""
    import subprocess
    import sys

    folder = tmp_path / "out"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_WRITES, str(folder)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert set(got["outcomes"]) == {"interrupted", "written"}, got
    assert got["outcomes"]["interrupted"] > 50 and got["left"] == [] and got["same"], got
