"""One Golub–Kahan basis per example, recycled by every least-squares step of Algorithm 1.

With ``linearize_at="input"`` the R·i steps ``ε(j) = argmin ‖J ε − z̃‖`` of an example all
share its Jacobian J. LSQR from zero spends its products building a Krylov space that
resolves J's small singular values (the ones the bound lives on), returns one vector
and forgets the space; on ResNet-18 that is ~1,920 steps per solve (benchmarks/README.md).
Here, per example, LSQR runs once on one right-hand side ``b`` (restart 0's start vector)
with every Lanczos vector kept and reorthogonalized (classical Gram–Schmidt), so
that after k steps (Paige & Saunders 1982, eqs. 3.1–3.3)

    J V_k = U_{k+1} B_k,   U_{k+1}ᵀU_{k+1} = I,   V_kᵀV_k = I,   B_k lower bidiagonal (k+1) × k.

Every step, for any right-hand side c, is then solved in that space with no model product:

    ε = argmin_{ε ∈ span V_k} ‖J ε − c‖ = V_k B_k⁺ U_{k+1}ᵀ c        (two matrix products)

For ``c = b`` this is LSQR's own iterate x_k; when the space holds J's whole row space
(k = rank J) it is ``J⁺ c``, the dense solve. Any ε gives a valid bound (``z_ε`` comes from
forward passes), so a space that misses part of ``c`` costs tightness, never validity.
The basis is built by :func:`lsqr_step` itself, with LSQR's stopping rules on ``b``, in
lockstep over the examples of a chunk, stopped ones compacted out as in :func:`hcrfast.lsqr.lsqr`.

Memory: k·(n + p) values per example in the data dtype (ResNet-18 at k = 2,000: 0.4 GB in
float32), against the ~16 vectors of LSQR; :func:`basis_values` is what chunking counts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from hcrfast import profiling
from hcrfast.backend import get_array_module, to_host
from hcrfast.kernels import tridiagonal
from hcrfast.bindings import from_torch, ieee_float32, solver_stream, to_device, to_torch
from hcrfast.lsqr import LSQROptions, bidiag_step, compact, lsqr_init, lsqr_step

#: Basis steps per example when the options give no ``iter_lim`` (LSQR's own default, 2·p, is
#: no memory budget): 4,096 steps of ResNet-18's n + p ≈ 50,000 values are 0.8 GB in float32.
MAX_STEPS = 4096

#: The basis' default stopping rules (``bound(solver="krylov")`` without ``lsqr=``): no tolerance on
#: the pilot, whose own solve is not the point, so the basis grows until the Krylov space is exhausted
#: (the next α or β under ``rtol`` × ‖B_k‖: every right-hand side then gets ``J⁺ c`` within the
#: space reachable from the pilot, which is J's whole row space for a random pilot) or until
#: :data:`MAX_STEPS`. Stopping at the pilot's own tolerance (atol = btol = 1e-5) lost 17% of the median
#: bound on the MNIST MLP (200 of ~380 steps) and 19% on ResNet-18 (benchmarks/README.md). No limit on
#: LSQR's condition estimate either (conlim = 0): in float32 it passes 1e8 before the space is exhausted
#: (MNIST MLP: 3 of 8 examples stopped 20-60 steps short of J's rank, up to 8% lower bounds); the rank
#: tolerance ``rtol`` of :func:`build` is what keeps noise out of the solves.
DEFAULT_OPTIONS = LSQROptions(atol=0.0, btol=0.0, conlim=0.0, iter_lim=None, check_every=8)

#: Ritz values (singular values of B_k) under ``RITZ_NOISE · k · sqrt(max(n, p)) · eps64`` of the largest
#: count as zero. A basis run to exhaustion takes one step more on rounding noise (β or α just above the
#: exhaustion floor), which gives B_k a singular value that is no direction of J: on float64 stacks
#: (150 × 120 of rank 100 ... 300 × 200 of rank 150) it came out up to 24 times ``k · sqrt(max(n, p)) ·
#: eps64`` of the largest, above the rank tolerance ``rtol`` (~1e-15 in float64), and the solves along it
#: were ~1e8 times the minimum-norm ones (a float64 ReLU MLP: steps ~1e13 too large, D overflowed, the
#: example's bounds all 0; tests/test_krylov.py). Only float64 bases feel it: for float32 it stays
#: below ``rtol`` (sqrt(max(n, p)) · eps32) up to k = 500,000 steps.
RITZ_NOISE = 1000.0

#: Classical Gram–Schmidt passes against the kept vectors per new vector: ``"auto"`` (default), 1 or 2.
#: Two passes are always enough ("twice is enough", Giraud et al. 2005); one is enough while the pass
#: removes little (Daniel, Gragg, Kaufman & Stewart 1976: the vector keeps more than :data:`KEEP_RATIO`
#: of its norm), which is every step of a basis until its Krylov space is nearly exhausted: the
#: Golub–Kahan recurrence has already removed the new vector's part in the kept space. At exhaustion
#: the new vector IS mostly in the kept space, and one pass leaves too much there (a rank-100 float64
#: matrix: a spurious singular value 4.4e-13 > the rank tolerance 2.7e-15, and solves off pinv's).
#: ``"auto"`` runs one pass and checks that ratio on the device; at the next host check a block of
#: steps where an active example fell under it is rolled back and run again with two passes, and so
#: are the next :data:`TWO_PASS_BLOCKS` blocks (the whole rest of the build if that example did not stop
#: in the rerun, i.e. it was no exhausted space). Each pass reads every kept vector twice, which on a GPU
#: is the build's cost beside the products: "auto" halves it until exhaustion (benchmarks/README.md).
REORTH_PASSES = "auto"

#: ``"auto"`` reorthogonalization: one pass is accepted while the vector keeps this share of its norm.
KEEP_RATIO = 1 / math.sqrt(2)

#: ``"auto"``: blocks of steps run with two passes after a rolled-back one, before one pass is tried again.
#: The examples of a batch tend to exhaust their spaces within a few blocks of each other (MNIST MLP,
#: 32 examples: at 386-406 steps), and each rollback runs a block of products again: with 4, 9.5 steps
#: per example ran twice there (with 0: 27.5; with the rest of the build at two passes: 7.9).
TWO_PASS_BLOCKS = 4

#: Growth of the kept-vector buffers: first capacity, then doubling.
_FIRST_CAPACITY = 64

#: How the eigendecompositions of B_kᵀB_k run: "auto" = "lapack" (LAPACK called through ctypes without the
#: GIL, a thread per core), "numba" (the same from a Numba loop, compiled once per process) or "twin" (SciPy
#: one by one; see hcrfast.kernels.tridiagonal); on CUDA also "cusolver" or "cupy" (written out dense and
#: decomposed by a batched cuSOLVER routine on the device: :func:`hcrfast.kernels.tridiagonal.eigh_tridiagonal_device`;
#: not yet run on a GPU). The device is used only where the rank cut ``max(rtol, k·noise)²`` is at least
#: ``DEVICE_EIG_MARGIN · K · eps64`` of the largest eigenvalue (a dense eigensolver's eigenvalues are good
#: to ~eps·‖T‖; LAPACK's dstevd resolves far smaller ones of these graded matrices): float32 bases (the
#: MNIST MLP: 1.1e-11 against 8.7e-14, a margin of 128), not float64 ones, which stay on the host.
EIG_IMPL = "auto"
DEVICE_EIG_MARGIN = 10.0


#: ``bound(krylov_pilots="auto")``: where one basis of :data:`MAX_STEPS` steps cannot exhaust the Krylov
#: space (min(n, p) > MAX_STEPS and no ``iter_lim`` given), every restart gets a basis of its own (up to
#: :data:`AUTO_MAX_PILOTS`), of ``MAX_STEPS // restarts`` steps but never fewer than this (nor more than
#: :data:`AUTO_PILOT_MAX_STEPS`). ResNet-18 (3×91×91, R = 25, i = 10, three examples; benchmarks/README.md):
#: at equal products 25 bases of 163-164 steps gave a higher median bound than one of 4,096 (by 75% on
#: example 0), and each step runs 25 rows at once. Across budgets (three examples, at equal products
#: against one basis): 82-step pilots still won (128-134% of its median), 41-step ones lost (85-96%); at
#: ~8,200 products, 50 pilots of 82 steps gave 0.352 against 25 of 163's 0.442. So past R = 25 the pilots
#: keep 160 steps and the products grow with R, as LSQR's do: restarts sharing a basis that is short of
#: the space land on the same bounds (R = 100 on 25 pilots: the median of R = 25 to four digits), and 50
#: pilots of 163 steps (auto takes 160) at R = 50 raised the median by 12% over 25 (0.494 and 0.480
#: against 0.442 and 0.429 on examples 0 and 1) for twice the products. Swin-T (R = 25, two examples): 25 bases
#: of 163 steps gave a median 55.5% / 53.5% above one basis of 4,096 at equal products, and 99.8% of what
#: 246 steps give (its medians flatten past ~123 steps instead of peaking).
AUTO_PILOT_STEPS = 160

#: ``bound(krylov_pilots="auto")`` with several pilots: none runs more steps than this. Past ~200-250 steps a
#: pilot's deeper basis gives a LOWER median bound (ResNet-18, R = P pilots, i = 10; benchmarks/README.md "how
#: many Krylov pilots, how deep"): R = 2: 0.231 at 246 steps against 0.153 at 2,048 (auto's split before);
#: R = 5: 0.326 at 246 against 0.267 at 819; R = 10: 0.387 / 0.373 (two examples) at 246 against 0.364 /
#: 0.352 at 409; R = 1: 0.151 at 246 against 0.100 at 4,096; at R = 25 the medians peak at 205-246 steps (163
#: is what MAX_STEPS leaves each pilot, kept). Fewer products and higher bounds both. Swin-T's medians do not
#: fall past the cap, they stay flat (R = 10: 0.1823 at 246 steps, 0.1822 at 409 and 512): the cap costs it
#: nothing (benchmarks/README.md, "Swin-T ... bears out").
AUTO_PILOT_MAX_STEPS = 246

#: ``bound(krylov_pilots="auto")``: at most this many pilots per example; restarts beyond share them,
#: restart r the basis of pilot r mod pilots.
AUTO_MAX_PILOTS = 100

#: ``bound(krylov_pilots="auto")``: past :data:`MAX_STEPS` steps per example (R > 25), no more pilots than hold
#: this many values per example in all (their bases are held together; 4 GiB in float32), and never fewer
#: than ``MAX_STEPS // AUTO_PILOT_STEPS`` (25). ResNet-18 at 3×91×91 (n + p = 49,931): 100 pilots of 160
#: steps, 3.2 GB; at 3×224×224 (n + p = 175,616): 37 pilots. A count of the input and features alone, so
#: the same call resolves the same pilots on every machine.
AUTO_MAX_BASIS_VALUES = 2**30


def resolve_pilots(pilots, n: int, p: int, restarts: int, options: LSQROptions, *, solver: str = "krylov"):
    """``(pilots, options)`` for ``bound(krylov_pilots=...)``: an int is kept (options unchanged); "auto"
    is 1 for any other solver and for spaces one basis can exhaust, else a pilot per restart (at most
    :data:`AUTO_MAX_PILOTS`, and past R = 25 as many as :data:`AUTO_MAX_BASIS_VALUES` holds) with ``iter_lim``
    set to each pilot's steps: ``MAX_STEPS // restarts`` within [:data:`AUTO_PILOT_STEPS`,
    :data:`AUTO_PILOT_MAX_STEPS`] (R = 25: 25 pilots of 163 steps; R = 10: 10 of 246; R = 1: one of 246;
    R = 50: 50 of 160)."""
    if pilots != "auto":
        return pilots, options
    if solver != "krylov" or options.iter_lim is not None or min(n, p) <= MAX_STEPS:
        return 1, options
    pilots = max(1, min(restarts, AUTO_MAX_PILOTS))
    steps = min(max(MAX_STEPS // pilots, AUTO_PILOT_STEPS), AUTO_PILOT_MAX_STEPS)
    if pilots * steps > MAX_STEPS:   # past one basis' steps: as many as the memory budget holds, at least 25
        pilots = max(MAX_STEPS // AUTO_PILOT_STEPS, min(pilots, AUTO_MAX_BASIS_VALUES // ((steps + 1) * (n + p))))
    return pilots, dataclasses.replace(options, iter_lim=steps)


def step_limit(n: int, p: int, options: LSQROptions | None = None) -> int:
    """Basis steps at most: ``iter_lim`` if set, else :data:`MAX_STEPS`, and never beyond
    min(n, p) (orthonormal bases of R^n and R^p hold no more vectors)."""
    cap = MAX_STEPS if options is None or options.iter_lim is None else int(options.iter_lim)
    return max(1, min(cap, n, p))


def basis_values(n: int, p: int, options: LSQROptions | None = None) -> int:
    """Values (of a 4-byte dtype) one example's basis may hold at its step limit k: U and V, the
    buffer growth's copy, and the float64 eigenvectors of B_kᵀB_k (k² of them, 2k² such values)."""
    k = step_limit(n, p, options)
    return 3 * (k + 1) * (n + p) + 2 * k * k


