"""Recycled Golub–Kahan bases (hcrfast.krylov) against numpy.linalg.pinv / lstsq / qr and SciPy's LSQR,
and ``bound(solver="krylov")`` against the test's own Algorithm 1 on a projected Krylov space."""
import math
import dataclasses
import warnings

import numpy as np
import pytest
import scipy.fft
import scipy.sparse.linalg as spla
import torch

import hcrfast
from test_bound import algorithm1
from hcrfast import krylov
from hcrfast.lsqr import LSQROptions
from hcrfast.operators import DenseBatchOperator

TIGHT = LSQROptions(atol=1e-13, btol=1e-13, conlim=1e14)


def spectrum_batch(rng, B, n, p, singular_values):
    """B matrices n × p with the given singular values (random singular vectors)."""
    k = len(singular_values)
    A = np.empty((B, n, p))
    for b in range(B):
        U, _ = np.linalg.qr(rng.standard_normal((n, k)))
        V, _ = np.linalg.qr(rng.standard_normal((p, k)))
        A[b] = (U * singular_values) @ V.T
    return A


@pytest.mark.parametrize("n,p", [(30, 20), (20, 30)])
def test_a_basis_of_the_whole_row_space_solves_every_right_hand_side_like_pinv(n, p):
    """Rank 12 < min(n, p): the basis stops at the rank, and then ``solve`` is J⁺ c for any c."""
    rng = np.random.default_rng(n)
    A = spectrum_batch(rng, 3, n, p, np.logspace(0, -2, 12))
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((3, n)), TIGHT)
    assert np.all(basis.rank == 12) and np.all(basis.steps <= 13)
    c = rng.standard_normal((3, 5, n))
    got = basis.solve(torch.as_tensor(c)).numpy()
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A), c)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize("scale", [1.0, 2.0**-60, 2.0**60])
def test_the_default_basis_keeps_every_singular_value_above_its_tolerance_at_any_scale(scale):
    """Rank 12, condition 1e9, float64: the default rank tolerance sqrt(max(n, p))·eps64 ~ 1.2e-15 (relative
    to the singular values, not their squares) keeps all 12, and exhaustion is judged relative to the
    largest α or β: J·k and b·k (k a power of two) give the same basis, pinv's solves times 1/k."""
    rng = np.random.default_rng(4)
    A = spectrum_batch(rng, 2, 30, 20, np.logspace(0, -9, 12))
    b = rng.standard_normal((2, 30))
    basis = krylov.build(DenseBatchOperator(A * scale), b * scale)
    assert np.all(basis.rank == 12) and np.all(basis.steps <= 13) and set(basis.istop) <= {1, 2}
    c = rng.standard_normal((2, 3, 30))
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A, rcond=1e-12), c)
    got = basis.solve(torch.as_tensor(c * scale)).numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_by_default_the_basis_stops_where_the_krylov_space_is_exhausted_in_float32():
    """No tolerance on the pilot (DEFAULT_OPTIONS): the basis runs to J's rank (12 of min(n, p) = 40) and
    stops there (rounding noise would follow); the solves are then pinv's up to float32 rounding."""
    rng = np.random.default_rng(11)
    A = spectrum_batch(rng, 2, 60, 40, np.logspace(0, -2, 12)).astype(np.float32)
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((2, 60)).astype(np.float32))
    assert np.all(basis.steps <= 13) and np.all(basis.rank == 12) and set(basis.istop) <= {1, 2}
    c = rng.standard_normal((2, 3, 60)).astype(np.float32)
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A.astype(np.float64), rcond=1e-4), c)  # rank 12, not float32 noise
    got = basis.solve(torch.as_tensor(c)).numpy()
    # float32 vectors, condition 100: a least-squares solve is good to ~eps32 · cond² = 1.2e-3
    assert np.abs(got - want).max() < 2e-3 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_bidiagonalization_step_is_lsqrs_without_its_estimates(dtype):
    """bidiag_step (the basis' step without a tolerance) against lsqr_step with zero tolerances, itself
    SciPy's LSQR (tests/test_lsqr.py): the same u, v, α, β and itn at every step, bit for bit, with and
    without a Gram-Schmidt hook; x and w untouched."""
    from hcrfast.lsqr import bidiag_step, lsqr_init, lsqr_step

    rng = np.random.default_rng(3)
    A = rng.standard_normal((4, 30, 20)).astype(dtype)
    A[1, :, 5:] = 0                                           # rank 5: its space is exhausted early
    op = DenseBatchOperator(A)
    b = rng.standard_normal((4, 30)).astype(dtype)
    kept = []

    def orth(name, vec):                                       # a hook that changes the vector in place
        vec *= 1.0 + 0.01 * len(kept)

    for hook in (None, orth):
        full, lean = lsqr_init(op, b), lsqr_init(op, b)
        x0, w0 = lean.x.copy(), lean.w.copy()
        for _ in range(12):
            with np.errstate(all="ignore"):
                full = lsqr_step(full, op, damp=0.0, atol=0.0, btol=0.0, ctol=0.0, iter_lim=100, orthogonalize=hook)
                lean = bidiag_step(lean, op, orthogonalize=hook)
            kept.append(1)
            for name in ("u", "v", "alfa", "beta"):
                np.testing.assert_array_equal(getattr(lean, name), getattr(full, name), err_msg=name)
            np.testing.assert_array_equal(lean.itn, np.full(4, len(kept)))
        np.testing.assert_array_equal(lean.x, x0)
        np.testing.assert_array_equal(lean.w, w0)
        assert lean.active.all() and not lean.istop.any()     # the basis decides its stops itself
        kept.clear()


def test_a_basis_exhausted_at_the_step_limit_says_so():
    """A 40 x 30 matrix of full rank: the space is exhausted at the step limit, min(n, p) = 30. The
    basis reports the exhaustion (2: least squares, b outside the range; 1: b in the range), not the
    step limit (7), which it reports where the space was not exhausted (a limit of 10 steps)."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2, 40, 30))
    b = rng.standard_normal((2, 40))
    b[1] = A[1] @ rng.standard_normal(30)
    basis = krylov.build(DenseBatchOperator(A), b)
    assert basis.steps.tolist() == [30, 30] and basis.istop.tolist() == [2, 1]
    short = krylov.build(DenseBatchOperator(A), b, iter_lim=10)
    assert short.steps.tolist() == [10, 10] and short.istop.tolist() == [7, 7]


@pytest.mark.parametrize("rank", [10, 70, 100, 120])
def test_by_default_the_basis_runs_past_the_pilots_own_convergence_to_the_rank(rank):
    """Without a tolerance, LSQR's "for this machine" stops (istop 4-6), which fire once the pilot is
    solved to rounding, must not end the basis: in float64 a rank-70 matrix used to stop at istop 5
    with α_{k+1} = 6e-7 and the solves 1.5e-5 off pinv; now it runs to the rank, and pinv's answer."""
    rng = np.random.default_rng(rank)
    A = spectrum_batch(rng, 1, 150, 120, np.logspace(0, -2, rank))
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((1, 150)))
    assert basis.rank[0] == rank and basis.istop[0] in (1, 2)
    c = rng.standard_normal((1, 4, 150))
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A, rcond=1e-10), c)
    got = basis.solve(torch.as_tensor(c)).numpy()
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


