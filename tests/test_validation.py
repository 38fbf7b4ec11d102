"""Every bad input of hcrfast.bound raises the documented error, naming the value and the fix."""
import copy
import math
import sys
import threading
import warnings

import numpy as np
import pytest
import torch

import hcrfast

QUICK = dict(iterations=1, restarts=1, lsqr=hcrfast.LSQROptions(iter_lim=5))


def mlp(p=16, n=12):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(p, n), torch.nn.Tanh()).eval()


@pytest.fixture
def x():
    return torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.nan, math.inf])
def test_bad_sigma_value(x, sigma):
    with pytest.raises(ValueError, match=r"sigma must be a positive finite number, got .*rms_sigma"):
        hcrfast.bound(mlp(), x, sigma, **QUICK)


def test_bad_sigma_type(x):
    with pytest.raises(TypeError, match="sigma must be a real number, got str"):
        hcrfast.bound(mlp(), x, "1.0", **QUICK)


@pytest.mark.parametrize("kind", ["tensor", "numpy", "list"])
def test_one_std_per_feature_is_the_whitened_problem(x, kind):
    """sigma = one std per feature runs bound, targeted_bound and the attack on the features divided by
    the stds with sigma = 1: the same numbers as that explicit whitening (and, with equal stds, as the
    scalar sigma); z comes back in the features' units; params name the stds."""
    stds = np.linspace(0.03, 0.08, 12)
    sigma = dict(tensor=torch.as_tensor(stds), numpy=stds, list=stds.tolist())[kind]
    model = mlp()
    whitened = torch.nn.Sequential(model, Divide(stds)).eval()
    got, want = hcrfast.bound(model, x, sigma, **QUICK), hcrfast.bound(whitened, x, 1.0, **QUICK)
    np.testing.assert_array_equal(got.std, want.std)  # the same computation, bit for bit
    np.testing.assert_array_equal(got.divergence, want.divergence)
    np.testing.assert_allclose(got.z, want.z * stds, rtol=1e-15)
    assert got.params["sigma"] is None and got.params["noise"].startswith("Gaussian(sigma per feature, 12 stds, min 0.03")
    t_got = hcrfast.targeted_bound(model, x, sigma, targets=[0, 5])
    np.testing.assert_array_equal(t_got.std, hcrfast.targeted_bound(whitened, x, 1.0, targets=[0, 5]).std)
    a_got = hcrfast.gauss_newton_attack(model, x, sigma, draws=2)
    np.testing.assert_array_equal(a_got.rmse, hcrfast.gauss_newton_attack(whitened, x, 1.0, draws=2).rmse)
    assert hcrfast.compare(got, a_got)["n_modes"] == got.std.size  # the same noise in both params
    equal = hcrfast.bound(model, x, np.full(12, 0.05), **QUICK)  # float32 features / 0.05 round otherwise
    np.testing.assert_allclose(equal.std, hcrfast.bound(model, x, 0.05, **QUICK).std, rtol=1e-3)


def test_per_feature_sigma_wherever_a_scalar_works(x, tmp_path):
    """Inside inference_mode, by keyword, with a plain function in the attack (which never certifies),
    in summaries, and certified in float64 with the user's stds even for a float16 model."""
    stds = np.linspace(0.03, 0.08, 12)
    model = mlp()
    want = hcrfast.bound(model, x, stds, **QUICK)
    with torch.inference_mode():
        np.testing.assert_array_equal(hcrfast.bound(model, x, stds, **QUICK).std, want.std)
        hcrfast.targeted_bound(model, x, stds, targets=[0])
        hcrfast.gauss_newton_attack(model, x, stds, draws=2)
    hcrfast.gauss_newton_attack(model, x, noise_or_sigma=stds, draws=2)
    hcrfast.gauss_newton_attack(lambda t: model(t), x, stds, draws=2)
    res = hcrfast.bound(model, x, stds, targets=[0, 1], **QUICK)
    # the targeted part's params say what bound()'s say: no one sigma (its whitened 1.0 is no σ of the features)
    assert res.targeted.params["sigma"] is None and res.targeted.params["noise"] == res.params["noise"]
    for text in (res.summary(), res.targeted.summary(), hcrfast.targeted_bound(model, x, stds, targets=[0]).summary()):
        assert "noise=Gaussian(sigma per feature, 12 stds, min 0.03, median 0.055, max 0.08, sha256 " in text
    half = hcrfast.bound(mlp().half(), x.half(), stds, iterations=1, restarts=2, solver="lsqr",
                         lsqr=hcrfast.LSQROptions(atol=1e-2, btol=1e-2, iter_lim=5))
    d = np.expm1(((half.z / stds) ** 2).sum(axis=1))  # z in feature units, D from the user's float64 stds
    # (past float64's rounding of the passes: algorithm._widened, ~3e-11 here)
    np.testing.assert_allclose(half.divergence[np.arange(3), half.best_restart], d, rtol=1e-9)


def test_per_feature_stds_live_on_the_batch_device():
    """The buffer is made where the batch is (a CPU buffer would fail against a CUDA batch at the first
    division, and moving it per call would copy it at every product); the meta device shows it here."""
    from hcrfast.noise import _whiten

    model = torch.nn.Linear(4, 3).to("meta")
    batch = torch.zeros(2, 4, device="meta")
    wrapped = _whiten(model, batch, np.array([0.1, 0.2, 0.3]), certify=False)
    assert wrapped.stds.device.type == "meta" and wrapped(batch).device.type == "meta"


def test_per_feature_sigma_of_the_wrong_size_or_sign_is_named(x):
    with pytest.raises(ValueError, match=r"sigma holds 5 stds, one per feature, but the model gives 12 features") as exc:
        hcrfast.bound(mlp(), x, np.full(5, 0.05), **QUICK)
    # the refusal alone: not also the note that the model raised it on its first pass (the model is fine)
    assert not getattr(exc.value, "__notes__", None), exc.value.__notes__
    with pytest.raises(ValueError, match=r"must be positive and finite; entries \[2\] are \[-0.1\]"):
        hcrfast.bound(mlp(), x, [0.1, 0.1, -0.1] + [0.1] * 9, **QUICK)
    with pytest.raises(ValueError, match=r"must be positive and finite; entries \[3\] are \[0.0\]"):
        hcrfast.bound(mlp(), x, [0.1, 0.1, 0.1, 0.0] + [0.1] * 8, **QUICK)  # a zero std is no noise
    with pytest.raises(ValueError, match=r"values float32 cannot represent \(entries \[0, 1\] become 0, subnormal or inf\)"):
        hcrfast.bound(mlp(), x, [1e-50, 1e50] + [0.1] * 10, **QUICK)
    with pytest.raises(ValueError, match=r"sigma has the shape \(4, 3\), one std per feature, but the model's "
                                         r"features have the shape \(12,\)"):
        hcrfast.bound(mlp(), x, np.full((4, 3), 0.1), **QUICK)
    with pytest.raises(ValueError, match="sigma has the shape") as exc:
        hcrfast.bound(mlp(), x, np.full((4, 3), 0.1), **QUICK)
    assert not getattr(exc.value, "__notes__", None), exc.value.__notes__
    with pytest.raises(TypeError, match="must hold real numbers"):
        hcrfast.bound(mlp(), x, np.full(12, 0.1 + 0j), **QUICK)


class Divide(torch.nn.Module):
    """The explicit whitening: features / stds, the stds float64 and cast to the features' dtype."""

    def __init__(self, stds):
        super().__init__()
        self.register_buffer("stds", torch.as_tensor(stds, dtype=torch.float64))

    def forward(self, f):
        return f / self.stds.to(f.dtype)


class Scale(torch.nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor)

    def forward(self, f):
        return f * self.factor


@pytest.mark.parametrize("sigma", [np.array([0.05]), torch.tensor([[0.05]]), np.float32(0.05), [0.05]])
def test_one_element_sigma_is_that_number(x, sigma):
    number = float(np.asarray(sigma).item())
    got = hcrfast.bound(mlp(), x, sigma, **QUICK)
    np.testing.assert_array_equal(got.std, hcrfast.bound(mlp(), x, number, **QUICK).std)
    assert got.params["sigma"] == number


def test_batch_with_nonfinite_values_names_examples(x):
    x[2, 0, 1, 1] = math.nan
    with pytest.raises(ValueError, match=r"NaN or inf in examples \[2\]"):
        hcrfast.bound(mlp(), x, 1.0, **QUICK)


def test_batch_not_a_tensor(x):
    with pytest.raises(TypeError, match="torch.as_tensor"):
        hcrfast.bound(mlp(), x.numpy(), 1.0, **QUICK)


def test_integer_batch(x):
    with pytest.raises(TypeError, match=r"floating-point.*torch.int64.*batch.float\(\).*embedding\(ids\)"):
        hcrfast.bound(mlp(), (x * 10).long(), 1.0, **QUICK)


def test_complex_batch_names_the_real_split(x):
    with pytest.raises(TypeError, match=r"torch.complex64.*view_as_real"):
        hcrfast.bound(mlp(), x.to(torch.complex64), 1.0, **QUICK)


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_batch_on_another_device_type_names_cpu_and_cuda(x, entry):
    """A device NumPy and CuPy cannot reach (``meta`` here, as ``mps`` or ``xpu`` would be) is refused before any
    pass, naming the device and the way out; without the check, torch failed deep inside an input check."""
    model = mlp().to("meta")
    with pytest.raises(ValueError, match=r"batch is on meta.*model\.cpu\(\) and batch\.cpu\(\)"):
        getattr(hcrfast, entry)(model, x.to("meta"), 1.0)


def test_bfloat16_batch_names_the_float32_fix(x):
    """NumPy and CuPy have no bfloat16: without this check torch's conversion fails with a bare ScalarType error."""
    with pytest.raises(TypeError, match=r"bfloat16.*model\.float\(\) and batch\.float\(\)"):
        hcrfast.bound(mlp().bfloat16(), x.bfloat16(), 1.0, **QUICK)


def test_missing_batch_axis():
    with pytest.raises(ValueError, match=r"leading batch axis.*batch\[None\]"):
        hcrfast.bound(mlp(), torch.rand(16), 1.0, basis="pixel", **QUICK)


class SumFeatures(torch.nn.Module):
    """Features of any input, an empty one included: its sum, three times, plus 0, 1, 2."""

    def forward(self, x):
        return x.flatten(1).sum(1, keepdim=True).repeat(1, 3) + torch.arange(3.0, dtype=x.dtype)


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_examples_of_no_values_are_refused_by_name(entry):
    """Examples of shape (1, 0, 5) have nothing to bound: refused before the solvers (which raised torch's
    'max(): Expected reduction dim to be specified for input.numel() == 0' or amax's IndexError)."""
    x = torch.zeros(2, 1, 0, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"each example of the batch has no values \(shape \(1, 0, 5\)\)"):
        getattr(hcrfast, entry)(SumFeatures().eval(), x, 0.05)


def test_model_that_drops_the_batch_axis(x):
    model = torch.nn.Sequential(mlp(), torch.nn.Flatten(0)).eval()
    with pytest.raises(ValueError, match="keep the batch axis first"):
        hcrfast.bound(model, x, 1.0, **QUICK)


def test_model_returning_a_tuple(x):
    class Pair(torch.nn.Module):
        def forward(self, t):
            return t.flatten(1), t.flatten(1)

    with pytest.raises(TypeError, match="must return a torch.Tensor of features, got tuple"):
        hcrfast.bound(Pair().eval(), x, 1.0, **QUICK)


def test_features_with_nan_name_examples(x):
    class Log(torch.nn.Module):
        def forward(self, t):
            return torch.log(t.flatten(1))

    x[1] = -1.0
    with pytest.raises(ValueError, match=r"features contain NaN or inf for examples \[1\]"):
        hcrfast.bound(Log().eval(), x, 1.0, **QUICK)


@pytest.mark.parametrize("name,value,err", [
    ("size", 0.0, ValueError), ("size", -0.1, ValueError), ("restarts", 0, ValueError),
    ("iterations", 0, ValueError), ("iterations", 1.5, TypeError), ("restarts", True, TypeError),
    ("chunk_size", 0, ValueError), ("linearize_at", "middle", ValueError), ("basis", "fourier", ValueError),
    ("jacobian", "symbolic", ValueError), ("lsqr", {"atol": 1}, TypeError), ("seed", -1, ValueError), ("seed", 1.0, TypeError),
    ("example_ids", [0, 1], ValueError),
])
def test_bad_parameters(x, name, value, err):
    kw = dict(QUICK)
    kw[name] = value
    with pytest.raises(err, match=name):
        hcrfast.bound(mlp(), x, 1.0, **kw)


def test_dct_basis_needs_two_trailing_axes():
    with pytest.raises(ValueError, match="basis='pixel'"):
        hcrfast.bound(mlp(), torch.rand(3, 16), 1.0, **QUICK)
    hcrfast.bound(mlp(), torch.rand(3, 16), 1.0, basis="pixel", **QUICK)  # and the fix works


def test_dtype_and_device_mismatch(x):
    with pytest.raises(TypeError, match=r"batch.to\(torch.float32\)"):
        hcrfast.bound(mlp(), x.double(), 1.0, **QUICK)


def test_training_mode_is_switched_for_the_call_and_restored(x):
    model = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5)).train()
    with pytest.warns(UserWarning, match="training mode"):
        res = hcrfast.bound(model, x, 1.0, **QUICK)
    assert model.training
    assert np.all(np.isfinite(res.std))


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_a_training_mode_warning_raised_as_an_error_leaves_every_flag_as_it_was(x, entry):
    """Under ``-W error`` (pytest's filterwarnings=error) the training-mode warning is an exception. It was raised
    after the switch to eval mode and before the block that restores the flags, so the model stayed in eval mode
    for the rest of the program (dropout off in training, BatchNorm's statistics frozen)."""
    kwargs = dict(bound=QUICK, targeted_bound=dict(targets=[0, 1], method="lsqr"),
                  gauss_newton_attack=dict(draws=1, steps=1))[entry]
    model = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5)).train()
    model[0].eval()   # one submodule left in eval mode on purpose
    before = [m.training for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="training mode"):
            getattr(hcrfast, entry)(model, x, 1.0, **kwargs)
    assert [m.training for m in model.modules()] == before


def test_the_training_mode_warning_is_shown_for_each_class_of_model_met_at_one_line(x):
    """Python shows a warning once per text and line: the text named no model, so with the default filters a loop
    over two models in training mode warned about the first only. The text now names the model's class."""
    class Wide(torch.nn.Sequential):
        pass

    models = [torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5)).train(), Wide(mlp(), torch.nn.Dropout(0.5)).train()]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("default")
        for model in models * 2:
            hcrfast.bound(model, x, 1.0, **QUICK)
        hcrfast.bound(models[1], x, np.linspace(0.5, 1.5, 12), **QUICK)   # one std per feature: hcrfast's wrapper
    said = [str(w.message) for w in got if "training mode" in str(w.message)]
    assert len(said) == 3, said
    assert said[2] == said[1]   # the user's class, not hcrfast's wrapper for one std per feature
    assert said[0].startswith("the model was in training mode (Sequential)"), said[0]
    assert said[1].startswith("the model was in training mode (test_the_training_mode_warning_is_shown_for_each_"
                              "class_of_model_met_at_one_line.<locals>.Wide)"), said[1]