@dataclass
class _Group:
    """Bases of examples that finished at the same host check, stacked and zero-padded to the group's
    longest (K steps), so that a whole group is solved by batched matrix products:
    ``ε = V_kᵀ Y diag(filt) Yᵀ B_kᵀ (U_{k+1} c)``, with ``B_kᵀB_k = Y diag(λ) Yᵀ`` truncated at the rank.

    Padding is exact zeros (rows of U past k+1, of V and Y past k, columns of Y and ``filt`` past the
    rank), so a shorter example's solve through the padded products equals its own.
    """

    members: np.ndarray    # (g,) int64: the examples (indices into the basis)
    ks: np.ndarray         # (g,) int64: steps k of each
    ranks: np.ndarray      # (g,) int64: kept singular values of each B_k
    U: torch.Tensor        # (g, K+1, n), data dtype: u_1 .. u_{k+1} as rows
    V: torch.Tensor        # (g, K, p): v_1 .. v_k
    alfa: torch.Tensor     # (g, K+1) float64: α_1 .. α_{k+1}
    beta: torch.Tensor     # (g, K+1) float64: β_1 .. β_{k+1}
    Y: torch.Tensor        # (g, K, r) float64: kept eigenvectors of B_kᵀB_k (right singular vectors of B_k)
    filt: torch.Tensor     # (g, r) float64: 1 / (λ + damp²), 0 in the padding

    def solve(self, c: torch.Tensor) -> torch.Tensor:
        """(g, R, n) → (g, R, p): every member's right-hand sides in its own basis."""
        U, V, alfa, beta, Y, filt = self.U, self.V, self.alfa, self.beta, self.Y, self.filt
        K = V.shape[1]
        with ieee_float32():  # a projection, not a TF32 approximation of one
            t = torch.bmm(U, c.to(U.dtype).transpose(1, 2)).to(torch.float64)          # U_{k+1}ᵀ c: (g, K+1, R)
            w = alfa[:, :K, None] * t[:, :K] + beta[:, 1:K + 1, None] * t[:, 1:K + 1]    # B_kᵀ t: (g, K, R)
            y = torch.bmm(Y, filt[:, :, None] * torch.bmm(Y.transpose(1, 2), w))          # (g, K, R)
            return torch.bmm(y.to(V.dtype).transpose(1, 2), V)                           # (g, R, p)

    def pilot_residual(self) -> np.ndarray:
        """Per member, ``‖β₁e₁ − B_k y‖ / β₁`` with ``y = B_k⁺ β₁e₁`` (the kept singular values): the
        share of the pilot right-hand side that the basis' space leaves unreached, on the host (0 where
        β₁ = 0). About 0 where the pilot is in J's range (SciPy's istop 1), the least-squares residual
        otherwise (istop 2)."""
        alfa, beta, Y, filt = self.alfa, self.beta, self.Y, self.filt
        K = self.V.shape[1]
        b1 = beta[:, 0]
        w = torch.zeros_like(alfa[:, :K])
        if K:
            w[:, 0] = alfa[:, 0] * b1                                      # B_kᵀ β₁e₁ = α₁β₁e₁
        y = torch.bmm(Y, filt[:, :, None] * torch.bmm(Y.transpose(1, 2), w[:, :, None]))[:, :, 0]
        r = torch.zeros_like(alfa[:, :K + 1])
        r[:, 0] = b1
        r[:, :K] -= alfa[:, :K] * y                                        # B_k[j, j] = α_{j+1}
        r[:, 1:K + 1] -= beta[:, 1:K + 1] * y                              # B_k[j+1, j] = β_{j+2}
        norm = torch.linalg.vector_norm(r, dim=1)
        return torch.where(b1 > 0, norm / torch.where(b1 > 0, b1, 1.0), 0.0).cpu().numpy()