def test_auto_reorthogonalization_reruns_the_exhausting_block_with_two_passes():
    """REORTH_PASSES="auto" (the default): one Gram–Schmidt pass per vector, checked on the device, and
    the block where the space is exhausted (the new vector mostly in the kept space) run again with
    two. On a rank-100 float64 matrix one pass alone left B_k a spurious singular value above the rank
    tolerance (rank 101, solves far off pinv, on one thread); "auto" reruns that block and gets pinv's."""
    rng = np.random.default_rng(100)
    A = spectrum_batch(rng, 1, 150, 120, np.logspace(0, -2, 100))
    assert krylov.REORTH_PASSES == "auto"
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((1, 150)))
    assert basis.rank[0] == 100 and basis.istop[0] in (1, 2)
    assert 0 < basis.redone[0] <= 8  # one block of the default check_every, at the end
    c = rng.standard_normal((1, 4, 150))
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A, rcond=1e-10), c)
    assert np.abs(basis.solve(torch.as_tensor(c)).numpy() - want).max() <= 1e-9 * np.abs(want).max()


def _basis_arrays(basis):
    return [torch.cat([t.reshape(-1) for t in basis.vectors(e)]) for e in range(basis.batch)]


@pytest.mark.parametrize("compact_below", [0.0, 1.0])
def test_a_rolled_back_block_is_rerun_exactly_as_two_passes_would_run_it(monkeypatch, compact_below):
    """The rollback restores the LSQR state (whose vectors a step updates in place), the scales and the
    count of kept vectors: with a ratio no pass can meet (every one-pass block rolled back) the basis is
    bit for bit the two-pass one, and with a ratio every pass meets, the one-pass one. Float32 bases of
    different lengths (ranks 5, 11, 18 of 20), compacted at every look or never, 3 steps a look."""
    rng = np.random.default_rng(21)
    A = np.concatenate([spectrum_batch(rng, 1, 30, 20, np.logspace(0, -1, r)) for r in (5, 11, 18)]).astype(np.float32)
    b = rng.standard_normal((3, 30)).astype(np.float32)
    opts = dict(check_every=3, compact_below=compact_below)

    def run(passes, ratio=krylov.KEEP_RATIO):
        monkeypatch.setattr(krylov, "REORTH_PASSES", passes)
        monkeypatch.setattr(krylov, "KEEP_RATIO", ratio)
        return krylov.build(DenseBatchOperator(A), b, **opts)

    two, one = run(2), run(1)
    always, never = run("auto", 2.0), run("auto", 0.0)
    np.testing.assert_array_equal(two.rank, [5, 11, 18])
    assert np.all(always.redone > 0) and np.all(never.redone == 0) and np.all(two.redone == 0)
    for got, want in ((always, two), (never, one)):
        np.testing.assert_array_equal(got.steps, want.steps)
        np.testing.assert_array_equal(got.istop, want.istop)
        for x, y in zip(_basis_arrays(got), _basis_arrays(want)):
            assert torch.equal(x, y)
    # one and two passes differ in the last bits (else the comparison above could not fail)
    assert not all(torch.equal(x, y) for x, y in zip(_basis_arrays(one), _basis_arrays(two)))


def test_a_truncated_basis_is_the_basis_of_a_shorter_run():
    rng = np.random.default_rng(12)
    A = spectrum_batch(rng, 2, 30, 25, np.logspace(0, -1, 25))
    b = rng.standard_normal((2, 30))
    c = torch.as_tensor(rng.standard_normal((2, 3, 30)))
    no_stop = LSQROptions(atol=0, btol=0, conlim=0)
    long = krylov.build(DenseBatchOperator(A), b, no_stop, iter_lim=12)
    short = krylov.build(DenseBatchOperator(A), b, no_stop, iter_lim=5)
    cut = long.truncated(5)
    np.testing.assert_array_equal(cut.steps, [5, 5])
    np.testing.assert_allclose(cut.solve(c).numpy(), short.solve(c).numpy(), rtol=1e-9, atol=1e-12)
    assert not np.allclose(long.solve(c).numpy(), short.solve(c).numpy(), rtol=1e-3)


def test_the_pilot_right_hand_side_gets_scipys_lsqr_iterate():
    """k steps from b: the basis' solve of b is LSQR's x_k (SciPy, same k, no early stop)."""
    rng = np.random.default_rng(1)
    A = spectrum_batch(rng, 4, 40, 25, np.logspace(0, -1, 25))
    b = rng.standard_normal((4, 40))
    k = 7
    basis = krylov.build(DenseBatchOperator(A), b, LSQROptions(atol=0, btol=0, conlim=0, iter_lim=k))
    assert np.all(basis.steps == k) and np.all(basis.istop == 7)
    got = basis.solve(torch.as_tensor(b[:, None, :])).numpy()[:, 0]
    for e in range(4):
        want = spla.lsqr(A[e], b[e], atol=0, btol=0, conlim=0, iter_lim=k)[0]
        np.testing.assert_allclose(got[e], want, rtol=1e-9, atol=1e-12)


def test_other_right_hand_sides_get_the_best_vector_of_the_krylov_space():
    """The space is span{Aᵀb, (AᵀA)Aᵀb, ...} (k vectors, orthonormalized by numpy.linalg.qr); the
    solve of any c is the least-squares solution restricted to it (numpy.linalg.lstsq on A Q)."""
    rng = np.random.default_rng(2)
    A = spectrum_batch(rng, 3, 35, 30, np.logspace(0, -1, 30))
    b = rng.standard_normal((3, 35))
    c = rng.standard_normal((3, 4, 35))
    k = 6
    basis = krylov.build(DenseBatchOperator(A), b, LSQROptions(atol=0, btol=0, conlim=0, iter_lim=k))
    got = basis.solve(torch.as_tensor(c)).numpy()
    for e in range(3):
        K = [A[e].T @ b[e]]
        for _ in range(k - 1):
            K.append(A[e].T @ (A[e] @ K[-1]))
        Q, _ = np.linalg.qr(np.stack(K, axis=1))
        y = np.linalg.lstsq(A[e] @ Q, c[e].T, rcond=None)[0]
        np.testing.assert_allclose(got[e], (Q @ y).T, rtol=1e-8, atol=1e-10)


def test_float32_vectors_stay_orthonormal_and_satisfy_the_bidiagonal_relation():
    """Condition 1e4 in float32 over 150 steps: without reorthogonalization the Lanczos vectors lose
    orthogonality within tens of steps; with it ‖VᵀV − I‖ and ‖UᵀU − I‖ stay at float32 rounding, and
    A V_k = U_{k+1} B_k holds (B_k from the kept scalars, via the stored pseudo-inverse's SVD)."""
    rng = np.random.default_rng(3)
    A = spectrum_batch(rng, 2, 220, 180, np.logspace(0, -4, 180)).astype(np.float32)
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((2, 220)).astype(np.float32),
                         LSQROptions(atol=0, btol=0, conlim=0, iter_lim=150))
    for e in range(2):
        U, V, a, b = basis.vectors(e)
        U, V = U.double().numpy(), V.double().numpy()
        assert U.shape == (151, 220) and V.shape == (150, 180)
        assert np.abs(V @ V.T - np.eye(150)).max() < 2e-5
        assert np.abs(U @ U.T - np.eye(151)).max() < 2e-5
        # A V_k = U_{k+1} B_k, B_k lower bidiagonal from the kept α, β
        a, b = a.numpy(), b.numpy()
        Bk = np.zeros((151, 150))
        Bk[np.arange(150), np.arange(150)] = a[:150]
        Bk[np.arange(1, 151), np.arange(150)] = b[1:151]
        assert np.abs(A[e] @ V.T - U.T @ Bk).max() < 1e-4 * np.abs(A[e]).max()


