"""LSQR for a batch of independent least-squares problems, solved in lockstep.

Paige & Saunders (1982), "LSQR: An algorithm for sparse linear equations and
sparse least squares", ACM TOMS 8(1), 43-71. The names, the blocks of the
loop and the ``istop`` codes follow ``scipy.sparse.linalg.lsqr`` so that the
two can be read side by side; every scalar of SciPy's version is here a
vector of shape (B,), one entry per problem, held in float64 on the device of
the data. Each problem stops by its own tests; a stopped problem is frozen by
masks (its vectors and scalars no longer change) and, at the every-k host
check, compacted out of the active batch when that saves operator products.

No Python ``if`` looks at device data inside :func:`lsqr_step`; the only
host synchronisation is the deliberate check in :func:`lsqr` every
``check_every`` steps.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np

from hcrfast import profiling
from hcrfast.backend import get_array_module, to_host
from hcrfast import kernels

#: One message per ``istop`` code, as in SciPy.
ISTOP_MESSAGES = (
    "The exact solution is  x = 0",
    "Ax - b is small enough, given atol, btol",
    "The least-squares solution is good enough, given atol",
    "The estimate of cond(Abar) has exceeded conlim",
    "Ax - b is small enough for this machine",
    "The least-squares solution is good enough for this machine",
    "Cond(Abar) seems to be too large for this machine",
    "The iteration limit has been reached",
)

_EPS = np.finfo(np.float64).eps


@dataclass(frozen=True)
class LSQROptions:
    """Stopping rules, with SciPy's meaning (``iter_lim=None`` means 2·n_cols).

    ``check_every`` is how many steps run between host looks at convergence;
    ``compact_below`` the active fraction under which stopped problems are
    removed from the batch at such a look (1.0: whenever any stopped).
    ``kernels`` picks the vector kernels on CuPy data (``"auto"``, ``"twin"``
    or ``"numba"``; see :mod:`hcrfast.kernels`).
    """

    damp: float = 0.0
    atol: float = 1e-6
    btol: float = 1e-6
    conlim: float = 1e8
    iter_lim: int | None = None
    check_every: int = 8
    compact_below: float = 0.9
    kernels: str = "auto"

    def __post_init__(self):
        # Checked here, once, so that a bad option fails at construction (also through
        # ``dataclasses.replace``), not inside the solver after the model has run. Values are
        # stored as Python numbers: NumPy scalars would reach the JSON of params and checkpoints.
        for name in ("damp", "atol", "btol", "conlim"):
            value = _real(name, getattr(self, name), "a finite number >= 0")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"LSQROptions.{name} must be finite and >= 0, got {value!r}; "
                                 f"pass e.g. {name}={getattr(LSQROptions, name)!r}")
            object.__setattr__(self, name, value)
        if self.iter_lim is not None:
            iter_lim = _integer("iter_lim", self.iter_lim, "an integer >= 1 or None (None: 2 x n_cols)")
            if iter_lim < 1:
                raise ValueError(f"LSQROptions.iter_lim must be >= 1 or None (None: 2 x n_cols), got {iter_lim!r}")
            object.__setattr__(self, "iter_lim", iter_lim)
        check_every = _integer("check_every", self.check_every, "an integer >= 1")
        if check_every < 1:
            raise ValueError(f"LSQROptions.check_every must be >= 1, got {check_every!r}; "
                             f"pass e.g. check_every={LSQROptions.check_every}")
        object.__setattr__(self, "check_every", check_every)
        compact_below = _real("compact_below", self.compact_below, "a number in [0, 1]")
        if not 0.0 <= compact_below <= 1.0:
            raise ValueError(f"LSQROptions.compact_below must lie in [0, 1] (0: never compact, 1: whenever a "
                             f"problem stopped), got {compact_below!r}")
        object.__setattr__(self, "compact_below", compact_below)
        if not isinstance(self.kernels, str):
            raise TypeError(f"LSQROptions.kernels must be one of {kernels.IMPLS} (a str), got {self.kernels!r} "
                            f"({type(self.kernels).__name__})")
        if self.kernels not in kernels.IMPLS:
            raise ValueError(f"LSQROptions.kernels must be one of {kernels.IMPLS}, got {self.kernels!r}")
        object.__setattr__(self, "kernels", str(self.kernels))


def _real(name: str, value, expected: str) -> float:
    """``value`` as a float if it is a real number (NumPy's too; not a bool), else a TypeError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"LSQROptions.{name} must be {expected}, got {value!r} ({type(value).__name__}); "
                        f"pass a number, e.g. {name}={getattr(LSQROptions, name)!r}")
    return float(value)