@pytest.mark.parametrize("per_feature", [False, True])  # one std per feature: a wrapper deeper
@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_warnings_name_the_callers_own_line(x, entry, per_feature):
    """However deep inside hcrfast a warning is raised, it names the line that called hcrfast."""
    kwargs = dict(bound=QUICK, targeted_bound=dict(targets=[0, 1], method="lsqr"),
                  gauss_newton_attack=dict(draws=1, steps=1))[entry]
    call = getattr(hcrfast, entry)
    trained = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5)).train()
    sigma = np.linspace(0.5, 1.5, 12) if per_feature else 1.0
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        call(trained, x, sigma, **kwargs); line = sys._getframe().f_lineno  # noqa: E702
        if entry == "bound":
            blind_sigma = np.ones(6) if per_feature else 1.0  # Blind has 6 features
            call(Blind().eval(), x, blind_sigma, solver="lsqr", **kwargs); blind_line = sys._getframe().f_lineno  # noqa: E702
    said = {(w.filename, w.lineno) for w in got if "training mode" in str(w.message)}
    assert said == {(__file__, line)}, [(w.filename, w.lineno, str(w.message)[:60]) for w in got]
    if entry == "bound":
        said = {(w.filename, w.lineno) for w in got if "found J = 0" in str(w.message)}
        assert said == {(__file__, blind_line)}, [(w.filename, w.lineno, str(w.message)[:60]) for w in got]


@pytest.mark.parametrize("sigma", [1.0, np.linspace(0.5, 1.5, 12)])
def test_each_submodules_own_mode_is_restored(x, sigma):
    """A model in training mode with one layer frozen in eval mode on purpose gets both back as they were."""
    model = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5)).train()
    model[1].eval()
    with warnings.catch_warnings():   # (the modules left in training mode compute the same in eval mode: unsaid)
        warnings.simplefilter("error")
        hcrfast.bound(model, x, sigma, **QUICK)
    assert model.training and model[0].training and not model[1].training
    mixed = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5)).eval()
    mixed[1].train()  # an eval model with a submodule in training mode: switched for the call, then restored
    with pytest.warns(UserWarning, match=r"the model's submodule 1 was in training mode"):
        hcrfast.bound(mixed, x, sigma, **QUICK)
    assert not mixed.training and mixed[1].training


def test_jacobian_auto_is_taken_by_bound_and_the_attack_as_targeted_bound_takes_it(x):
    """targeted_bound's default is jacobian="auto" ("reverse" on its LSQR path); bound and the attack refused "auto",
    so one set of keyword arguments could not serve both. "auto" is "reverse" there, and recorded so."""
    model = mlp().double()
    batch = x.double()
    auto = hcrfast.bound(model, batch, 0.1, jacobian="auto", **QUICK)
    reverse = hcrfast.bound(model, batch, 0.1, jacobian="reverse", **QUICK)
    assert auto.std.tobytes() == reverse.std.tobytes() and auto.params["jacobian"] == "reverse"
    kw = dict(draws=1, steps=1, seed=0)
    got = hcrfast.gauss_newton_attack(model, batch, 0.1, jacobian="auto", **kw)
    assert got.estimates.tobytes() == hcrfast.gauss_newton_attack(model, batch, 0.1, **kw).estimates.tobytes()
    with pytest.raises(ValueError, match=r"jacobian must be one of \('reverse', 'forward', 'auto'\), got 'sideways'"):
        hcrfast.bound(model, batch, 0.1, jacobian="sideways", **QUICK)


class _Plain(torch.nn.Module):
    """A user's class whose code never reads its training flag."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 12)

    def forward(self, x):
        return torch.tanh(self.lin(x.flatten(1)))


class _Dropping(_Plain):
    """A user's class that reads its training flag in a helper method, not in forward."""
    def forward(self, x):
        return self._drop(super().forward(x))

    def _drop(self, y):
        return torch.nn.functional.dropout(y, 0.5, self.training)


class _GetattrDrop(_Plain):
    def forward(self, x):
        return torch.nn.functional.dropout(super().forward(x), 0.5, getattr(self, "training"))


class _DictDrop(_Plain):
    def forward(self, x):
        return torch.nn.functional.dropout(super().forward(x), 0.5, self.__dict__["training"])


def _drop_by_flag(module, y):
    return torch.nn.functional.dropout(y, 0.5, module.training)


class _HelperDrop(_Plain):
    """Reads its flag in a function outside the class, handed ``self``."""
    def forward(self, x):
        return _drop_by_flag(self, super().forward(x))


@pytest.mark.parametrize("entry", ["bound", "dithered_accuracy"])
def test_training_mode_is_warned_of_only_where_a_module_may_compute_otherwise(x, entry):
    """A fresh nn.Linear head, or a Sequential of Linear and Tanh, is in training mode as built, and computes the same
    in both modes: the switch to eval mode said nothing worth a warning. It is still made, and undone; a Dropout, a
    BatchNorm or a user's class whose code reads the flag (in a helper method too) is warned of as before."""
    def call(model):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            if entry == "bound":   # (a callable is not copied to float64: certify=False, its warning filtered)
                kw = {} if isinstance(model, torch.nn.Module) else dict(certify=False)
                hcrfast.bound(model, x, 1.0, **QUICK, **kw)
            else:   # (the model in the head's place: its training flag is the head's)
                hcrfast.dithered_accuracy(torch.nn.Flatten(), model, x, torch.zeros(3, dtype=torch.long), 0.1,
                                          draws=1)
        return [str(w.message) for w in got if "training mode" in str(w.message)]

    torch.manual_seed(0)
    for quiet in (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh()), _Plain(),
                  torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.LayerNorm(12))):
        assert quiet.training
        assert call(quiet) == []
        assert all(m.training for m in quiet.modules())
        closure = call(lambda t, quiet=quiet: quiet(t))   # (a callable's modules, switched as they are called)
        assert closure == [] and all(m.training for m in quiet.modules())
    for loud in (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Dropout(0.5)), _Dropping(),
                 torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.BatchNorm1d(12)),
                 _GetattrDrop(), _DictDrop(), _HelperDrop()):   # (the flag read by a string, or by a helper)
        assert call(loud) and all(m.training for m in loud.modules())
        assert call(lambda t, loud=loud: loud(t))
    made = {}
    exec("class Made(torch.nn.Linear):\n    pass", {"torch": torch}, made)   # (no source to read: counted as reading)
    assert hcrfast.validation._reads_training_flag(made["Made"])
    assert not hcrfast.validation._reads_training_flag(torch.nn.Linear)
    assert hcrfast.validation._reads_training_flag(torch.nn.MultiheadAttention)


def test_a_closure_over_modules_in_training_mode_runs_them_in_eval_mode_and_restores_them():
    """A plain function over a network in training mode (a lambda, certify=False or float64): hcrfast cannot list
    its modules, so its first forward updated a BatchNorm's running statistics before the probe refused the model
    (BatchNorm1d in training mode fails on one example). Each module the function calls in training mode is now run
    in eval mode, warned about and restored: the bounds are those of the network in eval mode, passed as a Module."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                              torch.nn.Dropout(0.5), torch.nn.Linear(8, 5)).double()
    net[4].eval()   # left in eval mode on purpose: stays so
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    batch = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = dict(restarts=2, iterations=3, basis="pixel")
    with pytest.warns(UserWarning, match=r"the model \(a callable, not a Module\) calls 5 module\(s\) in training mode "
                                         r"\(BatchNorm1d, Dropout, Linear, Sequential, Tanh\)"):
        got = hcrfast.bound(lambda t: net(t), batch, 0.1, **kw)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    assert [m.training for m in net] == [True, True, True, True, False] and net.training
    expected = hcrfast.bound(copy.deepcopy(net).eval(), batch, 0.1, **kw)
    np.testing.assert_array_equal(got.std, expected.std)
    # another thread's module is not switched while hcrfast runs
    other = torch.nn.Dropout(0.5).train()
    seen = []
    def watch(t):
        thread = threading.Thread(target=lambda: seen.append(other(torch.ones(1000)).eq(0).any().item()))
        thread.start(); thread.join()  # noqa: E702
        return net(t)
    with pytest.warns(UserWarning, match="in training mode"):
        hcrfast.bound(watch, batch, 0.1, **kw)
    assert seen and all(seen) and other.training


class BatchCentering(torch.nn.Module):
    def forward(self, t):
        f = t.flatten(1)
        return f - f.mean(dim=0, keepdim=True)


class BatchAttention(torch.nn.Module):
    """Every example attends to every other example of the batch."""

    def forward(self, t):
        f = t.flatten(1)
        weights = torch.softmax(f @ f.T, dim=1)
        return weights @ f


@pytest.mark.parametrize("model", [BatchCentering(), BatchAttention()])
def test_models_that_mix_examples_are_refused(x, model):
    with pytest.raises(ValueError, match="mixes the examples of a batch"):
        hcrfast.bound(model.eval(), x, 1.0, **QUICK)


def test_batchnorm_in_eval_mode_is_accepted(x):
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten()).eval()
    res = hcrfast.bound(model, x, 1.0, **QUICK)
    assert np.all(np.isfinite(res.std))


@pytest.mark.filterwarnings("ignore:certify=False. every feature shift")  # uncertified on purpose
@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_plain_functions_are_refused_by_certify_with_the_fix(x, entry):
    """certify=True needs a float64 copy of the model; a function has none. The error names the function
    and the fixes, and each fix runs: a float64 model and batch, or certify=False."""
    model = mlp()
    fn = lambda t: model(t)  # noqa: E731
    call = getattr(hcrfast, entry)
    kw = QUICK if entry == "bound" else dict(targets=[0, 1])
    with pytest.raises(TypeError, match=r"certify=True .* the model is function '.*<lambda>'.*make it a Module"):
        call(fn, x, 0.05, **kw)
    call(fn, x, 0.05, certify=False, **kw)
    model.double()
    call(fn, x.double(), 0.05, **kw)


class Detached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, t):
        return self.net(t).detach()


class Float64Out(Detached):
    def forward(self, t):
        return self.net(t).double()


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_inside_inference_mode_gives_the_bounds_of_a_plain_call(x, entry):
    call = getattr(hcrfast, entry)
    kw = dict(bound=QUICK, targeted_bound=dict(targets=[0, 5]), gauss_newton_attack=dict(draws=2))[entry]
    model = mlp()
    want = call(model, x, 0.05, **kw)
    with torch.inference_mode():
        inference_batch = x.clone()
        got = call(model, inference_batch, 0.05, **kw)
        made_inside = mlp()
        with pytest.raises(ValueError, match=r"parameters were made under torch.inference_mode.* outside it"):
            call(made_inside, inference_batch, 0.05, **kw)
    field = "rmse" if entry == "gauss_newton_attack" else "std"
    np.testing.assert_array_equal(getattr(got, field), getattr(want, field))


def _batchnorm_cnn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(48, 6))
    with torch.no_grad():   # running statistics far from a batch's own: a forward in training mode moves them
        model[1].running_mean.fill_(0.3)
        model[1].running_var.fill_(2.0)
    return model


def _batchnorm1d_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 4))


@pytest.mark.parametrize("make", [_batchnorm_cnn, _batchnorm1d_mlp])
@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_a_float16_model_in_training_mode_gets_the_bounds_of_eval_mode_in_float32(x, entry, make):
    """The float32 copy of a float16 model was checked by a forward in the model's training mode, before the entry
    point switched it to eval: BatchNorm2d updated the copy's running statistics (the bounds were another
    model's), and BatchNorm1d refused the check's one row, which left the call in float16. A float16 model in
    training mode now gets the bounds of its eval mode, solved in float32, and is given back as it was."""
    call = getattr(hcrfast, entry)
    kw = dict(bound=dict(iterations=2, restarts=2, solver="dense", singular_steps=0),
              targeted_bound=dict(targets=[0, 1], method="dense"))[entry]
    basis = "dct" if make is _batchnorm_cnn else "pixel"
    xh = x.half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = call(make().half().eval(), xh, 0.1, basis=basis, **kw)
    model = make().half().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call(model, xh, 0.1, basis=basis, **kw)
    said = [str(w.message) for w in caught]
    assert any("training mode" in m for m in said) and any("solves with a float32 copy" in m for m in said), said
    assert want.params["dtype"] == got.params["dtype"] == "float32"
    np.testing.assert_array_equal(got.std, want.std)
    assert model.training and all(m.training for m in model.modules())
    for k, v in model.state_dict().items():   # the user's model: its dtype, and its buffers untouched
        assert v.dtype == before[k].dtype and torch.equal(v, before[k]), k


@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_a_float16_model_inside_inference_mode_gives_the_bounds_of_a_plain_call(x, entry):
    """The float32 copies of a float16 model and batch were made before the entry point left inference mode:
    inference tensors, on which autograd raised 'Inference tensors cannot be saved for backward'."""
    call = getattr(hcrfast, entry)
    kw = dict(bound=QUICK, targeted_bound=dict(targets=[0, 5]))[entry]
    model, xh = mlp().half(), x.half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = call(model, xh, 0.05, **kw)
        with torch.inference_mode():
            got = call(model, xh, 0.05, **kw)
            model32, batch32 = hcrfast.validation.float32_for_float16(model, xh)
    assert got.params["dtype"] == "float32"
    np.testing.assert_array_equal(got.std, want.std)
    assert batch32.dtype == torch.float32 and not batch32.is_inference()
    assert all(p.dtype == torch.float32 and not p.is_inference() for p in model32.parameters())


class _Unpicklable(torch.nn.Module):
    """copy.deepcopy raises TypeError (cannot pickle '_thread.lock')."""

    def __init__(self):
        super().__init__()
        self.net = mlp()
        self.lock = __import__("threading").Lock()

    def forward(self, t):
        return self.net(t)


class _BackToHalf(Detached):
    """Its float32 copy returns float16 features: a cast inside the forward."""

    def forward(self, t):
        return self.net(t).half()


@pytest.mark.parametrize("make, said", [(_Unpicklable, r"could not run a float32 copy of the model \(TypeError: "),
                                        (_BackToHalf, r"a float32 copy of the model returns float16 features")])
def test_a_float16_model_left_in_float16_is_warned_about(x, make, said):
    """A float16 model whose float32 copy cannot be made, or gives float16 features, is solved in float16 as it
    is: said, not done silently."""
    model, xh = make().half().eval(), x.half()
    with pytest.warns(UserWarning, match=said + r".* so hcrfast solves in float16, whose range \(65504\)"):
        got, batch = hcrfast.validation.float32_for_float16(model, xh)
    assert got is model and batch is xh


class NoGradInside(Detached):
    def forward(self, t):
        with torch.no_grad():
            return self.net(t)


class NumpyRoundTrip(Detached):
    def forward(self, t):
        return self.net(torch.as_tensor(t.detach().numpy() if t.requires_grad else t.numpy()))


@pytest.mark.parametrize("solver", ["lsqr", "dense"])
@pytest.mark.parametrize("jacobian", ["reverse", "forward"])  # forward mode gives J = 0 through .detach() silently
@pytest.mark.parametrize("model", [Detached, NoGradInside, NumpyRoundTrip])  # forward mode: raw torch errors were
def test_models_without_an_input_jacobian_are_named(x, solver, jacobian, model):
    with pytest.raises(ValueError, match=r"not differentiable with respect to its input .* remove \.detach\(\)"):
        hcrfast.bound(model().eval(), x, 0.05, solver=solver, jacobian=jacobian, **dict(QUICK, lsqr=None))
    with pytest.raises(TypeError, match=r"returns float64 features for a float32 batch.*model\.to\(torch\.float64\)"):
        hcrfast.bound(Float64Out().eval(), x, 0.05, solver=solver, **dict(QUICK, lsqr=None))


class Rounds(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return (x.flatten(1) * 10).to(self.dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64])
def test_integer_or_complex_features_are_named_without_a_fix_that_cannot_work(x, dtype):
    with pytest.raises(TypeError) as info:
        hcrfast.bound(Rounds(dtype).eval(), x, 0.05, **dict(QUICK, lsqr=None))
    assert "features for a float32 batch; the bounds need real floating-point features" in str(info.value)
    assert "run both in" not in str(info.value)


class NormalizesInPlace(torch.nn.Module):
    """torchvision's normalize(..., inplace=True) first: each forward shifts the batch it is given again."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, t):
        import torchvision.transforms.functional as TF

        return self.net(TF.normalize(t, [0.5], [0.25], inplace=True))