def test_examples_stop_on_their_own_and_compaction_changes_nothing():
    """Example 0 has rank 2 and stops after 2 steps; the others go on. Compacting at every look
    (compact_below=1) or never (0) gives what each example gets alone."""
    rng = np.random.default_rng(4)
    A = np.concatenate([spectrum_batch(rng, 1, 30, 20, [1.0, 0.5]),
                        spectrum_batch(rng, 2, 30, 20, np.logspace(0, -1, 20))])
    b = rng.standard_normal((3, 30))
    c = rng.standard_normal((3, 2, 30))
    opts = LSQROptions(atol=1e-10, btol=1e-10, check_every=1)
    alone = [krylov.build(DenseBatchOperator(A[e:e + 1]), b[e:e + 1], opts) for e in range(3)]
    for compact in (1.0, 0.0):
        basis = krylov.build(DenseBatchOperator(A), b, opts, compact_below=compact)
        assert basis.steps[0] == 2 and np.all(basis.steps[1:] > 2)
        np.testing.assert_array_equal(basis.steps, [a.steps[0] for a in alone])
        got = basis.solve(torch.as_tensor(c)).numpy()
        for e in range(3):
            want = alone[e].solve(torch.as_tensor(c[e:e + 1])).numpy()[0]
            np.testing.assert_allclose(got[e], want, rtol=1e-10, atol=1e-12)


def test_damping_gives_the_damped_least_squares_solution():
    rng = np.random.default_rng(5)
    A = spectrum_batch(rng, 2, 25, 15, np.logspace(0, -2, 15))
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((2, 25)), TIGHT, damp=0.05)
    c = rng.standard_normal((2, 3, 25))
    got = basis.solve(torch.as_tensor(c)).numpy()
    for e in range(2):
        want = np.linalg.solve(A[e].T @ A[e] + 0.05**2 * np.eye(15), A[e].T @ c[e].T).T
        np.testing.assert_allclose(got[e], want, rtol=1e-8, atol=1e-10)


def test_a_zero_operator_gives_an_empty_basis_and_zero_solutions():
    basis = krylov.build(DenseBatchOperator(np.zeros((2, 6, 4))), np.ones((2, 6)), TIGHT)
    assert np.all(basis.steps == 0) and np.all(basis.rank == 0) and np.all(basis.istop == 0)
    assert np.all(basis.solve(torch.ones((2, 3, 6), dtype=torch.float64)).numpy() == 0)


def test_bad_shapes_are_named():
    op = DenseBatchOperator(np.zeros((2, 6, 4)))
    with pytest.raises(ValueError, match=r"expected b of shape \(2, 6\)"):
        krylov.build(op, np.ones((2, 5)))
    basis = krylov.build(DenseBatchOperator(np.eye(3)[None]), np.ones((1, 3)), TIGHT)
    with pytest.raises(ValueError, match=r"expected c of shape \(1, R, n\)"):
        basis.solve(torch.ones((2, 1, 3), dtype=torch.float64))


def test_step_limit_and_memory_count():
    assert krylov.step_limit(25088, 24843) == krylov.MAX_STEPS
    assert krylov.step_limit(40, 784) == 40
    assert krylov.step_limit(900, 784, LSQROptions(iter_lim=100)) == 100
    assert krylov.basis_values(40, 784) == 3 * 41 * 824 + 2 * 40 * 40


# --- bound(solver="krylov") ----------------------------------------------------------------------------

def _tanh_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.Tanh(),
                               torch.nn.Linear(48, 56), torch.nn.Tanh()).double().eval()


def _rows_through_the_build(monkeypatch):
    """A list whose one entry counts the rows of the Jacobian products (TorchJacobian.matvec / rmatvec)
    taken inside krylov.build: one product per row."""
    from hcrfast.bindings.jacobian import TorchJacobian
    rows, inside = [0], [False]
    for name in ("matvec", "rmatvec"):
        def counted(self, a, _f=getattr(TorchJacobian, name)):
            rows[0] += a.shape[0] if inside[0] else 0
            return _f(self, a)
        monkeypatch.setattr(TorchJacobian, name, counted)

    def build(*args, _build=krylov.build, **kwargs):
        inside[0] = True
        try:
            return _build(*args, **kwargs)
        finally:
            inside[0] = False
    monkeypatch.setattr(krylov, "build", build)
    return rows


def test_bound_counts_the_products_of_rerun_blocks(monkeypatch):
    """params["krylov"]["products_per_example"] is what the basis cost the model: 2 (steps + redone) + 1
    per example, counted here at the Jacobian operator inside krylov.build (each matvec / rmatvec row is
    one product), with every one-pass block rolled back (a ratio no pass meets) and with none."""
    rows = _rows_through_the_build(monkeypatch)
    net = _tanh_net()
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((3, 1, 8, 8)))
    for ratio in (2.0, 0.0):
        monkeypatch.setattr(krylov, "KEEP_RATIO", ratio)
        rows[0] = 0
        res = hcrfast.bound(net, x, 0.2, size=0.05, iterations=2, restarts=2, solver="krylov",
                            lsqr=LSQROptions(atol=0, btol=0, conlim=0, iter_lim=20, compact_below=0.0))
        k = res.params["krylov"]
        assert (k["steps_redone_mean"] > 0) == (ratio > 1)
        assert rows[0] == 3 * k["products_per_example"]


def test_the_build_counts_every_row_the_operator_computed_and_every_rollback(monkeypatch):
    """Ranks 100 and 20 in one batch: the short one exhausts first, and its block is run again for the
    long one too; the long one is rolled back a second time at its own exhaustion. The rows through the
    operator (counted at DenseBatchOperator) are Σ (2 · passes + 1) whether a stopped example is compacted
    out at once or rides along to the end (its 0/0 and overflowing scalars, masked, warn of nothing);
    looking after every step and compacting at once, passes = steps + redone exactly, with the long
    one's redone summing both of its rollbacks."""
    rows = [0]
    for name in ("matvec", "rmatvec"):
        def counted(self, a, _f=getattr(DenseBatchOperator, name)):
            rows[0] += a.shape[0]
            return _f(self, a)
        monkeypatch.setattr(DenseBatchOperator, name, counted)
    rng, other = np.random.default_rng(100), np.random.default_rng(200)
    A = np.concatenate([spectrum_batch(rng, 1, 150, 120, np.logspace(0, -2, 100)),
                        spectrum_batch(other, 1, 150, 120, np.logspace(0, -2, 20))])
    b = np.concatenate([rng.standard_normal((1, 150)), other.standard_normal((1, 150))])
    for check_every, compact_below in ((1, 1.0), (1, 0.0), (8, 1.0), (8, 0.0)):
        rows[0] = 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            basis = krylov.build(DenseBatchOperator(A), b, check_every=check_every, compact_below=compact_below)
        np.testing.assert_array_equal(basis.steps, [101, 21])
        assert rows[0] == (2 * basis.passes + 1).sum()
        assert np.all(basis.passes >= basis.steps + basis.redone)
        if compact_below == 0.0:  # never compacted: both ride to the end
            assert basis.passes[0] == basis.passes[1]
        if (check_every, compact_below) == (1, 1.0):
            np.testing.assert_array_equal(basis.redone, [2, 1])
            np.testing.assert_array_equal(basis.passes, basis.steps + basis.redone)


def test_bound_reports_the_products_the_model_computed_with_examples_of_other_lengths(monkeypatch):
    """A ReLU net whose examples' bases stop at different steps (their ranks differ), default options:
    params["krylov"]["products_per_example"] is what went through the Jacobian inside the build (rows of
    matvec / rmatvec), above what the bases needed (products_needed_per_example), the difference being
    the examples that stopped riding along in their batch."""
    rows = _rows_through_the_build(monkeypatch)
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 40), torch.nn.ReLU(),
                              torch.nn.Linear(40, 30), torch.nn.ReLU()).double().eval()
    x = torch.as_tensor(np.random.default_rng(8).standard_normal((12, 1, 8, 8)))
    res = hcrfast.bound(net, x, 0.2, iterations=2, restarts=2, solver="krylov")
    k = res.params["krylov"]
    assert k["steps_max"] > k["steps_median"]
    assert rows[0] == 12 * k["products_per_example"]
    assert k["products_per_example"] > k["products_needed_per_example"]
    assert "needed, the rest spent on examples riding along" in res.summary()