def _integer(name: str, value, expected: str) -> int:
    """``value`` as an int if it is an integer (NumPy's too; not a bool, not a float), else a TypeError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        example = max(1, int(value)) if isinstance(value, (float, np.floating)) and math.isfinite(value) else \
            getattr(LSQROptions, name) or 100
        raise TypeError(f"LSQROptions.{name} must be {expected}, got {value!r} ({type(value).__name__}); "
                        f"pass an int, e.g. {name}={example}")
    return int(value)


@dataclass
class LSQRResult:
    """Per-problem results of :func:`lsqr`; every field has B entries on axis 0."""

    x: object
    istop: object
    itn: object
    r1norm: object
    r2norm: object
    anorm: object
    acond: object
    arnorm: object
    xnorm: object

    def messages(self) -> list[str]:
        """The stop reason of each problem, in words."""
        return [ISTOP_MESSAGES[int(k)] for k in to_host(self.istop)]

    def __eq__(self, other) -> bool:
        """Every array bitwise equal, as the other result classes compare (:func:`hcrfast.results.same_result`);
        the dataclass's own ``==`` asked NumPy for the truth value of an array comparison, and raised."""
        from hcrfast.results import same_result

        return same_result(self, other)

    __hash__ = None


@dataclass
class LSQRState:
    """The solver's state: vectors (B, ·) in the data dtype, scalars (B,) in float64."""

    x: object
    u: object
    v: object
    w: object
    alfa: object
    beta: object
    bnorm: object
    rhobar: object
    phibar: object
    anorm: object
    acond: object
    ddnorm: object
    res2: object
    xnorm: object
    xxnorm: object
    z: object
    cs2: object
    sn2: object
    rnorm: object
    r1norm: object
    r2norm: object
    arnorm: object
    itn: object
    istop: object
    active: object
    x0norm: object

    def take(self, rows) -> "LSQRState":
        return LSQRState(**{f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self)})


def _col(a):
    return a[:, None]


def _sym_ortho(a, b, xp):
    """Stable Givens rotation ``(c, s, r)`` with ``[c s; -s c]ᵀ[a; b] = [r; 0]``, batched.

    The branches of SciPy's ``_sym_ortho`` become masks; unused branches are
    evaluated on safe denominators so that no warning is raised.
    """
    absa, absb = xp.abs(a), xp.abs(b)
    b_zero = b == 0
    a_zero = (a == 0) & ~b_zero
    b_big = (absb > absa) & ~b_zero & ~a_zero

    safe_b = xp.where(b == 0, 1.0, b)
    safe_a = xp.where(a == 0, 1.0, a)
    # |b| > |a|
    tau_b = a / safe_b
    s_b = xp.sign(b) / xp.sqrt(1 + tau_b * tau_b)
    c_b = s_b * tau_b
    r_b = b / xp.where(s_b == 0, 1.0, s_b)
    # |a| >= |b|
    tau_a = b / safe_a
    c_a = xp.sign(a) / xp.sqrt(1 + tau_a * tau_a)
    s_a = c_a * tau_a
    r_a = a / xp.where(c_a == 0, 1.0, c_a)

    c = xp.where(b_zero, xp.sign(a), xp.where(a_zero, 0.0, xp.where(b_big, c_b, c_a)))
    s = xp.where(b_zero | a_zero, xp.where(a_zero, xp.sign(b), 0.0), xp.where(b_big, s_b, s_a))
    r = xp.where(b_zero, absa, xp.where(a_zero, absb, xp.where(b_big, r_b, r_a)))
    return c, s, r