@pytest.mark.parametrize("entry", ["sigma_for", "sweep_sigma", "dithered_accuracy", "rms"])
def test_nan_inputs_are_named_as_inputs_not_as_a_model_writing_into_them(x, entry):
    """The calls whose first forward pass picks sigma (the features' RMS) or reads the features: a NaN in
    the batch is the data's fault (NaN != NaN made it look like an in-place write)."""
    model = mlp()
    x = x.clone()
    x[1, 0, 0, 0] = float("nan")
    calls = {"sigma_for": lambda: hcrfast.sigma_for(model, x, 0.3),
             "sweep_sigma": lambda: hcrfast.sweep_sigma(model, x, [1.0]),
             "dithered_accuracy": lambda: hcrfast.dithered_accuracy(model, None, x, None, 0.1, metric="cosine"),
             "rms": lambda: hcrfast.validation.features_of(model, x)}
    with pytest.raises(ValueError, match=r"batch contains NaN or inf in examples \[1\]; clean or drop"):
        calls[entry]()


@pytest.mark.parametrize("jacobian", ["reverse", "forward"])
@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_a_model_that_writes_into_its_input_is_named_and_the_batch_is_untouched(x, jacobian, entry):
    relu = torch.nn.Sequential(torch.nn.ReLU(inplace=True), torch.nn.Flatten(), torch.nn.Linear(16, 6)).eval()
    x = x - 0.5  # negative entries, which the in-place ReLU would zero
    before = x.clone()
    for model in (relu, NormalizesInPlace().eval()):  # the second was refused as random
        with pytest.raises(ValueError, match=r"writes into its input in place.* nn\.ReLU\(inplace=False\)"):
            getattr(hcrfast, entry)(model, x, 0.05, jacobian=jacobian)
        assert torch.equal(x, before)


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
def test_sigma_beyond_float32s_range_is_refused_never_nan(x, solver):
    """σ·s far outside what float32 resolves: every step's eps comes out 0 (underflow), or eps or z
    overflow. Either is refused naming sigma and the fixes; the float64 fix gives finite bounds. (Since
    2026-12-02 such a σ runs on the features divided by it: the dense solve then gives, at 1e30, the float64
    model's bounds; a σ that far from features near 1 still leaves LSQR's and the Krylov basis' range.)"""
    kw = dict(iterations=2, restarts=2, solver=solver)
    with pytest.raises(ValueError, match=r"Gaussian\(sigma=1e-30\) with size=0.005(: every step's eps came out 0| asks "
                                         r"for steps float32 cannot hold).*float64 model and batch"):
        hcrfast.bound(mlp(), x, 1e-30, **kw)
    res = hcrfast.bound(mlp().double(), x.double(), 1e30, **kw)
    assert np.all(np.isfinite(res.std)) and np.all(res.std > 0)
    if solver == "dense":
        np.testing.assert_allclose(hcrfast.bound(mlp(), x, 1e30, **kw).std, res.std, rtol=1e-5)
        return
    with pytest.raises(ValueError, match=r"Gaussian\(sigma=1e\+30\) with size=0.005 asks for steps float32 cannot "
                                         r"hold|every step's eps came out 0"):
        hcrfast.bound(mlp(), x, 1e30, **kw)


@pytest.mark.parametrize("method", ["dense", "lsqr"])
def test_targeted_bound_refuses_sigma_whose_steps_vanish(x, method):
    """Steps s·σ·(direction) of 1e-32 vanish added to inputs of order 1, even in float64. (Since 2026-12-02 the
    features are divided by such a σ: J, 1e30 times larger, may overflow the solve first; refused either way.)"""
    with pytest.raises(ValueError, match=r"Gaussian\(sigma=1e-30\) with size=0.005(: every step's eps came out 0| "
                                         r"asks for steps float32 cannot hold)"):
        hcrfast.targeted_bound(mlp(), x, 1e-30, targets=[0, 1], method=method)


def test_a_restart_whose_eps_came_out_0_is_reported_as_bounding_nothing(x, monkeypatch):
    """Its D is 0 but it moves no coordinate: bound 0 (not +inf), its own reason, and a warning. (Its only step: with
    every iterate certified, a restart whose earlier iterates moved bounds by them, and is not lost.)"""
    from hcrfast import algorithm

    real = algorithm._certified_shift

    def first_row_lost(model64, rows, eps):
        eps = eps.copy()
        eps[0] = 0
        return real(model64, rows, eps)

    monkeypatch.setattr(algorithm, "_certified_shift", first_row_lost)
    with pytest.warns(UserWarning, match=r"1 restarts' eps came out 0 in float32 .* bound nothing \(0\)"):
        res = hcrfast.bound(mlp(), x, 0.05, iterations=2, restarts=2, solver="dense", iterates="last")
    assert res.infinite_reasons == []  # nothing is +inf
    assert res.params["zero_step_reasons"] == ["example 0, restart 0: eps came out 0 (a step outside the range the "
                                               "solver's dtype resolves), so this restart bounds nothing (0)"]
    assert res.divergence[0, 0] == 0 and np.all(np.isfinite(res.std)) and res.best_restart[0] == 1


UNRESOLVED = r"D\(z\) is below what float64 resolves \(2\^-960, hcrfast.noise.D_FLOOR\) for 6 steps whose features"


@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_a_divergence_that_underflows_is_refused_not_reported_as_infinite(x, entry):
    """+inf is proved only by a feature shift of exactly 0. With σ = 1e170 (float64 throughout, so the
    steps ~1e167 fit) ‖z‖²/σ² is below float64's range: D = 0 although z ≠ 0. Before, such bounds read +inf."""
    model, xd = mlp().double(), x.double()
    if entry == "bound":
        # There the solve itself overflows at such σ (refused as such); shrink the certified shifts instead.
        from hcrfast import algorithm

        real, real_magnitude = algorithm._certified_shift, algorithm._rounding_magnitude
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(algorithm, "_certified_shift", lambda m64, rows, eps: (lambda e, z: (e, z * 1e-200))(
                *real(m64, rows, eps)))
            # shifts 1e-200 of features of order 1 are far inside float64's rounding of those features, which
            # D now counts (algorithm._widened): D is not established (0), never +inf
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = hcrfast.bound(model, xd, 0.05, iterations=2, restarts=2, solver="dense", singular_steps=0,
                                    iterates="last")
            assert np.all(res.std == 0) and not res.infinite_reasons
            assert all("within float64's rounding" in r for r in res.params["zero_step_reasons"])
        with pytest.MonkeyPatch.context() as mp:   # features and shifts both tiny: D below float64's range
            mp.setattr(algorithm, "_certified_shift", lambda m64, rows, eps: (lambda e, z: (e, z * 1e-200))(
                *real(m64, rows, eps)))
            mp.setattr(algorithm, "_rounding_magnitude", lambda *a, **k: real_magnitude(*a, **k) * 1e-200)
            with pytest.raises(ValueError, match=UNRESOLVED):
                hcrfast.bound(model, xd, 0.05, iterations=2, restarts=2, solver="dense")
    else:
        # (on the features as they are: hcrfast divides them by a σ that far from 1 since 2026-12-02, where the
        # solve itself overflows first; the check stays, for D from any shift)
        with pytest.MonkeyPatch.context() as mp, pytest.raises(ValueError, match=UNRESOLVED):
            mp.setattr(hcrfast.noise, "whitened_scale", lambda sigma, batch: None)
            hcrfast.targeted_bound(model, xd, 1e170, targets=[0, 1])


class Blind(torch.nn.Module):
    """Features that do not depend on the input (J = 0), or only on its first ``seen`` pixels."""

    def __init__(self, seen=0):
        super().__init__()
        self.seen, self.lin = seen, torch.nn.Linear(16, 6)

    def forward(self, t):
        flat = t.reshape(t.shape[0], -1)
        mask = torch.zeros(16, dtype=t.dtype)
        mask[:self.seen] = 1
        return torch.tanh(self.lin(flat * mask))


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
def test_features_that_ignore_the_input_are_named_and_targeted_bound_certifies_them(x, solver):
    """J = 0: every ε is 0 for a reason other than range, whatever the chunks; the warning and each
    restart's reason say so and where +inf is proved."""
    for chunk_size in (1, 3):
        with pytest.warns(UserWarning, match=r"6 restarts found J = 0 at their example .* null_probes=True"):
            res = hcrfast.bound(Blind().eval(), x, 0.05, iterations=2, restarts=2, solver=solver, chunk_size=chunk_size)
        assert np.all(res.std == 0) and np.all(res.mse == 0) and res.infinite_reasons == []
        assert len(res.params["zero_step_reasons"]) == 6
        assert all("J = 0 here" in r for r in res.params["zero_step_reasons"])
    res = hcrfast.targeted_bound(Blind().eval(), x, 0.05, targets=[0, 7], basis="pixel")
    assert np.all(np.isinf(res.std.reshape(3, -1)[:, [0, 7]]))
    with pytest.warns(UserWarning, match=r"6 \(example, mode\) pairs got no direction .* null_probes=True"):
        res = hcrfast.targeted_bound(Blind().eval(), x, 0.05, targets=[0, 7], basis="pixel", method="lsqr")
    assert np.all(res.std.reshape(3, -1)[:, [0, 7]] == 0)


def test_summary_says_what_a_bound_of_0_means_and_names_the_rank(x):
    res = hcrfast.bound(Blind(seen=8).eval(), x, 0.05, basis="pixel", iterations=2, restarts=2, solver="dense")
    assert np.all(res.std.reshape(3, -1)[:, 8:] == 0)  # Algorithm 1 never moves the unseen pixels
    text = res.summary()
    assert "24 coordinates have bound 0: no restart moved them. 0 guarantees nothing" in text
    assert "J's rank is as low as 6 of 16 inputs" in text and "targeted_bound(..., null_probes=True)" in text


class Stuck(torch.nn.Module):
    """Its Jacobian says identity, its features never move: every certified D is 0, every bound +inf."""

    def forward(self, t):
        flat = t.flatten(1)
        return flat - flat.detach() + 1.0


def test_summary_of_bounds_that_are_all_infinite(x):
    res = hcrfast.bound(Stuck().eval(), x, 0.05, iterations=1, restarts=2, solver="lsqr")
    assert np.all(np.isinf(res.std))
    text = res.summary()
    assert "std bounds: all +inf" in text and "nan" not in text.split("divergence")[0]


def test_repeated_example_ids_are_refused(x):
    with pytest.raises(ValueError, match=r"example_ids must be distinct .* repeated: \[4\]"):
        hcrfast.bound(mlp(), x, 0.05, example_ids=[4, 4, 5], **QUICK)


def test_targeted_bound_takes_a_gaussian_law_and_names_the_others(x):
    with pytest.raises(TypeError, match=r"got str; pass the noise std .* or one std per feature$"):
        hcrfast.targeted_bound(mlp(), x, "0.05", targets=[0])  # no noise law suggested: it takes none
    kw = dict(targets=[0, 3])
    np.testing.assert_array_equal(hcrfast.targeted_bound(mlp(), x, hcrfast.Gaussian(0.05), **kw).std,
                                  hcrfast.targeted_bound(mlp(), x, 0.05, **kw).std)
    with pytest.raises(NotImplementedError, match=r"needs Gaussian noise .* got Laplace\(scale=0.05\)"):
        hcrfast.targeted_bound(mlp(), x, hcrfast.Laplace(0.05), **kw)


def test_saving_into_a_missing_folder_names_the_file_not_a_temporary_one(x, tmp_path):
    res = hcrfast.bound(mlp(), x, 0.05, **QUICK)
    with pytest.raises(FileNotFoundError, match=r"cannot write .*missing/b\.npz: the folder .*missing does not exist"):
        res.save(tmp_path / "missing" / "b.npz")


