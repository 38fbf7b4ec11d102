"""hcrfast.dense: Jacobians against torch.func.jacrev, the basis against scipy.fft, the SVD
quantities against numpy.linalg."""
import math
import warnings

import numpy as np
import pytest
import torch
from test_bound import dct_basis

import hcrfast
from hcrfast import dense


def tanh_mlp(p, hidden, n, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(p, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, n), torch.nn.Tanh()).to(dtype).eval()


def jacrev_oracle(model, x):
    """(B, n, p) from torch.func.jacrev, one example at a time."""
    out = [torch.func.jacrev(lambda t: model(t[None]).reshape(-1))(x[b]).reshape(-1, x[b].numel())
           for b in range(len(x))]
    return torch.stack(out).detach().numpy()


@pytest.mark.parametrize("mode", ["forward", "reverse", "auto"])
@pytest.mark.parametrize("chunk_size", [None, 5, 1])
@pytest.mark.parametrize("n", [12, 30])
def test_jacobian_matches_jacrev(mode, chunk_size, n):
    model = tanh_mlp(16, 20, n)
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    J = dense.jacobian(model, x, mode=mode, chunk_size=chunk_size)
    assert J.shape == (3, n, 16) and J.dtype == torch.float64
    np.testing.assert_allclose(J.numpy(), jacrev_oracle(model, x), rtol=1e-12, atol=1e-14)
    assert all(p.grad is None for p in model.parameters())


def relu_mlp(p, hidden, n, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(p, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, n), torch.nn.ReLU()).double().eval()