def lsqr_init(op, b, *, impl: str = "auto", x0=None) -> LSQRState:
    """Set up the first vectors of the bidiagonalization for every problem.

    ``beta·u = b − A x0``, ``alfa·v = Aᵀu``, x = x0 (default 0), ``bnorm = ‖b‖``
    as in SciPy. Problems with ``alfa·beta = 0`` (nothing left to solve, or
    Aᵀ(b − A x0) = 0) are finished at once with ``istop = 0`` and x = x0.
    """
    xp = get_array_module(b)
    B = b.shape[0]
    f64 = xp.float64
    if x0 is None:
        u, beta = kernels.row_normalize(b, 1.0, impl=impl)
        beta = beta.astype(f64)
        bnorm = beta.copy()
        x = xp.zeros((B, op.n_cols), dtype=b.dtype)
        x0norm = xp.zeros(B, dtype=f64)
    else:
        bnorm = kernels.row_norms(b, impl=impl).astype(f64)
        x = x0.astype(b.dtype, order="C", copy=True)  # the Numba x/w update writes C-ordered rows in place
        x0norm = kernels.row_norms(x, impl=impl).astype(f64)
        u, beta = kernels.row_normalize(b - op.matvec(x), 1.0, impl=impl)
        beta = beta.astype(f64)
    v, alfa = kernels.row_normalize(op.rmatvec(u), 1.0, impl=impl)
    alfa = alfa.astype(f64)
    # A row whose beta is 0 has u = 0, hence v = 0 and alfa = 0 already.
    w = v.copy()
    zeros = xp.zeros(B, dtype=f64)
    arnorm = alfa * beta
    return LSQRState(
        x=x, u=u, v=v, w=w,
        alfa=alfa, beta=beta, bnorm=bnorm, rhobar=alfa.copy(), phibar=beta.copy(),
        anorm=zeros.copy(), acond=zeros.copy(), ddnorm=zeros.copy(), res2=zeros.copy(),
        xnorm=zeros.copy(), xxnorm=zeros.copy(), z=zeros.copy(), cs2=-xp.ones(B, dtype=f64),
        sn2=zeros.copy(), rnorm=beta.copy(), r1norm=beta.copy(), r2norm=beta.copy(),
        arnorm=arnorm, itn=xp.zeros(B, dtype=xp.int64), istop=xp.zeros(B, dtype=xp.int64),
        active=arnorm != 0, x0norm=x0norm,
    )


def _bidiagonalize(s: LSQRState, op, *, impl: str, orthogonalize):
    """The next ``beta, u, alfa, v`` of the Golub-Kahan bidiagonalization of every problem:
        beta*u  =  A@v   -  alfa*u,
        alfa*v  =  A'@u  -  beta*v.

    Stopped problems keep iterating u and v (normalized, so finite) because masking whole
    vectors costs passes over memory; their x and scalars are frozen by the caller. An active
    problem whose beta is exactly 0 stops at this step: in :func:`lsqr_step` by test1 (SciPy keeps
    v and alfa then; the step's x, istop and estimates are the same either way), in a Krylov basis
    by its exhaustion test. The new u and v are formed in the
    buffers of the old ones, which are not read again (as x and w, they are updated in place: a
    step consumes its input state). The operator's outputs are only read, so an operator may hand
    back a buffer it still uses. Returns ``(u, beta, v, alfa)``, the scalars in float64.
    """
    xp = get_array_module(s.u)
    dtype = s.u.dtype
    u = xp.multiply(s.u, _col(s.alfa.astype(dtype)), out=s.u)
    u = xp.subtract(op.matvec(s.v), u, out=u)
    if orthogonalize is not None:
        orthogonalize("u", u)
    u, beta = kernels.row_normalize(u, 1.0, out=u, impl=impl)
    v = xp.multiply(s.v, _col(beta.astype(dtype)), out=s.v)
    v = xp.subtract(op.rmatvec(u), v, out=v)
    if orthogonalize is not None:
        orthogonalize("v", v)
    v, alfa = kernels.row_normalize(v, 1.0, out=v, impl=impl)
    return u, beta.astype(xp.float64), v, alfa.astype(xp.float64)