def test_a_torchscript_model_is_certified_without_torchs_internal_warnings(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script itself is deprecated
        scripted = torch.jit.script(mlp())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = hcrfast.bound(scripted, x, 0.05, **QUICK)
    np.testing.assert_allclose(got.std, hcrfast.bound(mlp(), x, 0.05, **QUICK).std, rtol=1e-6)


def test_a_finite_bound_beyond_float64s_range_is_its_largest_value_not_inf(x):
    """At sigma = 1e100 against saturated tanh features D ~ 1e-200 and the MSE bound ~1e396: a finite bound
    that float64 cannot hold is reported as float64's largest value (still a lower bound); +inf stays
    reserved for D = 0."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh()).double().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = hcrfast.bound(model, x.double(), 1e100, iterations=2, restarts=2, solver="dense")
    assert np.all(res.mse == np.finfo(np.float64).max) and not np.isinf(res.std).any()
    assert res.infinite_reasons == []


# --------------------------------------------------------------------------------------------
# Models as users bring them (a compatibility probe's findings): each works or is refused early,
# naming the cause and the fix, and is left as it was.


class CastsToFloat32(torch.nn.Module):
    """A forward that casts its input (or its output) to float32: its float64 copy is not float64."""

    def __init__(self, where):
        super().__init__()
        self.where, self.lin = where, mlp()

    def forward(self, x):
        if self.where == "input":
            return self.lin(x.float())
        return self.lin(x).float()


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_float64_copy_that_is_not_float64_is_refused_before_the_solve(x, where, monkeypatch):
    """It used to crash with torch's dtype error after the whole solve (input), or certify in float32
    without a word (output)."""
    from hcrfast import algorithm

    monkeypatch.setattr(algorithm, "_chunk_perturbations", None)  # the solve must not start
    with pytest.raises(TypeError, match=r"float64 copy of the model.*(fails on a float64 example|returns float32 "
                                        r"features).*certify=False"):
        hcrfast.bound(CastsToFloat32(where).eval(), x, 0.05, **QUICK)


class BranchesOnDtype(torch.nn.Module):
    """The same features in float32 as ``mlp()``; its float64 path scales them by ``c`` (a float32-only fused or
    quantized path with another float64 fallback)."""

    def __init__(self, c):
        super().__init__()
        self.c, self.lin = c, mlp()

    def forward(self, x):
        y = self.lin(x)
        return self.c * y if x.dtype == torch.float64 else y


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "sigma_for"])
def test_a_float64_copy_that_computes_another_function_is_refused(x, entry, monkeypatch):
    """The copy's features were never compared with the model's: a forward that scales its features by 0.01 in
    float64 only got bounds 100 times the model's (certified for the copy's function), with a warning that called
    them rigorous still. The model itself, in float32, is exactly mlp()."""
    from hcrfast import algorithm

    model = BranchesOnDtype(0.01).eval()
    assert torch.equal(model(x), mlp()(x))
    monkeypatch.setattr(algorithm, "_chunk_perturbations", None)  # refused before any solve
    call = dict(bound=lambda: hcrfast.bound(model, x, 0.05, **QUICK),
                targeted_bound=lambda: hcrfast.targeted_bound(model, x, 0.05, targets="low:2"),
                sigma_for=lambda: hcrfast.sigma_for(model, x, 0.01, sigma0=0.05, **QUICK))[entry]
    with pytest.raises(ValueError, match=r"float64 copy of the model .*differ from the model's by up to [0-9.e-]+, "
                                         r"0\.99 of the largest feature.*branches on its input's dtype.*"
                                         r"model\.double\(\), batch\.double\(\).*certify=False"):
        call()


def test_a_float64_copy_within_the_models_rounding_is_accepted(x):
    """A copy 1e-3 apart from the model (TF32's rounding is ~5e-4 of the features) is its rounding, not another
    function: the call runs, and its bounds are those of the float64 model within that gap."""
    bounds = hcrfast.bound(BranchesOnDtype(1 + 1e-3).eval(), x, 0.05, iterations=2, restarts=2, basis="pixel",
                           solver="dense")
    want = hcrfast.bound(mlp().double().eval(), x.double(), 0.05, iterations=2, restarts=2, basis="pixel",
                         solver="dense")
    np.testing.assert_allclose(bounds.std, want.std / (1 + 1e-3), rtol=1e-2)
    assert hcrfast.validation.COPY_GAP_LIMIT == 1e-2


@pytest.mark.filterwarnings("ignore:certify=False. every feature shift")  # uncertified on purpose
def test_a_frozen_torchscript_model_runs_uncertified_and_is_named_when_certified(x):
    model = mlp()
    frozen = torch.jit.freeze(torch.jit.script(model))  # no training flag; constants ignore .double()
    with pytest.raises(TypeError, match=r"frozen TorchScript constants.*certify=False"):
        hcrfast.bound(frozen, x, 0.05, **QUICK)
    got = hcrfast.bound(frozen, x, 0.05, certify=False, **QUICK)
    np.testing.assert_allclose(got.std, hcrfast.bound(model, x, 0.05, certify=False, **QUICK).std, rtol=1e-5)


def test_legacy_weight_norm_names_the_parametrization_that_copies(x):
    model = mlp()
    torch.nn.utils.weight_norm(model[1])
    with pytest.raises(TypeError, match=r"cannot be copied.*parametrizations\.weight_norm.*certify=False"):
        hcrfast.bound(model, x, 0.05, **QUICK)


class Counter(torch.nn.Module):
    """Counts its calls in a buffer, in place: torch.func.vmap refuses it."""

    def __init__(self):
        super().__init__()
        self.lin = mlp()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_a_forward_that_changes_its_buffers_names_the_matrix_free_solver(x):
    with pytest.raises(ValueError, match=r"torch\.func\.vmap.*changes its own buffers.*solver='lsqr'"):
        hcrfast.bound(Counter().eval(), x, 0.05, solver="dense", iterations=1, restarts=2)
    got = hcrfast.bound(Counter().eval(), x, 0.05, solver="lsqr", **QUICK)
    np.testing.assert_array_equal(got.std, hcrfast.bound(mlp(), x, 0.05, solver="lsqr", **QUICK).std)


class DividesByBatchMax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = mlp()

    def forward(self, x):
        return self.lin(x / x.abs().max().detach())  # detached: the JVP leak check cannot see it


def test_mixing_is_caught_when_the_first_example_dominates_the_batch(x):
    """Example 0 holds the batch's max, so it alone equals it in the batch; the other rows do not."""
    x = x.clone()
    x[0] *= 10
    with pytest.raises(ValueError, match="mixes the examples of a batch"):
        hcrfast.bound(DividesByBatchMax().eval(), x, 0.05, **QUICK)


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = mlp()

    def forward(self, x):
        return torch.nn.functional.dropout(self.lin(x), 0.5, training=True)


def test_a_model_that_draws_random_numbers_is_named_as_such(x):
    """It used to be called a model that mixes the examples."""
    with pytest.raises(ValueError, match=r"other features for the same batch at each call.*dropout called with "
                                         r"training=True"):
        hcrfast.bound(Noisy().eval(), x, 0.05, **QUICK)


def test_a_submodule_in_training_mode_under_an_eval_model_is_switched_and_untouched(x):
    """Only the root's flag used to be looked at: the call ran the submodule in training mode and
    its running statistics moved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten()).eval()
    model[1].train()
    stats = [t.clone() for t in model[1].buffers()]
    with pytest.warns(UserWarning, match=r"the model's submodule 1 was in training mode"):
        got = hcrfast.bound(model, x, 0.05, **QUICK)
    assert model[1].training and not model.training and not model[0].training
    assert all(torch.equal(a, b) for a, b in zip(stats, model[1].buffers()))
    np.testing.assert_array_equal(got.std, hcrfast.bound(model.eval(), x, 0.05, **QUICK).std)


class NoGradFirstLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.rest = torch.nn.Linear(16, 16), mlp()

    def forward(self, x):
        with torch.no_grad():
            h = self.first(x.flatten(1))
        return self.rest(h + x.flatten(1) * 0.1)


def test_forward_and_reverse_jacobians_that_disagree_are_named(x):
    """Forward mode differentiates through the no_grad section, reverse mode does not: LSQR's J and
    J^T would not be adjoint. It used to end in 'every eps came out 0 ... sigma'."""
    with pytest.raises(ValueError, match=r"forward and reverse mode give different Jacobians.*torch\.no_grad\(\)"):
        hcrfast.bound(NoGradFirstLayer().eval(), x, 0.05, jacobian="forward", solver="lsqr", **QUICK)


class Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return g * 2


class OnceDifferentiable(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(Once.apply(x)).flatten(1)


def test_models_differentiable_once_only_are_named(x):
    with pytest.raises(ValueError, match=r"cannot be differentiated twice.*jacobian='forward'"):
        hcrfast.bound(OnceDifferentiable().eval(), x, 0.05, solver="lsqr", **QUICK)
    with pytest.raises(ValueError, match=r"does not support forward-mode AD.*jvp staticmethod"):
        hcrfast.bound(OnceDifferentiable().eval(), x, 0.05, solver="lsqr", jacobian="forward", **QUICK)


def test_a_compiled_model_points_to_forward_mode_which_gives_the_plain_models_bounds(x):
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8, 5)).eval()
    compiled = torch.compile(model, backend="aot_eager")  # its compiled backward refuses create_graph
    with pytest.raises(ValueError, match=r"cannot be differentiated twice.*jacobian='forward'.*model\._orig_mod"):
        hcrfast.bound(compiled, x, 0.05, solver="lsqr", **QUICK)
    got = hcrfast.bound(compiled, x, 0.05, solver="lsqr", jacobian="forward", **QUICK)
    np.testing.assert_allclose(got.std, hcrfast.bound(model, x, 0.05, solver="lsqr", jacobian="forward", **QUICK).std,
                               rtol=1e-5)


def test_targeted_bound_and_the_attack_probe_with_the_jacobian_mode_they_were_given(x):
    """They probed in reverse mode whatever jacobian= said, so a compiled model was refused with
    'pass jacobian=forward' although it had been passed."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                                torch.nn.Linear(8, 5)).eval()
    compiled = torch.compile(model, backend="aot_eager")
    got = hcrfast.targeted_bound(compiled, x, 0.05, targets=[0, 3], method="lsqr", jacobian="forward")
    want = hcrfast.targeted_bound(model, x, 0.05, targets=[0, 3], method="lsqr", jacobian="forward")
    np.testing.assert_allclose(got.std, want.std, rtol=1e-4)
    got = hcrfast.gauss_newton_attack(compiled, x, 0.05, draws=2, jacobian="forward")
    np.testing.assert_allclose(got.rmse, hcrfast.gauss_newton_attack(model, x, 0.05, draws=2, jacobian="forward").rmse,
                               rtol=1e-4)


def test_fused_attention_runs_in_both_modes_and_is_named_where_torch_refuses_it(monkeypatch):
    """torch's fused CPU attention has no double backward (reverse mode's J v) and no forward AD, and its
    multi-head fast path no forward AD either. Reverse mode records the attention through
    lean_double_backward, so the default runs, with the bounds the MATH backend gives; forward mode's
    JVPs run it on the MATH backend with the fast path off (``composite_attention``), so it runs too,
    with reverse mode's bounds, and leaves both switches as it found them. Torch's own graph (the lean
    mode off) ends in a ValueError naming the fixes, not torch's raw RuntimeError."""
    import hcrfast.bindings.jacobian as jac
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16,
                            num_classes=5).eval()
    torch.nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at 0: J = 0
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    res = hcrfast.bound(vit, x, 0.05, solver="lsqr", **QUICK)
    with sdpa_kernel(SDPBackend.MATH):
        math_backend = hcrfast.bound(vit, x, 0.05, solver="lsqr", **QUICK)
    assert np.all(np.isfinite(res.std)) and np.all(res.mse > 0)
    np.testing.assert_allclose(res.std, math_backend.std, rtol=1e-4)
    vit64, x64 = copy.deepcopy(vit).double(), x.double()  # float32 LSQR iterates differ by more than rounding
    assert torch.backends.mha.get_fastpath_enabled()
    forward = hcrfast.bound(vit64, x64, 0.05, solver="lsqr", jacobian="forward", **QUICK)
    assert torch.backends.mha.get_fastpath_enabled()                         # restored
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    reverse64 = hcrfast.bound(vit64, x64, 0.05, solver="lsqr", **QUICK)
    np.testing.assert_allclose(forward.std, reverse64.std, rtol=1e-6)
    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", False)
    with pytest.raises(ValueError, match=r"cannot be differentiated twice.*jacobian='forward'.*sdpa_kernel\("
                                         r"torch\.nn\.attention\.SDPBackend\.MATH\)"):
        hcrfast.bound(vit, x, 0.05, solver="lsqr", **QUICK)
    with pytest.raises(ValueError, match=r"cannot be differentiated twice"):
        hcrfast.bound(vit64, x64, 0.05, solver="lsqr", **QUICK)
    # the fix that message names first, with the lean graph off: forward mode, the lean graph's bounds
    np.testing.assert_allclose(hcrfast.bound(vit64, x64, 0.05, solver="lsqr", jacobian="forward", **QUICK).std,
                               reverse64.std, rtol=1e-6)


class _Quantized(torch.nn.Module):
    """Features rounded to 1/100: piecewise constant, so torch's derivative is 0 (floor) or absent (round)."""

    def __init__(self, op):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.op = torch.nn.Linear(16, 12), op

    def forward(self, x):
        out = self.op(self.lin(x.flatten(1)) * 100) / 100
        return out + 0 * x.flatten(1).sum(dim=1, keepdim=True) if self.op is torch.floor else out


@pytest.mark.parametrize("solver", ["lsqr", "dense"])
def test_piecewise_constant_features_are_named_not_blamed_on_sigma(x, solver):
    """floor: autograd's J is 0 while a finite step moves the features (so not 'J = 0 here': the
    examples are not blind) and every eps is 0; the error names the piecewise-constant map, not σ's range."""
    with pytest.raises(ValueError, match=r"derivative of the features is 0 at every example, although a finite "
                                         r"step of the inputs moves them: the features are piecewise constant"):
        hcrfast.bound(_Quantized(torch.floor).eval(), x, 1.0, iterations=2, restarts=2, solver=solver)


def test_round_is_called_not_differentiable_not_once_differentiable(x):
    """torch.round's backward gives J^T u = 0 without u in its graph: the double backward fails, but
    jacobian='forward' would not help; the error says the features are not differentiable."""
    with pytest.raises(ValueError, match=r"features are not differentiable with respect to its input"):
        hcrfast.bound(_Quantized(torch.round).eval(), x, 1.0, iterations=2, restarts=2)


def test_a_model_with_a_fixed_batch_size_is_told_to_take_any(x):
    """x.view(3, -1) works on the batch of 3 and fails on one example: the error says why hcrfast needs any size."""
    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 5)

        def forward(self, x):
            return self.lin(x.view(3, -1))

    with pytest.raises(ValueError, match=r"ran on the batch of 3 examples but fails on one example alone .*"
                                         r"must take any batch size"):
        hcrfast.bound(Fixed().eval(), x, 1.0, iterations=1, restarts=2)


class SqrtFeatures(torch.nn.Module):
    """sqrt of the pixels beside the pixels: its derivative is infinite where a pixel is exactly 0."""

    def forward(self, t):
        return torch.cat([t.sqrt().flatten(1), t.flatten(1)], 1)


@pytest.mark.parametrize("entry, kw", [
    ("bound", dict(solver="dense")), ("bound", dict(solver="lsqr")), ("bound", dict(solver="krylov")),
    ("targeted_bound", dict(targets="low:2")), ("gauss_newton_attack", dict(draws=2, steps=10))])
def test_an_infinite_derivative_at_the_input_is_named_not_blamed_on_sigma(entry, kw):
    """sqrt at MNIST-like black pixels: J is infinite there, so no step exists; it was blamed on sigma,
    size or the dtype (or raised SciPy's 'array must not contain infs or NaNs' under Krylov)."""
    x = torch.rand(3, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.1
    x[1, :, :2, :2] = 0.0  # example 1 only: named by its index in the batch, not in its chunk
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(SqrtFeatures()(x), 1.0)
    chunk = dict(chunk_size=1) if entry != "targeted_bound" else {}
    with pytest.raises(ValueError, match=r"derivative is not finite at examples 1 \(.*sqrt\(x \+ 1e-12\)"):
        getattr(hcrfast, entry)(SqrtFeatures().eval(), x, sigma, **chunk, **kw)
    x[1] += 0.1  # no zero pixel: the same model has finite bounds
    res = getattr(hcrfast, entry)(SqrtFeatures().eval(), x, sigma, **chunk, **kw)
    assert np.all(np.isfinite(res.std if entry != "gauss_newton_attack" else res.rmse))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_a_model_that_fails_on_the_batch_raises_its_own_error_with_the_batch_named(entry):
    """A batch the model cannot take (5 x 5 images for a 4 x 4 model): torch's own error, untouched in type
    and message, with a note naming the batch's shape, dtype and device."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8)).eval()
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as info:
        getattr(hcrfast, entry)(model, torch.rand(2, 1, 5, 5), 0.1)
    assert any("first forward pass over the batch, of shape (2, 1, 5, 5), float32, on cpu" in note
               for note in getattr(info.value, "__notes__", []))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_a_model_with_no_features_is_named(x):
    """Features of shape (B, 0): the documented ValueError, not torch's error about max() of an empty tensor."""
    empty = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 0)).eval()
    assert empty(x).shape == (3, 0)
    with pytest.raises(ValueError, match=r"the model returned no features \(0 entries per example\)"):
        hcrfast.bound(empty, x, 1.0, **QUICK)


@pytest.mark.parametrize("size", [0.0, -0.1])
def test_a_size_that_is_not_positive_is_named_as_such(x, size):
    """size <= 0 is refused by its own check, not taken downstream for an eps below the solver's resolution."""
    with pytest.raises(ValueError, match=rf"size must be a positive finite number, got {size!r}"):
        hcrfast.bound(mlp(), x, 1.0, size=size, **QUICK)


