"""``hcrfast.dithered_accuracy``: a head's accuracy on the dithered features, against the test's own loop.

The oracle is written here, one input and one draw at a time: example e's d-th noise vector is row d
of ``numpy.random.default_rng([seed, e, 0x64697468]).standard_normal((draws, n))`` times the std(s),
added to the features in float64; the head's argmax against the label.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import threading
import time

import numpy as np
import pytest
import torch

import hcrfast
from hcrfast.utility import accuracy_on_features


class Features(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(12, 20, generator=g, dtype=torch.float64) / 3)

    def forward(self, x):  # (B, 20) -> (B, 3, 4): features of any shape, the head flattens them
        return torch.tanh(x @ self.w.T).reshape(-1, 3, 4)


class Head(torch.nn.Module):
    def __init__(self, ignore=()):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.lin = torch.nn.Linear(12, 5, dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(5, 12, generator=g, dtype=torch.float64))
            self.lin.bias.copy_(torch.randn(5, generator=g, dtype=torch.float64) / 4)
            self.lin.weight[:, list(ignore)] = 0.0   # features the head never looks at

    def forward(self, f):
        return self.lin(f.flatten(1))


@pytest.fixture
def problem():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 20, generator=g, dtype=torch.float64)
    model, head = Features().eval(), Head().eval()
    with torch.no_grad():
        labels = head(model(x)).argmax(dim=1).numpy()
    labels[::4] = (labels[::4] + 1) % 5   # a quarter wrong: clean accuracy 0.75
    return model, head, x, labels


def _oracle_scores(model, head, x, sigma, draws, seed, score):
    """The test's own loop for any per-copy score: score(noisy output, clean output, e) one copy at a time."""
    with torch.no_grad():
        feats = model(x).double()
        flat = np.broadcast_to(np.asarray(sigma, dtype=np.float64).reshape(-1), (feats[0].numel(),))
        per_draw = np.zeros(draws)
        for e in range(len(x)):
            z = np.random.default_rng([seed, e, 0x64697468]).standard_normal((draws, feats[0].numel()))
            ref = (head(feats[e][None]) if head is not None else feats[e][None])[0]
            for d in range(draws):
                noisy = feats[e] + torch.from_numpy(flat * z[d]).reshape(feats[e].shape)
                out = (head(noisy[None]) if head is not None else noisy[None])[0]
                per_draw[d] += score(out, ref, e)
    return per_draw / len(x)


def _oracle(model, head, x, labels, sigma, draws, seed):
    """(clean accuracy, accuracy per draw): :func:`_oracle_scores` with the head's argmax against the label."""
    with torch.no_grad():
        clean = np.mean((head(model(x).double()).argmax(dim=1).numpy() == labels))
    return clean, _oracle_scores(model, head, x, sigma, draws, seed,
                                 lambda out, ref, e: int(out.argmax()) == labels[e])


@pytest.mark.parametrize("sigma", [0.05, 0.4, "profile"])
def test_matches_the_tests_own_loop(problem, sigma):
    model, head, x, labels = problem
    if sigma == "profile":
        sigma = np.linspace(0.01, 0.8, 12).reshape(3, 4)
    got = hcrfast.dithered_accuracy(model, head, x, labels, sigma, draws=7, seed=3)
    clean, per_draw = _oracle(model, head, x, labels, sigma, 7, 3)
    assert got.clean == clean == 0.75
    np.testing.assert_array_equal(got.per_draw, per_draw)
    assert got.dithered == round(per_draw.sum() * 40) / (40 * 7)   # the exact share of the 280 copies
    assert got.stderr == pytest.approx(per_draw.std(ddof=1) / np.sqrt(7))
    assert got.draws == 7 and got.examples == 40 and got.seed == 3
    if np.ndim(sigma):
        assert got.sigma is None and got.sigma_rms == pytest.approx(np.sqrt(np.mean(sigma ** 2)))
    else:
        assert got.sigma == got.sigma_rms == sigma
    assert got.dithered < got.clean      # the noise costs accuracy (0.4: a lot; 0.05: a little)
    assert f"clean {got.clean:.4f}" in got.summary()


def test_noise_only_where_the_head_does_not_look_costs_nothing(problem):
    """A per-feature profile is laid on the features in their order: huge noise on the features the head
    ignores, none elsewhere, leaves every prediction as it was."""
    model, _, x, labels = problem
    ignore = [0, 5, 11]
    head = Head(ignore).eval()
    sigma = np.zeros(12)
    sigma[ignore] = 1e3
    got = hcrfast.dithered_accuracy(model, head, x, labels, sigma, draws=4)
    assert np.all(got.per_draw == got.clean)
    shifted = np.zeros(12)
    shifted[[1, 6, 10]] = 1e3     # the same noise on features it does look at
    assert hcrfast.dithered_accuracy(model, head, x, labels, shifted, draws=4).dithered < got.clean


def test_no_noise_is_the_clean_accuracy_and_one_std_per_feature_alike_is_the_scalar(problem):
    model, head, x, labels = problem
    assert np.all(hcrfast.dithered_accuracy(model, head, x, labels, 0.0, draws=3).per_draw == 0.75)
    a = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=5, seed=1)
    b = hcrfast.dithered_accuracy(model, head, x, labels, np.full(12, 0.3), draws=5, seed=1)
    np.testing.assert_array_equal(a.per_draw, b.per_draw)
    assert b.sigma is None and a.sigma == 0.3


def test_chunks_of_draws_give_the_one_batch_answer(problem, monkeypatch):
    model, head, x, labels = problem
    whole = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=6)
    monkeypatch.setattr("hcrfast.utility._CHUNK_ENTRIES", 12 * 6 * 7)   # 7 inputs per head call
    np.testing.assert_array_equal(hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=6).per_draw,
                                  whole.per_draw)


class _WideHead(torch.nn.Module):
    """A head with a 64-wide hidden layer, recording the rows of each forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 64), torch.nn.Tanh(),
                                       torch.nn.Linear(64, 5)).double()
        self.rows = []

    def forward(self, f):
        self.rows.append(f.shape[0])
        return self.net(f)


def test_the_heads_forwards_on_the_noisy_copies_run_in_pieces_of_its_activations_on_a_cpu(problem, monkeypatch):
    """The head ran on every copy of a chunk at once (examples x draws rows, up to 2^24 feature values): a head
    with a hidden layer of 512 on 10 features, 170,000 inputs x 10 draws, peaked 7.1 GiB above its start (0.8 GiB
    in pieces: benchmarks/head_pieces.py). Its
    forwards on the copies now run in pieces of FORWARD_PIECE_BYTES of its largest activation per row (64 float64
    values here, counted in its clean forward), as bound's do, to the same accuracies."""
    from hcrfast import algorithm

    model, _, x, labels = problem
    head = _WideHead().eval()
    whole = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=6)
    assert max(head.rows) == 40 * 6   # (every copy at once: one chunk)
    head.rows.clear()
    monkeypatch.setattr(algorithm, "FORWARD_PIECE_BYTES", 7 * 64 * 8)
    got = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=6)
    # the clean forward (its first 16 rows measured, the other 24 in pieces of 6), the probes' few rows (4 twice,
    # then 1 each), and the 240 copies in 35 pieces of 6 or 7 rows
    assert head.rows[:11] == [16, 6, 6, 6, 6, 4, 4, 1, 1, 1, 1]
    assert sum(head.rows[11:]) == 40 * 6 and len(head.rows[11:]) == 35 and set(head.rows[11:]) == {6, 7}
    np.testing.assert_array_equal(got.per_draw, whole.per_draw)
    assert got.clean == whole.clean


def test_reproduce_draws_its_dithering_from_the_same_stream(problem):
    """hcrfast reproduce's dithered accuracy is this function's, draw for draw (one draw per restart)."""
    from hcrfast.reproduce import _accuracies

    model, head, x, labels = problem

    class Split:  # reproduce's model: features (flat) and a head
        pass

    zm = Split()
    zm.head = torch.nn.Sequential(torch.nn.Unflatten(1, (3, 4)), head).eval()
    with torch.no_grad():
        feats = model(x).flatten(1)
    clean, mean, per_draw = _accuracies(zm, feats, torch.as_tensor(labels), 0.4, seed=5, restarts=4)
    want_clean, want = _oracle(model, head, x, labels, 0.4, 4, 5)
    assert clean == want_clean and per_draw == want.tolist() and mean == pytest.approx(want.mean())