def bidiag_step(state: LSQRState, op, *, impl: str = "auto", orthogonalize=None) -> LSQRState:
    """One step of the bidiagonalization alone, for :mod:`hcrfast.krylov`'s bases built without a
    tolerance: the new ``u, v, alfa, beta`` and ``itn`` of every problem; x, w, LSQR's estimates,
    ``istop`` and ``active`` are left as they are (the basis never reads the estimates, and decides
    its stops itself: exhaustion, then its step limit).

    :func:`lsqr_step` with ``atol = btol = conlim = 0`` gives the same vectors and scalars. What
    this step saves is LSQR's operations on the scalars and its passes over the x and w rows: on a
    GPU, each a kernel launch of the host's time (the H100 profile of the MNIST target: ~250
    launches per step, 6.1 of a slice's 21.5 s in the steps). A basis step's array operations fall
    from 288.5 to 114.5 (tests/test_cupy_emulated.py counts them; 105.4 with the basis' own bookkeeping
    trimmed since).
    """
    u, beta, v, alfa = _bidiagonalize(state, op, impl=impl, orthogonalize=orthogonalize)
    return dataclasses.replace(state, u=u, v=v, alfa=alfa, beta=beta, itn=state.itn + state.active)


def lsqr_step(state: LSQRState, op, *, damp: float, atol: float, btol: float,
              ctol: float, iter_lim: int, impl: str = "auto", orthogonalize=None) -> LSQRState:
    """One LSQR iteration for every active problem; stopped problems stay as they are.

    The vectors of ``state`` (x, u, v, w) are updated in place and belong to the
    returned state: do not use ``state`` afterwards. ``orthogonalize(name, vec)``,
    when given, is called on the new ``u`` and ``v`` (``name`` "u" or "v") before
    they are normalized and may change ``vec`` in place: :mod:`hcrfast.krylov`
    reorthogonalizes against the kept Lanczos vectors there.
    """
    s = state
    xp = get_array_module(s.x)
    act = s.active
    dtype = s.x.dtype
    dampsq = damp * damp
    itn = s.itn + act

    u, beta, v, alfa = _bidiagonalize(s, op, impl=impl, orthogonalize=orthogonalize)
    anorm = xp.where(act & (beta > 0), xp.sqrt(s.anorm**2 + s.alfa**2 + beta**2 + dampsq), s.anorm)

    # Use a plane rotation to eliminate the damping parameter.
    # This alters the diagonal (rhobar) of the lower-bidiagonal matrix.
    if damp > 0:
        rhobar1 = xp.sqrt(s.rhobar**2 + dampsq)
        cs1 = s.rhobar / rhobar1
        sn1 = damp / rhobar1
        psi = sn1 * s.phibar
        phibar = cs1 * s.phibar
    else:
        rhobar1 = s.rhobar
        psi = xp.zeros_like(s.rhobar)
        phibar = s.phibar

    # Use a plane rotation to eliminate the subdiagonal element (beta)
    # of the lower-bidiagonal matrix, giving an upper-bidiagonal matrix.
    cs, sn, rho = _sym_ortho(rhobar1, beta, xp)
    theta = sn * alfa
    rhobar = -cs * alfa
    phi = cs * phibar
    phibar = sn * phibar
    tau = sn * phi

    # Update x and w. A stopped problem gets t1 = 0 (x frozen) and t2 = 0 (w = v stays finite).
    safe_rho = xp.where(rho == 0, 1.0, rho)
    t1 = xp.where(act, phi / safe_rho, 0.0)
    t2 = xp.where(act, -theta / safe_rho, 0.0)
    ddnorm = s.ddnorm + kernels.row_norms(s.w, impl=impl).astype(xp.float64) ** 2 / safe_rho**2
    x, w = kernels.lsqr_update_xw(s.x, s.w, v, t1.astype(dtype), t2.astype(dtype), impl=impl)

    # Use a plane rotation on the right to eliminate the
    # super-diagonal element (theta) of the upper-bidiagonal matrix.
    # Then use the result to estimate norm(x).
    delta = s.sn2 * rho
    gambar = -s.cs2 * rho
    rhs = phi - delta * s.z
    zbar = rhs / xp.where(gambar == 0, 1.0, gambar)
    xnorm = xp.sqrt(s.xxnorm + zbar**2)
    gamma = xp.sqrt(gambar**2 + theta**2)
    safe_gamma = xp.where(gamma == 0, 1.0, gamma)
    cs2 = gambar / safe_gamma
    sn2 = theta / safe_gamma
    z = rhs / safe_gamma
    xxnorm = s.xxnorm + z**2

    # Test for convergence.
    # First, estimate the condition of the matrix Abar,
    # and the norms of rbar and Abar'rbar.
    acond = anorm * xp.sqrt(ddnorm)
    res1 = phibar**2
    res2 = s.res2 + psi**2
    rnorm = xp.sqrt(res1 + res2)
    arnorm = alfa * xp.abs(tau)
    if damp > 0:
        r1sq = rnorm**2 - dampsq * xxnorm
        r1norm = xp.sign(r1sq) * xp.sqrt(xp.abs(r1sq))
        r1norm = xp.where(r1sq == 0, 0.0, r1norm)
    else:
        r1norm = rnorm
    r2norm = rnorm

    # Now use these norms to estimate certain other quantities,
    # some of which will be small near a solution.
    bnorm = xp.where(s.bnorm == 0, 1.0, s.bnorm)
    test1 = rnorm / bnorm
    # SciPy guards test2 with ``+ eps``, which is not scale-free: for features (and σ) of order 1e-9,
    # ``anorm·rnorm`` falls under eps and every problem "converges" at step 1. A zero guard is enough
    # (rnorm = 0 means b is solved, and then arnorm = 0 too).
    scale2 = anorm * rnorm
    test2 = arnorm / xp.where(scale2 > 0, scale2, 1.0)
    test3 = 1 / (acond + _EPS)
    # ‖x‖ in the tests is that of the whole solution x0 + δ (bounded by ‖x0‖ + ‖δ‖), as the
    # backward-error meaning of atol asks; SciPy's x0 uses ‖δ‖ alone, which after a good start
    # demands a far smaller residual than the same atol from zero. Without x0 they agree.
    xnorm_all = xnorm + s.x0norm
    t1 = test1 / (1 + anorm * xnorm_all / bnorm)
    rtol = btol + atol * anorm * xnorm_all / bnorm

    # The later tests take precedence, as in SciPy (the guards against
    # tolerances below machine precision come first).
    istop = xp.zeros_like(s.istop)
    istop = xp.where(itn >= iter_lim, 7, istop)
    istop = xp.where(1 + test3 <= 1, 6, istop)
    istop = xp.where(1 + test2 <= 1, 5, istop)
    istop = xp.where(1 + t1 <= 1, 4, istop)
    istop = xp.where(test3 <= ctol, 3, istop)
    istop = xp.where(test2 <= atol, 2, istop)
    istop = xp.where(test1 <= rtol, 1, istop)

    def keep(new, old):
        return xp.where(act, new, old)

    return LSQRState(
        x=x, u=u, v=v, w=w, alfa=alfa, beta=beta, bnorm=s.bnorm,
        rhobar=keep(rhobar, s.rhobar), phibar=keep(phibar, s.phibar), anorm=keep(anorm, s.anorm),
        acond=keep(acond, s.acond), ddnorm=keep(ddnorm, s.ddnorm), res2=keep(res2, s.res2),
        xnorm=keep(xnorm, s.xnorm), xxnorm=keep(xxnorm, s.xxnorm), z=keep(z, s.z),
        cs2=keep(cs2, s.cs2), sn2=keep(sn2, s.sn2), rnorm=keep(rnorm, s.rnorm),
        r1norm=keep(r1norm, s.r1norm), r2norm=keep(r2norm, s.r2norm), arnorm=keep(arnorm, s.arnorm),
        itn=itn, istop=keep(istop, s.istop), active=act & (istop == 0), x0norm=s.x0norm,
    )