class RoundsOtherwiseAlone(torch.nn.Module):
    """``inner``, rounded up by one float16 ulp for a row alone: what another kernel for one row may do."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, t):
        out = self.inner(t)
        return torch.nextafter(out, torch.full_like(out, math.inf)) if t.shape[0] == 1 else out


def test_the_independence_probe_allows_a_few_ulps_of_a_float16_model(x):
    """The probe's tolerance is at least 4 ulps of the features' dtype: a float16 model whose row alone
    rounds one ulp off its row in the batch does not mix the examples."""
    from hcrfast import validation

    model = RoundsOtherwiseAlone(mlp()).half()
    xh = x.half()
    with torch.no_grad():
        feats = model(xh)
        gap = ((model(xh[:1]) - feats[:1]).abs().max() / feats.abs().max()).item()
    assert 1e-4 < gap <= 4 * torch.finfo(torch.float16).eps  # above the default rtol, within 4 ulps
    validation.check_independent(model, xh, feats)  # no error


class RunningMaxScale(torch.nn.Module):
    """Each row divided by the running max of |x| over the rows up to it (detached): a row mixes the
    rows before it only where one of them is larger than it."""

    def __init__(self):
        super().__init__()
        self.lin = mlp()

    def forward(self, t):
        scale = t.flatten(1).abs().amax(dim=1).cummax(dim=0).values.detach()
        return self.lin(t / scale.reshape((-1,) + (1,) * (t.dim() - 1)))


def test_mixing_that_reaches_only_the_last_example_is_caught(x):
    """Rows of growing size, the last one small: only the last row's features change with the batch."""
    xb = torch.rand(5, 1, 4, 4, generator=torch.Generator().manual_seed(3)) * torch.tensor(
        [1.0, 2.0, 3.0, 4.0, 0.5]).reshape(5, 1, 1, 1)
    model = RunningMaxScale().eval()
    with torch.no_grad():
        batch = model(xb)
        alone = torch.cat([model(xb[i:i + 1]) for i in range(5)])
    assert torch.allclose(alone[:4], batch[:4], rtol=0, atol=1e-6) and not torch.allclose(alone[4], batch[4], rtol=1e-2)
    with pytest.raises(ValueError, match="mixes the examples of a batch"):
        hcrfast.bound(model, xb, 0.05, **QUICK)


class CouplesNextRowInDerivativeOnly(torch.nn.Module):
    """Features of row i plus (g(x_{i-1}) - g(x_{i-1}).detach()): the values are those of row i alone,
    the Jacobian couples each row to the row before it (row 0 to none)."""

    def __init__(self):
        super().__init__()
        self.lin, self.g = mlp(), torch.nn.Linear(16, 12)

    def forward(self, t):
        g = self.g(t.flatten(1))
        prev = torch.cat([torch.zeros_like(g[:1]), g[:-1]])
        return self.lin(t) + (prev - prev.detach())


def test_a_jacobian_that_couples_example_0_to_example_1_only_is_caught(x):
    model = CouplesNextRowInDerivativeOnly().eval()
    jac = torch.autograd.functional.jacobian(lambda t: model(t), x)  # (B, n, B, ...): the dense oracle
    cross = jac.reshape(3, 12, 3, 16).abs().sum(dim=(1, 3))
    assert cross[1, 0] > 0 and cross[2, 0] == 0 and cross[0, 1] == 0  # row 0 reaches row 1 only
    with pytest.raises(ValueError, match="mixes the examples of a batch"):
        hcrfast.bound(model, x, 0.05, **QUICK)


class _PairwiseDistances(torch.nn.Module):
    """Distances between 30 points computed from the input and 5 of them: the 5 zero distances are where
    torch.cdist's double backward (more than 25 points: its matrix-product path) is NaN."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(61)
        self.lin = torch.nn.Linear(16, 30 * 4)

    def forward(self, x):
        h = torch.tanh(self.lin(x.flatten(1))).reshape(-1, 30, 4)
        return torch.cdist(h, h[:, :5]).flatten(1)


def test_a_jacobian_product_that_is_nan_is_named_not_solved_with():
    """It went into LSQR, whose NaN iterates ended as some bound; now the probe names the cause and the fix,
    and the same distances with an eps inside the root run."""
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(62))
    model = _PairwiseDistances().eval()
    # (of the 5 zero distances, those that the matrix-product path rounds to exactly 0: 5 on one CPU, 3 on another)
    with pytest.raises(ValueError, match=r"J v at example 0 is NaN or inf in [1-5] of its 150 features \(jacobian="
                                         r"'reverse'\).*torch\.cdist between a point and itself.*torch\.sqrt\(d2 \+"):
        hcrfast.bound(model, x, 0.05, solver="lsqr", **QUICK)

    class Smooth(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model.lin

        def forward(self, x):
            h = torch.tanh(self.lin(x.flatten(1))).reshape(-1, 30, 4)
            return torch.sqrt(((h[:, :, None] - h[:, None, :5]) ** 2).sum(-1) + 1e-12).flatten(1)

    res = hcrfast.bound(Smooth().eval(), x, 0.05, solver="lsqr", **QUICK)
    assert np.all(np.isfinite(res.std))


class _NonLinearBackward(torch.autograd.Function):
    """tanh whose hand-written backward adds g²/2: not linear in g, so the J v that reverse mode gets by
    differentiating it is not the adjoint of its J^T u (it went into LSQR as it was)."""

    @staticmethod
    def forward(t):
        return torch.tanh(t)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y) + 0.5 * g * g


def test_reverse_mode_products_that_are_not_adjoint_are_named(x):
    torch.manual_seed(65)
    lin = torch.nn.Linear(x[0].numel(), 8)

    class Model(torch.nn.Module):
        def __init__(self, op):
            super().__init__()
            self.lin, self.op = lin, op

        def forward(self, t):
            return self.op(self.lin(t.flatten(1)))

    with pytest.raises(ValueError, match=r"J v \(by differentiating its backward pass, jacobian='reverse'\) is not "
                                         r"the adjoint of its J\^T u.*not linear in its incoming gradient"):
        hcrfast.bound(Model(_NonLinearBackward.apply).eval(), x, 0.05, solver="lsqr", **QUICK)
    res = hcrfast.bound(Model(torch.tanh).eval(), x, 0.05, solver="lsqr", **QUICK)  # the same forward, torch's backward
    assert np.all(np.isfinite(res.std))


def test_a_model_split_over_devices_is_refused_naming_its_parameters():
    """Only the first parameter's device was checked: one layer on the meta device gave torch's own "Tensor on
    device meta is not on the expected device cpu", naming nothing."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    model[3].to("meta")
    with pytest.raises(ValueError, match=r"parameters \['3.weight', '3.bias'\] are not on cpu"):
        hcrfast.bound(model.eval(), torch.randn(2, 1, 4, 4), 0.1, restarts=1, iterations=1)


class _Exp80(torch.nn.Module):
    def forward(self, x):
        return torch.exp(80 * x.flatten(1))


class _Sqrt(torch.nn.Module):
    def forward(self, x):
        return torch.sqrt(x.flatten(1))


def test_a_derivative_that_overflows_the_dtype_is_told_from_an_infinite_one():
    """exp(80x) at x = 1.1 in float32: finite features (1.7e38), a derivative past float32's range. It was
    refused as "undefined at this input (a square root or a norm at 0)"; it now says overflow and float64,
    which a float64 copy's finite J v tells apart from sqrt's truly infinite derivative at 0."""
    with pytest.raises(ValueError, match=r"J v at example 0 overflows float32 .* run the model and batch in float64"):
        hcrfast.bound(_Exp80().eval(), torch.full((2, 1, 3, 3), 1.1), 0.1, restarts=2, iterations=2)
    x = torch.rand(2, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0, 0] = 0
    with pytest.raises(ValueError, match=r"J v at example 0 is NaN or inf .*a square root or a norm at 0"):
        hcrfast.bound(_Sqrt().eval(), x, 0.1, restarts=2, iterations=2)


class _FailsFromItsFourthCall(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = torch.nn.Linear(16, 4), 0

    def forward(self, x):
        self.calls += 1
        if self.calls >= 4:
            raise RuntimeError("my model's own failure")
        return self.lin(x.flatten(1))


def test_a_model_that_fails_for_its_own_reasons_is_not_said_to_need_any_batch_size():
    """A model whose own RuntimeError fires from its 4th call on was reported as failing "on one example
    alone", with advice about batch sizes; it fails on the whole batch again too, so its own error is raised,
    with a note saying so."""
    with pytest.raises(RuntimeError, match="my model's own failure") as info:
        hcrfast.bound(_FailsFromItsFourthCall().eval(), torch.randn(3, 1, 4, 4), 0.1, restarts=1, iterations=1)
    assert any("not a matter of the batch size" in n for n in getattr(info.value, "__notes__", []))


class _LateRowsChange(torch.nn.Module):
    """Deterministic and example by example, except on inputs marked by a first pixel above 10 (the batch's
    later rows below): there a random term (``noise``) or the batch's mean (``mix``) is added."""

    def __init__(self, noise=0.0, mix=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 12).double()
        self.noise, self.mix = noise, mix

    def forward(self, x):
        y = torch.tanh(self.lin(x.flatten(1)))
        marked = (x.flatten(1)[:, :1] > 10).to(y.dtype)
        return y + marked * (self.noise * torch.randn_like(y) + self.mix * y.mean(0, keepdim=True))


@pytest.mark.parametrize("kind", [dict(noise=1e-4), dict(mix=1e-3)])
def test_repeatable_probe_spans_the_batch_and_catches_a_model_changing_only_at_later_rows(kind):
    """check_repeatable probed the first REPEAT_ROWS rows only: a model random, or mixing the batch, only on the
    examples past row 8 passed. The probe now takes REPEAT_ROWS rows spread evenly, the first and last included."""
    from hcrfast import validation

    batch = torch.rand(20, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    batch[12:, 0, 0, 0] += 100.0   # rows 12..19 are the marked ones
    seen = []
    clean = _LateRowsChange()
    hook = clean.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validation.check_repeatable(clean, batch, 1.5e-3)   # deterministic: passes, no warning
    hook.remove()
    rows = [0, 2, 5, 8, 10, 13, 16, 19]   # i * 19 // 7
    assert len(rows) == validation.REPEAT_ROWS
    torch.testing.assert_close(seen[0], batch[rows], rtol=0, atol=0)
    assert max(len(s) for s in seen) <= validation.REPEAT_ROWS
    with pytest.raises(ValueError, match=r"not a fixed function of each input"):
        validation.check_repeatable(_LateRowsChange(**kind), batch, 1.5e-3)
    validation.check_repeatable(_LateRowsChange(**kind), batch[:12], 1.5e-3)   # unmarked rows only: passes


class _Normalized(torch.nn.Module):
    """A bias-free encoder, then F.normalize: a scale-invariant embedding, whose J at x has x in its null space."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 24, bias=False, dtype=torch.float32)

    def forward(self, t):
        return torch.nn.functional.normalize(self.lin(t.flatten(1)), dim=-1)


@pytest.mark.parametrize("jacobian", ["reverse", "forward"])
def test_a_scale_invariant_embedding_of_inputs_drawn_from_the_probes_seed_is_not_refused(jacobian):
    """The entry probe's tangent is randn from seed 0, bit for bit example 0 of a batch a user drew after
    torch.manual_seed(0): for a scale-invariant model J v ~ 0 there, and the adjoint check's tolerance, 1e-3
    of |J v| |u|, fell to float32's rounding of <v, J^T u>: the model was refused as having a wrong double
    backward (forward mode: a no_grad section). The tolerance is also 1e-3 of |v| |J^T u| now. (Every pixel
    mode has a component along x, J's null direction (torch.func.jacrev in float64), so the exact bounds are
    +inf: any bound holds; what is tested is that the model is taken.)"""
    torch.manual_seed(0)
    model = _Normalized().eval()
    torch.manual_seed(0)
    batch = torch.randn(2, 1, 4, 4)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(batch[0], torch.randn(batch.shape[1:], generator=gen))   # the probe's tangent, exactly
    res = hcrfast.bound(model, batch, 0.01, restarts=2, iterations=2, basis="pixel", jacobian=jacobian)
    model64 = copy.deepcopy(model).double()
    J = torch.func.jacrev(lambda t: model64(t[None])[0])(batch[0].double()).detach().reshape(24, 16)
    assert float((J @ batch[0].double().reshape(16)).norm()) < 1e-12 * float(J.norm())   # x: J's null direction
    assert np.all(res.std >= 0) and np.isfinite(res.std).any()


def test_autocast_features_name_the_cast_back_not_a_dtype_the_solver_refuses(x):
    """A float32 model whose forward runs under torch.autocast to bfloat16 returns bfloat16 features. The
    refusal said to run model and batch in bfloat16, which check_batch then refuses; it names the cast back."""

    class Autocast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = mlp()

        def forward(self, t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.inner(t)

    with pytest.raises(TypeError, match=r"returns bfloat16 features for a float32 batch.*y\.to\(x\.dtype\)") as err:
        hcrfast.bound(Autocast().eval(), x, 0.05, **QUICK)
    assert "model.to(torch.bfloat16)" not in str(err.value)


class HalfDetached(torch.nn.Module):
    """Its last 8 features are 2 × the last 8 pixels, through a .detach(): constant to both autograd modes."""

    def forward(self, t):
        f = t.flatten(1)
        return torch.cat([f[:, :8], 2 * f[:, 8:].detach()], 1)


MISSED = r"misses how 8 of the 16 features of example 0 move: finite differences in float64.*\.detach\(\)"


@pytest.mark.parametrize("jacobian", ["reverse", "forward"])
def test_a_partly_detached_path_is_warned_about_and_the_bounds_are_still_returned(jacobian):
    """Both modes see the detached half as constant, so their adjoint check passed and half the bounds came out 0
    without a word (the exact std of those pixels is sigma / 2). Float64 central differences see them move."""
    batch = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=MISSED) as record:
        res = hcrfast.bound(HalfDetached().eval(), batch, 0.1, basis="pixel", restarts=2, iterations=2,
                            jacobian=jacobian)
    text = next(str(w.message) for w in record if "finite differences" in str(w.message))
    assert "bounds stay valid" in text and "straight-through gradient" in text
    std = res.std.reshape(2, 16)
    assert np.all(std[:, :8] > 0) and np.all(std[:, 8:] == 0)   # valid, and blind where J v is


class _StraightThroughRound(torch.nn.Module):
    """Rounds the input to steps of 1/8 with the gradient of the identity: J v ≠ 0 where the features do not move."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, t):
        return self.net(t + (torch.round(t * 8) / 8 - t).detach())


class _Scaled(torch.nn.Module):
    def __init__(self, net, factor):
        super().__init__()
        self.net, self.factor = net, factor

    def forward(self, t):
        return self.net(t) * self.factor


def _fd_models():
    torch.manual_seed(0)
    relu = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 12))
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    with torch.no_grad():   # running statistics of their own, not 0 and 1
        cnn[1].running_mean.uniform_(-0.5, 0.5)
        cnn[1].running_var.uniform_(0.5, 2.0)
    flat = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
    with torch.no_grad():   # pre-activations below -10 for inputs in [0, 1): every ReLU off, J = 0
        flat[1].weight.uniform_(-0.1, 0.1)
        flat[1].bias.fill_(-10.0)
    return dict(relu=relu, tanh=mlp(), cnn=cnn, straight_through=_StraightThroughRound(), flat=flat,
                times_1e8=_Scaled(mlp(), 1e8), times_1e_8=_Scaled(mlp(), 1e-8))


@pytest.mark.parametrize("jacobian", ["reverse", "forward"])
@pytest.mark.parametrize("name", ["relu", "tanh", "cnn", "straight_through", "flat", "times_1e8", "times_1e_8"])
def test_models_whose_jv_sees_every_move_are_not_warned_about(x, name, jacobian, monkeypatch):
    """ReLU kinks, BatchNorm and max-pool, a straight-through rounding (J v ≠ 0, the features still), a model flat
    at the input and features of any scale: the finite-difference check runs on each and finds nothing to say."""
    from hcrfast import validation

    found, check = [], validation._missed_by_jv

    def recorded(*args):
        found.append(check(*args))
        return found[-1]

    monkeypatch.setattr(validation, "_missed_by_jv", recorded)
    model = _fd_models()[name].eval()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hcrfast.bound(model, x, 0.05, basis="pixel", jacobian=jacobian, **QUICK)
    assert not [str(w.message) for w in record if "finite differences" in str(w.message)]
    assert len(found) == 1 and found[0] is not None   # it ran, on a float64 copy
    assert found[0][1] < validation.FD_SHARE