@pytest.mark.parametrize("seed", [100, 101, 102])
def test_the_noise_step_past_exhaustion_adds_no_direction(seed):
    """Float64 stacks of rank 100 (150 × 120, singular values 1 ... 1e-2), two to a batch: each basis runs
    one step past its exhausted space, on rounding noise (101 steps), and that step gives B_k a singular
    value of 1e-14 to 1e-12 of the largest, above the rank tolerance sqrt(max(n, p))·eps but below
    krylov.RITZ_NOISE · k · sqrt(max(n, p)) · eps. It is no direction of J: every rank is 100 and the
    solves are numpy.linalg.pinv's (one example of each pair kept it before, and its solves were ~1e8
    times pinv's)."""
    rng = np.random.default_rng(seed)
    A = spectrum_batch(rng, 2, 150, 120, np.logspace(0, -2, 100))
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((2, 150)))
    assert np.all(basis.steps == 101)
    np.testing.assert_array_equal(basis.rank, [100, 100])
    c = rng.standard_normal((2, 4, 150))
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A, rcond=1e-10), c)
    assert np.abs(basis.solve(torch.as_tensor(c)).numpy() - want).max() <= 1e-9 * np.abs(want).max()


def test_bound_krylov_on_a_float64_relu_net_is_the_dense_solve():
    """A float64 ReLU net (J of rank 31 of 64 per example): every Krylov basis holds J's whole row space,
    so its steps are the dense solve's, and so are the bounds, for every example, in one chunk or one
    example a chunk. One of the 12 examples' bases kept its noise step's direction before: its steps
    came out ~1e13 too large, D overflowed and all its bounds were 0."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 64), torch.nn.ReLU()).double().eval()
    x = torch.as_tensor(np.random.default_rng(1).standard_normal((12, 1, 8, 8)))
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(net(x))
    dense = algorithm1(net, x, sigma, solver="dense", restarts=3, iterations=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recycled = algorithm1(net, x, sigma, solver="krylov", restarts=3, iterations=3)
        alone = algorithm1(net, x, sigma, solver="krylov", restarts=3, iterations=3, chunk_size=1)
    assert recycled.params["krylov"]["rank_median"] == dense.params["dense"]["rank_median"]
    np.testing.assert_allclose(recycled.std, dense.std, rtol=1e-6)
    np.testing.assert_allclose(alone.std, recycled.std, rtol=1e-6)  # whatever chunk an example is in


def test_bound_krylov_is_algorithm_1_projected_on_the_pilot_krylov_space():
    """The test's own Algorithm 1: J from torch.func.jacrev, the space of restart 0's start vector after
    k steps (numpy QR of the Krylov matrix), every step numpy.linalg.lstsq on J Q, z from forward passes."""
    net = _tanh_net()
    rng = np.random.default_rng(6)
    x = torch.as_tensor(rng.standard_normal((2, 1, 8, 8)))
    sigma, size, R, iterations, k = 0.2, 0.05, 3, 3, 5
    opts = LSQROptions(atol=0, btol=0, conlim=0, iter_lim=k)
    res = algorithm1(net, x, sigma, size=size, iterations=iterations, restarts=R, seed=2, solver="krylov",
                        lsqr=opts)
    last = algorithm1(net, x, sigma, size=size, iterations=iterations, restarts=R, seed=2, solver="krylov",
                         lsqr=opts, iterates="last")
    assert res.params["solver"] == "krylov" and res.params["krylov"]["steps_max"] == k
    assert np.all(res.lsqr_iterations[:, 0, 0] == k) and np.all(res.lsqr_istop[:, 0, 0] == 7)
    assert np.all(res.lsqr_iterations.reshape(2, -1)[:, 1:] == 0) and np.all(res.lsqr_istop.reshape(2, -1)[:, 1:] == -2)
    assert res.params["krylov"]["products_per_example"] == 2 * k + 1
    with torch.no_grad():
        f0 = net(x).numpy()
    z0 = hcrfast.start_vectors(np.arange(2), R, 56, seed=2, size=size, sigma=sigma).reshape(2, R, 56)
    for b in range(2):
        J = torch.func.jacrev(lambda t: net(t[None]).reshape(-1))(x[b]).reshape(56, 64).detach().numpy()
        K = [J.T @ z0[b, 0]]
        for _ in range(k - 1):
            K.append(J.T @ (J @ K[-1]))
        Q, _ = np.linalg.qr(np.stack(K, axis=1))
        target = np.linalg.norm(z0[b], axis=1)
        zt = z0[b]
        every = []   # each iterate's bounds (iterates="all", the default, takes their max)
        for _ in range(iterations):
            eps = (Q @ np.linalg.lstsq(J @ Q, zt.T, rcond=None)[0]).T
            with torch.no_grad():
                z = net(x[b] + torch.as_tensor(eps).reshape(R, 1, 8, 8)).numpy() - f0[b]
            zt = z * (target / np.linalg.norm(z, axis=1))[:, None]
            d = np.expm1(np.linalg.norm(z, axis=1) ** 2 / sigma**2)
            coords = np.abs(scipy.fft.dctn(eps.reshape(R, 8, 8), axes=(-2, -1), norm="ortho")).reshape(R, 64)
            every.append((coords / np.sqrt(d)[:, None]).max(axis=0))
        np.testing.assert_allclose(res.std[b].reshape(64), np.max(every, axis=0), rtol=1e-6)
        np.testing.assert_allclose(last.std[b].reshape(64), every[-1], rtol=1e-6)
        np.testing.assert_allclose(res.divergence[b], d, rtol=1e-6)
    assert "Krylov basis" in res.summary()


def test_bound_krylov_with_the_whole_row_space_is_the_dense_solve():
    net = _tanh_net()
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((3, 1, 8, 8)))
    kw = dict(size=0.05, iterations=3, restarts=4, seed=1)
    dense = algorithm1(net, x, 0.2, solver="dense", **kw)
    rec = algorithm1(net, x, 0.2, solver="krylov", lsqr=TIGHT, chunk_size=2, **kw)
    assert rec.params["krylov"]["rank_min"] == 48  # J = W2 diag(tanh') W1 has rank 48
    np.testing.assert_allclose(rec.std, dense.std, rtol=1e-7)


@pytest.mark.parametrize("k", [2, 6, None])
def test_bound_krylov_never_exceeds_the_least_squares_std_on_linear_models(k):
    """Validity, whatever the basis size: std_k² ≤ σ²[Q (WᵀW)⁻¹ Qᵀ]_kk (W full column rank)."""
    rng = np.random.default_rng(8)
    n, p = 30, 16
    U, _ = np.linalg.qr(rng.standard_normal((n, p)))
    V, _ = np.linalg.qr(rng.standard_normal((p, p)))
    W = (U * np.logspace(0, -2, p)) @ V.T
    lin = torch.nn.Linear(p, n).double()
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(W))
    model = torch.nn.Sequential(torch.nn.Flatten(), lin).eval()
    x = torch.as_tensor(rng.standard_normal((2, 1, 4, 4)))
    sigma = 0.3
    res = hcrfast.bound(model, x, sigma, size=0.01, iterations=3, restarts=5, solver="krylov",
                        lsqr=LSQROptions(atol=1e-12, btol=1e-12, iter_lim=k))
    Q = np.stack([scipy.fft.dctn(e.reshape(4, 4), norm="ortho").ravel() for e in np.eye(p)], axis=1)
    crb = sigma**2 * np.diag(Q @ np.linalg.inv(W.T @ W) @ Q.T)
    ratio = res.std.reshape(2, p) ** 2 / crb
    assert np.all(ratio <= 1 + 1e-9)
    if k is None:  # the whole space: Algorithm 1 with exact solves, not vacuous
        assert np.median(ratio) > 0.01


def test_bound_krylov_needs_the_input_linearization():
    with pytest.raises(ValueError, match="builds one Krylov basis.*linearize_at='input' or solver='lsqr'"):
        hcrfast.bound(_tanh_net(), torch.zeros(1, 1, 8, 8, dtype=torch.float64), 0.2, solver="krylov",
                      linearize_at="current")


def test_pilots_give_each_restart_the_basis_of_pilot_r_mod_pilots():
    """krylov_pilots = 2: bases from restarts 0 and 1 (their own Krylov spaces, checked by SciPy's LSQR
    iterate on their first steps); restart r uses pilot r mod 2. Each pilot's basis equals a one-pilot
    build on that start vector (numpy QR + lstsq oracle of the projection). R = 5 is odd: pilot 0 solves
    3 restarts, pilot 1 two (its batched pass pads a zero right-hand side)."""
    net = _tanh_net()
    rng = np.random.default_rng(9)
    x = torch.as_tensor(rng.standard_normal((2, 1, 8, 8)))
    sigma, size, R, k = 0.2, 0.05, 5, 6
    opts = LSQROptions(atol=0, btol=0, conlim=0, iter_lim=k)
    res = algorithm1(net, x, sigma, size=size, iterations=1, restarts=R, seed=4, solver="krylov", lsqr=opts,
                        krylov_pilots=2, certify=False)
    assert res.params["krylov"]["pilots"] == 2 and res.params["krylov"]["products_per_example"] == 2 * (2 * k + 1)
    assert np.all(res.lsqr_iterations[:, :2, 0] == k) and np.all(res.lsqr_istop[:, 2:, 0] == -2)
    z0 = hcrfast.start_vectors(np.arange(2), R, 56, seed=4, size=size, sigma=sigma).reshape(2, R, 56)
    for b in range(2):
        J = torch.func.jacrev(lambda t: net(t[None]).reshape(-1))(x[b]).reshape(56, 64).detach().numpy()
        best = np.zeros(64)
        for r in range(R):
            pilot = z0[b, r % 2]
            K = [J.T @ pilot]
            for _ in range(k - 1):
                K.append(J.T @ (J @ K[-1]))
            Q, _ = np.linalg.qr(np.stack(K, axis=1))
            eps = Q @ np.linalg.lstsq(J @ Q, z0[b, r], rcond=None)[0]
            with torch.no_grad():
                z = (net(x[b:b + 1] + torch.as_tensor(eps).reshape(1, 1, 8, 8)) - net(x[b:b + 1])).numpy()[0]
            d = np.expm1(z @ z / sigma**2)
            best = np.maximum(best, np.abs(scipy.fft.dctn(eps.reshape(8, 8), norm="ortho")).ravel() / np.sqrt(d))
        np.testing.assert_allclose(res.std[b].reshape(64), best, rtol=1e-6)


def test_krylov_pilots_are_checked():
    net, x = _tanh_net(), torch.zeros(1, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="krylov_pilots=3 exceeds restarts=2"):
        hcrfast.bound(net, x, 0.2, restarts=2, solver="krylov", krylov_pilots=3)
    with pytest.raises(ValueError, match="applies to solver='krylov' only"):
        hcrfast.bound(net, x, 0.2, restarts=2, solver="dense", krylov_pilots=2)
    # more pilots than restarts with another solver: the solver is what is wrong, and 'auto' the default
    with pytest.raises(ValueError, match=r"krylov_pilots=3 applies to solver='krylov' only, but this call solves "
                                         r"with 'lsqr'; .*leave krylov_pilots at its default \('auto'"):
        hcrfast.bound(net, x, 0.2, restarts=2, solver="lsqr", krylov_pilots=3)
    with pytest.raises(ValueError, match="krylov_pilots"):
        hcrfast.bound(net, x, 0.2, restarts=2, solver="krylov", krylov_pilots=0)


def test_auto_pilots_keep_one_basis_where_it_exhausts_the_space_and_split_its_steps_where_not():
    """krylov_pilots="auto" (hcrfast.krylov.resolve_pilots): one pilot for other solvers, for spaces a
    basis of MAX_STEPS exhausts (min(n, p) <= MAX_STEPS) and where iter_lim is given; beyond, a pilot per
    restart up to AUTO_MAX_PILOTS, of MAX_STEPS // R steps within [AUTO_PILOT_STEPS, AUTO_PILOT_MAX_STEPS]
    (deeper pilots gave lower bounds on ResNet-18, shallower ones lost at equal products, and restarts
    sharing a short basis gave its bounds again)."""
    opts = krylov.DEFAULT_OPTIONS
    assert krylov.resolve_pilots(3, 10**5, 10**5, 25, opts) == (3, opts)
    assert krylov.resolve_pilots("auto", 10**5, 10**5, 25, opts, solver="lsqr") == (1, opts)
    assert krylov.resolve_pilots("auto", 512, 10**5, 25, opts) == (1, opts)  # min(n, p) = 512: exhaustible
    given = LSQROptions(atol=0, btol=0, conlim=0, iter_lim=1000)
    assert krylov.resolve_pilots("auto", 10**5, 10**5, 25, given) == (1, given)
    for R in (1, 3, 25, 26, 50, 100, 101, 400):
        pilots, o = krylov.resolve_pilots("auto", 10**5, 10**5, R, opts)
        # past 25, what 2^30 values hold: 2^30 // (161 * 2e5) = 33 pilots
        assert pilots == (min(R, 33) if R > 25 else R)
        assert krylov.AUTO_PILOT_STEPS <= o.iter_lim <= krylov.AUTO_PILOT_MAX_STEPS
        # up to R = MAX_STEPS // AUTO_PILOT_STEPS (25) the pilots share one basis' steps; beyond, 160 steps each
        assert o.iter_lim == min(max(krylov.MAX_STEPS // pilots, krylov.AUTO_PILOT_STEPS), krylov.AUTO_PILOT_MAX_STEPS)
        assert (pilots * o.iter_lim <= krylov.MAX_STEPS) == (R <= krylov.MAX_STEPS // krylov.AUTO_PILOT_STEPS)
        assert (o.atol, o.btol, o.conlim, o.check_every) == (opts.atol, opts.btol, opts.conlim, opts.check_every)
    # ResNet-18 at the published R = 25 keeps 25 pilots of 163 steps; fewer restarts, 246 steps each; more, 160
    resolved = [krylov.resolve_pilots("auto", 25088, 24843, R, opts) for R in (400, 100, 50, 25, 10, 2, 1)]
    assert [(P, o.iter_lim) for P, o in resolved] == [(100, 160), (100, 160), (50, 160), (25, 163), (10, 246),
                                                      (2, 246), (1, 246)]
    # past 25 pilots, no more than AUTO_MAX_BASIS_VALUES hold (ResNet-18 at 224 x 224: 37), never fewer than 25
    assert krylov.resolve_pilots("auto", 25088, 150528, 100, opts)[0] == 2**30 // (161 * (25088 + 150528)) == 37
    assert krylov.resolve_pilots("auto", 10**6, 10**6, 100, opts)[0] == 25
    assert krylov.resolve_pilots("auto", 10**6, 10**6, 10, opts) == (10, dataclasses.replace(opts, iter_lim=246))
    for R in (26, 50, 100, 400):
        for n, p in ((5000, 5000), (25088, 24843), (25088, 150528), (10**6, 10**6)):
            P, o = krylov.resolve_pilots("auto", n, p, R, opts)
            assert P * (o.iter_lim + 1) * (n + p) <= krylov.AUTO_MAX_BASIS_VALUES or P == 25


def test_bound_auto_pilots_are_resolved_before_the_checkpoint_key(monkeypatch, tmp_path):
    """With MAX_STEPS = 8 the tanh net (n = 56, p = 64) is beyond one basis: "auto" runs 5 pilots of 2 steps
    (R = 5, AUTO_PILOT_STEPS = 2), says so in params and the summary, and equals the explicit call, which
    resumes the auto call's checkpoint (the key holds the resolved pilots and iter_lim, not "auto")."""
    monkeypatch.setattr(krylov, "MAX_STEPS", 8)
    monkeypatch.setattr(krylov, "AUTO_PILOT_STEPS", 2)
    net = _tanh_net()
    x = torch.as_tensor(np.random.default_rng(10).standard_normal((3, 1, 8, 8)))
    kw = dict(size=0.05, iterations=2, restarts=5, seed=2, solver="krylov", checkpoint=tmp_path / "ck")
    auto = hcrfast.bound(net, x, 0.2, krylov_pilots="auto", **kw)
    assert auto.params["krylov"]["pilots"] == 5 and auto.params["krylov"]["pilots_auto"]
    assert auto.params["lsqr"]["iter_lim"] == 2 and auto.params["krylov"]["steps_max"] == 2
    assert "5 pilot(s), chosen by krylov_pilots='auto'" in auto.summary()
    explicit = hcrfast.bound(net, x, 0.2, krylov_pilots=5,
                             lsqr=hcrfast.algorithm.dataclasses.replace(krylov.DEFAULT_OPTIONS, iter_lim=2), **kw)
    assert explicit.params["checkpoint"]["examples_read_back"] == 3 and not explicit.params["krylov"]["pilots_auto"]
    np.testing.assert_array_equal(auto.std, explicit.std)
    fresh = hcrfast.bound(net, x, 0.2, krylov_pilots=5,
                          lsqr=hcrfast.algorithm.dataclasses.replace(krylov.DEFAULT_OPTIONS, iter_lim=2),
                          **{**kw, "checkpoint": None})
    np.testing.assert_array_equal(auto.std, fresh.std)  # what was read back is what a run computes
    one = hcrfast.bound(net, x, 0.2, krylov_pilots="auto", **{**kw, "restarts": 1, "checkpoint": None})
    # one restart: one pilot, of MAX_STEPS (8 here) steps at most AUTO_PILOT_MAX_STEPS
    assert one.params["krylov"]["pilots"] == 1 and one.params["lsqr"]["iter_lim"] == 8
    with pytest.raises(ValueError, match="krylov_pilots='many': pass a positive integer or 'auto'"):
        hcrfast.bound(net, x, 0.2, krylov_pilots="many", **kw)
    dense = hcrfast.bound(net, x, 0.2, krylov_pilots="auto", size=0.05, iterations=1, restarts=2, solver="dense")
    assert dense.params["solver"] == "dense"  # "auto" means one pilot (none) for the other solvers