@pytest.mark.parametrize("change, words", [
    (dict(labels=np.zeros(39, dtype=int)), "labels have shape (39,); pass one class per input, shape (40,)"),
    (dict(labels=np.full(40, 5)), "labels hold class 5, but the head scores 5 classes (0..4)"),
    (dict(labels=np.full(40, -1)), "labels hold -1"),
    (dict(labels=np.full(40, 0.5)), "labels are float64; pass integer classes"),
    (dict(sigma=np.ones(5)), "sigma has 5 entries, shape (5,); the model returns 12 features of shape (3, 4)"),
    (dict(sigma=np.ones((4, 3))), "sigma has the shape (4, 3), but the model's features have the shape (3, 4)"),
    (dict(sigma=-1.0), "sigma must be finite and >= 0, got -1"),
    (dict(sigma=np.full(12, np.nan)), "12 entries are not"),
    (dict(draws=0), "draws=0: pass a positive integer"),
    (dict(seed=-2), "seed=-2: pass an integer >= 0"),
    (dict(head=3), "head=int: pass a callable that reads the features (a torch.nn.Module, or a function"),
    (dict(head=torch.nn.Flatten(0)), "the head returned (480,) for 40 feature vectors"),
    (dict(head=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 1, dtype=torch.float64))),
     "the head scores 1 class"),
])
def test_bad_input_is_named_with_its_fix(problem, change, words):
    model, head, x, labels = problem
    kwargs = dict(head=head, labels=labels, sigma=0.1, draws=2, seed=0) | change
    if isinstance(kwargs["head"], torch.nn.Module):
        kwargs["head"].eval()
    with pytest.raises((ValueError, TypeError)) as info:
        hcrfast.dithered_accuracy(model, kwargs.pop("head"), x, kwargs.pop("labels"), kwargs.pop("sigma"), **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("metric", ["accuracy", "top2"])
def test_a_metric_of_classes_without_labels_says_it_needs_them_or_the_cosine(problem, metric):
    # (np.asarray(None) is an object array: the message was "labels are object; pass integer classes")
    model, head, x, _ = problem
    words = (f"labels=None, but metric={metric!r} needs labels: pass integer classes, one per input, shape (40,); "
             f"or metric='cosine', which needs no labels")
    with pytest.raises(ValueError) as info:
        hcrfast.dithered_accuracy(model, head, x, None, 0.5, metric=metric)
    assert str(info.value) == words
    with pytest.raises(ValueError) as info:
        hcrfast.sigma_for_accuracy(model, head, x, None, 0.5, metric=metric)
    assert str(info.value) == words
    # the fix it names runs
    assert hcrfast.dithered_accuracy(model, head, x, None, 0.5, metric="cosine", draws=2).metric == "cosine"


def test_an_empty_or_non_tensor_batch_is_refused_before_the_model_runs(problem):
    model, head, x, labels = problem
    with pytest.raises(ValueError, match=r"batch is empty \(shape \(0, "):
        hcrfast.dithered_accuracy(model, head, x[:0], labels[:0], 0.1)
    with pytest.raises(ValueError, match="batch is empty"):
        hcrfast.sigma_for_accuracy(model, head, x[:0], labels[:0], 0.5)
    with pytest.raises(TypeError, match="batch must be a torch.Tensor.*got ndarray; convert with torch.as_tensor"):
        hcrfast.dithered_accuracy(model, head, x.numpy(), labels, 0.1)


def _correct_per_copy(model, head, x, labels, sigma, draws, seed):
    """(B, draws): whether the head's argmax on example e's d-th noisy copy is its label, e the row in x, drawn
    one copy at a time from the test's own stream (the oracle of :func:`_oracle`, kept per example)."""
    with torch.no_grad():
        feats = model(x).double()
        n = feats[0].numel()
        out = np.zeros((len(x), draws), dtype=bool)
        for e in range(len(x)):
            z = np.random.default_rng([seed, e, 0x64697468]).standard_normal((draws, n))
            for d in range(draws):
                noisy = feats[e] + torch.from_numpy(sigma * z[d]).reshape(feats[e].shape)
                out[e, d] = int(head(noisy[None])[0].argmax()) == labels[e]
    return out


def test_a_slice_with_its_example_ids_draws_what_the_whole_batch_draws_for_those_rows(problem):
    """example_ids: example e draws from default_rng([seed, e, ...]) with e its global index, as hcrfast.bound
    takes them. Each one-row slice's per_draw is that row's correctness per draw (0 or 1): it matches the whole
    batch's row, draw for draw; a ten-row slice's counts are those rows' counts. Without the ids the slice draws
    row 0's noise instead, which differs here."""
    model, head, x, labels = problem
    sigma, draws, seed = 0.4, 6, 3
    want = _correct_per_copy(model, head, x, labels, sigma, draws, seed)
    assert 0 < want[10:20].mean() < 1 and not np.array_equal(want[10:20], want[0:10])   # the test can tell
    for e in (0, 13, 39):
        one = hcrfast.dithered_accuracy(model, head, x[e:e + 1], labels[e:e + 1], sigma, draws=draws, seed=seed,
                                        example_ids=[e])
        np.testing.assert_array_equal(one.per_draw, want[e].astype(float))
    part = hcrfast.dithered_accuracy(model, head, x[10:20], labels[10:20], sigma, draws=draws, seed=seed,
                                     example_ids=range(10, 20))
    np.testing.assert_array_equal(np.round(part.per_draw * 10), want[10:20].sum(axis=0))
    assert part.dithered == want[10:20].sum() / (10 * draws) and part.examples == 10
    plain = hcrfast.dithered_accuracy(model, head, x[10:20], labels[10:20], sigma, draws=draws, seed=seed)
    assert not np.array_equal(np.round(plain.per_draw * 10), want[10:20].sum(axis=0))
    # recorded as Bounds records them in params["run"], in to_dict too, and left out of ==
    ids = np.arange(10, 20, dtype="<i8")
    assert part.run == {"example_ids": dict(count=10, first=10, last=19,
                                            sha256=hashlib.sha256(ids.tobytes()).hexdigest()[:16],
                                            ids=list(range(10, 20)))}
    assert json.loads(json.dumps(part.to_dict()))["run"] == part.run
    assert plain.run["example_ids"]["ids"] == list(range(10))
    with torch.no_grad():
        feats = model(x[10:20])
    again = accuracy_on_features(head, feats, labels[10:20], sigma, draws=draws, seed=seed,
                                 example_ids=np.arange(10, 20, dtype=np.int32))
    assert again == part and again.run == part.run
    search = hcrfast.sigma_for_accuracy(model, head, x[10:20], labels[10:20], 0.5, draws=draws, seed=seed,
                                        example_ids=range(10, 20))
    assert search.utility.run == part.run


@pytest.mark.parametrize("ids, error, words", [
    (range(9), ValueError, "example_ids must be 10 non-negative integers (one per example), got an array of shape "
                           "(9,)"),
    ([10] * 10, ValueError, "example_ids must be distinct"),
    ([-1] + list(range(9)), ValueError, "example_ids must be 10 non-negative integers"),
])
def test_bad_example_ids_are_refused_as_bound_refuses_them_before_the_model_runs(problem, ids, error, words):
    model, head, x, labels = problem
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(error) as info:
        hcrfast.dithered_accuracy(model, head, x[:10], labels[:10], 0.1, draws=2, example_ids=ids)
    assert words in str(info.value) and not calls
    with pytest.raises(error, match=re.escape(words)):
        hcrfast.bound(model, x[:10], 0.1, basis="pixel", restarts=1, iterations=1, example_ids=ids)
    with torch.no_grad():
        feats = model(x[:10])
    with pytest.raises(error, match=re.escape(words)):
        accuracy_on_features(head, feats, labels[:10], 0.1, draws=2, example_ids=ids)


def test_a_head_may_be_any_callable_as_a_model_may_be_in_bound(problem):
    """A function of the features (a lambda, functools.partial of F.linear) is a head, as bound takes any callable
    as its model: the same weights as a function and as the Module give the test's own loop's accuracies. A
    function that calls a Module in training mode runs it in eval mode (its dropout off), and gives the mode back."""
    model, head, x, labels = problem
    W, b = head.lin.weight.detach().clone(), head.lin.bias.detach().clone()
    clean, per_draw = _oracle(model, head, x, labels, 0.3, 5, 2)
    as_module = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=5, seed=2)
    for fn in (lambda f: f.flatten(1) @ W.T + b,
               functools.partial(lambda f, weight, bias: torch.nn.functional.linear(f.flatten(1), weight, bias),
                                 weight=W, bias=b)):
        got = hcrfast.dithered_accuracy(model, fn, x, labels, 0.3, draws=5, seed=2)
        assert got.clean == clean == 0.75
        np.testing.assert_array_equal(got.per_draw, per_draw)
        assert got == as_module
    dropped = torch.nn.Sequential(head, torch.nn.Dropout(0.9)).train()   # dropout would scramble the scores
    with pytest.warns(UserWarning, match="training mode"):
        got = hcrfast.dithered_accuracy(model, lambda f: dropped(f), x, labels, 0.3, draws=5, seed=2)
    np.testing.assert_array_equal(got.per_draw, per_draw)
    assert dropped.training and dropped[1].training