class _DerivativeOff(torch.autograd.Function):
    """x Wᵀ whose backward gives J^T u right but whose own derivative (reverse mode's J v) is 1.1x J v."""

    @staticmethod
    def forward(ctx, t, w):
        ctx.save_for_backward(w)
        return t @ w.t()

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g @ w + 0.1 * (g - g.detach()) @ w, None


def test_a_wrong_double_backward_is_named_at_image_sizes():
    """With 3x224x224 inputs and 10 features |v||J^T u| is ~120x |J v||u|: a tolerance of 1e-3 of it let a J v
    20% off pass the adjoint check (here one 10% off). The check's rounding term is 64 ulps of it, not 1e-3."""
    from hcrfast import validation

    torch.manual_seed(2)   # (not 0: the weights would be drawn from the probe tangent's own stream)
    p = 3 * 224 * 224

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(10, p) / p**0.5)

        def forward(self, t):
            return _DerivativeOff.apply(t.flatten(1), self.w)

    model, batch = Model().eval(), torch.randn(3, p)
    with pytest.raises(ValueError, match=r"is not the adjoint of its J\^T u"):
        validation.probe_independent(model, batch, validation.features_of(model, batch))


def test_a_call_under_the_callers_autocast_is_warned_of(x):
    """Under an ambient torch.autocast the model's float32 passes ran in bfloat16: the steps moved (a mode's bound
    3.6x under LSQR), the dense solve failed blaming vmap, and the only warning blamed float32 rounding."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            try:
                hcrfast.bound(mlp(), x, 0.05, solver="lsqr", **QUICK)
            except (TypeError, ValueError):
                pass   # (what the bfloat16 passes make of this model is not the point)
    assert any("called under torch.autocast (cpu, bfloat16)" in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hcrfast.bound(mlp(), x, 0.05, solver="lsqr", **QUICK)
    assert not any("autocast" in str(w.message) for w in caught)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_features_under_the_callers_autocast_name_the_autocast(x, half):
    """Under the caller's torch.autocast a float32 MLP returns half features: the refusal blamed the model ("drop
    the cast at its end") for a cast it does not make; it names the autocast region and how to leave it."""
    with torch.autocast("cpu", dtype=half), pytest.warns(UserWarning, match="called under torch.autocast"):
        with pytest.raises(TypeError, match=rf"because hcrfast was called under torch.autocast \(cpu, "
                                            rf"{str(half)[6:]}\).*enabled=False") as err:
            hcrfast.bound(mlp(), x, 0.05, **QUICK)
    assert "drop the cast" not in str(err.value)

    class OwnCast(torch.nn.Module):   # its own cast: leaving the caller's autocast would not help
        def __init__(self):
            super().__init__()
            self.inner = mlp()

        def forward(self, t):
            return self.inner(t).to(half)

    with torch.autocast("cpu", dtype=half), pytest.warns(UserWarning, match="called under torch.autocast"):
        with pytest.raises(TypeError, match="drop the cast at its end") as err:
            hcrfast.bound(OwnCast().eval(), x, 0.05, **QUICK)
    assert "because hcrfast was called under" not in str(err.value)


def _exported(module, batch, **dims):
    """torch.export's module of ``module`` (a dynamic batch axis unless ``dims`` says otherwise)."""
    shapes = dims.get("dynamic_shapes", ({0: torch.export.Dim("batch")},))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(module, (batch,), dynamic_shapes=shapes).module()


@pytest.mark.filterwarnings("ignore:certify=False. every feature shift")  # uncertified on purpose
def test_an_exported_program_runs_as_exported_from_every_entry_point(x):
    """torch.export's module reads training=True and its eval() raises NotImplementedError: every entry point
    warned that it switched the model to eval mode and then crashed in model.eval(). Its graph is frozen in the mode
    it was exported in: it runs as it is, unwarned, and its bounds are the original module's, bit for bit."""
    base = mlp()
    program = _exported(base, x)
    assert program.training   # (what torch says of a program exported in eval mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # no "switched to eval mode"
        got = hcrfast.bound(program, x, 0.05, **QUICK)
    np.testing.assert_array_equal(got.std, hcrfast.bound(base, x, 0.05, **QUICK).std)
    np.testing.assert_array_equal(hcrfast.bound(program, x, 0.05, certify=False, **QUICK).std,
                                  hcrfast.bound(base, x, 0.05, certify=False, **QUICK).std)
    np.testing.assert_array_equal(hcrfast.targeted_bound(program, x, 0.05, targets=[0, 5]).std,
                                  hcrfast.targeted_bound(base, x, 0.05, targets=[0, 5]).std)
    np.testing.assert_array_equal(hcrfast.gauss_newton_attack(program, x, 0.05, draws=2, steps=2).rmse,
                                  hcrfast.gauss_newton_attack(base, x, 0.05, draws=2, steps=2).rmse)
    assert hcrfast.dithered_accuracy(program, None, x, None, 0.05, metric="cosine") == hcrfast.dithered_accuracy(
        base, None, x, None, 0.05, metric="cosine")
    assert program.training
    # inside a Module in training mode: the modules around it are switched and named, the program is left as it is
    wrapped = torch.nn.Sequential(program, torch.nn.Dropout(0.5))   # (made in training mode: .train() raises)
    with pytest.warns(UserWarning, match=r"the model was in training mode"):
        np.testing.assert_array_equal(hcrfast.bound(wrapped, x, 0.05, **QUICK).std, got.std)
    assert wrapped.training and wrapped[1].training and program.training


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14),
                    reason="torch 2.8's exported program does not check a bounded batch axis when run (no "
                           "'Guard failed'); measured on torch 2.8 and 2.14, versions between not tried")
def test_an_exported_program_that_cannot_run_as_hcrfast_needs_is_refused_with_the_fix(x):
    """Exported in training mode (BatchNorm on batch statistics baked in), for a fixed batch size, or with a bound on
    the batch axis that hcrfast's stacked rows pass: each refusal says how to export it instead."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.BatchNorm2d(3), torch.nn.Flatten()).train()
    program = _exported(net, x)
    state = {k: v.clone() for k, v in program.state_dict().items()}
    with pytest.raises(ValueError, match=r"mixes the examples.*exported program \(torch.export\), frozen in the mode "
                                         r"it was exported in: export it again after \.eval\(\)"):
        hcrfast.bound(program, x, 0.05, **QUICK)
    assert all(torch.equal(v, program.state_dict()[k]) for k, v in state.items())
    with pytest.raises(ValueError, match=r"fails on one example alone.*export it with a dynamic batch axis"):
        hcrfast.bound(_exported(mlp(), x, dynamic_shapes=None), x, 0.05, **QUICK)
    bounded = _exported(mlp(), x, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    with pytest.raises(AssertionError, match="Guard failed") as caught:
        hcrfast.targeted_bound(bounded, x, 0.05, targets="low:2")
    assert any("dynamic_shapes=({0: torch.export.Dim('batch')},)" in note for note in caught.value.__notes__)
    casting = _exported(torch.nn.Sequential(torch.nn.Flatten(), _CastsToFloat32(), torch.nn.Linear(16, 5)).eval(), x)
    with pytest.raises(TypeError, match=r"fails on a float64 example.*exported program \(torch.export\) keeps the "
                                        r"dtypes it was exported for: export a float64 model"):
        hcrfast.bound(casting, x, 0.05, **QUICK)


class _CastsToFloat32(torch.nn.Module):
    def forward(self, t):
        return t.float()


def test_a_model_traced_in_training_mode_is_refused_naming_the_retrace_and_left_untouched(x):
    """torch.jit.trace bakes BatchNorm's training=True into the graph: the user's .eval() does not reach it. The
    refusal told them to call model.eval() (done already), and the refused call had moved the running statistics."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.BatchNorm2d(3), torch.nn.Flatten())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(net.train(), x, check_trace=False).eval()
    state = {k: v.clone() for k, v in traced.state_dict().items()}
    with pytest.raises(ValueError, match=r"TorchScript: a traced model .* keeps the mode it was traced in.*trace it "
                                         r"again after \.eval\(\) \(torch\.jit\.trace\(model\.eval\(\), example\)\)"):
        hcrfast.bound(traced, x, 0.05, **QUICK)
    assert all(torch.equal(v, traced.state_dict()[k]) for k, v in state.items())


def test_a_pruned_model_is_refused_naming_prune_remove(x):
    """torch.nn.utils.prune's masked weights are not leaves, so the float64 copy fails; the refusal named only
    weight_norm and spectral_norm."""
    from torch.nn.utils import prune

    model = torch.nn.Sequential(mlp(), torch.nn.Linear(12, 5)).eval()
    prune.l1_unstructured(model[0][1], "weight", amount=0.3)
    prune.random_unstructured(model[1], "bias", amount=0.5)
    with pytest.raises(TypeError, match=r"pruned with torch\.nn\.utils\.prune.*"
                                        r"torch\.nn\.utils\.prune\.remove\(model\[0\]\[1\], 'weight'\); "
                                        r"torch\.nn\.utils\.prune\.remove\(model\[1\], 'bias'\), or pass a float64"):
        hcrfast.bound(model, x, 0.05, **QUICK)
    prune.remove(model[0][1], "weight")
    prune.remove(model[1], "bias")
    assert np.all(np.isfinite(hcrfast.bound(model, x, 0.05, **QUICK).std))


class _DrawsInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = mlp()

    def forward(self, t):
        return self.m(t) + 0.1 * torch.rand(t.shape[0], 12)


class _CountsCalls(torch.nn.Module):
    """A fixed feature map that counts its calls in a buffer, in place or by replacing it."""

    def __init__(self, replace=False):
        super().__init__()
        self.m, self.replace = mlp(), replace
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, t):
        if self.replace:
            self.calls = self.calls + 1
        else:
            self.calls += 1
        return self.m(t)


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_the_models_buffers_are_as_they_were_and_the_rng_moves_as_the_model_moves_it(x, entry):
    """A model counting its calls in a buffer ended a call with 12 there (also a refused call): its buffers are as
    on entry now, and hcrfast's own seeded draws are untouched: the counting model's results are those of the same
    map without a counter. A model drawing torch.rand in its forward is refused, and moves the caller's global RNG
    as any call of it would: hcrfast does not fork it (that rewound the process-wide generator under other threads,
    test_another_threads_draws_during_a_call_are_not_drawn_again)."""
    kwargs = dict(bound=dict(solver="lsqr", **QUICK), targeted_bound=dict(targets=[0, 5], method="lsqr"),
                  gauss_newton_attack=dict(draws=2, steps=2))[entry]
    call, drawing = getattr(hcrfast, entry), _DrawsInForward().eval()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    with pytest.raises(ValueError, match="other features for the same batch"):
        call(drawing, x, 0.05, **kwargs)
    assert not torch.equal(torch.get_rng_state(), state)
    for replace in (False, True):
        model = _CountsCalls(replace).eval()
        calls = model.calls
        got = call(model, x, 0.05, **kwargs)
        assert model.calls is calls and float(calls) == 0
        want = call(mlp(), x, 0.05, **kwargs)
        np.testing.assert_array_equal(got.rmse if entry == "gauss_newton_attack" else got.std,
                                      want.rmse if entry == "gauss_newton_attack" else want.std)
    refused = _CountsCalls()
    with pytest.raises(ValueError, match="mixes the examples"):
        call(torch.nn.Sequential(refused, BatchCentering()).eval(), x, 0.05, **kwargs)
    assert float(refused.calls) == 0


def test_buffers_untouched_by_the_call_are_not_written(x):
    """Only the buffers the call changed are written back: the others keep their version counters (a graph of the
    caller's that saved them still runs its backward)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten()).eval()
    versions = [b._version for b in model.buffers()]
    hcrfast.bound(model, x, 0.05, **QUICK)
    assert [b._version for b in model.buffers()] == versions


def test_an_uninitialized_lazy_module_is_refused_naming_it(x):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(12), torch.nn.Tanh()).eval()
    with pytest.raises(ValueError, match=r"the model's submodule 1 \(LazyLinear\) is a lazy module whose parameters "
                                         r"are not initialized yet.*model\(batch\[:1\]\)"):
        hcrfast.bound(model, x, 0.05, **QUICK)
    model(x[:1])
    assert np.all(np.isfinite(hcrfast.bound(model, x, 0.05, **QUICK).std))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes (add_note) are Python 3.11's")
@pytest.mark.parametrize("per_feature", [False, True])
def test_a_closure_given_a_batch_of_another_dtype_is_told_the_fix(x, per_feature):
    """A closure over float32 parameters (torch.func.functional_call) given a float64 batch (as a plain function needs
    for certify=True) failed with torch's bare "mat1 and mat2 must have the same dtype"."""
    base = mlp()
    params = dict(base.named_parameters())
    sigma = np.linspace(0.04, 0.06, 12) if per_feature else 0.05
    with pytest.raises(RuntimeError, match="same dtype") as caught:
        hcrfast.bound(lambda t: torch.func.functional_call(base, params, (t,)), x.double(), sigma, **QUICK)
    note = " ".join(caught.value.__notes__)
    assert "the batch is float64" in note and "float64 parameters" in note and "certify=False" in note
    with pytest.raises(RuntimeError, match="same dtype") as caught:   # float32 batch, float64 parameters
        hcrfast.bound(lambda t: torch.func.functional_call(base, {k: v.double() for k, v in params.items()}, (t,)),
                      x, sigma, certify=False, **QUICK)
    note = " ".join(caught.value.__notes__)
    assert "the batch is float32" in note and "float32 parameters" in note and "certify=False" not in note