def test_auto_pilots_capped_below_the_restarts_warn_that_the_rest_share_bases(monkeypatch):
    """Past AUTO_MAX_PILOTS (3 here) restarts share the pilots' bases: "auto" says so, naming both ways out,
    and the explicit call with as many pilots as restarts gives each its own (no warning)."""
    monkeypatch.setattr(krylov, "MAX_STEPS", 8)
    monkeypatch.setattr(krylov, "AUTO_PILOT_STEPS", 2)
    monkeypatch.setattr(krylov, "AUTO_MAX_PILOTS", 3)
    net = _tanh_net()
    x = torch.as_tensor(np.random.default_rng(10).standard_normal((2, 1, 8, 8)))
    kw = dict(size=0.05, iterations=2, seed=2, solver="krylov")
    with pytest.warns(UserWarning, match=r"took 3 pilots \(hcrfast.krylov.AUTO_MAX_PILOTS.*\) for R = 5: restarts 3..4 "
                                         r"share their bases.*pass restarts=3, or krylov_pilots=5 with lsqr=dataclasses.replace\(hcrfast.krylov."
                                         r"DEFAULT_OPTIONS, iter_lim=2\) for a basis each"):
        res = hcrfast.bound(net, x, 0.2, restarts=5, **kw)
    assert res.params["krylov"]["pilots"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert hcrfast.bound(net, x, 0.2, restarts=3, **kw).params["krylov"]["pilots"] == 3
        assert hcrfast.bound(net, x, 0.2, restarts=5, krylov_pilots=5,
                             lsqr=hcrfast.algorithm.dataclasses.replace(krylov.DEFAULT_OPTIONS, iter_lim=2),
                             **kw).params["krylov"]["pilots"] == 5


def test_auto_on_large_inputs_builds_the_basis_with_its_own_rules():
    """p = 4,225 > DENSE_SOLVE_MAX_INPUTS: "auto" takes the basis, with hcrfast.krylov.DEFAULT_OPTIONS
    (no pilot tolerance), not DEFAULT_LSQR's atol = 1e-5, and gets what solver="krylov" gets."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4225, 24), torch.nn.Tanh()).double().eval()
    x = torch.randn(2, 1, 65, 65, dtype=torch.float64)
    auto = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2)
    assert auto.params["solver"] == "krylov" and auto.params["lsqr"]["atol"] == 0
    assert auto.params["lsqr"] == hcrfast.algorithm.dataclasses.asdict(krylov.DEFAULT_OPTIONS)
    explicit = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, solver="krylov")
    np.testing.assert_array_equal(auto.std, explicit.std)
    assert auto.params["krylov"]["rank_min"] == 24



def test_directions_are_the_cramer_rao_directions_of_the_space():
    """Whole row space: (AᵀA)⁺q scaled to ‖Aε‖ = 1 (numpy pinv). Partial space (k = 5 steps): the
    maximizer of (qᵀε)²/‖Aε‖² over the Krylov space, Q (QᵀAᵀAQ)⁻¹ Qᵀq, Q from numpy's QR."""
    rng = np.random.default_rng(13)
    A = spectrum_batch(rng, 2, 30, 20, np.logspace(0, -2, 12))
    b = rng.standard_normal((2, 30))
    q = torch.as_tensor(rng.standard_normal((4, 20)))
    full = krylov.build(DenseBatchOperator(A), b, TIGHT)
    got = krylov.directions(full, q).numpy()
    for e in range(2):
        want = (np.linalg.pinv(A[e].T @ A[e], rcond=1e-10) @ q.numpy().T).T
        want /= np.linalg.norm(want @ A[e].T, axis=1)[:, None]
        np.testing.assert_allclose(got[e], want, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(np.linalg.norm(got[e] @ A[e].T, axis=1), 1.0, rtol=1e-10)
    k = 5
    part = krylov.build(DenseBatchOperator(A), b, LSQROptions(atol=0, btol=0, conlim=0, iter_lim=k))
    got = krylov.directions(part, q).numpy()
    for e in range(2):
        K = [A[e].T @ b[e]]
        for _ in range(k - 1):
            K.append(A[e].T @ (A[e] @ K[-1]))
        Q, _ = np.linalg.qr(np.stack(K, axis=1))
        want = (Q @ np.linalg.solve(Q.T @ A[e].T @ A[e] @ Q, Q.T @ q.numpy().T)).T
        want /= np.linalg.norm(want @ A[e].T, axis=1)[:, None]
        np.testing.assert_allclose(got[e], want, rtol=1e-7, atol=1e-9)


def test_bound_krylov_with_targets_takes_the_directions_from_the_basis():
    """The whole row space: the targeted bounds are the dense path's (which builds and factors J);
    the targeted part then reports method "krylov" and no extra Jacobian."""
    net = _tanh_net()
    x = torch.as_tensor(np.random.default_rng(14).standard_normal((3, 1, 8, 8)))
    kw = dict(size=0.05, iterations=2, restarts=2, targets="low:3")
    rec = algorithm1(net, x, 0.2, solver="krylov", chunk_size=2, **kw)
    den = algorithm1(net, x, 0.2, solver="dense", **kw)
    assert rec.targeted.method == "krylov" and rec.targeted.params["shared_factorization"]
    assert rec.params["targeted"]["method"] == "krylov"
    np.testing.assert_allclose(rec.targeted.std, den.targeted.std, rtol=1e-7)
    np.testing.assert_allclose(rec.std, den.std, rtol=1e-7)


def test_stacked_groups_padding_and_pilots_against_each_examples_own_oracle():
    """Bases of different sizes stacked in groups (compaction at every look makes one group per stop;
    never compacting makes one padded group whose short members ran on, through zero vectors, after
    stopping): each example's solve is numpy's lstsq on its own matrix, each direction (AᵀA)⁺q, and
    with 2 pilots per example over 3 restarts the padded pass gives pilot j restarts j, j + 2."""
    rng = np.random.default_rng(21)
    ranks = [2, 7, 20, 13]
    A = np.concatenate([spectrum_batch(rng, 1, 30, 20, np.logspace(0, -1, r)) for r in ranks])
    b = rng.standard_normal((4, 30))
    c = rng.standard_normal((4, 3, 30))
    q = torch.as_tensor(rng.standard_normal((5, 20)))
    want = np.stack([(np.linalg.pinv(A[e], rcond=1e-10) @ c[e].T).T for e in range(4)])
    dirs = np.stack([(np.linalg.pinv(A[e].T @ A[e], rcond=1e-10) @ q.numpy().T).T for e in range(4)])
    dirs /= np.linalg.norm(np.einsum("ekp,enp->ekn", dirs, A), axis=2)[..., None]
    for compact in (1.0, 0.0):
        basis = krylov.build(DenseBatchOperator(A), b, TIGHT, compact_below=compact, check_every=1)
        assert list(basis.rank) == ranks
        assert len(basis.groups) == (len(set(basis.steps)) if compact == 1.0 else 1)
        np.testing.assert_allclose(basis.solve(torch.as_tensor(c)).numpy(), want, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(krylov.directions(basis, q).numpy(), dirs, rtol=1e-8, atol=1e-10)
        for g in basis.groups:  # the padding is exact zeros
            for i, k in enumerate(g.ks):
                assert torch.all(g.U[i, k + 1:] == 0) and torch.all(g.V[i, k:] == 0) and torch.all(g.Y[i, k:] == 0)
    # 2 pilots per example (bases 2e, 2e+1 on the same matrix: every basis spans A's row space here)
    twice = krylov.build(DenseBatchOperator(np.repeat(A, 2, axis=0)), rng.standard_normal((8, 30)), TIGHT)
    got = krylov.solve(twice, c.reshape(12, 30), pilots=2)  # solver arrays (NumPy here)
    np.testing.assert_allclose(np.asarray(got).reshape(4, 3, 20), want, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(krylov.directions(twice, q, pilots=2).numpy(), dirs, rtol=1e-8, atol=1e-10)


def test_directions_with_pilots_take_each_modes_best_pilot():
    """krylov_pilots = 3, spaces of k = 4 < rank steps, so the pilots of an example span different
    spaces: for each mode, example e's direction is the maximizer of (qᵀε)²/‖Aε‖² over the Krylov space
    (numpy QR of the Krylov matrix of its own b) of whichever of its pilots gives the largest ratio,
    and over 12 modes the winners are not all one pilot."""
    rng = np.random.default_rng(31)
    P, k, K = 3, 4, 12
    A = spectrum_batch(rng, 2, 30, 20, np.logspace(0, -1, 20))
    b = rng.standard_normal((2 * P, 30))  # bases P·e + j: example e's pilot j
    q = torch.as_tensor(rng.standard_normal((K, 20)))
    basis = krylov.build(DenseBatchOperator(np.repeat(A, P, axis=0)), b, LSQROptions(atol=0, btol=0, conlim=0,
                                                                                      iter_lim=k))
    got = krylov.directions(basis, q, pilots=P).numpy()
    assert got.shape == (2, K, 20)
    winners = set()
    for e in range(2):
        per_pilot, ratio = [], []
        for j in range(P):
            Kr = [A[e].T @ b[P * e + j]]
            for _ in range(k - 1):
                Kr.append(A[e].T @ (A[e] @ Kr[-1]))
            Q, _ = np.linalg.qr(np.stack(Kr, axis=1))
            want = (Q @ np.linalg.solve(Q.T @ A[e].T @ A[e] @ Q, Q.T @ q.numpy().T)).T
            want /= np.linalg.norm(want @ A[e].T, axis=1)[:, None]
            per_pilot.append(want)
            ratio.append(np.einsum("kp,kp->k", want, q.numpy()) ** 2)  # ‖Aε‖ = 1
        pick = np.argmax(np.stack(ratio), axis=0)
        winners |= set(pick.tolist())
        want = np.stack([per_pilot[pick[m]][m] for m in range(K)])
        np.testing.assert_allclose(got[e], want, rtol=1e-7, atol=1e-9)
    assert len(winners) > 1  # the test reaches the choice between pilots


def test_after_a_rollback_the_rest_of_a_running_build_takes_two_passes(monkeypatch):
    """REORTH_PASSES="auto" with a ratio no pass meets: the first block falls under it and is run again
    with two passes; an example still running after that rerun is no exhausted space, so the whole rest
    of its build takes two passes (not TWO_PASS_BLOCKS blocks, then one pass and another rollback):
    exactly one block of check_every steps is run twice, on a 30 × 20 full-rank matrix (20 steps)."""
    rng = np.random.default_rng(32)
    A = spectrum_batch(rng, 2, 30, 20, np.logspace(0, -1, 20))
    monkeypatch.setattr(krylov, "KEEP_RATIO", 2.0)
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((2, 30)), check_every=3)
    np.testing.assert_array_equal(basis.steps, [20, 20])
    np.testing.assert_array_equal(basis.redone, [3, 3])


def test_the_default_basis_runs_to_exhaustion_with_scipys_code_and_the_documented_rank_tolerance():
    """A consistent full-rank square system is exhausted by β = 0 (b reached exactly): SciPy's LSQR says
    istop 1 there, and so must the basis (2 is α = 0, Jᵀr = 0). The default rank tolerance is
    sqrt(max(n, p))·eps of the data dtype."""
    rng = np.random.default_rng(41)
    A = spectrum_batch(rng, 1, 20, 20, np.logspace(0, -1, 20))
    b = rng.standard_normal((1, 20))
    basis = krylov.build(DenseBatchOperator(A), b)
    assert spla.lsqr(A[0], b[0], atol=1e-14, btol=1e-14, conlim=0)[1] == 1
    np.testing.assert_array_equal(basis.istop, [1])
    np.testing.assert_array_equal(basis.steps, [20])
    assert basis.rtol == np.sqrt(20) * np.finfo(np.float64).eps
    tall = krylov.build(DenseBatchOperator(np.ascontiguousarray(A[:, :, :12])), b)  # 20 × 12: max(n, p) = n
    assert tall.rtol == np.sqrt(20) * np.finfo(np.float64).eps
    # cut short it is a run stopped by its step limit, SciPy's istop 7; at its own length it keeps istop 1
    assert spla.lsqr(A[0], b[0], atol=0, btol=0, conlim=0, iter_lim=19)[1] == 7
    np.testing.assert_array_equal(basis.truncated(19).istop, [7])
    np.testing.assert_array_equal(basis.truncated(20).istop, [1])
    # ‖b‖ = β_1 is no scale of J: a huge b must not raise the exhaustion floor (rank 20 = numpy's)
    huge = krylov.build(DenseBatchOperator(A), 1e14 * b)
    assert np.linalg.matrix_rank(A[0]) == 20
    np.testing.assert_array_equal(huge.steps, [20])
    np.testing.assert_array_equal(huge.rank, [20])


def test_the_automatic_cpu_chunk_makes_room_for_the_restarts():
    """Each restart keeps ~16 rows of n + p values beside the bases: the automatic chunk shrinks with R
    (it did not, and 400 restarts doubled the peak memory of 25), as the LSQR and dense chunks do."""
    from hcrfast import algorithm

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 784)).eval()
    x = torch.zeros(2, 1, 28, 28)
    opts = hcrfast.LSQROptions(atol=0, btol=0, iter_lim=32)
    chunks = [algorithm._krylov_chunk(model, x, R, 784, 784, "reverse", opts) for R in (1, 25, 400)]
    per_example = hcrfast.krylov.basis_values(784, 784, opts) + 16 * (1 + 400) * (784 + 784)
    assert chunks[0] > chunks[1] > chunks[2] == algorithm._KRYLOV_ELEMENTS // per_example


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rank,n,p", [(10, 150, 120), (70, 150, 120), (70, 120, 150), (100, 120, 150),
                                      (120, 150, 120), (120, 120, 150)])