def test_a_head_in_training_mode_runs_in_eval_mode_and_is_told(problem):
    model, head, x, labels = problem
    head = torch.nn.Sequential(head, torch.nn.Dropout(0.9))   # dropout would scramble the scores
    with pytest.warns(UserWarning, match=r"the head was in training mode.*Call head.eval\(\)"):
        got = hcrfast.dithered_accuracy(model, head, x, labels, 0.0, draws=2)
    assert got.clean == 0.75 and head.training


def test_a_bool_among_the_stds_is_refused_as_sweep_sigma_refuses_it(problem):
    """NumPy makes [0.1, True] the stds 0.1 and 1.0: taken as a per-feature profile, where bound refuses a bool.
    dithered_accuracy and sweep_sigma now read their numbers by one rule (validation.real_array)."""
    model, head, x, labels = problem
    with torch.no_grad():
        n = model(x[:1]).numel()
    with pytest.raises(TypeError, match="pass the noise's std, a real number or one per feature"):
        hcrfast.dithered_accuracy(model, head, x, labels, [0.1] * (n - 1) + [True], draws=1)
    got = hcrfast.dithered_accuracy(model, head, x, labels, [0.1] * n, draws=1)
    assert got == hcrfast.dithered_accuracy(model, head, x, labels, np.full(n, 0.1), draws=1)


def test_accuracy_on_features_takes_features_already_computed(problem):
    model, head, x, labels = problem
    with torch.no_grad():
        feats = model(x)
    np.testing.assert_array_equal(accuracy_on_features(head, feats, labels, 0.2, draws=3).per_draw,
                                  hcrfast.dithered_accuracy(model, head, x, labels, 0.2, draws=3).per_draw)


def test_one_draw_is_printed_with_no_standard_error_never_plus_minus_0(problem):
    """One draw measures no spread: its ``stderr`` stays 0 (a number, so that summary.json stays strict JSON),
    but no summary may print it as a standard error, "± 0.0000"."""
    from hcrfast.report import _utility_paragraph

    model, head, x, labels = problem
    one = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=1)
    assert one.stderr == 0.0 and one.to_dict()["stderr"] == 0.0
    assert one.summary().endswith(f"(sigma 0.3, 1 draw each) {one.dithered:.4f} (1 draw: no standard error)")
    two = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=2)
    assert two.summary().endswith(f"(sigma 0.3, 2 draws each) {two.dithered:.4f} ± {two.stderr:.4f}")
    found = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.6, draws=1, rtol=0.1)
    assert found.history[0]["stderr"] == 0.0
    text = found.summary()
    assert "±" not in text and f"{found.utility.dithered:.4f} (1 draw: no standard error)" in text
    # the report's paragraph on the utility
    page = _utility_paragraph({"utility": one.to_dict(), "head": {"spec": "head.py:Head"}})
    assert "±" not in page and "1 noise draw per input" in page and "(one draw: no standard error)" in page
    page = _utility_paragraph({"utility": two.to_dict(), "head": {"spec": "head.py:Head"}})
    assert "2 noise draws per input" in page and "± " in page and "(standard error over the draws)" in page


# ---- hcrfast.sigma_for_accuracy: the most noise a utility target allows ----

@pytest.mark.parametrize("target, profile", [(0.6, False), (0.7, True)])
def test_the_sigma_found_keeps_the_accuracy_and_a_little_more_loses_it(problem, target, profile):
    """Checked with the test's own loop: at the sigma returned the head keeps the target, at the next sigma
    tried (within the bracket's 1 + rtol) it falls under it."""
    model, head, x, labels = problem
    sigma0 = np.linspace(0.1, 1.0, 12).reshape(3, 4) if profile else None
    found = hcrfast.sigma_for_accuracy(model, head, x, labels, target, sigma0=sigma0, draws=6, seed=4, rtol=0.02)
    assert found.above_scale is not None and found.scale < found.above_scale <= found.scale * 1.02
    unit = np.asarray(found.sigma0)
    _, at = _oracle(model, head, x, labels, found.scale * unit, 6, 4)
    _, above = _oracle(model, head, x, labels, found.above_scale * unit, 6, 4)
    assert at.mean() >= target > above.mean()
    assert found.utility.dithered == pytest.approx(at.mean()) and found.above.dithered == pytest.approx(above.mean())
    np.testing.assert_allclose(found.sigma, found.scale * unit, rtol=1e-15)
    if not profile:
        with torch.no_grad():
            assert found.sigma0 == pytest.approx(np.sqrt(np.mean(model(x).numpy() ** 2)), rel=1e-12)
    assert [h["scale"] for h in found.history][0] == 1.0 and "bracketed within rtol=0.02" in found.summary()


def test_a_head_that_ignores_the_features_lets_any_noise_through(problem):
    model, _, x, labels = problem
    head = Head(ignore=range(12)).eval()   # the bias alone decides: the same class for every input
    with torch.no_grad():
        labels = head(model(x)).argmax(dim=1).numpy()
    found = hcrfast.sigma_for_accuracy(model, head, x, labels, 1.0, draws=2)
    assert found.above is None and found.scale == hcrfast.utility.MAX_SCALE and "barely looks" in found.note



def _chance_problem():
    torch.manual_seed(0)
    x = torch.randn(40, 1, 4, 4)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.Tanh()).eval()
    head = torch.nn.Linear(24, 3).eval()
    with torch.no_grad():
        labels = head(model(x)).argmax(1)
    labels[:5] = (labels[:5] + 1) % 3
    return model, head, x, labels


def test_a_target_at_or_below_what_noise_alone_gives_is_warned_not_met_by_a_huge_sigma():
    """3 classes: the dithered accuracy falls from 0.875 to its floor, 0.35 on these draws (chance: 1/3), and
    keeps it at any larger sigma. A target of 0.34 returned 2^40 x sigma0 as "the largest sigma keeping it"
    and blamed the head; it is the floor that meets it."""
    model, head, x, labels = _chance_problem()
    with pytest.warns(RuntimeWarning, match="accuracy=0.34 is at or below what noise alone gives"):
        found = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.34)
    assert found.floor == 0.35 and found.above is None and found.scale < hcrfast.utility.MAX_SCALE
    assert found.utility.dithered == 0.35 and found.scale == 2048.0   # where the floor begins
    assert "no largest sigma" in found.summary() and "barely looks" not in found.note
    with torch.no_grad():
        feats = model(x)
    for k in (found.scale, hcrfast.utility.MAX_SCALE / 2):   # the floor holds from there on, to the end
        assert accuracy_on_features(head, feats, labels, k * found.sigma0).dithered == 0.35
    assert accuracy_on_features(head, feats, labels, found.scale / 2 * found.sigma0).dithered > 0.35
    # a target above the floor is limited by it: a crossing, and no warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        above = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.36)
    assert above.floor is None and above.above is not None and above.above.dithered < 0.36 <= above.utility.dithered