@dataclass
class KrylovBasis:
    """Per-example Golub–Kahan bases, built once by :func:`build`.

    Attributes
    ----------
    groups : list of :class:`_Group`
        The kept vectors and ``B_k⁺`` factors, stacked by group (examples that finished together).
    steps : numpy.ndarray (B,) int64
        k, the LSQR steps run on the example's pilot right-hand side.
    istop : numpy.ndarray (B,) int64
        Why the pilot LSQR stopped (SciPy's codes; 7: the step limit).
    rank : numpy.ndarray (B,) int64
        Singular values of B_k kept (above ``rtol``, and :data:`RITZ_NOISE`'s floor, relative to the largest).
    ritz : list of numpy.ndarray
        Per example, B_k's singular values (Ritz values of J), descending, float64 on the host.
    redone : numpy.ndarray (B,) int64
        Steps run a second time (a block of one-pass Gram–Schmidt rolled back, :data:`REORTH_PASSES`):
        the example needed ``2 (steps + redone) + 1`` products.
    passes : numpy.ndarray (B,) int64
        Steps the example went through the operator, ``steps + redone`` and the steps it rode along in
        its batch after it stopped, until it was compacted out (the batch runs in lockstep): the build
        cost the model ``2 · passes + 1`` products for it.
    """

    groups: list
    steps: np.ndarray
    istop: np.ndarray
    rank: np.ndarray
    ritz: list
    damp: float = 0.0
    rtol: float = 0.0
    redone: np.ndarray | None = None
    passes: np.ndarray | None = None

    def __post_init__(self):
        if self.redone is None:
            self.redone = np.zeros(self.batch, dtype=np.int64)
        if self.passes is None:
            self.passes = np.asarray(self.steps, dtype=np.int64) + self.redone
        self._group_of = np.full(self.batch, -1, dtype=np.int64)
        self._row_of = np.zeros(self.batch, dtype=np.int64)
        for gi, g in enumerate(self.groups):
            self._group_of[g.members] = gi
            self._row_of[g.members] = np.arange(len(g.members))
        if self.batch and self._group_of.min() < 0:
            raise ValueError("KrylovBasis: some examples belong to no group")
        # each group's members as a device index, made once (not a host copy per solve)
        self._index = [to_device(g.members, g.U.device) for g in self.groups]

    @property
    def batch(self) -> int:
        return len(self.steps)

    def vectors(self, e: int):
        """Example e's ``(U_{k+1}, V_k, α_1..α_{k+1}, β_1..β_{k+1})``, views without the padding."""
        g, i, k = self.groups[self._group_of[e]], self._row_of[e], int(self.steps[e])
        return g.U[i, :k + 1], g.V[i, :k], g.alfa[i, :k + 1], g.beta[i, :k + 1]

    def solve(self, c: torch.Tensor) -> torch.Tensor:
        """``V_k B_k⁺ U_{k+1}ᵀ c`` for c of shape (B, R, n); (B, R, p) in the basis' dtype.

        The minimizer of ``‖J ε − c‖`` over ``ε ∈ span V_k`` (the minimum-norm one), for
        every right-hand side of every example; one batched pass per group.
        """
        if c.ndim != 3 or c.shape[0] != self.batch:
            raise ValueError(f"Shape mismatch: expected c of shape ({self.batch}, R, n), got {tuple(c.shape)}")
        if len(self.groups) == 1 and np.array_equal(self.groups[0].members, np.arange(self.batch)):
            return self.groups[0].solve(c)
        out = None
        for g, at in zip(self.groups, self._index):
            part = g.solve(c.index_select(0, at))
            if out is None:
                out = part.new_empty((self.batch,) + tuple(part.shape[1:]))
            out[at] = part
        return out

    def truncated(self, k: int) -> "KrylovBasis":
        """The basis after its first k steps (fewer where an example stopped earlier): the Golub–Kahan
        vectors of a shorter run are a prefix of a longer one's, so one long build serves a study of
        how the bound grows with k (``benchmarks/krylov_depth.py``). Shares the vectors' storage;
        ``redone`` and ``passes`` stay the long build's."""
        k = int(k)
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        groups, ritz = [], [None] * self.batch
        for g in self.groups:
            K = min(k, g.V.shape[1])
            ks = np.minimum(g.ks, K)
            made, sv = _factors(g.members, ks, g.U[:, :K + 1], g.V[:, :K], g.alfa[:, :K + 1], g.beta[:, :K + 1],
                              damp=self.damp, rtol=self.rtol, pad=False)
            groups.append(made)
            for e, s in zip(g.members, sv):
                ritz[e] = s
        return KrylovBasis(groups=groups, steps=np.minimum(self.steps, k), istop=np.where(self.steps > k, 7, self.istop),
                           rank=_ranks(groups, self.batch), ritz=ritz, damp=self.damp, rtol=self.rtol,
                           redone=self.redone, passes=self.passes)