def test_an_exhausted_basis_reports_scipys_stop_code_and_the_least_squares_residual(dtype, rank, n, p):
    """A basis run to exhaustion says istop 1 where b is in J's range and 2 where it is not (Jᵀr = 0), as
    SciPy's LSQR solved tightly does. The step past exhaustion, on rounding noise, used to end by a small
    β and report 1 for inconsistent systems (rank 70 and 100: k = rank + 1). ``pilot_residual`` is the
    least-squares residual of b over ‖b‖ (numpy.linalg.lstsq's)."""
    rng = np.random.default_rng(rank)
    A = spectrum_batch(rng, 1, n, p, np.logspace(0, -2, rank)).astype(dtype)
    b = rng.standard_normal((1, n)).astype(dtype)
    basis = krylov.build(DenseBatchOperator(A), b)
    A64, b64 = A[0].astype(np.float64), b[0].astype(np.float64)
    want = spla.lsqr(A64, b64, atol=1e-8, btol=1e-8, conlim=0, iter_lim=4 * max(n, p))[1]
    assert want in (1, 2)
    np.testing.assert_array_equal(basis.istop, [want])
    x = np.linalg.lstsq(A64, b64, rcond=1e-6)[0]
    lsq = np.linalg.norm(b64 - A64 @ x) / np.linalg.norm(b64)
    (got,) = basis.groups[0].pilot_residual()
    assert abs(got - lsq) <= 1e-6 + 1e-6 * lsq