def test_a_gaussian_law_is_its_std_here_as_in_sigma_for_and_other_laws_are_refused_alike(problem):
    model, head, x, labels = problem
    plain = hcrfast.dithered_accuracy(model, head, x, labels, 0.5, draws=3)
    # (raised TypeError, while sigma_for took sigma0=hcrfast.Gaussian(0.5) as 0.5)
    assert hcrfast.dithered_accuracy(model, head, x, labels, hcrfast.Gaussian(0.5), draws=3) == plain
    found = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.6, sigma0=hcrfast.Gaussian(0.5), draws=3)
    assert found.sigma0 == 0.5 and found == hcrfast.sigma_for_accuracy(model, head, x, labels, 0.6, sigma0=0.5,
                                                                         draws=3)
    fix = "pass a float, one std per feature, or hcrfast.Gaussian(std)"
    with pytest.raises(TypeError, match=re.escape(fix)):
        hcrfast.dithered_accuracy(model, head, x, labels, hcrfast.Laplace(0.5), draws=3)
    with pytest.raises(TypeError, match=re.escape(fix)):
        hcrfast.sigma_for(model, x, 0.5, sigma0=hcrfast.Laplace(0.5), restarts=2, iterations=2)


@pytest.mark.parametrize("kwargs, words", [
    (dict(accuracy=0.9), "the head's clean accuracy on these inputs is 0.7500, under the target"),
    (dict(accuracy=0.0), "accuracy=0.0: pass the dithered accuracy to keep, a number in (0, 1]"),
    (dict(accuracy=1.5), "accuracy=1.5"),
    (dict(accuracy=0.5, rtol=0), "rtol=0: pass a positive number"),
    (dict(accuracy=0.5, sigma0=np.zeros(12)), "sigma0 must be positive and finite; 12 entries are not"),
    (dict(accuracy=0.5, sigma0=np.ones((4, 3))), "sigma0 has the shape (4, 3), but the model's features have"),
])
def test_a_bad_accuracy_search_is_named_with_its_fix(problem, kwargs, words):
    model, head, x, labels = problem
    accuracy = kwargs.pop("accuracy")
    with pytest.raises(ValueError) as info:
        hcrfast.sigma_for_accuracy(model, head, x, labels, accuracy, **kwargs)
    assert words in str(info.value)


# ---- other metrics: top-K accuracy, the cosine with the clean output, a callable ----

def test_top_k_accuracy_matches_the_tests_own_loop(problem):
    model, head, x, labels = problem
    got = hcrfast.dithered_accuracy(model, head, x, labels, 0.5, draws=5, seed=2, metric="top2")
    want = _oracle_scores(model, head, x, 0.5, 5, 2,
                          lambda out, ref, e: labels[e] in np.argsort(-out.numpy())[:2])
    np.testing.assert_array_equal(got.per_draw, want)
    with torch.no_grad():
        clean = np.mean([labels[e] in np.argsort(-row)[:2] for e, row in enumerate(head(model(x)).numpy())])
    assert got.metric == "top2" and got.clean == clean > 0.75   # some wrong labels are the clean runner-up
    top1 = hcrfast.dithered_accuracy(model, head, x, labels, 0.5, draws=5, seed=2)
    assert got.dithered > top1.dithered and "top-2 accuracy of the head" in got.summary()
    same = hcrfast.dithered_accuracy(model, head, x, labels, 0.5, draws=5, seed=2, metric="top1")
    np.testing.assert_array_equal(same.per_draw, top1.per_draw)
    assert same.metric == top1.metric == "accuracy"


@pytest.mark.parametrize("head_kind", ["none", "head"])
def test_the_cosine_with_the_clean_output_matches_the_tests_own_loop(problem, head_kind):
    model, head, x, _ = problem
    head = None if head_kind == "none" else head

    def cos(out, ref, e):
        a, b = out.numpy().ravel(), ref.numpy().ravel()
        return a @ b / (np.linalg.norm(a) * np.linalg.norm(b))

    sigma = np.linspace(0.05, 0.6, 12).reshape(3, 4)
    got = hcrfast.dithered_accuracy(model, head, x, None, sigma, draws=4, seed=1, metric="cosine")
    np.testing.assert_allclose(got.per_draw, _oracle_scores(model, head, x, sigma, 4, 1, cos), rtol=1e-12)
    assert got.metric == "cosine" and got.clean == pytest.approx(1.0, abs=1e-12)
    assert 0 < got.dithered < 1 and got.dithered == pytest.approx(got.per_draw.mean(), rel=1e-12)
    assert "cosine similarity of the noisy outputs with the clean ones" in got.summary()


def test_a_callable_metric_sees_each_copys_targets(problem):
    """A regression-style metric: the negative squared error of the noisy features against targets per input,
    which the callable receives row for row with the noisy copies."""
    model, _, x, _ = problem
    targets = torch.from_numpy(np.random.default_rng(7).standard_normal((40, 3, 4)))

    def neg_sq_error(outputs, rows):
        return -((outputs - rows) ** 2).flatten(1).sum(dim=1)

    got = hcrfast.dithered_accuracy(model, None, x, targets, 0.3, draws=3, seed=6, metric=neg_sq_error)
    want = _oracle_scores(model, None, x, 0.3, 3, 6,
                          lambda out, ref, e: -float(((out - targets[e]) ** 2).sum()))
    np.testing.assert_allclose(got.per_draw, want, rtol=1e-12)
    with torch.no_grad():
        assert got.clean == pytest.approx(-float(((model(x) - targets) ** 2).sum()) / 40, rel=1e-12)
    assert got.metric == "neg_sq_error()" and got.dithered < got.clean
    assert got.to_dict()["metric"] == "neg_sq_error()" and "neg_sq_error() (the mean per noisy copy)" in got.summary()


@pytest.mark.parametrize("metric, labels, words", [
    ("top0", "labels", "metric='top0': pass 'accuracy', 'topK'"),
    ("f1", "labels", "metric='f1'"),
    ("top5", "labels", "the head scores 5 classes; top-5 accuracy needs more than 5 (pass a smaller K)"),
    ("cosine", "labels", "labels given with metric='cosine'"),
    (lambda out, t: out.sum(), None, "returned () scores for 40 copies: it must return one finite score per copy"),
    (lambda out, t: torch.full((len(out),), float("nan")), None, "not all finite"),
    (lambda out, t: out[:, 0], np.zeros(39), "labels have shape (39,); pass one row per input, 40 rows"),
])
def test_a_bad_metric_is_named_with_its_fix(problem, metric, labels, words):
    model, head, x, y = problem
    with pytest.raises(ValueError) as info:
        hcrfast.dithered_accuracy(model, head, x, y if isinstance(labels, str) else labels, 0.1, draws=2,
                                  metric=metric)
    assert words in str(info.value)


def test_a_cosine_against_an_all_zero_clean_output_is_refused_naming_the_inputs(problem):
    """A ReLU head that zeroes some inputs' outputs: their cosine is undefined (torch's eps would make it 0
    even with no noise, and the clean cosine under 1), so they are named; the other inputs' clean cosine
    is 1."""
    model, _, x, _ = problem
    head = torch.nn.Sequential(torch.nn.Flatten(), _Shift(-0.9), torch.nn.ReLU()).eval()
    with torch.no_grad():
        zeroed = [e for e, f in enumerate(head(model(x))) if bool((f == 0).all())]
    assert 0 < len(zeroed) < 40
    with pytest.raises(ValueError, match=re.escape(f"the clean outputs of inputs {zeroed[:10]}")):
        hcrfast.dithered_accuracy(model, head, x, None, 0.1, metric="cosine")
    keep = [e for e in range(40) if e not in zeroed]
    got = hcrfast.dithered_accuracy(model, head, x[keep], None, 0.0, draws=2, metric="cosine")
    assert got.clean == pytest.approx(1.0, abs=1e-15) and np.allclose(got.per_draw, 1.0, atol=1e-15)


class _Shift(torch.nn.Module):
    def __init__(self, by):
        super().__init__()
        self.by = by

    def forward(self, f):
        return f + self.by