def test_a_closure_with_one_std_per_feature_runs_its_modules_in_eval_mode():
    """With sigma one std per feature the model is wrapped (noise.PerFeatureStd), a Module: a closure inside it over a
    BatchNorm in training mode was run in training mode (its running statistics moved, one example alone failed)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh()).double().train()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    batch = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    stds, kw = np.linspace(0.05, 0.1, 8), dict(restarts=2, iterations=2, basis="pixel")
    with pytest.warns(UserWarning, match=r"a callable, not a Module\) calls .* in training mode"):
        got = hcrfast.bound(lambda t: net(t), batch, stds, **kw)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items()) and net.training
    np.testing.assert_array_equal(got.std, hcrfast.bound(copy.deepcopy(net).eval(), batch, stds, **kw).std)


@pytest.mark.gpu   # (gpu_session.sh's tests stage runs the files that hold the mark, -m gpu: it ran nowhere without)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_buffers_copied_to_host_are_as_they_were(x, monkeypatch):
    """Buffers past BUFFER_COPIES_ON_DEVICE (0 here: all) are copied to host memory and put back from there."""
    from hcrfast import validation

    monkeypatch.setattr(validation, "BUFFER_COPIES_ON_DEVICE", 0)
    model, batch = _CountsCalls().eval().cuda(), x.cuda()
    calls = model.calls
    hcrfast.bound(model, batch, 0.05, solver="lsqr", **QUICK)
    assert model.calls is calls and float(calls) == 0


def test_another_threads_draws_during_a_call_are_not_drawn_again(x):
    """The entry points forked torch's global RNG and set it back on exit: a thread of the caller's that drew from it
    while hcrfast ran (a data-augmentation thread) saw its numbers drawn again after the call."""
    entered, drawn, seen = threading.Event(), threading.Event(), {}

    class WaitsOnce(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = mlp()

        def forward(self, t):
            if not entered.is_set():
                entered.set()
                drawn.wait(30)   # the other thread draws while hcrfast runs
            return self.m(t)

    def other():
        entered.wait(30)
        seen["during"] = torch.rand(4)
        drawn.set()

    torch.manual_seed(0)
    thread = threading.Thread(target=other)
    thread.start()
    hcrfast.bound(WaitsOnce().eval(), x, 0.05, solver="lsqr", **QUICK)
    thread.join()
    assert "during" in seen and not torch.equal(torch.rand(4), seen["during"])


def test_a_buffer_made_under_inference_mode_is_kept_by_its_values():
    """An inference tensor has no version counter (reading it raises "Inference tensors do not track version
    counter."): a model holding one as a buffer failed every call. It is compared by its values, and put back when
    the forward replaces it."""
    class Offset(torch.nn.Module):
        def __init__(self, replace=False):
            super().__init__()
            self.m, self.replace = mlp(), replace
            with torch.inference_mode():
                self.register_buffer("offset", torch.full((12,), 0.5))

        def forward(self, t):
            out = self.m(t) + self.offset
            if self.replace:
                self.offset = self.offset.clone()   # another tensor of the same values
            return out

    x = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    want = hcrfast.bound(torch.nn.Sequential(mlp(), _Plus(0.5)).eval(), x, 0.05, **QUICK).std
    for replace in (False, True):
        model = Offset(replace).eval()
        offset = model.offset
        np.testing.assert_array_equal(hcrfast.bound(model, x, 0.05, **QUICK).std, want)
        assert model.offset is offset and offset.is_inference() and torch.equal(offset, torch.full((12,), 0.5))


class _Plus(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, t):
        return t + self.value


class _SparseMix(torch.nn.Module):
    """A fixed sparse mixing of its features (a GCN's normalized adjacency), a sparse buffer of layout ``layout``."""

    def __init__(self, layout="coo", replace=False):
        super().__init__()
        self.m, self.replace = mlp(), replace
        a = torch.eye(12) + torch.diag(torch.ones(11), 1) * 0.5
        self.register_buffer("adj", a.to_sparse() if layout == "coo" else a.to_sparse_csr())

    def forward(self, t):
        out = (self.adj @ self.m(t).T).T
        if self.replace:
            self.adj = self.adj * 1.0   # another sparse tensor in its place
        return out


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_buffer_neither_throws_away_the_result_nor_masks_the_refusal(x, layout):
    """torch.equal takes no sparse tensor: the buffer check at the end of every call raised NotImplementedError,
    throwing away a finished LSQR result and masking the dense solve's refusal of the model. The bounds are those
    of the same map with a dense buffer, and the buffer is as on entry, also where the forward replaced it."""
    dense = torch.eye(12) + torch.diag(torch.ones(11), 1) * 0.5
    kw = dict(solver="lsqr", certify=layout == "coo", **QUICK)   # (a sparse CSR tensor cannot be deep-copied)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (certify=False's, torch's beta state of sparse CSR)
        want = hcrfast.bound(torch.nn.Sequential(mlp(), _Matmul(dense)).eval(), x, 0.05, **kw).std
    for replace in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.filterwarnings("error", message="hcrfast could not give")
            model = _SparseMix(layout, replace).eval()
            adj = model.adj
            got = hcrfast.bound(model, x, 0.05, **kw).std
        np.testing.assert_allclose(got, want, rtol=1e-5)
        assert model.adj is adj and torch.equal(adj.to_dense(), dense)
    if layout == "coo":   # (the dense solve's vmap refuses this sparse product; its own message says so)
        with pytest.raises(ValueError, match="building J for the dense solve"):
            hcrfast.bound(_SparseMix(layout).eval(), x, 0.05, solver="dense", **QUICK)


class _Matmul(torch.nn.Module):
    def __init__(self, matrix):
        super().__init__()
        self.register_buffer("matrix", matrix)

    def forward(self, t):
        return (self.matrix @ t.T).T


def test_a_buffer_that_cannot_be_given_back_is_warned_about_not_raised(x, monkeypatch):
    """The buffers are given back in a finally: a failure there replaced the call's result, or its own error. It is
    a warning naming the buffer now."""
    from hcrfast import validation

    def fails(tensor, values):
        raise RuntimeError("cannot compare this layout")

    monkeypatch.setattr(validation, "_same_values", fails)
    model = torch.nn.Sequential(_CountsCalls(replace=True), torch.nn.Identity()).eval()   # (its version unmoved)
    with pytest.warns(UserWarning, match=r"could not give the model's buffer '0\.calls' \(\(\), torch\.strided\) "
                                         r"back as it was on entry \(RuntimeError: cannot compare this layout\)"):
        got = hcrfast.bound(model, x, 0.05, solver="lsqr", **QUICK)
    assert np.all(np.isfinite(got.std))
    with pytest.warns(UserWarning, match="could not give the model's buffer"), pytest.raises(
            ValueError, match="mixes the examples"):
        hcrfast.bound(torch.nn.Sequential(_CountsCalls(replace=True), BatchCentering()).eval(), x, 0.05, **QUICK)


class _DropsAndCounts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = mlp()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, t):
        self.calls += 1
        return self.m(torch.nn.functional.dropout(t, 0.5, self.training))


def test_a_bound_method_of_a_module_runs_it_in_eval_mode_and_keeps_its_buffers(x):
    """hcrfast.bound(m.forward, ...) calls m's forward directly, not through Module.__call__, so the forward pre-hook
    that switches a callable's modules to eval mode never saw m: it ran in training mode (refused as random, the
    warning naming only its Linear), and its calls buffer ended at 2. The bounds are those of m itself now."""
    kw = dict(solver="lsqr", certify=False, **QUICK)
    model = _DropsAndCounts().train()
    with pytest.warns(UserWarning, match="the model was in training mode"):
        want = hcrfast.bound(model, x, 0.05, **kw).std
    for f in (model.forward, model.__call__):
        with pytest.warns(UserWarning, match="the model was in training mode"):
            got = hcrfast.bound(f, x, 0.05, **kw).std
        np.testing.assert_array_equal(got, want)
        assert model.training and all(m.training for m in model.modules()) and int(model.calls) == 0


def test_a_closures_modules_get_their_buffers_back(x):
    """A closure's modules cannot be listed: their buffers were not given back (a closure over a Module in eval mode
    that counts its calls ended a call with 18 there). Each module the closure calls has its buffers (its
    submodules' too) copied as it is first called and given back at the end, in eval mode or not."""
    kw = dict(solver="lsqr", certify=False, **QUICK)
    want = hcrfast.bound(mlp(), x, 0.05, **kw).std
    for training in (False, True):
        inner = _CountsCalls()
        model = torch.nn.Sequential(inner, torch.nn.Identity()).train(training)
        calls = inner.calls
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # (training mode, said)
            np.testing.assert_array_equal(hcrfast.bound(lambda t: model(t), x, 0.05, **kw).std, want)
        assert inner.calls is calls and float(calls) == 0 and model.training == training


def test_bound_with_targets_keeps_the_buffers_and_checks_the_model_once_per_call(monkeypatch):
    """bound(targets=...) calls the public targeted_bound once per chunk: each opened its own entry point, which
    copied and compared the model's buffers, and ran its own _StillTheSameFunction (three probe forwards), per
    chunk, besides bound's own. A call nested in another on the same model (validation.nested) leaves both to the
    outer call."""
    from hcrfast import algorithm, validation

    counts = {"copies": 0, "still": 0}
    copies, init = validation._buffer_copies, algorithm._StillTheSameFunction.__init__

    def counted_copies(model):
        counts["copies"] += 1
        return copies(model)

    def counted_init(self, *args, **kwargs):
        counts["still"] += 1
        return init(self, *args, **kwargs)

    monkeypatch.setattr(validation, "_buffer_copies", counted_copies)
    monkeypatch.setattr(algorithm._StillTheSameFunction, "__init__", counted_init)
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    kw = dict(restarts=2, iterations=2, targets=[0, 1], chunk_size=1)
    # the dense solve's directions (targeted_bound(directions=...)), and LSQR's (targeted_bound's own pieces)
    for model, solve in ((torch.nn.Sequential(mlp(), _Matmul(torch.eye(12))).eval(), {}),
                         (_CountsCalls().eval(), dict(solver="lsqr", targeted_method="lsqr"))):
        counts.update(copies=0, still=0)
        buffers = list(model.buffers())
        got = hcrfast.bound(model, x, 0.05, **kw, **solve)
        assert counts == {"copies": 1, "still": 1} and not validation.nested(model)
        assert all(a is b for a, b in zip(model.buffers(), buffers)) and float(buffers[0].sum()) in (0.0, 12.0)
        want = hcrfast.bound(mlp(), x, 0.05, **kw, **solve)
        np.testing.assert_array_equal(got.targeted.std, want.targeted.std)


class _Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = mlp()

    def forward(self, t):
        return self.m(t) + 0.1 * torch.rand(t.shape[0], 12)


def test_torchscript_refused_on_its_own_merits_is_not_told_to_retrace(x):
    """The refusal of any TorchScript model said to trace it again after .eval(): a scripted model reads its flags as
    it runs, and one traced after .eval() has eval mode in its graph; the advice changed nothing for them. It is
    given where the graph runs BatchNorm or dropout with training=True fixed in it (traced in training mode, also
    saved and loaded)."""
    import io

    scripted = torch.jit.script(_Noisy().eval())
    with pytest.raises(ValueError, match="other features for the same batch") as caught:
        hcrfast.bound(scripted, x, 0.05, **QUICK)
    assert "TorchScript" not in str(caught.value)
    traced = torch.jit.trace(torch.nn.Sequential(mlp(), BatchCentering()).eval(), x)
    with pytest.raises(ValueError, match="mixes the examples") as caught:
        hcrfast.bound(traced, x, 0.05, **QUICK)
    assert "TorchScript" not in str(caught.value)
    net = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(net.train(), x, check_trace=False)
    saved = io.BytesIO()
    torch.jit.save(traced, saved)
    saved.seek(0)
    loaded = torch.jit.load(saved).eval()
    with pytest.raises(ValueError, match=r"The model is TorchScript: a traced model .* keeps the mode it was traced "
                                         r"in .*dropout with training=True.*trace it again after \.eval\(\)"):
        hcrfast.bound(loaded, x, 0.05, **QUICK)


def test_a_model_that_never_reads_its_input_is_told_so_not_to_remove_detach():
    """A forward on torch.zeros_like(x): autograd finds no path from input to features, and the refusal said the
    features were not differentiable, to remove .detach() or NumPy round trips, none of which the model has."""
    class Blind(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(16, 5).double()

        def forward(self, t):
            return self.l(torch.zeros_like(t.flatten(1)))

    class Detached(Blind):
        def forward(self, t):
            return self.l(t.flatten(1).detach())

    x = torch.randn(3, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"features do not depend on its input.*every mode's bound would be \+inf"):
        hcrfast.bound(Blind().eval(), x, 0.1, restarts=2, iterations=2)
    with pytest.raises(ValueError, match=r"not differentiable with respect to its input.*remove \.detach\(\)"):
        hcrfast.bound(Detached().eval(), x, 0.1, restarts=2, iterations=2)


def test_a_bound_method_s_calls_outside_its_module_run_in_eval_mode_and_keep_their_buffers():
    """enc.encode calling a BatchNorm that is not a submodule of enc: only enc's own modules were switched, so that
    BatchNorm ran in training mode and kept the running statistics the call left, unwarned; a closure's was handled."""
    from hcrfast import validation

    bn = torch.nn.BatchNorm1d(3)

    class Enc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def encode(self, t):
            return bn(self.lin(t))

    enc = Enc().eval()
    for call in (enc.encode, lambda t: bn(enc.lin(t))):
        bn.reset_running_stats()
        bn.train()
        with pytest.warns(UserWarning, match=r"calls 1 module\(s\) in training mode \(BatchNorm1d\)"):
            with validation.model_kept(call):
                call(torch.randn(4, 3))
                inside = bn.training
        assert not inside and bn.training and int(bn.num_batches_tracked) == 0
        assert torch.equal(bn.running_mean, torch.zeros(3))


def test_a_buffer_holding_nan_that_nothing_writes_is_left_alone():
    """torch.equal takes NaN for unequal to NaN: an untouched NaN buffer was written back at every call, and an expanded
    one (stride 0), which cannot be written, warned at every call that it could not be given back."""
    import warnings
    from hcrfast import validation

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.full((1,), float("nan")).expand(3))
            self.register_buffer("some", torch.tensor([1.0, float("nan")]))

        def forward(self, t):
            return t

    m = M().eval()
    versions = [b._version for b in m.buffers()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with validation.model_kept(m):
            m(torch.ones(3))
    assert [b._version for b in m.buffers()] == versions
    with validation.model_kept(m):   # changed where it is not NaN: given back
        m.some[0] = 5.0
    assert m.some[0] == 1.0 and torch.isnan(m.some[1])


def test_a_call_on_another_model_made_inside_one_keeps_that_model_s_buffers():
    """The inner call skipped the buffer keeping whenever it was opened inside any hcrfast call (a user's metric that
    calls hcrfast on another model): that model's buffers were left changed."""
    from hcrfast import utility

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, t):
            self.calls += 1
            return t

    other = Counter().eval()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))

    def metric(out, targets):
        utility.dithered_accuracy(other, None, x, None, 0.1, draws=2, metric="cosine")
        return torch.ones(out.shape[0])

    utility.accuracy_on_features(torch.nn.Identity().eval(), torch.randn(4, 3), None, 0.1, draws=2, metric=metric)
    assert int(other.calls) == 0


def test_example_ids_past_int64_are_named_not_reported_as_float64():
    """[2**63, 1, 2]: NumPy made the list float64, and the refusal named that dtype, not the id the user passed."""
    with pytest.raises(ValueError, match=r"up to 2\*\*63 - 1 .*got 9223372036854775808"):
        hcrfast.bound(mlp(), torch.rand(3, 1, 4, 4), 1.0, example_ids=[2**63, 1, 2], **QUICK)


def test_no_global_module_hook_runs_during_a_module_s_call_only_during_a_callable_s(x):
    """A global forward pre-hook for every Module call (tried on 2026-12-01, to switch modules a Module calls outside
    its own tree) switched and restored a BatchNorm that another thread was training, rolling back its statistics,
    made torch.compile warn of global hooks at every call, and ran a Dropout the forward creates at each call in eval
    mode. A Module's call installs none; a plain callable's does (its modules cannot be listed)."""
    seen = []

    class Looks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()

        def forward(self, t):
            seen.append(len(torch.nn.modules.module._global_forward_pre_hooks))
            return self.body(t)

    model = Looks().eval()
    hcrfast.bound(model, x, 0.1, **QUICK)
    assert seen and set(seen) == {0}
    seen.clear()
    hcrfast.bound(lambda t: model(t), x, 0.1, certify=False, **QUICK)
    assert seen and set(seen) == {1}
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == 0