def _ranks(groups, batch: int) -> np.ndarray:
    rank = np.zeros(batch, dtype=np.int64)
    for g in groups:
        rank[g.members] = g.ranks
    return rank


def _factors(members, ks, U, V, alfa, beta, *, damp: float, rtol: float, pad: bool = True):
    """A :class:`_Group` of ``len(members)`` bases whose vectors are the rows of ``U`` (g, ≥K+1, n),
    ``V`` (g, ≥K, p) and scalars ``alfa``, ``beta`` (``alfa[a, j] = α_{j+1}``, ``beta[a, j] = β_{j+1}``),
    with ``ks[a]`` steps each (K = max ks), and each example's Ritz values (host).

    The eigendecompositions of the tridiagonal B_kᵀB_k run on the host (unless :data:`EIG_IMPL` puts
    them on the device, where its margin allows: :data:`DEVICE_EIG_MARGIN`) (LAPACK's divide and conquer,
    :func:`hcrfast.kernels.tridiagonal.eigh_tridiagonal_batch`: rows in parallel, without the GIL, on
    every core (at most torch's thread count); 10,000 MNIST bases of ~390 steps: ~30 s on one core, the H100's profile spent 9.2 s of
    a 21.5 s slice of 1,250 here with SciPy's wrapper, which keeps the GIL); the eigenvalues in
    descending order, truncated at ``max(rtol, k · noise)`` of the largest singular value
    (:data:`RITZ_NOISE`; ``noise`` is its unit for the basis' shape); the eigenvectors go to the device
    in one copy, zero-padded. With
    ``pad``, the rows past each example's k (filled by the steps it ran after stopping, until
    compaction, possibly with 0/0 values) are zeroed in place and the buffers cut to K steps (one copy).
    """
    members, ks = np.asarray(members, dtype=np.int64), np.asarray(ks, dtype=np.int64)
    dev, g = alfa.device, len(ks)
    K = int(ks.max()) if g else 0
    U, V, alfa, beta = U[:, :K + 1], V[:, :K], alfa[:, :K + 1], beta[:, :K + 1]
    if pad:
        U, V, alfa, beta = (t.contiguous() for t in (U, V, alfa, beta))
        if K and int(ks.min()) < K:
            kt = torch.as_tensor(ks, device=dev)[:, None]
            steps = torch.arange(K + 1, device=dev)[None, :]
            U.masked_fill_((steps > kt)[..., None], 0)
            V.masked_fill_((steps[:, :K] >= kt)[..., None], 0)
            alfa.masked_fill_(steps > kt, 0)
            beta.masked_fill_(steps > kt, 0)
    noise = RITZ_NOISE * math.sqrt(max(U.shape[-1], V.shape[-1])) * float(np.finfo(np.float64).eps)
    # B_kᵀB_k, tridiagonal: (B_kᵀB_k)_jj = α_{j+1}² + β_{j+2}², (B_kᵀB_k)_{j,j+1} = α_{j+2} β_{j+2}.
    # Squaring costs no accuracy that matters here: singular values down to a float32 basis' rtol
    # (≥ 1.2e-7 of the largest) keep their digits, and on float64 ones down to 1e-9 of the largest
    # (condition 1e9: all kept, the solves pinv's; tests/test_krylov.py).
    device = EIG_IMPL in tridiagonal.DEVICE_IMPLS and g > 0
    if device and max(rtol, int(ks.min()) * noise) ** 2 < DEVICE_EIG_MARGIN * K * float(np.finfo(np.float64).eps):
        # The rank cut lies where a dense eigensolver's errors (~eps·‖T‖) are: a float64 basis. dstevd
        # resolves those eigenvalues; the device routine would keep rounding noise or drop real ones.
        from hcrfast.validation import HcrfastRuntimeWarning

        warnings.warn(f"hcrfast.krylov.EIG_IMPL={EIG_IMPL!r}: this basis' rank cut ({max(rtol, int(ks.min()) * noise):.1e} "
                      f"of the largest singular value) is below what a dense eigensolver on the device resolves; "
                      f"its B_kᵀB_k are decomposed by LAPACK's dstevd on the host (float64 bases always are)",
                      HcrfastRuntimeWarning, stacklevel=2)
        device = False
    if device:   # on the device: only the eigenvalues come to the host
        diag = alfa[:, :K] ** 2 + beta[:, 1:K + 1] ** 2
        off = alfa[:, 1:K + 1] * beta[:, 1:K + 1]
        with _overflow_named(U.dtype):
            lam, Y, ranks = tridiagonal.eigh_tridiagonal_device(diag, off, ks, rtol=rtol, noise=noise, impl=EIG_IMPL)
        r = Y.shape[1]
    else:
        ah, bh = alfa.cpu().numpy(), beta.cpu().numpy()   # one host copy for the whole group
        diag = ah[:, :K] ** 2 + bh[:, 1:K + 1] ** 2
        off = ah[:, 1:K + 1] * bh[:, 1:K + 1]
        host_impl = "auto" if EIG_IMPL in tridiagonal.DEVICE_IMPLS else EIG_IMPL
        with _overflow_named(U.dtype):
            lam, Yt, ranks = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=rtol, noise=noise, impl=host_impl)
        r = int(ranks.max()) if g else 0
        if r < K:
            Yt = np.ascontiguousarray(Yt[:, :r])   # eigenvectors as rows: (g, r, K)
        Y = torch.as_tensor(Yt, device=dev)
    kept = np.arange(r)[None, :] < ranks[:, None]
    fh = np.divide(1.0, lam[:, :r] + damp * damp, out=np.zeros((g, r)), where=kept)
    group = _Group(members=members, ks=ks, ranks=ranks, U=U, V=V, alfa=alfa, beta=beta,
                   Y=Y.transpose(1, 2), filt=torch.as_tensor(fh, device=dev))
    return group, [np.sqrt(lam[i, :k]) for i, k in enumerate(ks)]