@pytest.mark.parametrize("metric, labels, words", [
    (lambda out, t: out[:, 0] - t, None, "the metric lambda() failed on outputs of shape (40, 5) and targets None "
                                         "(TypeError: unsupported operand"),
    (lambda out, t: None, None, "the metric lambda() returned NoneType"),
    (lambda out, t: out[:, 0].to(torch.complex128), None, "returned torch.complex128 scores: it must return real"),
    (lambda out, t: out[:, 0], np.array([object()] * 40), "labels of type ndarray are not numbers torch can hold"),
])
def test_a_failing_callable_metric_is_named_with_its_fix(problem, metric, labels, words):
    model, head, x, _ = problem
    with pytest.raises(ValueError) as info:
        hcrfast.dithered_accuracy(model, head, x, labels, 0.1, draws=2, metric=metric)
    assert words in str(info.value)
    if labels is None and "failed" in words:
        assert "pass the labels it needs as its targets (hcrfast bound: --labels)" in str(info.value)


def test_a_callable_named_as_a_built_in_metric_is_not_taken_for_it(problem):
    model, head, x, labels = problem

    def accuracy(out, t):
        return out[:, 0]

    got = hcrfast.dithered_accuracy(model, head, x, labels, 0.1, draws=2, metric=accuracy)
    assert got.metric == "accuracy()" and "accuracy() (the mean per noisy copy)" in got.summary()


def test_the_sigma_found_for_a_cosine_keeps_it_and_a_little_more_loses_it(problem):
    model, _, x, _ = problem

    def cos(out, ref, e):
        a, b = out.numpy().ravel(), ref.numpy().ravel()
        return a @ b / (np.linalg.norm(a) * np.linalg.norm(b))

    found = hcrfast.sigma_for_accuracy(model, None, x, None, 0.9, draws=5, seed=3, rtol=0.02, metric="cosine")
    assert found.above_scale is not None and found.scale < found.above_scale <= found.scale * 1.02
    at = _oracle_scores(model, None, x, found.sigma, 5, 3, cos).mean()
    above = _oracle_scores(model, None, x, found.above_scale * found.sigma0, 5, 3, cos).mean()
    assert at >= 0.9 > above
    assert "dithered cosine >= 0.9" in found.summary() and f"cosine {found.utility.dithered:.4f}" in found.summary()
    for bad in (-1, 0, 1):   # 1: no noise at all; 0: what pure noise gives
        with pytest.raises(ValueError, match=rf"accuracy={bad}: pass the dithered cosine to keep, a number in "
                                             r"\(0, 1\) \(1: no noise at all; 0: what pure noise gives\)"):
            hcrfast.sigma_for_accuracy(model, None, x, None, bad, metric="cosine")
    with pytest.raises(ValueError, match=r"accuracy=inf: pass the dithered f\(\) to keep, a finite number"):
        def f(out, t):
            return out[:, 0, 0]
        hcrfast.sigma_for_accuracy(model, None, x, None, float("inf"), metric=f)


class _Sqrt(torch.nn.Module):
    def forward(self, f):
        return f.sqrt()


@pytest.mark.parametrize("metric", ["accuracy", "top2", "cosine"])
def test_non_finite_head_outputs_are_refused_for_the_built_in_metrics(metric):
    """A head that is NaN on most noisy copies (sqrt of features that noise makes negative) was scored:
    argmax picked the NaN (accuracy 0.26 where ~80% of the copies were NaN), the cosine read it as 0. A
    callable's scores were checked; the built-in metrics' outputs now are too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softplus()).eval()
    x = torch.randn(50, 4)
    labels = None if metric == "cosine" else model(x).argmax(1).detach()
    with pytest.raises(ValueError, match=r"the head gave non-finite outputs \(NaN or inf\) for \d+ of 1000 noisy copies"):
        hcrfast.dithered_accuracy(model, _Sqrt().eval(), x, labels, 2.0, draws=20, metric=metric)
    feats = torch.rand(6, 4) + 0.5
    with pytest.raises(ValueError, match=r"non-finite outputs .* of 6 clean inputs"):
        accuracy_on_features(_NaNHead().eval(), feats, None if metric == "cosine" else feats.argmax(1) % 3, 0.1, draws=2,
                             metric=metric)


class _NaNHead(torch.nn.Module):
    def forward(self, f):
        out = f[:, :3].clone()
        out[0, 0] = float("nan")
        return out


@pytest.mark.parametrize("metric", ["accuracy", "cosine"])
def test_accuracy_on_features_refuses_non_finite_features(metric):
    """accuracy_on_features (public) took NaN features: accuracy 0.667, and the cosine said the NaN row was
    "all zero". Now refused, naming the inputs."""
    feats = torch.rand(6, 4) + 0.5
    feats[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"the features of inputs \[2\] are not finite"):
        accuracy_on_features(None, feats, None if metric == "cosine" else feats.nan_to_num().argmax(1), 0.1,
                             draws=2, metric=metric)


def test_utility_results_compare_by_value():
    """Utility and AccuracySearch hold a NumPy per_draw: == raised "truth value ... ambiguous". They compare
    by value now, as the other results do, and are unhashable like them."""
    torch.manual_seed(0)
    model, head = torch.nn.Linear(4, 5).eval(), torch.nn.Linear(5, 3).eval()
    x, y = torch.randn(6, 4), torch.zeros(6, dtype=torch.long)
    a = hcrfast.dithered_accuracy(model, head, x, y, 0.5, draws=3)
    assert a == hcrfast.dithered_accuracy(model, head, x, y, 0.5, draws=3)
    assert a != hcrfast.dithered_accuracy(model, head, x, y, 0.5, draws=3, seed=1)
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    labels = head(model(x)).argmax(1).detach()
    s = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, draws=3)
    assert s == hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, draws=3)


@pytest.mark.parametrize("sigma", ["0.5", True, ["0.1"] * 5, np.array([1 + 1j] * 5)])
def test_utility_refuses_what_is_not_a_real_std(sigma):
    """A string σ ("0.5"), a bool, strings per feature and complex values ran (NumPy parsed them); bound and
    the attack refuse them."""
    torch.manual_seed(0)
    model, head = torch.nn.Linear(4, 5).eval(), torch.nn.Linear(5, 3).eval()
    x, y = torch.randn(6, 4), torch.zeros(6, dtype=torch.long)
    with pytest.raises(TypeError, match=r"pass the noise's std, a real number or one per feature"):
        hcrfast.dithered_accuracy(model, head, x, y, sigma, draws=2)
    with pytest.raises(TypeError, match=r"sigma0=.*pass the noise's std"):
        hcrfast.sigma_for_accuracy(model, head, x, y, 0.1, sigma0=sigma, draws=2)


def test_accuracy_targets_may_be_one_number_tensors_and_the_clean_value_of_a_continuous_metric_is_named():
    """accuracy=torch.tensor(0.5) was refused as not a number in (0, 1]; a continuous metric's clean value as the
    target ran down to sigma 4.5e-13 x sigma0 and blamed the head ("unstable"): now said for what it is."""
    torch.manual_seed(0)
    model, head = torch.nn.Linear(4, 5).double().eval(), torch.nn.Linear(5, 2).double().eval()
    x, t = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    labels = head(model(x)).argmax(1).detach()
    a = hcrfast.sigma_for_accuracy(model, head, x, labels, torch.tensor(0.5), draws=3)
    assert a.target == 0.5 and a == hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, draws=3)

    def neg_sq_error(o, tt):
        return -((o - tt) ** 2).sum(1)

    clean = hcrfast.dithered_accuracy(model, head, x, t, 0.0, metric=neg_sq_error, draws=3).clean
    with pytest.raises(ValueError, match=r"is the head's clean neg_sq_error\(\) itself .* pass a target below"):
        hcrfast.sigma_for_accuracy(model, head, x, t, clean, metric=neg_sq_error, draws=3)


def test_sweep_tables_and_figure_give_one_draw_no_standard_error(tmp_path):
    """The sweep reports' tables printed "0.5000 ± 0.0000" for one noise draw, and the trade-off figure drew
    an error bar of 0: one draw measures no spread. Two draws keep their standard error."""
    import warnings

    from hcrfast import report

    one = {"clean": 0.75, "dithered": 0.5, "stderr": 0.0, "draws": 1}
    two = {"clean": 0.75, "dithered": 0.5, "stderr": 0.0125, "draws": 2}
    assert report._dithered_cell(one) == "0.5000 (1 draw: no s.e.)"
    assert report._dithered_cell(two) == "0.5000 ± 0.0125"
    levels = [{"std": {"q50": q}, "utility": u, "sigma_rms": q, "scale": q, "metric": "accuracy"}
              for q, u in ((0.5, one), (1.0, one))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report._tradeoff_figure(tmp_path / "t.png", levels)
    assert (tmp_path / "t.png").stat().st_size > 1000


def _small():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 4)).eval()
    return model, torch.nn.Linear(4, 3).eval(), torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("model, batch, error, words", [
    ("net", np.zeros((2, 1, 4, 4), dtype=np.float32), TypeError, "batch must be a torch.Tensor"),
    ("net", torch.zeros(0, 1, 4, 4), ValueError, "batch is empty"),
    ("net", torch.zeros(2, 1, 4, 4, dtype=torch.float64), TypeError,
     "the model's parameters are torch.float32 but the batch is torch.float64"),
    ("net", torch.zeros(2, 1, 4, 4, dtype=torch.bfloat16), TypeError,
     "the model's parameters are torch.float32 but the batch is torch.bfloat16"),
    ("net", torch.zeros(2, 1, 4, 4, dtype=torch.int32), TypeError, "batch must be a real floating-point tensor"),
    ("net", torch.zeros(16), ValueError, "batch must have a leading batch axis"),
    ("net", torch.full((2, 1, 4, 4), float("nan")), ValueError, r"batch contains NaN or inf in examples \[0, 1\]"),
    (None, torch.zeros(2, 1, 4, 4), TypeError, "model must be a torch.nn.Module"),
])
def test_the_model_and_batch_are_checked_as_bound_checks_them(model, batch, error, words):
    """dithered_accuracy and sigma_for_accuracy checked only that the batch was a non-empty tensor: a float64 or
    bfloat16 batch for a float32 model, an int or 1-D batch and model=None reached the model (torch's raw
    RuntimeError, IndexError, "'NoneType' object is not callable"). bound's messages now."""
    net, head, _ = _small()
    model = net if model == "net" else model
    labels = torch.tensor([0, 2])
    with pytest.raises(error, match=words):
        hcrfast.dithered_accuracy(model, head, batch, labels, 0.1, draws=2)
    with pytest.raises(error, match=words):
        hcrfast.sigma_for_accuracy(model, head, batch, labels, 0.3, draws=2)