def test_a_call_leaves_the_warnings_filters_as_it_found_them():
    """torch imports SymPy at a process's first gradient (torch.func's transforms too), and SymPy's import adds a
    filter ('once', SymPyDeprecationWarning): hcrfast's first call left it in the caller's list. In a fresh interpreter
    (SymPy may be loaded in this one), the list is the same object with the same entries after a call."""
    import subprocess

    script = ("import sys, warnings, torch, hcrfast\n"
              "assert 'sympy' not in sys.modules, 'sympy was imported before the call'\n"
              "filters = warnings.filters; before = list(filters)\n"
              "model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4), torch.nn.Tanh()).eval()\n"
              "hcrfast.bound(model, torch.rand(2, 1, 4, 4), 1.0, iterations=1, restarts=1)\n"
              "assert 'sympy' in sys.modules\n"
              "print(warnings.filters is filters, warnings.filters == before, warnings.filters[:3])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("True True"), done.stdout


def test_a_sympy_import_interrupted_at_the_first_call_leaves_later_calls_working():
    """Ctrl-C in the first ~0.3 s of a process's first call landed in hcrfast's import of SymPy, and its half-imported
    modules stayed in sys.modules: every later call of the process failed on `sympy.logic`. In a fresh interpreter,
    an import interrupted inside SymPy (a finder that raises KeyboardInterrupt at sympy.logic, once) is taken out, and
    the next call runs."""
    import subprocess

    script = (
        "import sys, torch, hcrfast\n"
        "class Interrupt:\n"
        "    armed = True\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'sympy.logic' and Interrupt.armed:\n"
        "            Interrupt.armed = False\n"
        "            raise KeyboardInterrupt\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4), torch.nn.Tanh()).eval()\n"
        "x = torch.rand(2, 1, 4, 4)\n"
        "try:\n"
        "    hcrfast.bound(model, x, 1.0, iterations=1, restarts=1)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', [m for m in sys.modules if m.startswith('sympy')][:3])\n"
        "r = hcrfast.bound(model, x, 1.0, iterations=1, restarts=1)\n"
        "print('then', r.std.shape)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "interrupted []" in done.stdout and "then (2, 1, 4, 4)" in done.stdout, done.stdout


def test_a_warning_repeated_from_one_line_is_shown_once_across_calls():
    """With Python's default filters a warning repeated from one line is shown once: hcrfast's calls used
    warnings.catch_warnings, which empties every module's record of the warnings shown, so a training-mode model's
    warning came at every call of a loop (5 times in a 4-sigma sweep), and the user's own once-per-line warnings
    came again too. In a fresh interpreter with the default filters, after one warm-up call (the imports of a
    process's first call, torch's and SymPy's, change the filters once), each is shown once."""
    import subprocess

    script = (
        "import sys, warnings, torch, hcrfast\n"
        "shown = []\n"
        "warnings.showwarning = lambda message, *rest, **kw: shown.append(str(message)[:40])\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8))\n"
        "x = torch.randn(3, 1, 4, 4)\n"
        "for solver in ('dense', 'lsqr', 'krylov'):\n"
        "    hcrfast.bound(model.eval(), x, 0.1, restarts=2, iterations=2, solver=solver)\n"
        "hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, targets='low:2')\n"
        "assert shown == [], shown\n"
        "model.train()\n"
        "for solver in ('dense', 'lsqr', 'krylov', 'dense', 'lsqr', 'krylov'):\n"
        "    warnings.warn('the user own warning')\n"
        "    hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, solver=solver)\n"
        "    hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, targets='low:2')\n"
        "hcrfast.sweep_sigma(model, x, [0.05, 0.1, 0.2, 0.4], restarts=2, iterations=2)\n"
        "print(sorted(shown))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(sorted(["the model was in training mode (Sequenti"] * 3
                                              + ["the user own warning"])), done.stdout


def test_a_quiet_pass_leaves_no_filter_behind_when_another_thread_catches_warnings_meanwhile():
    """hcrfast's quiet pass (backend.warnings_ignored) in one thread, another thread's warnings.catch_warnings
    entered during it and left after it: that block copies the filter list on entry and puts the original back
    on exit. The pass took its filter out of the copy only, so the original kept an ignore-everything filter and
    every later warning of the process was dropped. Both lists lose it now."""
    from hcrfast.backend import warnings_ignored

    before = list(warnings.filters)
    inside, entered, left = threading.Event(), threading.Event(), threading.Event()

    def quiet_pass():
        with warnings_ignored((None, Warning)):
            inside.set()
            assert entered.wait(10)
        left.set()

    def other_thread():
        assert inside.wait(10)
        with warnings.catch_warnings():
            entered.set()
            assert left.wait(10)

    threads = [threading.Thread(target=quiet_pass), threading.Thread(target=other_thread)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert warnings.filters == before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with warnings_ignored((r"quiet\b", UserWarning)):
            warnings.warn("quiet please")
            warnings.warn("shown still")
        warnings.warn("quiet again")
    assert [str(w.message) for w in caught] == ["shown still", "quiet again"]


def test_a_batchnorm_hcrfast_cannot_switch_is_named_and_a_model_that_trains_itself_is_given_back_in_eval_mode(x):
    """A BatchNorm in training mode outside the model's tree (held in a list) failed the one-example probe, and the
    refusal told the user to reshape with x.flatten(1); it names the BatchNorm now. A forward that calls
    self.train() left a model entered in eval mode in training mode after the call (flags were kept only for a model
    entered in training mode)."""
    outside = torch.nn.BatchNorm1d(12).train()

    class Shares(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()
            self.held = [outside]   # a list: not a submodule

        def forward(self, t):
            return self.held[0](self.body(t))

    with pytest.raises(ValueError, match=r"a BatchNorm runs in training mode.*outside its tree.*call \.eval\(\) on it"):
        hcrfast.bound(Shares().eval(), x, 0.1, **QUICK)

    class TrainsItself(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()

        def forward(self, t):
            self.train()
            return self.body(t)

    model = TrainsItself().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hcrfast.bound(model, x, 0.1, **QUICK)
    assert not any(m.training for m in model.modules())


@pytest.mark.parametrize("stream", ["none", "closed", "broken pipe"])
def test_progress_lines_are_best_effort(x, stream, monkeypatch, capsys):
    """bound(progress=True) with no standard error (sys.stderr None: pythonw, a service) printed its lines to
    standard output; with a closed one or a broken pipe it raised mid-run, losing the call. Now the lines are lost
    and the bounds are those of progress=False."""
    import io

    class Broken(io.TextIOBase):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    closed = io.StringIO()
    closed.close()
    model = mlp().eval()
    want = hcrfast.bound(model, x, 1.0, **QUICK)
    monkeypatch.setattr(sys, "stderr", {"none": None, "closed": closed, "broken pipe": Broken()}[stream])
    got = hcrfast.bound(model, x, 1.0, progress=True, **QUICK)
    monkeypatch.undo()
    assert capsys.readouterr().out == ""
    np.testing.assert_array_equal(got.std, want.std)


class _CopyFails(torch.nn.Module):
    """An MLP whose float64 copy fails as ``how`` says: out of memory while copied or in its float64 forward, or by
    its own __deepcopy__."""

    def __init__(self, how):
        super().__init__()
        self.net, self.how = mlp(), how

    def __deepcopy__(self, memo):
        if self.how == "copy oom":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)")
        if self.how == "own copy error":
            raise RuntimeError("this model holds a device handle that cannot be copied")
        twin = _CopyFails(self.how)
        twin.load_state_dict(self.state_dict())
        return twin

    def forward(self, x):
        if x.dtype == torch.float64 and self.how == "forward oom":
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)")
        return self.net(x)


@pytest.mark.parametrize("how", ["copy oom", "forward oom", "own copy error"])
def test_a_float64_copy_out_of_memory_is_said_as_such_not_as_a_cast_or_weight_norm(x, how):
    """The float64 copy that certifies out of memory (or failing in the model's own __deepcopy__) was refused as a
    TypeError blaming a cast in the forward or torch.nn.utils.weight_norm, so the CLI printed that advice instead
    of "out of memory". The error is now the one raised, with a note naming the float64 copy and certify=False."""
    from hcrfast.algorithm import _is_oom

    with pytest.raises(RuntimeError) as got:
        hcrfast.bound(_CopyFails(how).eval(), x, 1.0, **QUICK)
    assert type(got.value) is RuntimeError
    assert _is_oom(got.value) == (how != "own copy error")
    assert "weight_norm" not in str(got.value) and "cast" not in str(got.value)
    assert any("float64 copy of the model" in n and "certify=False" in n for n in got.value.__notes__)
    with pytest.warns(UserWarning, match="certify=False"):
        assert hcrfast.bound(_CopyFails(how).eval(), x, 1.0, certify=False, **QUICK).std.shape[0] == x.shape[0]


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack", "dithered_accuracy"])
@pytest.mark.parametrize("layout", ["sparse_coo", "mkldnn", "nested"])
def test_a_sparse_nested_or_mkldnn_batch_is_refused_saying_how_to_make_it_dense(entry, layout):
    """These batches failed with torch's errors from deep inside the checks or the forward (an operator's name,
    "NotImplementedError: Could not run 'aten::...' with arguments from the 'SparseCPU' backend"); the refusal
    now names the layout and the fix."""
    if layout == "mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no MKL-DNN")
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 5)).eval()
    x = torch.randn(3, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    batch = dict(sparse_coo=lambda: x.to_sparse(), mkldnn=lambda: x.to_mkldnn(),
                 nested=lambda: torch.nested.nested_tensor([x[0], x[1, :, :5]], layout=torch.jagged))[layout]()
    call = dict(bound=lambda: hcrfast.bound(conv, batch, 0.5, **QUICK),
                targeted_bound=lambda: hcrfast.targeted_bound(conv, batch, 0.5, targets=[0, 1], method="lsqr"),
                gauss_newton_attack=lambda: hcrfast.gauss_newton_attack(conv, batch, 0.5, draws=1, steps=1),
                dithered_accuracy=lambda: hcrfast.dithered_accuracy(conv, torch.nn.Identity(), batch,
                                                                    torch.zeros(3, dtype=torch.long), 0.5))[entry]
    fix = r"to_padded_tensor\(batch, 0\.0\)" if layout == "nested" else rf"is a {layout} tensor.*batch\.to_dense\(\)"
    with pytest.raises(TypeError, match=fix):
        call()


def test_a_channels_last_batch_gets_the_bounds_of_the_contiguous_one():
    """A channels_last batch (torchvision's recipes make them) was cloned as it was, so its convolutions summed in
    another order: bounds other at rounding level, which a resumed call mixed with the first chunks' unwarned (a
    checkpoint's key hashes the values, not the strides). The batch is made contiguous when copied."""
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Tanh(), torch.nn.Conv2d(8, 4, 3),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 6)).eval()
    x = torch.randn(4, 3, 8, 8)
    last = x.to(memory_format=torch.channels_last)
    assert not last.is_contiguous() and torch.equal(last, x)
    want = hcrfast.bound(conv, x, 0.3, restarts=3, iterations=3)
    got = hcrfast.bound(conv, last, 0.3, restarts=3, iterations=3)
    np.testing.assert_array_equal(got.std, want.std)
    np.testing.assert_array_equal(got.divergence, want.divergence)


def test_rms_sigma_of_sparse_features_is_refused_not_the_mean_of_what_is_stored():
    features = torch.zeros(4, 6)
    features[0, 0] = 3.0
    assert hcrfast.rms_sigma(features) == pytest.approx(3.0 / np.sqrt(24), rel=1e-15)   # the dense oracle
    with pytest.raises(TypeError, match=r"features is a sparse_coo tensor.*features\.to_dense\(\)"):
        hcrfast.rms_sigma(features.to_sparse())


@pytest.mark.parametrize("entry", ["bound:dense", "bound:lsqr", "targeted", "attack"])
def test_the_model_and_batch_are_freed_when_the_call_returns_without_the_cycle_collector(entry):
    """With Python's cycle collector off (as between its runs, which may come long after a call), a call kept the
    model alive, and on a process's first call the batch too: the model check's closures referred to each other
    (product and explain, holding the model and its Jacobian operators), and importing torch._dynamo on the
    first call left a frame that holds itself (torch.fx's wrap), and with it every frame below, the entry point's
    included. On a GPU that is the model's and the batch's memory. Now both are freed when the call returns, in
    a fresh interpreter, on its first call and its second."""
    import subprocess

    script = (
        "import gc, sys, warnings, weakref, torch, hcrfast\n"
        "warnings.simplefilter('ignore')\n"
        "gc.disable()\n"
        f"entry = {entry!r}\n"
        "freed = []\n"
        "for i in range(2):\n"
        "    m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 5), torch.nn.Tanh()).eval()\n"
        "    x = torch.randn(3, 1, 4, 4)\n"
        "    wm, wx = weakref.ref(m), weakref.ref(x)\n"
        "    if entry.startswith('bound:'):\n"
        "        res = hcrfast.bound(m, x, 0.5, restarts=2, iterations=2, solver=entry[6:])\n"
        "    elif entry == 'targeted':\n"
        "        res = hcrfast.targeted_bound(m, x, 0.5, targets=[0, 1], method='lsqr')\n"
        "    else:\n"
        "        res = hcrfast.gauss_newton_attack(m, x, 0.5, draws=1, steps=1)\n"
        "    del m, x, res\n"
        "    freed.append([wm() is None, wx() is None])\n"
        "print(freed)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[[True, True], [True, True]]", done.stdout


@pytest.mark.parametrize("norm", ["1d", "2d"])
def test_a_batchnorm_without_running_statistics_is_named_with_its_fix(norm):
    """A BatchNorm built with track_running_stats=False normalizes with the batch's statistics in eval mode too.
    The refusal of the model already in eval mode said to call .eval() (2d), or blamed a BatchNorm outside its tree
    or switched back to training (1d, which fails on one example alone); it names the module and the fix now."""
    torch.manual_seed(0)
    if norm == "1d":
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12),
                                    torch.nn.BatchNorm1d(12, track_running_stats=False), torch.nn.Tanh()).eval()
    else:
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3, padding=1),
                                    torch.nn.BatchNorm2d(3, track_running_stats=False), torch.nn.Tanh(),
                                    torch.nn.Flatten()).eval()
    x, name = torch.randn(4, 1, 4, 4), rf"Its {2 if norm == '1d' else 1} \(BatchNorm{norm}\)"
    with pytest.raises(ValueError, match=rf"{name} has track_running_stats=False.*GroupNorm"):
        hcrfast.bound(model, x, 0.5, **QUICK)
    with pytest.raises(ValueError, match=rf"the model (mixes the examples|ran on 4 examples but fails on one alone)"
                                         rf".*{name} has track_running_stats=False"):
        hcrfast.dithered_accuracy(model, None, x, None, 0.5, draws=2, metric="cosine")


def test_the_float64_copys_check_compares_the_models_own_float32_not_the_callers_autocast(x, monkeypatch):
    """Under the caller's torch.autocast (bfloat16) the model's features round at ~1e-2 (ResNets, MobileNet-v2: up
    to 0.02), and the check refused models bound before it existed, blaming float32. It compares the model's own
    float32 function (autocast off, IEEE float32) with the copy: here with a limit of 1e-5, which bfloat16's
    rounding passes by far and float32's does not."""
    model = torch.nn.Sequential(mlp(), torch.nn.Linear(12, 12)).eval()
    monkeypatch.setattr(hcrfast.validation, "COPY_GAP_LIMIT", 1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            gap = float((model(x[:1]).float() - model.double()(x[:1].double()).float()).abs().max())
            model.float()
            assert gap > 1e-3 * float(model(x[:1]).abs().max())   # bfloat16's rounding is there
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # (the autocast warning)
            hcrfast.validation.float64_model(model, x, True)   # not refused
    with pytest.raises(ValueError, match="differ from the model's"):
        hcrfast.validation.float64_model(BranchesOnDtype(1 + 1e-3).eval(), x, True)