@pytest.mark.parametrize("chunk_size", [None, 7, 1])
def test_jacobian_skipping_zero_rows_matches_jacrev(chunk_size):
    """The rows of features behind ReLUs that are off are zero: found by two JVPs (checked by a VJP),
    never pulled back; each pass pulls every example's own next nonzero row. jacrev's J, exact zeros
    where it has them, with one example whose every feature is off (no row pulled), and the products
    per example its nonzero rows + 3."""
    model = relu_mlp(16, 20, 30)
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model[3].bias[:] = torch.linspace(-2, 1, 30, dtype=torch.float64)   # many features off
    x[:4] *= 4.0
    x[4] = 0.0
    with torch.no_grad():
        model[1].bias[:] = -0.1                                              # example 4: every unit off
    want = jacrev_oracle(model, x)
    nonzero = (np.abs(want).max(axis=2) > 0).sum(axis=1)
    assert nonzero[4] == 0 and 0 < nonzero[:4].min() and nonzero.max() < 30
    J, products = dense.jacobian(model, x, mode="reverse", chunk_size=chunk_size, skip_zero_rows=True,
                                 return_products=True)
    np.testing.assert_allclose(J.numpy(), want, rtol=1e-12, atol=1e-14)
    assert not J.numpy()[np.abs(want) == 0].any()
    np.testing.assert_array_equal(products, nonzero + 3 + 1)   # the probes, the check of J
    # without skipping: every row by a VJP, n products
    J, products = dense.jacobian(model, x, mode="reverse", chunk_size=chunk_size, return_products=True)
    np.testing.assert_allclose(J.numpy(), want, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(products, [30 + 1] * 5)
    assert all(p.grad is None for p in model.parameters())


def test_jacobian_pulls_back_every_row_where_reverse_mode_disagrees_with_the_probe():
    """A straight-through estimator: forward mode says round's derivative (0), backward passes the
    gradient on. The JVPs mark every row zero; the VJP check finds them not, and J is jacrev's (it
    was all zeros, so the dense solve found rank 0 and bounds of 0 where LSQR finds +inf)."""
    class STE(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return torch.round(x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return g

        @staticmethod
        def jvp(ctx, t):
            return torch.zeros_like(t)

    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 12).double()

    def model(x):
        return STE.apply(lin(x.reshape(x.shape[0], -1)))

    x = torch.randn(3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    want = jacrev_oracle(model, x)
    assert (np.abs(want).max(axis=2) > 0).all()
    J, products = dense.jacobian(model, x, mode="reverse", skip_zero_rows=True, return_products=True)
    np.testing.assert_allclose(J.detach().numpy(), want, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(products, [12 + 3 + 1] * 3)


def test_jacobian_of_a_model_without_zero_rows_is_built_the_usual_way():
    """tanh: the probes find no zero row, and every row is pulled back as without skipping: the same
    J, bit for bit, for the probes' 2 products more."""
    model = tanh_mlp(16, 20, 30)
    x = torch.randn(4, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    plain, products = dense.jacobian(model, x, mode="reverse", return_products=True)
    skipped, products_skipped = dense.jacobian(model, x, mode="reverse", skip_zero_rows=True, return_products=True)
    torch.testing.assert_close(skipped, plain, rtol=0, atol=0)
    np.testing.assert_array_equal(products_skipped, products + 2)


def test_jacobian_skips_nothing_where_forward_mode_cannot_run():
    """A custom autograd.Function with no jvp: torch.func's forward mode refuses it, so every row is
    pulled back (n products each), and J is still jacrev's."""
    class Relu(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x.clamp_min(0)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (x > 0)

    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 12).double()

    def model(x):
        return Relu.apply(lin(x.reshape(x.shape[0], -1)))

    x = torch.randn(3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with pytest.raises(NotImplementedError):
        torch.func.jvp(model, (x,), (x,))
    J, products = dense.jacobian(model, x, mode="reverse", skip_zero_rows=True, return_products=True)
    np.testing.assert_allclose(J.detach().numpy(), jacrev_oracle(model, x), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(products, [12 + 1] * 3)
    # forward mode builds columns: p JVPs each, whatever skip_zero_rows says
    _, products = dense.jacobian(relu_mlp(16, 20, 30), x.reshape(3, 1, 4, 4), mode="forward",
                                 skip_zero_rows=True, return_products=True)
    np.testing.assert_array_equal(products, [16 + 1] * 3)


class _SoftSign(torch.autograd.Function):
    """t / (1 + |t|) with a backward and no jvp staticmethod: torch.func's forward mode refuses it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(t):
        return t / (1 + t.abs())

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g / (1 + t.abs()) ** 2


class _Widening(torch.nn.Module):
    """16 inputs → 40 features (forward mode's side), through _SoftSign, or the same function in plain ops."""

    def __init__(self, custom=True):
        super().__init__()
        torch.manual_seed(7)
        self.lin, self.custom = torch.nn.Linear(16, 40), custom

    def forward(self, x):
        h = self.lin(x.flatten(1))
        return _SoftSign.apply(h) if self.custom else h / (1 + h.abs())


def test_auto_builds_j_in_reverse_mode_where_forward_ad_is_missing():
    """"auto" takes forward mode for 40 features of 16 inputs; an autograd.Function without a jvp staticmethod
    refuses it, so J is built from VJPs instead (40 products, not 16): autograd's J, and the mode that ran is
    said. Forward mode asked for by name is refused with the way out. bound's dense solve and targeted_bound
    then give the bounds of the same function written in plain ops (which runs in forward mode)."""
    import hcrfast

    QUICK = dict(iterations=2, restarts=2)
    model, plain = _Widening().double().eval(), _Widening(custom=False).double().eval()
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    with pytest.raises(NotImplementedError, match="jvp"):
        torch.func.jvp(model, (x,), (x,))
    J, products, mode = dense.jacobian(model, x, return_products=True, return_mode=True)
    assert mode == "reverse"
    np.testing.assert_array_equal(products, [40 + 1] * 3)       # and the VJP that checks J
    np.testing.assert_allclose(J.numpy(), jacrev_oracle(plain, x), rtol=1e-12, atol=1e-14)
    _, products, mode = dense.jacobian(plain, x, return_products=True, return_mode=True)
    assert mode == "forward"
    np.testing.assert_array_equal(products, [16 + 1] * 3)
    with pytest.raises(ValueError, match=r"in forward mode, asked for here.*jacobian='auto' builds J in reverse "
                                         r"mode.*solver='lsqr'"):
        dense.jacobian(model, x, mode="forward")

    got, want = hcrfast.bound(model, x, 0.05, **QUICK), hcrfast.bound(plain, x, 0.05, **QUICK)
    assert got.params["solver"] == "dense" and got.params["dense"]["jacobian_products"] == 41
    assert want.params["dense"]["jacobian_products"] == 17
    np.testing.assert_allclose(got.std, want.std, rtol=1e-9)
    targets = hcrfast.bound(model, x, 0.05, targets=[0, 5], **QUICK)
    plain_targets = hcrfast.bound(plain, x, 0.05, targets=[0, 5], **QUICK)
    np.testing.assert_allclose(targets.targeted.std, plain_targets.targeted.std, rtol=1e-9)
    got = hcrfast.targeted_bound(model, x, 0.05, targets=[0, 5, 9], method="dense")
    want = hcrfast.targeted_bound(plain, x, 0.05, targets=[0, 5, 9], method="dense")
    assert got.params["jacobian"] == "reverse" and want.params["jacobian"] == "forward"
    np.testing.assert_allclose(got.std, want.std, rtol=1e-9)


class _SoftSignNoVmap(_SoftSign):
    """With a jvp staticmethod and no vmap rule: forward mode's vmapped JVPs refuse it."""

    generate_vmap_rule = False

    @staticmethod
    def jvp(ctx, t_dot):
        (t,) = ctx.saved_tensors
        return t_dot / (1 + t.abs()) ** 2


def test_an_autograd_function_without_vmap_support_is_named_with_its_fix():
    class Model(_Widening):
        def forward(self, x):
            return _SoftSignNoVmap.apply(self.lin(x.flatten(1)))

    x = torch.randn(2, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    with pytest.raises(ValueError, match=r"autograd\.Function without vmap support.*solver='lsqr'.*or give it "
                                         r"generate_vmap_rule = True"):
        dense.jacobian(Model().double().eval(), x)           # "auto": forward mode


def test_dense_jacobian_of_a_transformer_layer_on_its_fast_path_matches_autograd():
    """nn.TransformerEncoderLayer in eval mode without gradients takes torch's fused fast path
    (_transformer_encoder_layer_fwd), which has no forward AD; forward mode's JVPs turn it off for their
    length (and leave it on), so J is autograd's."""
    torch.manual_seed(9)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    with torch.no_grad(), pytest.raises(NotImplementedError, match="forward AD"):
        torch.func.jvp(layer, (x,), (x,))
    J = dense.jacobian(layer, x, mode="forward")
    assert torch.backends.mha.get_fastpath_enabled()
    want = torch.stack([torch.autograd.functional.jacobian(lambda t: layer(t[None]).reshape(-1), x[b]).reshape(24, 24)
                        for b in range(2)])
    np.testing.assert_allclose(J.numpy(), want.numpy(), rtol=1e-12, atol=1e-13)
    # reverse mode: vmap over the fused kernel's backward has no batching rule (torch loops, and warns);
    # the J is recorded with the MATH backend's products, which vmap batches
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        J = dense.jacobian(layer, x, mode="reverse")
    assert not [w for w in seen if "batching rule" in str(w.message)]
    np.testing.assert_allclose(J.numpy(), want.numpy(), rtol=1e-12, atol=1e-13)


class _Distances(torch.nn.Module):
    """Distances from 6 points computed from the input to 5 fixed ones: torch.cdist."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(63)
        self.lin = torch.nn.Linear(16, 24)
        self.register_buffer("anchors", torch.randn(5, 4))

    def forward(self, x):
        h = torch.tanh(self.lin(x.flatten(1))).reshape(-1, 6, 4)
        return torch.cdist(h, self.anchors.to(h.dtype).expand(h.shape[0], -1, -1)).flatten(1)


def test_a_jacobian_that_torch_func_builds_wrong_is_built_again_by_plain_autograd():
    """In torch 2.14 vmap over torch.cdist's backward gives wrong rows (torch.func.jacrev's J is wrong with it):
    the check against one plain backward pass catches the J built that way, and it is built again one row at
    a time: autograd's J, with a warning, and the products spent on both counted."""
    model = _Distances().double().eval()
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(64))
    want = np.stack([torch.autograd.functional.jacobian(lambda t: model(t[None])[0], x[b]).reshape(30, 16).numpy()
                     for b in range(3)])
    torch_func_wrong = not np.allclose(jacrev_oracle(model, x), want, rtol=1e-10, atol=1e-12)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        J, products, mode = dense.jacobian(model, x, mode="reverse", return_products=True, return_mode=True)
    np.testing.assert_allclose(J.numpy(), want, rtol=1e-12, atol=1e-14)
    rebuilt = [w for w in seen if "plain autograd contradicts" in str(w.message)]
    assert len(rebuilt) == int(torch_func_wrong)
    np.testing.assert_array_equal(products, [30 + 1 + (30 + 1 if torch_func_wrong else 0)] * 3)
    assert mode == "reverse"


def test_jacobian_float32():
    model = tanh_mlp(16, 20, 12, dtype=torch.float32)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    J = dense.jacobian(model, x)
    assert J.dtype == torch.float32
    np.testing.assert_allclose(J.numpy(), jacrev_oracle(model, x), rtol=1e-5, atol=1e-6)


def test_resolve_jacobian_mode_takes_the_fewer_products():
    assert dense.resolve_jacobian_mode("auto", n=100, p=64) == "forward"
    assert dense.resolve_jacobian_mode("auto", n=10, p=64) == "reverse"
    assert dense.resolve_jacobian_mode("auto", n=64, p=64) == "reverse"  # a tie: reverse is faster in torch
    assert dense.resolve_jacobian_mode("reverse", n=100, p=64) == "reverse"
    with pytest.raises(ValueError, match="jacobian must be one of"):
        dense.resolve_jacobian_mode("sideways", n=1, p=1)


@pytest.mark.parametrize("shape", [(1, 4, 4), (2, 3, 4), (3, 5)])
def test_basis_vectors_are_the_rows_of_scipys_dct(shape):
    p = int(np.prod(shape))
    Q = dct_basis(shape)
    np.testing.assert_allclose(dense.basis_vectors(shape, "dct", np.arange(p)), Q, atol=1e-14)
    modes = np.array([p - 1, 0, 3])
    np.testing.assert_allclose(dense.basis_vectors(shape, "dct", modes), Q[modes], atol=1e-14)
    np.testing.assert_array_equal(dense.basis_vectors(shape, "pixel", modes), np.eye(p)[modes])


def rank_deficient(rng, B, n, p, r):
    return np.stack([rng.standard_normal((n, r)) @ rng.standard_normal((r, p)) for _ in range(B)])


@pytest.mark.parametrize("n,p,r", [(20, 12, 12), (20, 12, 7), (8, 12, 8), (8, 12, 5)])
def test_decomposition_against_numpy(n, p, r):
    rng = np.random.default_rng(n * 100 + p + r)
    J = rank_deficient(rng, 3, n, p, r)
    dec = dense.decompose(torch.as_tensor(J))
    q = dct_basis((1, 3, 4))
    dirs = dec.directions(torch.as_tensor(q))
    np.testing.assert_array_equal(dec.rank.numpy(), [np.linalg.matrix_rank(Jb) for Jb in J])
    np.testing.assert_array_equal(dec.null_dim.numpy(), p - r)
    for b in range(3):
        _, s, Vt = np.linalg.svd(J[b])
        np.testing.assert_allclose(dec.singular_values[b].numpy()[:r], s[:r], rtol=1e-12)
        np.testing.assert_allclose(abs(dec.weakest[b].numpy() @ Vt[r - 1]), 1.0, rtol=1e-10)
        np.testing.assert_allclose(dec.smallest_singular_value[b].item(), s[r - 1], rtol=1e-12)
        G = np.linalg.pinv(J[b].T @ J[b], rcond=1e-10, hermitian=True)
        crb = np.einsum("kp,pq,kq->k", q, G, q)
        np.testing.assert_allclose(dirs.linear_std[b].numpy() ** 2, crb, rtol=1e-8)
        direction = q @ G                         # rows (JᵀJ)⁺ q_k
        unit = direction / np.linalg.norm(direction @ J[b].T, axis=1, keepdims=True)
        np.testing.assert_allclose(dirs.eps[b].numpy(), unit, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(np.linalg.norm(dirs.eps[b].numpy() @ J[b].T, axis=1), 1.0, rtol=1e-10)
        P_null = np.eye(p) - np.linalg.pinv(J[b]) @ J[b]
        np.testing.assert_allclose(dirs.null_part[b].numpy(), q @ P_null, atol=1e-10)
        np.testing.assert_allclose(dirs.null_fraction[b].numpy(), np.linalg.norm(q @ P_null, axis=1), atol=1e-10)
    if r == p:
        assert dirs.null_fraction.max() < 1e-12


def test_weakest_direction_is_algorithm_1s_limit():
    """Algorithm 1 on a linear model converges to the smallest right singular vector (power iteration
    on (JᵀJ)⁻¹), which the dense path gives directly."""
    rng = np.random.default_rng(0)
    J = rng.standard_normal((15, 6))
    v = rng.standard_normal(6)
    for _ in range(200):
        v = np.linalg.solve(J.T @ J, v)
        v /= np.linalg.norm(v)
    dec = dense.decompose(torch.as_tensor(J[None]))
    np.testing.assert_allclose(abs(dec.weakest[0].numpy() @ v), 1.0, rtol=1e-10)


def test_decompose_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="Shape mismatch"):
        dense.decompose(torch.zeros(3, 4))


def test_eigh_driver_agrees_with_svd_above_its_resolution():
    """eigh of JᵀJ resolves singular values down to ~sqrt(p·eps)·s_max: at float32 tolerances it gives
    the SVD's rank, null space and directions."""
    rng = np.random.default_rng(9)
    J = torch.as_tensor(rank_deficient(rng, 2, 10, 16, 7)).float()
    a, b = dense.decompose(J, driver="svd"), dense.decompose(J, driver="eigh")
    np.testing.assert_array_equal(a.rank.numpy(), b.rank.numpy())
    np.testing.assert_allclose(b.singular_values[:, :7].numpy(), a.singular_values[:, :7].numpy(), rtol=1e-8)
    q = torch.as_tensor(dct_basis((1, 4, 4)))
    da, db = a.directions(q), b.directions(q)
    np.testing.assert_allclose(db.eps.numpy(), da.eps.numpy(), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db.null_fraction.numpy(), da.null_fraction.numpy(), atol=1e-8)
    assert dense.decompose(J, driver="auto").rank.tolist() == [7, 7]


@pytest.mark.parametrize("eigh_impl", ["torch", "lapack"])
@pytest.mark.parametrize("driver", ["svd", "eigh"])
@pytest.mark.parametrize("n,p", [(7, 12), (12, 7), (10, 10)])
def test_min_norm_solver_matches_numpy_lstsq(n, p, driver, eigh_impl, monkeypatch):
    """J⁺ z for zero rows, rank deficiency and both shapes, against numpy.linalg.lstsq (SVD, rcond),
    with the Gram matrices decomposed by torch and by the host's LAPACK (each example's live block)."""
    monkeypatch.setattr(dense, "EIGH_IMPL", eigh_impl)
    rng = np.random.default_rng(n * 100 + p)
    J = rng.standard_normal((4, n, p))
    J[0, 2] = 0.0                                                    # a dead feature
    J[1, :3] = 0.0                                                   # three
    J[2] = J[2][:, :3] @ rng.standard_normal((3, p))                 # rank 3
    J[3] = 0.0                                                       # nothing moves: ε = 0
    rtol = 1e-6  # the Gram matrix resolves singular values down to ~sqrt(eps64)·s_max, far below this
    solver = dense.min_norm_solver(torch.as_tensor(J), rtol=rtol, driver=driver)
    z = rng.standard_normal((4, 5, n))
    got = solver.solve(torch.as_tensor(z)).numpy()
    for b in range(4):
        want = np.linalg.lstsq(J[b], z[b].T, rcond=rtol)[0].T
        np.testing.assert_allclose(got[b], want, rtol=1e-9, atol=1e-12)
        assert solver.rank[b] == np.linalg.matrix_rank(J[b])
        assert solver.live_rows[b] == (np.abs(J[b]).max(axis=1) > 0).sum()
    assert solver.driver == driver


@pytest.mark.parametrize("eigh_impl", ["torch", "lapack"])
def test_min_norm_solver_of_no_inputs_is_rank_zero(eigh_impl, monkeypatch):
    """p = 0 (a J of no columns): rank 0 and an empty solve, with the Gram driver too."""
    monkeypatch.setattr(dense, "EIGH_IMPL", eigh_impl)
    J = torch.zeros((3, 4, 0), dtype=torch.float64)
    for driver in ("eigh", "svd"):
        solver = dense.min_norm_solver(J, driver=driver)
        assert solver.rank.tolist() == [0, 0, 0]
        assert solver.solve(torch.ones((3, 2, 4))).shape == (3, 2, 0)


@pytest.mark.parametrize("driver", ["auto", "eigh", "svd"])
def test_min_norm_solver_of_no_features_is_rank_zero(driver):
    """n = 0 (a J of no rows; decompose gives rank 0): an empty factorization whose steps are all 0 and
    whose singular directions are zero rows, not a torch shape error from gathering a row that is not there."""
    J = torch.zeros((2, 0, 4), dtype=torch.float64)
    assert dense.decompose(J).rank.tolist() == [0, 0]
    solver = dense.min_norm_solver(J, driver=driver, smallest=3)
    assert solver.rank.tolist() == [0, 0] and solver.live_rows.tolist() == [0, 0]
    assert torch.equal(solver.solve(torch.ones((2, 5, 0))), torch.zeros((2, 5, 4), dtype=torch.float64))
    assert solver.smallest.shape == (2, 3, 4) and not solver.smallest.any() and not solver.smallest_values.any()
    dirs = solver.directions(torch.eye(4, dtype=torch.float64), J)
    assert not dirs.eps.any() and torch.equal(dirs.null_fraction, torch.ones((2, 4), dtype=torch.float64))


def test_the_rank_tolerance_is_sqrt_max_n_p_eps_and_relative_to_singular_values():
    """Default tolerance: S_max·sqrt(max(n, p))·eps (here 9.9e-16 for a 20 × 12 float64 J): a singular value
    of 8e-16 counts as zero, in both factorizations, and one of 3.5e-15 is kept, which
    numpy.linalg.matrix_rank's max(n, p)·eps (4.4e-15; the rule until 2026-11-30) drops. An explicit rtol is
    relative to the singular values, not to their squares, also in the Gram-matrix (eigh) driver: cond 1e5
    at rtol 1e-6 keeps every singular value, as lstsq does."""
    for small, rank in ((8e-16, 11), (3.5e-15, 12)):
        J = np.zeros((1, 20, 12))
        J[0, np.arange(12), np.arange(12)] = [1.0] * 11 + [small]  # diagonal: its SVD is exact
        assert np.linalg.matrix_rank(J[0], tol=math.sqrt(20) * np.finfo(np.float64).eps) == rank
        assert dense.min_norm_solver(torch.as_tensor(J)).rank.tolist() == [rank]
        assert dense.decompose(torch.as_tensor(J)).rank.tolist() == [rank]
    assert np.linalg.matrix_rank(J[0]) == 11   # numpy's default would drop it
    rng = np.random.default_rng(3)
    U, _ = np.linalg.qr(rng.standard_normal((20, 12)))
    V, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    J = ((U * np.logspace(0, -5, 12)) @ V.T)[None]
    z = rng.standard_normal((1, 4, 20))
    want = np.linalg.lstsq(J[0], z[0].T, rcond=1e-6)[0].T
    for driver in ("svd", "eigh"):
        solver = dense.min_norm_solver(torch.as_tensor(J), rtol=1e-6, driver=driver)
        assert solver.rank.tolist() == [12]
        # (the Gram matrix squares cond = 1e5: ~1e-6 of the largest entry, cf. test_eigh_driver_agrees_with_svd_above_its_resolution)
        np.testing.assert_allclose(solver.solve(torch.as_tensor(z)).numpy()[0], want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_tall_float64_jacobian_keeps_the_singular_values_a_gram_matrix_would_lose():
    """100 × 12 float64 J of condition 1e10: the automatic driver must not square it (eigh of JᵀJ resolves
    singular values only down to ~sqrt(eps64)·s_max = 1.5e-8): J⁺ z as numpy.linalg.lstsq gives it."""
    rng = np.random.default_rng(8)
    U, _ = np.linalg.qr(rng.standard_normal((100, 12)))
    V, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    J = ((U * np.logspace(0, -10, 12)) @ V.T)[None]
    z = rng.standard_normal((1, 3, 100))
    solver = dense.min_norm_solver(torch.as_tensor(J))
    assert solver.rank.tolist() == [12]
    want = np.linalg.lstsq(J[0], z[0].T, rcond=None)[0].T
    np.testing.assert_allclose(solver.solve(torch.as_tensor(z)).numpy()[0], want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_min_norm_solver_auto_driver_and_float32_tolerance():
    rng = np.random.default_rng(1)
    J32 = torch.as_tensor(rng.standard_normal((2, 9, 6)), dtype=torch.float32)
    assert dense.min_norm_solver(J32).driver == "eigh"                 # float32 J: its own errors dominate
    assert dense.min_norm_solver(J32.double()).driver == "svd"         # float64 J: the Gram matrix would lose digits
    z = rng.standard_normal((2, 3, 9))
    got = dense.min_norm_solver(J32).solve(torch.as_tensor(z)).numpy()
    for b in range(2):
        want = np.linalg.lstsq(J32[b].double().numpy(), z[b].T, rcond=None)[0].T
        np.testing.assert_allclose(got[b], want, rtol=1e-7)
    with pytest.raises(ValueError, match="Shape mismatch"):
        dense.min_norm_solver(J32[0])


@pytest.mark.parametrize("n,p,r,dead", [(20, 12, 12, 0), (20, 12, 7, 5), (8, 12, 8, 0), (8, 12, 5, 3), (9, 12, 6, 4)])
def test_min_norm_solver_directions_against_numpy(n, p, r, dead):
    """The Cramér–Rao directions from the live-row factorization, with zero rows (ReLU features that
    are off) and rank deficiency, against numpy's pinv of JᵀJ and the projector I − J⁺J."""
    rng = np.random.default_rng(n * 1000 + p * 10 + r + dead)
    J = rank_deficient(rng, 3, n, p, r)
    J[:, rng.permutation(n)[:dead]] = 0.0
    q = dct_basis((1, 3, 4))
    solver = dense.min_norm_solver(torch.as_tensor(J))
    dirs = solver.directions(torch.as_tensor(q), torch.as_tensor(J))
    for b in range(3):
        rank = np.linalg.matrix_rank(J[b])
        assert solver.null_dim[b].item() == p - rank
        pinv = np.linalg.pinv(J[b])                 # (JᵀJ)⁺ = J⁺ (J⁺)ᵀ, without squaring cond(J)
        w = q @ pinv                                # rows (J⁺)ᵀ q_k
        np.testing.assert_allclose(dirs.linear_std[b].numpy(), np.linalg.norm(w, axis=1), rtol=1e-8)
        direction = w @ pinv.T                      # rows (JᵀJ)⁺ q_k
        norm = np.linalg.norm(direction @ J[b].T, axis=1, keepdims=True)
        unit = np.where(norm > 0, direction / np.where(norm > 0, norm, 1.0), 0.0)
        np.testing.assert_allclose(dirs.eps[b].numpy(), unit, rtol=1e-7, atol=1e-9)
        P_null = np.eye(p) - pinv @ J[b]
        np.testing.assert_allclose(dirs.null_part[b].numpy(), q @ P_null, atol=1e-10)
        np.testing.assert_allclose(dirs.null_fraction[b].numpy(), np.linalg.norm(q @ P_null, axis=1), atol=1e-10)


def test_min_norm_solver_directions_match_decompose_in_float32():
    """Float32 Jacobians (what the models give): both factorizations agree on rank and directions."""
    rng = np.random.default_rng(5)
    J = torch.as_tensor(rank_deficient(rng, 2, 14, 16, 9)).float()
    J[:, 3] = 0.0
    q = torch.as_tensor(dct_basis((1, 4, 4)))
    a, solver = dense.decompose(J), dense.min_norm_solver(J)
    da, db = a.directions(q), solver.directions(q, J)
    np.testing.assert_array_equal(solver.null_dim.numpy(), a.null_dim.numpy())
    np.testing.assert_allclose(db.eps.numpy(), da.eps.numpy(), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db.null_part.numpy(), da.null_part.numpy(), atol=1e-8)


class Checkpointed(torch.nn.Module):
    """Activation checkpointing (torch.utils.checkpoint, non-reentrant): plain autograd takes it,
    torch.func's vjp does not (saved tensor hooks)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh()).double()

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


def test_a_model_torch_func_cannot_run_is_refused_with_the_solver_that_can():
    import hcrfast

    model = Checkpointed().eval()
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((2, 1, 4, 4)))
    with pytest.raises(ValueError, match=r"runs the model under torch.func \(vmap over vjp\).* saved tensor hooks.*"
                                         r"pass solver='lsqr'"):
        hcrfast.bound(model, x, 0.1, restarts=1, iterations=1)  # the CPU default for 16 inputs: dense
    res = hcrfast.bound(model, x, 0.1, restarts=1, iterations=1, solver="lsqr")
    with torch.no_grad():  # its certified shift is the model's own, checked in float64
        np.testing.assert_allclose(res.z, (model(x + torch.as_tensor(res.eps)) - model(x)).numpy(), atol=1e-12)


class ChannelsLastOut(torch.nn.Module):
    """A forward that makes its output channels_last: plain autograd takes it, vmap has no rule for it
    (torch 2.14: "NYI: Tensor.clone(memory_format) ... ChannelsLast")."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x).contiguous(memory_format=torch.channels_last)


def test_a_dense_targeted_step_vmap_cannot_take_names_the_targeted_option_that_can():
    """bound(solver='lsqr', targets=...): the targeted directions' dense J needs vmap; the refusal names the
    operation as the cause and targeted_method='lsqr' (the user already passed solver='lsqr'), and that runs."""
    import hcrfast

    model, x = ChannelsLastOut().eval(), torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    kw = dict(restarts=2, iterations=2, solver="lsqr", targets="low:2")
    try:
        with torch.no_grad():
            torch.func.vmap(model)(x[None])
    except RuntimeError:
        pass
    else:
        pytest.skip("this torch's vmap runs a channels_last clone")
    with pytest.raises(ValueError, match=r"vmap has no rule for an operation of the forward.*"
                                         r"targeted_method='lsqr' \(hcrfast.bound\)"):
        hcrfast.bound(model, x, 0.1, **kw)
    res = hcrfast.bound(model, x, 0.1, targeted_method="lsqr", **kw)
    assert res.params["targeted"]["method"] == "lsqr" and np.all(np.isfinite(res.std))


@pytest.mark.parametrize("fault", [
    RuntimeError("CUDA error: an illegal memory access was encountered\nCompile with TORCH_USE_CUDA_DSA"),
    RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, ...)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    getattr(torch, "AcceleratorError", RuntimeError)("device-side assert triggered"),  # torch >= 2.8 has the class
])
def test_a_device_fault_while_building_j_is_raised_as_it_is(monkeypatch, fault):
    """A fault of the GPU or its libraries inside the vmapped build of J is raised unchanged, not turned
    into the advice for a forward torch.func cannot run (solver='lsqr'), which names the wrong cause."""
    from hcrfast import dense

    def broken(*args, **kwargs):
        raise fault

    monkeypatch.setattr(dense, "_fill_jacobian", broken)
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((2, 1, 4, 4)))
    with pytest.raises(type(fault)) as caught:
        dense.jacobian(Checkpointed().inner, x)
    assert caught.value is fault

    monkeypatch.setattr(dense, "_fill_jacobian", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("vmap: boom")))
    with pytest.raises(ValueError, match="solver='lsqr'"):   # what torch.func refuses still gets the advice
        dense.jacobian(Checkpointed().inner, x)


def test_dense_chunks_on_cuda_leave_room_for_the_device_eigendecomposition(monkeypatch):
    """On CUDA a chunk of the dense solve holds J's copies, the Gram matrix, the pseudo-inverse and the
    restarts' vectors, plus, with a device routine as dense.EIGH_IMPL, ~6 arrays of order min(n, p) (its symmetrized
    copy, eigenvectors, the core (Gram)⁺): with half the free memory, MNIST's geometry fits 349 examples
    in 40 GiB (the CPU's budget, a fixed count of values, is unchanged)."""
    from types import SimpleNamespace

    from hcrfast import algorithm

    free = 40 * 2**30
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(algorithm, "release_device_memory", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free, 80 * 2**30))
    n = p = 784
    R = 25
    per_example = 5 * n * p + n * n + 8 * R * (n + p) + 6 * n * n
    cuda = SimpleNamespace(device=torch.device("cuda"))
    host_eigh = algorithm._dense_chunk(cuda, R, n, p)          # dense.EIGH_IMPL "auto": LAPACK on the host
    assert host_eigh == (free // 2) // (8 * (per_example - 6 * n * n)) == 670
    monkeypatch.setattr(dense, "EIGH_IMPL", "cusolver")
    got = algorithm._dense_chunk(cuda, R, n, p)
    assert got == (free // 2) // (8 * per_example) == 349
    cpu = algorithm._dense_chunk(torch.zeros(1), R, n, p)
    assert cpu == algorithm._DENSE_ELEMENTS // (5 * n * p + n * n + 8 * R * (n + p)) == 16


class _Cells(torch.nn.Module):
    """An LSTM cell and a GRU cell stepped over the rows of the input, then an LSTM: what CUDA runs with
    torch's fused cells."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(61)
        self.lstm_cell, self.gru_cell = torch.nn.LSTMCell(4, 5), torch.nn.GRUCell(5, 3)
        self.lstm = torch.nn.LSTM(3, 2, batch_first=True)

    def forward(self, x):                                   # (B, T, 4)
        h = c = x.new_zeros((x.shape[0], 5))
        g, seq = x.new_zeros((x.shape[0], 3)), []
        for t in range(x.shape[1]):
            h, c = self.lstm_cell(x[:, t], (h, c))
            g = self.gru_cell(torch.relu(h), g)             # ReLU: some rows of J are zero (the live-row path)
            seq.append(g)
        out, _ = self.lstm(torch.stack(seq, dim=1))
        return torch.cat([g, out.flatten(1)], dim=1)


@pytest.mark.parametrize("live", [False, True])
def test_pullbacks_with_a_graph_give_the_same_jacobian(live):
    """On CUDA, with RNN cells in the model, the dense solve's vmapped pullbacks run with create_graph=True,
    so that torch takes its differentiable (batchable) backward of the fused cells instead of a CUDA kernel
    vmap runs row by row. Here on the CPU: that switch gives autograd's J, on both reverse paths (every row,
    the live rows alone), and leaves no graph on the result."""
    model = _Cells().double().eval()
    assert dense._has_rnn_cells(model) and not dense._has_rnn_cells(torch.nn.Linear(2, 2))
    x = torch.randn(3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    J = torch.stack([torch.autograd.functional.jacobian(lambda t: model(t[None])[0], x[b]).reshape(-1, 24)
                     for b in range(3)])

    def f(t):
        return model(t).reshape(t.shape[0], -1)

    rows = None
    if live:
        rows = (J != 0).any(dim=2)
        assert not rows.all()                               # the ReLU zeroes some rows
    for graph in (False, True):
        out = torch.zeros_like(J)
        dense._fill_jacobian(out, f, x, "reverse", 4, rows, graph=graph)
        assert not out.requires_grad
        torch.testing.assert_close(out, J, rtol=1e-10, atol=1e-12)


def test_the_dense_rank_rule_keeps_real_directions_of_an_ill_conditioned_float32_map():
    """Until 2026-11-30 the dense solve counted singular values below max(n, p)·eps(float32)·s_max as zero, so
    a float32 linear map whose J is exact but has one DCT mode ×300 (cond ~1e5) lost real small directions:
    bounds valid (at most the exact least-squares std, from the map's own QR) but a median of 0.25 of the
    exact std, against the Krylov basis' 0.83. With sqrt(max(n, p))·eps, the Krylov basis' rule, it keeps
    them: 0.83 too (restarts 4, iterations 3)."""
    import scipy.fft

    H, W = 13, 28
    n = H * W
    D = scipy.fft.dctn(np.eye(n).reshape(n, 1, H, W), axes=(-2, -1), norm="ortho").reshape(n, n).T
    rng = np.random.default_rng(0)
    g = np.ones(n)
    g[-1] = 300.0
    torch.manual_seed(0)
    lin = torch.nn.Linear(n, n + 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(rng.standard_normal((n + 2, n)) @ (g[:, None] * D)))
    model = torch.nn.Sequential(torch.nn.Flatten(1), lin).eval()
    A = lin.weight.detach().double().numpy()
    exact = 0.7 * np.linalg.norm(np.linalg.solve(np.linalg.qr(A)[1].T, D.T), axis=0)   # sqrt(σ² c_kᵀ(AᵀA)⁻¹c_k)
    x = torch.randn(2, 1, H, W, generator=torch.Generator().manual_seed(0))
    ratio = {}
    for solver in ("dense", "krylov"):
        res = hcrfast.bound(model, x, 0.7, restarts=4, iterations=3, solver=solver)
        ratio[solver] = np.asarray(res.std).reshape(2, -1) / exact
        assert ratio[solver].max() <= 1.0
    assert np.median(ratio["dense"]) > 0.75 and np.median(ratio["krylov"]) > 0.75


def test_a_backward_hook_that_breaks_the_dense_solve_is_named():
    """A Grad-CAM style full backward hook wraps the submodule's output in an autograd.Function that vmap cannot
    batch: the refusal blamed in-place changes of the model's state. It names the hooked submodule now."""
    import hcrfast

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Tanh(), torch.nn.Flatten(),
                              torch.nn.Linear(256, 10)).eval()
    net[0].register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(ValueError, match=r"the backward hooks on the submodules '0' \(register_full_backward_hook"):
        hcrfast.bound(net, torch.rand(2, 1, 8, 8), 0.1, iterations=2, restarts=2, solver="dense")


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_no_module_is_first_imported_inside_a_chunk(solver, tmp_path):
    """The dense solve's first chunk imported some 900 modules (torch.func's first use loads torch._dynamo) and
    mapped SciPy's OpenBLAS: under a memory limit that failed as an ImportError, a SystemError or a hang where the
    chunk's own allocations halve it. dense.warm_up loads them before the chunks, in a fresh interpreter here."""
    import subprocess
    import sys

    code = (
        "import sys, warnings, torch, hcrfast\n"
        "import hcrfast.algorithm as A\n"
        "warnings.simplefilter('ignore')\n"
        "real, new = A._in_chunks, []\n"
        "def watched(*a, **k):\n"
        "    before = set(sys.modules)\n"
        "    out = real(*a, **k)\n"
        "    new.extend(sorted(set(sys.modules) - before))\n"
        "    return out\n"
        "A._in_chunks = watched\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 30), torch.nn.Tanh()).eval()\n"
        f"hcrfast.bound(m, torch.rand(2, 1, 8, 8), 0.1, restarts=2, iterations=2, solver={solver!r})\n"
        "print(len(new), new[:10])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.stdout.strip() == "0 []", done.stdout + done.stderr[-2000:]


def test_the_warm_up_draws_nothing_from_torch_s_global_rng(tmp_path):
    """dense.warm_up built a torch.nn.Linear, whose init drew from the global RNG: a seeded script's next draws
    differed on a process's first dense call (and a closure's pre-hook warned of that Linear as the user's)."""
    import subprocess
    import sys

    code = ("import warnings, torch, hcrfast\n"
            "lin = torch.nn.Linear(6, 3).double().eval()\n"
            "x = torch.randn(2, 6, dtype=torch.float64)\n"
            "torch.manual_seed(123)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    hcrfast.bound(lambda t: lin(t), x, 0.1, restarts=1, iterations=1, solver='dense', basis='pixel')\n"
            "after = torch.rand(1).item()\n"
            "torch.manual_seed(123)\n"
            "print(after == torch.rand(1).item(), [str(m.message)[:60] for m in w if 'training mode' in str(m.message)])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.stdout.strip() == "True []", done.stdout + done.stderr[-2000:]


def test_torch_s_slow_batching_warning_is_kept_inside_the_jacobian_build():
    """An nn.LSTM's CPU backward (aten::mkldnn_rnn_layer_backward) has no batching rule: torch's UserWarning
    "There is a performance drop ..." reached the caller from hcrfast's own vmaps, ahead of hcrfast's refusal.
    Only that warning is ignored, and the caller's filter list is as it was after the call."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(6, 4, batch_first=True)

        def forward(self, x):
            return self.rnn(x.reshape(x.shape[0], 6, 6))[0].reshape(x.shape[0], -1)

    net = Net().eval()
    x = torch.rand(2, 1, 6, 6)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        try:
            hcrfast.bound(net, x, 0.1, restarts=2, iterations=2, solver="dense")
        except ValueError:
            pass   # (torch.func may not run the LSTM's backward: hcrfast's own refusal then)
        after = list(warnings.filters)
    assert after == before
    leaked = [f"{w.category.__name__}: {str(w.message)[:120]}" for w in rec
              if not issubclass(w.category, hcrfast.HcrfastWarning)]
    assert leaked == []


def test_the_slow_batching_filter_leaves_other_warnings_and_the_caller_s_own_filter():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=dense._SLOW_BATCHING, category=UserWarning)
        mine = list(warnings.filters)
        with dense._slow_batching_unsaid():
            warnings.warn(dense._SLOW_BATCHING + " for aten::x", UserWarning)
            warnings.warn("There is another warning", UserWarning)
        assert warnings.filters == mine
    assert [str(w.message) for w in rec] == ["There is another warning"]


def test_onednn_s_no_primitive_error_halves_the_chunk_and_one_example_still_gets_its_explanation(monkeypatch):
    """Under a memory limit oneDNN (the CPU's convolutions) raises "could not create a primitive" where it cannot
    allocate: ResNet-18's J build at 4 examples a chunk ran at 1, but the error was read as torch.func's, and
    the call refused with the advice to take LSQR (whose bounds were 3x lower). Where examples can be split, it is
    now read as out of memory; one example alone still gets the torch.func explanation."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).double().eval()
    x = torch.randn(4, 1, 4, 4, dtype=torch.float64)
    want = hcrfast.bound(model, x, 0.2, restarts=2, iterations=2, solver="dense", chunk_size=1)
    real = dense._fill_jacobian

    def short_of_memory(out, f, xb, *args, **kwargs):
        if xb.shape[0] > 1:
            raise RuntimeError("could not create a primitive")
        return real(out, f, xb, *args, **kwargs)

    monkeypatch.setattr(dense, "_fill_jacobian", short_of_memory)
    got = hcrfast.bound(model, x, 0.2, restarts=2, iterations=2, solver="dense", chunk_size=4)
    np.testing.assert_array_equal(got.std, want.std)

    def never(*args, **kwargs):
        raise RuntimeError("could not create a primitive")

    monkeypatch.setattr(dense, "_fill_jacobian", never)
    with pytest.raises(ValueError, match=r"torch\.func.*could not create a primitive; activation checkpointing.*memory runs out"):
        hcrfast.bound(model, x, 0.2, restarts=2, iterations=2, solver="dense", chunk_size=4)