def test_a_bfloat16_model_and_batch_still_run():
    """bound refuses bfloat16 for its solver's arrays; the dithering runs no solver, and took a bfloat16 model
    and batch before the checks: it still does, the features and noise in bfloat16."""
    net, head, x = _small()
    net, head, x = net.bfloat16(), head.bfloat16(), x.bfloat16()
    labels = head(net(x)).argmax(1).detach()
    got = hcrfast.dithered_accuracy(net, head, x, labels, 1e-3, draws=2)
    assert got.clean == 1.0 and got.examples == 2


@pytest.mark.parametrize("head", [None, "linear"])
def test_noise_past_the_features_dtype_is_named_not_blamed_on_the_head(head):
    """sigma = 1e39 on float32 features: the noise cast to float32 is inf, and the message said "the head gave
    non-finite outputs ... pass a head defined on every real input" (with no head at all, head=None): a fix
    that cannot work. It names sigma and the dtype now, and the float64 model that holds it."""
    net, lin, x = _small()
    with pytest.raises(ValueError, match=r"the noisy features overflow float32: with sigma = 1e\+39, .*largest value, "
                                         r"3\.40282e\+38.*pass a smaller sigma, or run the model and batch in float64"):
        hcrfast.dithered_accuracy(net, None if head is None else lin, x, None, 1e39, metric="cosine", draws=2)
    # float64 features hold it: the cosine of noise 1e39 with the clean output, finite
    net64 = net.double()
    got = hcrfast.dithered_accuracy(net64, None if head is None else lin.double(), x.double(), None, 1e39,
                                    metric="cosine", draws=2)
    assert abs(got.dithered) < 1


def test_a_search_that_doubles_sigma_past_the_features_dtype_says_where_and_why():
    """sigma_for_accuracy from sigma0 = 1e37 doubled sigma while the accuracy kept a target below chance, until
    the noise overflowed float32: the head was blamed ("non-finite outputs"). Now the search's own message: the
    scale it reached, the overflow, and fixes that apply (a target above chance, float64); and at sigma0 itself,
    a smaller sigma0."""
    net, head, x = _small()
    labels = head(net(x)).argmax(1).detach()
    with pytest.raises(ValueError, match=r"^sigma_for_accuracy: at 16 x sigma0, doubling sigma while the accuracy "
                                         r"kept the target 0\.1 \(it did up to 8 x sigma0\), the noisy features "
                                         r"overflow float32: with sigma = 1\.6e\+38.*pass a target above what noise "
                                         r"alone gives"):
        hcrfast.sigma_for_accuracy(net, head, x, labels, 0.1, sigma0=1e37, draws=2)
    with pytest.raises(ValueError, match=r"^sigma_for_accuracy: at sigma0, the first sigma it tries, the noisy "
                                         r"features overflow float32: with sigma = 1e\+39.*pass a smaller sigma0"):
        hcrfast.sigma_for_accuracy(net, head, x, labels, 0.1, sigma0=1e39, draws=2)


def test_one_std_per_feature_as_tensors_that_require_grad_is_taken_as_their_values():
    """A list of 0-d tensors that require grad raised torch's "Can't call numpy() on Tensor that requires grad";
    one such tensor is taken as its values (as bound takes it), and so is the list."""
    net, head, x = _small()
    stds = [0.125, 0.25, 0.375, 0.5]
    grads = [torch.tensor(s, requires_grad=True) for s in stds]
    labels = torch.tensor([0, 2])
    assert (hcrfast.dithered_accuracy(net, head, x, labels, grads, draws=3)
            == hcrfast.dithered_accuracy(net, head, x, labels, stds, draws=3))
    found = hcrfast.sigma_for_accuracy(net, None, x, None, 0.9, sigma0=grads, draws=3, metric="cosine")
    np.testing.assert_array_equal(found.sigma0, np.array(stds).reshape(found.sigma0.shape))



#: set by a forward in thread "B" (outside the module: its float64 deepcopy cannot copy an Event)
_B_RAN = threading.Event()