@pytest.mark.parametrize("batched", [False, True])
def test_keep_best_takes_each_modes_best_candidate_as_the_loop_did(batched):
    """krylov._keep_best, batched (CUDA's) and not, against taking the candidates one by one: per
    (example, mode) the candidate with the largest ratio replaces the kept one where it beats it strictly,
    the first of equal ones winning; examples repeated (several pilots in a slice), absent, and over two
    slices (a later slice must beat the earlier's best)."""
    rng = np.random.default_rng(8)
    B, K, p = 5, 7, 3
    out, best = torch.zeros((B, K, p), dtype=torch.float64), torch.zeros((B, K), dtype=torch.float64)
    want_out, want_best = out.clone(), best.clone()
    for n_slice, examples in enumerate(([0, 0, 2, 3, 3, 3], [3, 1, 0, 0], [2, 2])):  # example 4 never comes
        s = len(examples)
        lin2 = torch.as_tensor(rng.integers(0, 4, size=(s, K)).astype(np.float64))   # small integers: many ties
        if n_slice == 2:   # NaN candidates never win (the loop's NaN > best is False), alone or not
            lin2[0, :3] = math.nan
            lin2[:, 3] = math.nan
        found = torch.as_tensor(rng.standard_normal((s, K, p)))
        for i, e in enumerate(examples):
            better = lin2[i] > want_best[e]
            want_out[e] = torch.where(better[:, None], found[i], want_out[e])
            want_best[e] = torch.where(better, lin2[i], want_best[e])
        krylov._keep_best(out, best, found, lin2, np.array(examples), batched=batched)
        torch.testing.assert_close(best, want_best, rtol=0, atol=0)
        torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    assert not out[4].any() and (best[:4] > 0).any()