_RESULT_FIELDS = ("x", "istop", "itn", "r1norm", "r2norm", "anorm", "acond", "arnorm", "xnorm")


def compact(state: LSQRState, full_op, rows: np.ndarray, keep: np.ndarray):
    """Keep the problems at positions ``keep`` of the active batch (host indices).

    ``rows`` maps active positions to problems of ``full_op``; returns the restricted
    ``(state, op, rows)``. Used by :func:`lsqr` and :func:`hcrfast.krylov.build`.
    """
    xp = get_array_module(state.x)
    rows = rows[keep]
    return state.take(xp.asarray(keep)), full_op.take(xp.asarray(rows)), rows


def lsqr(op, b, options: LSQROptions | None = None, *, x0=None, progress=None, **overrides) -> LSQRResult:
    """Solve ``min ‖A_k x_k − b_k‖² + damp²‖x_k‖²`` for every problem k of a batch.

    Parameters
    ----------
    op : BatchedOperator
        The B matrices (see :mod:`hcrfast.operators`); ``op.take(rows)`` is
        used to drop stopped problems from the batch.
    b : array, shape (B, op.n_rows)
        Right-hand sides, NumPy or CuPy; its dtype is the vectors' dtype.
    options : LSQROptions, optional
        Stopping rules; keyword overrides (``atol=...``) replace its fields.
    x0 : array, shape (B, op.n_cols), optional
        Starting points: LSQR runs on ``b − A x0`` and returns ``x0`` plus its
        solution, with SciPy's iterates. The stopping tests keep ``‖b‖`` and take
        ``‖x0‖ + ‖δ‖`` for ``‖x‖`` (SciPy: ``‖δ‖``), so a good start stops at about the
        residual a start from zero stops at, in fewer iterations. One extra product
        ``A x0`` per problem. The reported ``xnorm`` is ``‖δ‖``'s estimate, as SciPy's.
        With ``damp > 0`` the damping is of ``δ``, as SciPy's: the solution minimizes
        ``‖A x − b‖² + damp²‖x − x0‖²``, not the damped problem above (the same only where damp is 0).
    progress : callable, optional
        Called as ``progress(steps, active, total)`` at every host check (every ``check_every``
        steps), with the problems still running: no host synchronisation of its own.

    Returns
    -------
    LSQRResult
        With per-problem ``istop`` codes as in ``scipy.sparse.linalg.lsqr``.
    """
    opts = dataclasses.replace(options or LSQROptions(), **overrides)
    xp = get_array_module(b)
    if b.ndim != 2 or b.shape[0] != op.batch or b.shape[1] != op.n_rows:
        raise ValueError(f"Shape mismatch: expected b of shape ({op.batch}, {op.n_rows}), got {tuple(b.shape)}")
    iter_lim = 2 * op.n_cols if opts.iter_lim is None else int(opts.iter_lim)
    ctol = 1.0 / opts.conlim if opts.conlim > 0 else 0.0
    step_kw = dict(damp=float(opts.damp), atol=float(opts.atol), btol=float(opts.btol),
                   ctol=ctol, iter_lim=iter_lim, impl=opts.kernels)

    full_op = op
    with profiling.annotate("lsqr.init"):
        if x0 is not None and tuple(x0.shape) != (op.batch, op.n_cols):
            raise ValueError(f"Shape mismatch: expected x0 of shape ({op.batch}, {op.n_cols}), got {tuple(x0.shape)}")
        state = lsqr_init(op, b, impl=opts.kernels, x0=x0)
    out = {name: getattr(state, name).copy() for name in _RESULT_FIELDS}
    rows = np.arange(b.shape[0])  # problems still in the batch, as indices into b
    steps = 0
    while True:
        # The one deliberate host synchronisation: which problems are still running.
        active = to_host(state.active)
        finished = steps >= iter_lim or not active.any()
        if progress is not None:
            progress(steps, 0 if finished else int(active.sum()), b.shape[0])
        if finished or active.mean() < opts.compact_below:
            done = np.ones_like(active) if finished else ~active
            src = xp.asarray(np.flatnonzero(done))
            dst = xp.asarray(rows[done])
            for name in _RESULT_FIELDS:
                out[name][dst] = getattr(state, name)[src]
            if finished:
                break
            state, op, rows = compact(state, full_op, rows, np.flatnonzero(active))
        with profiling.annotate("lsqr.block"):
            for _ in range(min(opts.check_every, iter_lim - steps)):
                state = lsqr_step(state, op, **step_kw)
                steps += 1
    return LSQRResult(**out)