class _Gated(torch.nn.Module):
    """A dropout MLP (left in training mode) whose forwards in thread "A" wait until thread "B" has run one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh(),
                                       torch.nn.Dropout(0.5), torch.nn.Linear(12, 10))

    def forward(self, x):
        name = threading.current_thread().name
        if name == "A":
            _B_RAN.wait(timeout=2.0)   # B cannot run while A holds the one-call lock: A goes on after 2 s
        elif name == "B":
            _B_RAN.set()
        return self.net(x)


def test_dithered_accuracy_and_bound_on_one_model_in_two_threads_do_not_switch_its_mode_under_each_other():
    """dithered_accuracy switched the model to eval mode outside hcrfast's one-call lock: a bound() in another
    thread that started meanwhile found it in eval mode, and once dithered_accuracy restored training mode the
    bound's later forwards ran dropout (refused as random, or other bounds). Each waits for the other now."""
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 3])
    kw = dict(restarts=2, iterations=2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (training mode, said)
        alone_bound = hcrfast.bound(_Gated().train(), x, 0.3, **kw).std
        alone_acc = hcrfast.dithered_accuracy(_Gated().train(), None, x, labels, 0.3, draws=3).per_draw
        model = _Gated().train()
        got = {}
        _B_RAN.clear()

        def run(name, call):
            try:
                got[name] = call()
            except Exception as exc:   # (the thread's error, for the assertion below)
                got[name] = exc

        a = threading.Thread(name="A", target=run, args=("A", lambda: hcrfast.dithered_accuracy(
            model, None, x, labels, 0.3, draws=3).per_draw))
        b = threading.Thread(name="B", target=run, args=("B", lambda: hcrfast.bound(model, x, 0.3, **kw).std))
        a.start()
        time.sleep(0.2)   # A is inside its forward, in eval mode
        b.start()
        a.join()
        b.join()
    assert not isinstance(got["B"], Exception), got["B"]
    assert np.array_equal(got["B"], alone_bound) and np.array_equal(got["A"], alone_acc)
    assert model.training and model.net[3].training


class _CountsCalls(torch.nn.Module):
    """Features(), counting its calls in a buffer (in place)."""

    def __init__(self):
        super().__init__()
        self.features = Features()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return self.features(x)


def test_the_models_buffers_are_as_they_were_after_the_helpers_that_run_it():
    """dithered_accuracy, and sigma_for / sweep_sigma's own sigma0 (one number or one std per feature), run the model
    outside bound's entry point: they took its one-call lock and eval mode but did not give its buffers back, as
    bound does (a model counting its calls ended dithered_accuracy with 1 there, a sweep with 1: bound's own call
    gives back what it found on entry). A head's buffers too."""
    x = torch.rand(4, 20, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3])
    model, head = _CountsCalls().eval(), Head().eval()
    head.register_buffer("calls", torch.zeros((), dtype=torch.long))
    head.register_forward_pre_hook(lambda module, args: None if module.calls.add_(1) is None else None)
    got = hcrfast.dithered_accuracy(model, head, x, labels, 0.3, draws=3)
    want = hcrfast.dithered_accuracy(Features().eval(), Head().eval(), x, labels, 0.3, draws=3)
    np.testing.assert_array_equal(got.per_draw, want.per_draw)
    assert int(model.calls) == 0 and int(head.calls) == 0
    kw = dict(restarts=2, iterations=2, basis="pixel", solver="lsqr")   # (vmap refuses the counter)
    for sigma0 in (None, np.full(12, 0.2)):
        sweep = hcrfast.sweep_sigma(model, x, [1.0], sigma0=sigma0, **kw)
        assert int(model.calls) == 0
        want = hcrfast.sweep_sigma(Features().eval(), x, [1.0], sigma0=sigma0, **kw)
        np.testing.assert_array_equal(sweep.bounds[0].std, want.bounds[0].std)


@pytest.mark.parametrize("kwargs, words", [
    (dict(draws=2.0), "draws=2.0 (float): pass a positive integer (noisy copies per input)"),
    (dict(draws=True), "draws=True (bool): pass a positive integer"),
    (dict(draws="3"), "draws='3' (str): pass a positive integer"),
    (dict(seed=1.5), "seed=1.5 (float): pass an integer >= 0"),
    (dict(seed=True), "seed=True (bool): pass an integer >= 0"),
    (dict(rtol=True), "rtol=True (bool): pass a positive number"),   # (was read as 1)
    (dict(rtol="0.1"), "rtol='0.1' (str): pass a positive number"),
    (dict(accuracy=True), "accuracy=True (bool): pass the dithered accuracy to keep, a number in (0, 1]"),
    (dict(accuracy="0.5"), "accuracy='0.5' (str): pass the dithered accuracy to keep"),
])
def test_a_value_of_the_wrong_type_is_a_type_error_as_in_bound_and_the_attack(problem, kwargs, words):
    """draws=2.0 was a TypeError in gauss_newton_attack but a ValueError here; seed=1.5 and seed=True a TypeError in
    bound but a ValueError here. A wrong type is a TypeError now, a wrong value (draws=0, seed=-1) a ValueError."""
    model, head, x, labels = problem
    accuracy = kwargs.pop("accuracy", 0.5)
    with pytest.raises(TypeError) as info:
        hcrfast.sigma_for_accuracy(model, head, x, labels, accuracy, **kwargs)
    assert words in str(info.value)
    kwargs.pop("rtol", None)
    if kwargs:
        with pytest.raises(TypeError) as info:
            hcrfast.dithered_accuracy(model, head, x, labels, 0.1, **kwargs)
        assert words in str(info.value)
    # bound and the attack agree on the kind
    if "seed" in kwargs:
        with pytest.raises(TypeError):
            hcrfast.bound(model, x, 0.1, seed=kwargs["seed"], restarts=2, iterations=2)
    if "draws" in kwargs:
        with pytest.raises(TypeError):
            hcrfast.gauss_newton_attack(model, x, 0.1, draws=kwargs["draws"], steps=1)
    for wrong_value, said in ((dict(draws=0), "draws=0: pass a positive integer"),
                              (dict(seed=-1), "seed=-1: pass an integer >= 0")):
        with pytest.raises(ValueError, match=re.escape(said)):
            hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, **wrong_value)
        with pytest.raises(ValueError, match=re.escape(said)):
            hcrfast.dithered_accuracy(model, head, x, labels, 0.1, **wrong_value)


@pytest.mark.parametrize("sigma0, words", [
    (-1.0, "sigma0 must be positive and finite, got -1.0"),
    (0.0, "sigma0 must be positive and finite, got 0.0"),
    (float("nan"), "sigma0 must be positive and finite, got nan"),
    (np.r_[np.ones(11), -1.0], "sigma0 must be positive and finite; 1 entries are not"),
])
def test_sigma0_is_asked_positive_from_the_first_message_as_sigma_for_asks_it(problem, sigma0, words):
    """sigma0=-1 was told "must be finite and >= 0", and sigma0=0, then passed, "must be positive": two fixes where
    one was needed. sigma_for and sweep_sigma say "positive" from the first."""
    model, head, x, labels = problem
    with pytest.raises(ValueError) as info:
        hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, sigma0=sigma0)
    assert str(info.value) == words
    with pytest.raises(ValueError, match="sigma0 must be positive and finite"):
        hcrfast.sigma_for(model, x, 0.05, sigma0=sigma0, max_calls=2, restarts=2, iterations=2)


def test_utility_and_accuracy_search_print_one_short_line_as_the_other_results_do(problem):
    """Utility and AccuracySearch printed the dataclass's repr: every field, the whole history, and for one std
    per feature every std (~600 characters here, thousands for a real model's features)."""
    model, head, x, labels = problem
    for sigma0 in (None, np.linspace(0.05, 0.6, 12)):
        found = hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, sigma0=sigma0, draws=3)
        text = repr(found)
        assert text.startswith("<AccuracySearch: sigma ") and text.endswith("; .summary() for the rest>")
        assert len(text) < 250 and "\n" not in text and "history" not in text and "array" not in text
        sig = (f"{found.sigma:.6g}" if sigma0 is None
               else f"{found.scale:.6g} x the given stds (RMS {np.sqrt(np.mean(np.square(found.sigma))):.6g})")
        assert (f"sigma {sig}: dithered accuracy {found.utility.dithered:.4f} ± {found.utility.stderr:.4f} >= target "
                f"0.5 (clean 0.7500), the largest sigma found, {len(found.history)} sigmas tried") in text
        u = found.utility
        assert repr(u) == f"<Utility: {u.summary()}>" and len(repr(u)) < 150 and "per_draw" not in repr(u)
    assert repr(hcrfast.AccuracySearch(*([None] * 9))).startswith("<AccuracySearch (no summary: ")


def test_a_model_loaded_under_inference_mode_and_a_fraction_sigma_are_taken_as_bound_takes_them():
    """dithered_accuracy runs forward passes only, but refused a model whose parameters were made under
    torch.inference_mode "for autograd"; and it refused sigma=Fraction(1, 2), which hcrfast.bound takes. Both now
    give what the same model made outside inference_mode and the float sigma give; the oracle is the test's own
    per-row loop over the noise streams."""
    from fractions import Fraction

    from hcrfast.utility import DITHER_STREAM

    torch.manual_seed(0)
    with torch.inference_mode():
        frozen = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 6), torch.nn.Tanh()).eval()
    plain = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 6), torch.nn.Tanh()).eval()
    plain.load_state_dict(frozen.state_dict())
    head = torch.nn.Linear(6, 3).eval()
    x = torch.randn(8, 1, 4, 4)
    with torch.no_grad():
        labels = head(plain(x)).argmax(dim=1)
        labels[:3] = (labels[:3] + 1) % 3
        feats = plain(x).double().numpy()
        hits = []
        for e in range(8):   # the oracle: each row's own stream, 10 draws
            z = 0.5 * np.random.default_rng([0, e, DITHER_STREAM]).standard_normal((10, 6))
            noisy = torch.as_tensor(feats[e] + z, dtype=torch.float32)
            hits.append((head(noisy).argmax(dim=1) == labels[e]).numpy())
    want = float(np.mean(hits))
    for model, sigma in [(plain, 0.5), (frozen, 0.5), (plain, Fraction(1, 2)), (frozen, Fraction(1, 2)),
                         (plain, [Fraction(1, 2)] * 6)]:
        got = hcrfast.dithered_accuracy(model, head, x, labels, sigma)
        assert got.dithered == pytest.approx(want, abs=1e-12) and got.clean == pytest.approx(5 / 8), (model, sigma)