class BasisOverflow(ValueError):
    """The bidiagonalization of J overflowed the basis' dtype (an α or β, or its square, inf or NaN): the start
    vectors or J's entries are too large for it. :func:`hcrfast.bound` says it in its own words (the noise, the
    size), as LSQR's refusal of the same inputs does."""

    def __init__(self, *, row: int, k: int, dtype: str, message: str):
        super().__init__(message)
        self.row, self.k, self.dtype = row, k, dtype


@contextlib.contextmanager
def _overflow_named(dtype):
    """Say a NaN or inf in B_kᵀB_k (:class:`hcrfast.kernels.tridiagonal.NonFiniteMatrix`) as what it is."""
    try:
        yield
    except tridiagonal.NonFiniteMatrix as exc:
        name = str(dtype).replace("torch.", "")
        raise BasisOverflow(
            row=exc.row, k=exc.k, dtype=name,
            message=f"the Krylov basis of row {exc.row} overflowed {name} by step {exc.k} (the bidiagonalization's "
                    f"alpha or beta, or B_kᵀB_k's entries from them, came out inf or NaN): its start vector or J's "
                    f"entries are too large for {name}; pass a sigma nearer the features' scale "
                    f"(hcrfast.rms_sigma(features, scale)){_smaller(name)}") from exc


def _smaller(name: str) -> str:
    """The end of an overflow's advice: a smaller size, and a float64 model and batch unless they are already."""
    return " or a smaller size" if name == "float64" else ", a smaller size, or a float64 model and batch"


def _copy_state(state, xp, names=None):
    """A copy of an LSQR state (:func:`hcrfast.lsqr.lsqr_step` updates its vectors in place): of the
    fields ``names`` (default all), the others shared. :func:`hcrfast.lsqr.bidiag_step` updates only u
    and v in place and replaces the arrays it changes, so a copy of those two keeps its starting point
    (a launch each on a GPU, where all of them took 26)."""
    names = [f.name for f in dataclasses.fields(state)] if names is None else names
    return dataclasses.replace(state, **{name: xp.copy(getattr(state, name)) for name in names})


def _stop_when_exhausted(state, rtol: float, scale, xp):
    """Stop a problem whose next β or α is under ``rtol · scale`` (``scale``: the largest α or β so
    far, ≤ ‖B_k‖ ≤ ‖J‖; LSQR's ``anorm`` is a Frobenius estimate that grows like √k and would stop
    long bases early): its Krylov space is invariant (β = 0: ``b`` is reached exactly, SciPy's istop
    1; α = 0: ``Jᵀr = 0``, istop 2). In floating point the process would go on from rounding noise,
    whose directions ``solve`` would only discard. The code set here is provisional: the step past
    exhaustion can end by a small β where b was never reached, so :func:`build` decides 1 or 2 from
    what the basis' kept space leaves of b (:meth:`_Group.pilot_residual`)."""
    floor = rtol * scale
    newly = state.active & ((state.beta <= floor) | (state.alfa <= floor))
    istop = xp.where(newly, xp.where(state.beta <= floor, 1, 2), state.istop)
    return dataclasses.replace(state, active=state.active & ~newly, istop=istop)


def build(op, b, options: LSQROptions | None = None, *, rtol: float | None = None, progress=None,
          **overrides) -> KrylovBasis:
    """Run LSQR with kept, reorthogonalized Lanczos vectors on each right-hand side ``b`` (B, n).

    Parameters
    ----------
    op : BatchedOperator
        One matrix per example (rows of ``b``); ``op.take`` drops finished examples.
    b : array (B, n), NumPy or CuPy
        The pilot right-hand sides; their dtype is the basis' dtype.
    options : LSQROptions, optional
        Default :data:`DEFAULT_OPTIONS`. LSQR's stopping rules for the pilot (``atol``, ``btol``,
        ``conlim``; a Krylov space that is exhausted stops whatever they say), ``iter_lim``
        the step limit (:func:`step_limit`), ``damp`` also used by :meth:`KrylovBasis.solve`,
        ``check_every`` and ``compact_below`` as in :func:`hcrfast.lsqr.lsqr`.
    rtol : float, optional
        Singular values of B_k under ``rtol`` × the largest count as zero. Default: the
        larger of ``1/conlim`` (LSQR's own limit on the condition it follows) and
        ``sqrt(max(n, p)) · eps(b.dtype)``, the rounding of one product in the data dtype:
        past J's rank (or its numerical rank) the process goes on from rounding noise, and
        B_k then has Ritz values at that level (MNIST MLP in float32: 1e-8 of the largest)
        whose pseudo-inverse would blow ε up along noise.
    progress : callable, optional
        Called as ``progress(steps, active)`` at every host check.

    Returns
    -------
    KrylovBasis
    """
    # torch (the Gram–Schmidt, the buffers) and CuPy (LSQR's vector work) rewrite the same vectors:
    # both on torch's current stream, whoever calls (bound() does already; nesting is harmless).
    with solver_stream(to_torch(b).device):
        return _build(op, b, options, rtol=rtol, progress=progress, **overrides)