def test_a_basis_that_overflows_its_dtype_is_refused_in_lsqr_s_words():
    """solver="krylov" refused a float16 model with features ~100, and per-feature sigma over 1e-30..1e30, with
    the eigensolver's "the tridiagonal matrix of row 0 (k = 20) holds NaN or inf" (no value, no fix), where LSQR
    says that the steps ask for values the dtype cannot hold and to pass a sigma nearer the features' scale."""
    import numpy as np

    import hcrfast

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 20)).eval()
    x = torch.rand(2, 1, 6, 6)
    for model, batch, sigma, kw in [
            (net, x, np.geomspace(1e-30, 1e30, 20), {}),
            (lambda t: half(t), x.half(), 10.0, {"certify": False})]:
        if sigma is not None and not isinstance(sigma, np.ndarray):
            half = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 20)).half().eval()
            with torch.no_grad():
                half[3].weight.mul_(100)
                half[1].weight.mul_(10)
        with pytest.raises(ValueError, match="asks for steps float(32|16) cannot hold.*sigma nearer the features"):
            hcrfast.bound(model, batch, sigma, solver="krylov", restarts=2, iterations=2, **kw)


@pytest.mark.parametrize("singular_steps", [0, 64])
def test_a_sigma_far_beyond_the_features_is_refused_in_lsqr_s_words(singular_steps):
    """At sigma = 1e30 the pilot's norm beta_1 was inf in float32: the basis stopped at its first step with rank 0,
    every eps came out 0, and the refusal said only that the steps "vanish once added to the inputs". Since
    2026-12-02 such a sigma runs on the features divided by it (noise.whitened_scale), ~1e-30 here: the Krylov
    solve and LSQR refuse as they do for any solver whose vectors' squares underflow, naming sigma against the
    features' scale, in the user's sigma."""
    import hcrfast

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
                              torch.nn.Linear(8, 6)).eval()
    x = torch.randn(2, 1, 4, 4)
    for solver in ("krylov", "lsqr") if singular_steps == 0 else ("krylov",):
        with pytest.raises(ValueError, match=r"Gaussian\(sigma=1e\+30\) with size=0.005: .*squares underflow or "
                                             r"overflow.*sigma nearer the features' scale"):
            hcrfast.bound(net, x, 1e30, solver=solver, restarts=2, iterations=2, singular_steps=singular_steps)


@pytest.mark.parametrize("solver", ["dense", "lsqr", "krylov"])
def test_a_float64_model_s_overflow_is_not_told_to_use_a_float64_model(solver):
    """A float64 model at sigma = 1e200 was told to pass "a float64 model and batch", which it is. (Since
    2026-12-02 the run is on the features divided by sigma, ~1e-200: the solvers' vectors, or D, underflow
    instead of overflowing, and the refusal still names sigma against the features.)"""
    import hcrfast

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).double().eval()
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"Gaussian\(sigma=1e\+200\).*(float64 cannot hold|squares underflow or "
                                         r"overflow|too small to square).*sigma nearer the feature") as err:
        hcrfast.bound(net, x, 1e200, solver=solver, restarts=2, iterations=2)
    assert "float64 model" not in str(err.value)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_pilot_that_overflows_is_named_with_the_advice_its_dtype_allows(dtype):
    """krylov.build's own refusal (BasisOverflow) told a float64 pilot to pass "a float64 model and batch"."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2, 12, 6))
    big = np.full((2, 12), np.finfo(dtype).max / 4, dtype=dtype)   # its norm, a sum of squares, overflows
    with pytest.raises(krylov.BasisOverflow, match="at its start") as err:
        krylov.build(DenseBatchOperator(A.astype(dtype)), big)
    assert err.value.k == 0 and err.value.dtype == np.dtype(dtype).name
    assert ("float64 model and batch" in str(err.value)) == (dtype != np.float64)