class _Identity(torch.nn.Module):
    def forward(self, x):   # the features are the batch itself (no copy)
        return x


def test_a_head_that_writes_into_its_input_neither_changes_the_results_nor_the_callers_batch(problem):
    """The clean reference ran the head on the features tensor itself: a head that adds to its input in place
    changed them, so the noisy copies were drawn around other features (accuracy 0.5 where the same head written
    out of place gives 0.61), and with an identity model it wrote into the caller's batch (0.7 per call; 6.3 after
    a sigma_for_accuracy). The oracle: the same head out of place."""
    _, head, x, _ = problem
    w = head.lin.weight.detach()[:, :4]

    def in_place(f):
        f.add_(0.7)
        return f @ w.T

    def out_of_place(f):
        return (f + 0.7) @ w.T

    batch = x[:, :4].clone()
    before = batch.clone()
    with torch.no_grad():
        labels = out_of_place(batch).argmax(dim=1)
    got = hcrfast.dithered_accuracy(_Identity().eval(), in_place, batch, labels, 0.3, draws=4)
    want = hcrfast.dithered_accuracy(_Identity().eval(), out_of_place, batch, labels, 0.3, draws=4)
    assert torch.equal(batch, before)
    assert got == want and got.dithered < 1.0
    found = hcrfast.sigma_for_accuracy(_Identity().eval(), in_place, batch, labels, 0.9, draws=4, sigma0=0.3)
    assert torch.equal(batch, before)
    assert found.sigma == hcrfast.sigma_for_accuracy(_Identity().eval(), out_of_place, batch, labels, 0.9, draws=4,
                                                     sigma0=0.3).sigma


class _Dropout(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return torch.nn.functional.dropout(self.model(x), 0.5, training=True)


class _MinusBatchMean(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        return y - y.mean(dim=0, keepdim=True)


@pytest.mark.parametrize("where, kind", [("model", "random"), ("model", "mixing"), ("head", "random"),
                                         ("head", "mixing")])
def test_a_model_or_head_that_is_random_or_mixes_the_batch_is_refused_as_bound_refuses_the_model(problem, where,
                                                                                                  kind):
    """dithered_accuracy never probed the model or the head: a model with forced dropout gave clean accuracies
    0.875 then 0.6875 on two calls, a head that subtracts the batch's mean gave numbers that hung on how the noisy
    copies were chunked, all without a word (bound refuses such a model). Both are probed now, with bound's words."""
    model, head, x, labels = problem
    if where == "model":
        model = (_Dropout(model) if kind == "random" else _MinusBatchMean(model)).eval()
    else:
        head = (_Dropout(head) if kind == "random" else _MinusBatchMean(head)).eval()
    words = (rf"the {where} gives other outputs for the same inputs at each call.*deterministic" if kind == "random"
             else rf"the {where} mixes the examples of a batch.*BatchNorm in eval mode")
    with pytest.raises(ValueError, match=words):
        hcrfast.dithered_accuracy(model, head, x, labels, 0.1, draws=2)
    with pytest.raises(ValueError, match=words):
        hcrfast.sigma_for_accuracy(model, head, x, labels, 0.5, draws=2)
    if where == "head":
        with torch.no_grad():
            feats = problem[0](x)
        with pytest.raises(ValueError, match=words):
            accuracy_on_features(head, feats, labels, 0.1, draws=2)


def test_the_probes_allow_autocasts_rounding_and_see_randomness_beside_infinite_outputs(problem):
    """Under torch.autocast (bfloat16) a row alone rounds apart from the batch at bfloat16's eps, and a VGG-11
    was refused as mixing the examples (2e-3 > 1e-4); the tolerance is the autocast dtype's now. A head whose
    outputs hold -inf (masked classes) made every gap NaN, and a random head passed; the finite outputs are
    compared, and the -inf must stay where they are."""
    from hcrfast import validation

    x = torch.randn(6, 8)

    def rounds_by_batch_size(b):   # 1e-3 apart alone and in a batch: bfloat16's rounding, not mixing
        return b * (1 + 1e-3 * (b.shape[0] > 1))

    out = rounds_by_batch_size(x)
    with pytest.raises(ValueError, match="mixes the examples"):
        validation.probe_forward(rounds_by_batch_size, x, out, name="model", why="it would")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        validation.probe_forward(rounds_by_batch_size, x, out, name="model", why="it would")
    mask = torch.tensor([0.0, -math.inf, 0.0])
    w = torch.randn(3, 8)
    with pytest.raises(ValueError, match="the head gives other outputs for the same inputs at each call"):
        validation.probe_forward(lambda f: f @ w.T + mask + 0.1 * torch.randn(f.shape[0], 3), x,
                                 x @ w.T + mask, name="head", why="it would")
    validation.probe_forward(lambda f: f @ w.T + mask, x, x @ w.T + mask, name="head", why="it would")


@pytest.mark.parametrize("metric", ["accuracy", "top2"])
def test_masked_logits_are_scored_and_a_float64_head_keeps_its_tolerance_under_autocast(metric):
    """A head with classes ruled out (-inf scores) was refused by the built-in metrics ("non-finite outputs"),
    though argmax and top-K over them are defined; a row with fewer than K finite scores (the K best tie among
    the -inf) and NaN or +inf still are. Autocast leaves float64 as it is: its probe no longer widens to
    bfloat16's tolerance, and a float64 head that mixes the batch by 2e-2 is refused under it too."""
    feats = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([0.0, -math.inf, 0.0, 0.0], dtype=torch.float64)
    labels = (feats @ w.T + mask).argmax(dim=1)
    got = accuracy_on_features(lambda f: f @ w.T + mask, feats, labels, 1e-3, draws=2, metric=metric)
    assert got.clean == 1.0
    with pytest.raises(ValueError, match=r"non-finite outputs .* at least 2 finite scores"):
        accuracy_on_features(lambda f: f @ w.T + torch.tensor([0.0, -math.inf, -math.inf, -math.inf],
                                                               dtype=torch.float64),
                             feats, labels, 1e-3, draws=2, metric="top2")
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="mixes the examples"):
        accuracy_on_features(lambda f: f @ w.T + 0.02 * (f @ w.T).mean(dim=0), feats, labels, 0.1, draws=2,
                             metric=metric)


def test_the_probes_join_a_float16_models_rows_outside_the_callers_autocast():
    """Under a CPU autocast to bfloat16, joining a float16 model's rows (torch.cat) raised "Unexpected floating
    ScalarType", and the probe said the model fails on one example alone."""
    from hcrfast import validation

    net = torch.nn.Linear(8, 3).half()
    x = torch.randn(5, 8).half()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
        validation.probe_forward(net, x, out, name="model", why="it would")


def test_a_top_k_metric_on_a_head_of_k_classes_or_fewer_says_so_not_non_finite(problem):
    """metric='top5' on a 3-class head said 'non-finite outputs for 16 of 16 clean inputs' (every row has fewer
    than 5 finite scores, the masked-logits rule of this session): the count of classes is checked first, with its
    own fix, as before that rule."""
    model, head, x, labels = problem
    with pytest.raises(ValueError, match=r"the head scores 5 classes; top-5 accuracy needs more than 5 \(pass a "
                                         r"smaller K\)"):
        hcrfast.dithered_accuracy(model, head, x, labels, 0.1, draws=2, metric="top5")