def _build(op, b, options, *, rtol, progress, **overrides) -> KrylovBasis:
    opts = dataclasses.replace(options or DEFAULT_OPTIONS, **overrides)
    xp = get_array_module(b)
    if b.ndim != 2 or b.shape[0] != op.batch or b.shape[1] != op.n_rows:
        raise ValueError(f"Shape mismatch: expected b of shape ({op.batch}, {op.n_rows}), got {tuple(b.shape)}")
    m, n = b.shape
    p = op.n_cols
    limit = step_limit(n, p, opts)
    ctol = 1.0 / opts.conlim if opts.conlim > 0 else 0.0
    step_kw = dict(damp=float(opts.damp), atol=float(opts.atol), btol=float(opts.btol), ctol=ctol,
                   iter_lim=limit, impl=opts.kernels)
    if rtol is None:
        rtol = max(ctol, math.sqrt(max(n, p)) * float(np.finfo(np.dtype(str(b.dtype))).eps))

    no_tolerance = not (opts.atol or opts.btol or opts.conlim)
    full_op = op
    with profiling.annotate("lsqr.init"):
        state = lsqr_init(op, b, impl=opts.kernels)
    # ‖b‖ or ‖Jᵀu₁‖ past the dtype (its square overflowed): the basis would stop at once, rank 0. Read with the
    # loop's first check, not a host read of its own
    first = xp.isfinite(state.beta) & xp.isfinite(state.alfa)
    tb = to_torch(b)
    dtype, dev = tb.dtype, tb.device
    cap = min(limit, _FIRST_CAPACITY)
    U = torch.empty((m, cap + 1, n), dtype=dtype, device=dev)
    V = torch.empty((m, cap + 1, p), dtype=dtype, device=dev)
    alfa = torch.zeros((m, cap + 1), dtype=torch.float64, device=dev)
    beta = torch.zeros((m, cap + 1), dtype=torch.float64, device=dev)
    kept = 0  # vectors kept per active example: u_1..u_kept, v_1..v_kept

    def keep(s):
        nonlocal kept
        U[:, kept] = to_torch(s.u)
        V[:, kept] = to_torch(s.v)
        alfa[:, kept] = to_torch(s.alfa)
        beta[:, kept] = to_torch(s.beta)
        kept += 1

    adaptive = REORTH_PASSES == "auto"
    if not adaptive and REORTH_PASSES not in (1, 2):
        raise ValueError(f"hcrfast.krylov.REORTH_PASSES must be 'auto', 1 or 2, got {REORTH_PASSES!r}")
    passes = 1 if adaptive else int(REORTH_PASSES)
    step_active = None                  # the examples active in the step being taken
    fell = None                         # per example: one pass kept too little of the vector (device)

    def orthogonalize(name, vec):
        # Classical Gram–Schmidt against the kept vectors (REORTH_PASSES): without it the float32
        # vectors lose orthogonality within tens of steps and U_{k+1}ᵀ c would no longer be the
        # projection solve() needs. Row-vector form (t Qᵀ) Q: on CPUs torch runs it as BLAS GEMMs, 17×
        # faster than Qᵀ(Q t) (8 × 380 × 784, one thread: 0.24 ms against 4.1 ms).
        nonlocal fell
        Q = (U if name == "u" else V)[:, :kept]
        t = to_torch(vec)[:, None, :]
        with ieee_float32():  # bound(tf32=True) must not turn the Gram-Schmidt into TF32 products
            if passes == 1 and adaptive:
                before = torch.linalg.vector_norm(t, dim=(1, 2))
                t -= torch.bmm(torch.bmm(t, Q.transpose(1, 2)), Q)
                after = torch.linalg.vector_norm(t, dim=(1, 2))
                fell |= step_active & (from_torch(after) < KEEP_RATIO * from_torch(before))  # no host sync
            else:
                for _ in range(passes):
                    t -= torch.bmm(torch.bmm(t, Q.transpose(1, 2)), Q)

    keep(state)
    scale = state.alfa.copy()  # per problem: the largest α or β so far (β_1 = ‖b‖ is no scale of J)
    groups, ritz = [], [None] * m
    steps = np.zeros(m, dtype=np.int64)
    istop = np.zeros(m, dtype=np.int64)
    redone = np.zeros(m, dtype=np.int64)  # steps run twice (a one-pass block rolled back)
    through = np.zeros(m, dtype=np.int64)  # steps through the operator, stopped or not, rolled back or not
    rows = np.arange(m)  # examples still running, as indices into b
    done_steps = 0
    saved = None     # with one "auto" pass: the block's starting point, to roll back to
    retried = None   # after a rollback: the examples that fell under KEEP_RATIO (host)
    two_left = 0     # blocks still to run with two passes after a rollback
    while True:
        # The deliberate host synchronisation: which examples are still running (and whether one
        # Gram–Schmidt pass was enough for the block just run).
        if first is not None:
            active, fine = to_host(xp.stack([state.active, first]))
            first = None
            if not fine.all():
                row, name = int(np.flatnonzero(~fine)[0]), str(b.dtype).replace("torch.", "")
                raise BasisOverflow(
                    row=row, k=0, dtype=name,
                    message=f"the Krylov basis of row {row} overflowed {name} at its start (the pilot right-hand "
                            f"side's norm beta_1, or alpha_1, came out inf or NaN): its start vector or J's entries "
                            f"are too large for {name}; pass a sigma nearer the features' scale "
                            f"(hcrfast.rms_sigma(features, scale)){_smaller(name)}")
        else:
            active = to_host(state.active)
        fallen = None if saved is None else to_host(fell)
        if fallen is not None and fallen.any():
            # One pass was not enough somewhere in the block: run the block again with two. The
            # state, the scales and the count of kept vectors go back; the vectors are overwritten.
            retried = fallen
            redone[rows] += to_host(state.itn - saved[0].itn)
            state, scale, kept, done_steps = saved
            passes, saved, two_left = 2, None, TWO_PASS_BLOCKS
        else:
            if retried is not None:
                # After a rerun: TWO_PASS_BLOCKS more blocks with two passes, or the whole build where
                # an example that fell under the ratio still runs (not an exhausted space, which stops).
                if (retried & active).any():
                    two_left = limit
                retried = None
            if adaptive:
                passes = 2 if two_left > 0 else 1
                two_left = max(two_left - 1, 0)
            finished = done_steps >= limit or not active.any()
            if progress is not None:
                progress(done_steps, int(active.sum()))
            if finished or active.mean() < opts.compact_below:
                done = np.ones_like(active) if finished else ~active
                itn, codes = to_host(state.itn), to_host(state.istop)
                with profiling.annotate("krylov.factor"):
                    idx = np.flatnonzero(done)
                    steps[rows[idx]], istop[rows[idx]] = itn[idx], codes[idx]
                    if finished:  # all the rest: the buffers themselves, cut to size (no gather)
                        parts = (U, V, alfa, beta)
                    else:
                        pick = to_device(idx, dev)
                        parts = (t.index_select(0, pick) for t in (U, V, alfa, beta))
                    made, sv = _factors(rows[idx], itn[idx], *parts, damp=float(opts.damp), rtol=rtol)
                    groups.append(made)
                    # An exhausted space: b reached (1) or Jᵀr = 0 (2), told by what the kept space
                    # leaves of b, not by which of β, α fell first (the step past exhaustion, on
                    # rounding noise, can end by β when b was never reached).
                    ended = np.isin(codes[idx], (1, 2))
                    if ended.any():
                        reached = made.pilot_residual() <= math.sqrt(float(torch.finfo(U.dtype).eps))
                        istop[rows[idx]] = np.where(ended, np.where(reached, 1, 2), codes[idx])
                    for e, s_e in zip(rows[idx], sv):
                        ritz[e] = s_e
                if finished:
                    break
                live = np.flatnonzero(active)
                state, op, rows = compact(state, full_op, rows, live)
                scale = scale[xp.asarray(live)]
                index = to_device(live, dev)
                U, V, alfa, beta = (t.index_select(0, index) for t in (U, V, alfa, beta))
            if adaptive and passes == 1:
                # lsqr_step consumes its state's vectors: the starting point is a copy (4 vectors a row)
                # (scale is replaced by every step, never changed in place: the reference is its copy)
                saved = (_copy_state(state, xp, ("u", "v") if no_tolerance else None), scale, kept, done_steps)
                fell = xp.zeros(len(rows), dtype=bool)
        with profiling.annotate("krylov.block"):
            for _ in range(min(opts.check_every, limit - done_steps)):
                if kept == U.shape[1]:  # full: double the capacity (amortized one copy per vector)
                    grow = min(U.shape[1], limit + 1 - U.shape[1])
                    U = torch.cat([U, U.new_empty((U.shape[0], grow, n))], dim=1)
                    V = torch.cat([V, V.new_empty((V.shape[0], grow, p))], dim=1)
                    alfa = torch.cat([alfa, alfa.new_zeros((alfa.shape[0], grow))], dim=1)
                    beta = torch.cat([beta, beta.new_zeros((beta.shape[0], grow))], dim=1)
                step_active = state.active
                # A problem stopped at an exhausted space keeps stepping until it is compacted out,
                # through zero vectors whose scalars (kept frozen by masks) may be 0/0 or overflow on the way.
                with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                    if no_tolerance:
                        # The vectors and scalars alone (LSQR's estimates would go unread). Nor do
                        # LSQR's "for this machine" tests (istop 4-6) stop the basis: they fire once the
                        # PILOT is solved to rounding, before the space is exhausted; without a tolerance
                        # only exhaustion or the step limit ends it (a 300-feature float32 net: 280 -> 300
                        # steps, +15%).
                        state = bidiag_step(state, op, orthogonalize=orthogonalize, impl=opts.kernels)
                    else:
                        state = lsqr_step(state, op, orthogonalize=orthogonalize, **step_kw)
                through[rows] += 1
                # Only active problems' scales are read (a stopped one's α, β, which may be 0/0 on the
                # zero vectors it rides along with, are skipped by fmax where NaN): 2 launches, not 3.
                scale = xp.fmax(scale, xp.fmax(state.alfa, state.beta))
                state = _stop_when_exhausted(state, rtol, scale, xp)
                if no_tolerance and done_steps + 1 >= limit:
                    # The step limit, after exhaustion (which says more of the space). Every active problem
                    # has run done_steps + 1 steps (they start together; rollbacks and compaction keep
                    # that), so the host knows the step, and the other steps launch nothing for it.
                    state = dataclasses.replace(state, istop=xp.where(state.active, 7, state.istop),
                                                active=xp.zeros_like(state.active))
                keep(state)
                done_steps += 1
    return KrylovBasis(groups=groups, steps=steps, istop=istop, rank=_ranks(groups, m), ritz=ritz,
                       damp=float(opts.damp), rtol=rtol, redone=redone, passes=through)


