"""hcrfast: Hammersley-Chapman-Robbins confidentiality bounds for neural-network features.

>>> import hcrfast
>>> res = hcrfast.bound(model, batch, sigma)   # doctest: +SKIP
>>> res.std        # per-DCT-mode lower bounds on the std of any unbiased estimator
"""
from hcrfast.attack import AttackResult, compare, gauss_newton_attack
from hcrfast.algorithm import DEFAULT_LSQR, bound, rms_sigma, start_vectors
from hcrfast.calibrate import SigmaSearch, SigmaSweep, sigma_for, sweep_sigma
from hcrfast.checkpoint import CheckpointMismatchError
from hcrfast.distributed import ShardError
from hcrfast.lsqr import LSQROptions, LSQRResult
from hcrfast.noise import Gaussian, Laplace, MonteCarlo, NoiseLaw, as_noise
from hcrfast.results import Bounds
from hcrfast.targeted import TargetedBounds, targeted_bound
from hcrfast.utility import AccuracySearch, Utility, dithered_accuracy, sigma_for_accuracy
from hcrfast.validation import HcrfastRuntimeWarning, HcrfastUserWarning, HcrfastWarning

__version__ = "0.1.0"

__all__ = ["AttackResult", "Bounds", "CheckpointMismatchError", "compare", "gauss_newton_attack", "DEFAULT_LSQR", "Gaussian", "Laplace", "MonteCarlo", "NoiseLaw", "as_noise", "LSQROptions", "LSQRResult", "bound",
           "ShardError", "SigmaSearch", "SigmaSweep", "TargetedBounds", "rms_sigma", "sigma_for", "start_vectors", "sweep_sigma", "targeted_bound",
           "AccuracySearch", "Utility", "dithered_accuracy", "sigma_for_accuracy",
           "HcrfastWarning", "HcrfastUserWarning", "HcrfastRuntimeWarning"]


def __getattr__(name: str):
    """``hcrfast.dp`` (the DP-SGD bounds, as the README names them) after a plain ``import hcrfast``: imported on
    first use, as ``import hcrfast.dp`` would (it loads SciPy's statistics, which the bounds do not need)."""
    if name == "dp":
        import importlib

        return importlib.import_module("hcrfast.dp")
    raise AttributeError(f"module 'hcrfast' has no attribute {name!r}")