def directions(basis: KrylovBasis, q: torch.Tensor, *, pilots: int = 1) -> torch.Tensor:
    """Cramér–Rao directions within each example's Krylov spaces, ``‖J ε‖ = 1``.

    For a mode q the best ε of the space ``span V_k`` maximizes ``(qᵀε)² / ‖J ε‖²``; since
    ``V_kᵀJᵀJ V_k = B_kᵀB_k``, it is ``ε = V_k (B_kᵀB_k)⁺ V_kᵀ q`` (METHOD.md §4 restricted to the
    space; the whole space gives ``(JᵀJ)⁺ q``, the dense path's direction). Then
    ``‖J ε‖² = Σ_i (Yᵀ V_kᵀ q)_i² / λ_i``, which is also ``(qᵀε)² / ‖J ε‖²`` there. With several pilots
    per example each mode takes the direction of the pilot whose space gives it the largest such ratio
    (the tightest Cramér–Rao bound of the one-dimensional steps; the pilot that wins may differ from
    mode to mode). No model product. Batched per group, in slices of bases whose float64 copy of V stays
    under 2²⁶ values.

    Parameters
    ----------
    q : torch.Tensor (K, p)
        The modes' basis vectors (rows).

    Returns
    -------
    torch.Tensor (B, K, p), float64; zero rows where q has no component in any of the example's spaces.
    """
    B = basis.batch // pilots
    p = q.shape[-1]
    out = best = None
    for g in basis.groups:
        dev = g.V.device
        q64 = q.to(device=dev, dtype=torch.float64)
        if out is None:
            out = torch.zeros((B, q.shape[0], p), dtype=torch.float64, device=dev)
            best = torch.zeros((B, q.shape[0]), dtype=torch.float64, device=dev)  # each mode's ratio so far
        per = max(1, 2**26 // max(1, g.V.shape[1] * p))
        for lo in range(0, len(g.members), per):
            at = to_device(np.arange(lo, min(lo + per, len(g.members))), dev)
            V = g.V.index_select(0, at).to(torch.float64)                 # (s, k, p)
            Y, filt = g.Y.index_select(0, at), g.filt.index_select(0, at)[:, :, None]
            h = torch.bmm(Y.transpose(1, 2), V @ q64.T)                     # Yᵀ V_kᵀ q: (s, r, K)
            lin2 = (h * h * filt).sum(dim=1)                                # ‖J ε‖² before scaling: (s, K)
            lin = torch.sqrt(lin2)
            scale = torch.where(lin > 0, 1.0 / torch.where(lin > 0, lin, torch.ones_like(lin)), torch.zeros_like(lin))
            y = torch.bmm(Y, h * filt) * scale[:, None, :]                  # (B_kᵀB_k)⁺ V_kᵀ q, scaled: (s, k, K)
            found = torch.bmm(y.transpose(1, 2), V)                         # (s, K, p)
            _keep_best(out, best, found, lin2, g.members[lo:lo + per] // pilots)
    if out is None:
        out = torch.zeros((B, q.shape[0], p), dtype=torch.float64, device=q.device)
    return out


def smallest_directions(basis: KrylovBasis, count: int, *, pilots: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example, the unit Ritz vectors of its ``count`` smallest kept Ritz values over all its pilots'
    bases: ``v = V_kᵀ y`` with ``B_kᵀB_k y = λ y``, so that ``‖J v‖ = sqrt(λ)`` (the basis
    orthonormal): the Krylov spaces' approximations of J's smallest singular directions, which
    ``bound(singular_steps=K)`` certifies. No model product. Pilots whose spaces overlap find the same
    vectors: a vector within 60° of one already taken (|cos| > 0.5) is passed over for the next Ritz
    value (up to ``pilots`` rounds of ``count`` candidates).

    Returns ``(dirs, values)``: (B, count, p) float64 and (B, count) ``sqrt(λ)``, ascending; zero rows
    (value 0) where an example's bases keep fewer than ``count`` such vectors."""
    B = basis.batch // pilots
    p = basis.groups[0].V.shape[-1] if basis.groups else 0
    dev = basis.groups[0].V.device if basis.groups else torch.device("cpu")
    cand = [[] for _ in range(B)]   # per example: (λ, group, row in group, column of Y), on the host
    for gi, g in enumerate(basis.groups):
        filt = g.filt.cpu().numpy()
        for row, member in enumerate(np.asarray(g.members).tolist()):
            cols = np.flatnonzero(filt[row] > 0)
            lam = 1.0 / filt[row, cols] - basis.damp**2
            cand[member // pilots].extend(zip(lam.tolist(), [gi] * len(cols), [row] * len(cols), cols.tolist()))
    dirs = torch.zeros((B, count, p), dtype=torch.float64, device=dev)
    values = np.zeros((B, count))
    for e, c in enumerate(cand):
        c = sorted(c)[:count * max(1, pilots)]
        taken = 0
        for lo in range(0, len(c), count):
            block = c[lo:lo + count]
            vs = torch.empty((len(block), p), dtype=torch.float64, device=dev)
            by_basis = {}   # one product per basis the block draws on: (gi, row) -> its candidates' places
            for i, (_, gi, row, _) in enumerate(block):
                by_basis.setdefault((gi, row), []).append(i)
            for (gi, row), places in by_basis.items():
                g = basis.groups[gi]
                cols = to_device(np.asarray([block[i][3] for i in places]), g.Y.device)
                vs[to_device(np.asarray(places), dev)] = g.Y[row][:, cols].T @ g.V[row].to(torch.float64)
            vs = vs / torch.clamp(torch.linalg.vector_norm(vs, dim=1, keepdim=True), min=1e-300)
            near = torch.abs(vs @ vs.T).cpu().numpy()                                   # within the block
            prior = (torch.abs(vs @ dirs[e, :taken].T).amax(dim=1).cpu().numpy() if taken
                     else np.zeros(len(block)))
            kept = []
            for i, (lam, *_) in enumerate(block):
                if taken == count:
                    break
                if prior[i] > 0.5 or any(near[i, j] > 0.5 for j in kept):
                    continue
                kept.append(i)
                dirs[e, taken] = vs[i]
                values[e, taken] = math.sqrt(max(lam, 0.0))
                taken += 1
            if taken == count:
                break
    return dirs, to_device(values, dev)


def _keep_best(out: torch.Tensor, best: torch.Tensor, found: torch.Tensor, lin2: torch.Tensor,
               examples: np.ndarray, *, batched: bool | None = None) -> None:
    """Per (example, mode), the candidate of ``found`` (s, K, p) with the largest ``lin2`` (s, K) replaces
    ``out`` (B, K, p) where it beats ``best`` (B, K) strictly; ``examples`` (s,) on the host: each candidate's
    example, repeated where a slice holds several pilots of one. The candidates are taken one by one in
    order (the first of equal ones wins); ``batched`` (default: on CUDA) does the same in a few batched
    operations instead of ~5 launches a basis, with no read of the device (the slice's examples are the
    host's). Not on the CPU: there its (E, K, p) temporaries, fresh pages each, made it 5× slower than the
    loop (2,000 bases of 8 modes × 784 values: 528 against 96 ms, one thread)."""
    if not (lin2.is_cuda if batched is None else batched):
        for i, e in enumerate(np.asarray(examples).tolist()):
            better = lin2[i] > best[e]
            out[e] = torch.where(better[:, None], found[i], out[e])
            best[e] = torch.where(better, lin2[i], best[e])
        return
    s, K = lin2.shape
    dev = lin2.device
    # a NaN candidate never wins, as in the loop (NaN > best is False); left NaN it would make its (example,
    # mode) max NaN, which no candidate equals, and index found[s]: out of range (a device assert on CUDA)
    lin2 = torch.nan_to_num(lin2, nan=-math.inf)
    idx = to_device(np.asarray(examples, dtype=np.int64), dev)[:, None].expand(s, K)
    top = best.new_full(best.shape, -math.inf).scatter_reduce(0, idx, lin2, "amax")       # (B, K)
    rank = torch.arange(s, device=dev)[:, None].expand(s, K)
    first = torch.where(lin2 == top.gather(0, idx), rank, s)                                # candidates at the max
    winner = torch.full(best.shape, s, dtype=rank.dtype, device=dev).scatter_reduce(0, idx, first, "amin")
    seen = to_device(np.unique(examples).astype(np.int64), dev)                             # the slice's examples
    w = winner[seen]                                                                        # (E, K), each < s
    better = top[seen] > best[seen]
    picked = found[w, torch.arange(K, device=dev)[None, :].expand_as(w)]                   # (E, K, p)
    out[seen] = torch.where(better[:, :, None], picked, out[seen])
    best[seen] = torch.where(better, top[seen], best[seen])


def solve(basis: KrylovBasis, c, *, pilots: int = 1):
    """Solve the restarts of every example in its pilots' bases, on solver arrays.

    ``basis`` holds B·pilots bases (example-major: example e's pilot j is basis ``e·pilots + j``);
    ``c`` (B·R, n) holds each example's R right-hand sides in a row. Restart r is solved in its
    example's basis of pilot ``r mod pilots``: basis ``e·pilots + j`` gets restarts j, j + pilots, ...
    (zero-padded to ⌈R / pilots⌉ right-hand sides), all bases in one batched pass per group.
    Returns (B·R, p), the solver's array type.
    """
    B = basis.batch // pilots
    if B * pilots != basis.batch or c.shape[0] % max(B, 1):
        raise ValueError(f"Shape mismatch: {basis.batch} bases for {pilots} pilots per example and "
                         f"{c.shape[0]} right-hand sides")
    tc = to_torch(c)
    R, n = tc.shape[0] // max(B, 1), tc.shape[-1]
    if pilots == 1:
        return from_torch(basis.solve(tc.reshape(B, R, n)).reshape(tc.shape[0], -1))
    per = -(-R // pilots)
    padded = tc.new_zeros((B, per * pilots, n))
    padded[:, :R] = tc.reshape(B, R, n)
    # (B, per, pilots, n) -> (B, pilots, per, n): basis e·pilots + j gets restarts j, j + pilots, ...
    grouped = padded.reshape(B, per, pilots, n).transpose(1, 2).reshape(B * pilots, per, n)
    out = basis.solve(grouped)
    p = out.shape[-1]
    out = out.reshape(B, pilots, per, p).transpose(1, 2).reshape(B, per * pilots, p)[:, :R]
    return from_torch(out.reshape(B * R, p))
