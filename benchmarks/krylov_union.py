"""Each restart solved in the union of its example's pilot bases, not in its own pilot's alone.

An experiment for ``krylov_depth.py --union``, not (yet) an engine path. With P pilots of k steps per example,
``J V_j = U_j B_j`` holds for every pilot j, so J is known, without one more model product, on the whole
union ``span [V_1 … V_P]`` (P·k vectors). Restart r can then take the least-squares step over that union
instead of over its pilot's k vectors: ε = argmin over ε ∈ span W of ‖J ε − c‖, the minimum-norm one,
W = [V_1 … V_P]. Any ε gives a certified bound (its ``z_ε`` comes from forward passes), so the union
costs host (or device) linear algebra only: per example two Gram matrices of P·k vectors and two
eigendecompositions of order P·k (ResNet-18 at P = 25, k = 163: ~4,100), then per right-hand side
P times the work of a pilot's solve.

How (float64 throughout, from the float32 vectors):

    Gw = W Wᵀ = E diag(μ) Eᵀ          W's vectors are orthonormal within a pilot, not across pilots;
                                        keep √μ ≥ ``tau`` · √μ_max: an orthonormal Q = diag(μ^-½) Eᵀ W.
    (J W)ᵀ rows: J v_i = α_i u_i + β_{i+1} u_{i+1}   (Golub–Kahan), so  J W = Bᵀ U  with U the stacked
                                        u's and Bᵀ the block-diagonal of the pilots' B_jᵀ;
    M = (J Q)(J Q)ᵀ = diag(μ^-½) Eᵀ Bᵀ (U Uᵀ) B E diag(μ^-½) = Z diag(λ) Zᵀ, keep λ ≥ rtol² λ_max;
    ε = Qᵀ Z diag(1/λ) Zᵀ (J Q) c = Wᵀ A Bᵀ (U c),   A = E μ^-½ Z λ⁻¹ Zᵀ μ^-½ Eᵀ  (P·k × P·k).

Why a cut on W: a direction of the union that is nearly in the other pilots' spans (√μ small) is
normalized by 1/√μ, and so is the float32 rounding of its J-image (~eps32·‖J‖), which would pass for a
small singular value of J and draw a large, useless step. With ``tau`` = 0.1 that noise stays ~1.2e-6·‖J‖,
under the rank tolerance ``rtol`` (~2e-5 for ResNet-18's float32 bases), as in a pilot's own solve.
"""
from __future__ import annotations

import torch

from hcrfast.bindings import from_torch, to_torch


class UnionSolver:
    """Drop-in for :func:`hcrfast.krylov.solve` (same signature) over one :class:`KrylovBasis` of
    B·pilots bases: each example's restarts are all solved in the union of its pilots' spaces."""

    def __init__(self, basis, pilots: int, *, tau: float = 0.1):
        self.basis, self.pilots, self.tau = basis, pilots, float(tau)
        B = basis.batch // pilots
        self.factors, self.kept, self.rank = [], [], []
        self.dtype = basis.groups[0].V.dtype
        for e in range(B):
            U, V, Bt = [], [], []
            for j in range(pilots):
                u, v, a, b = basis.vectors(e * pilots + j)
                k = v.shape[0]
                bt = torch.zeros((k, k + 1), dtype=torch.float64)
                idx = torch.arange(k)
                bt[idx, idx] = a[:k].double().cpu()          # J v_i = α_i u_i + β_{i+1} u_{i+1}
                bt[idx, idx + 1] = b[1:k + 1].double().cpu()
                U.append(u), V.append(v), Bt.append(bt)
            U = torch.cat(U).double()            # (Σ(k_j + 1), n)
            V = torch.cat(V).double()            # (K, p)
            Bt = torch.block_diag(*Bt)           # (K, Σ(k_j + 1))
            mu, E = torch.linalg.eigh(V @ V.T)
            keep = mu >= (self.tau ** 2) * mu.max()
            mu, E = mu[keep], E[:, keep]
            S = E / torch.sqrt(mu)[None, :]      # Q = Sᵀ W
            JQt = Bt.T @ S                        # (Σ(k+1), K'): J Q in U's coordinates (U not orthonormal across pilots)
            M = JQt.T @ ((U @ U.T) @ JQt)         # (J Q)(J Q)ᵀ, (K', K')
            lam, Z = torch.linalg.eigh(M)
            good = lam >= (basis.rtol ** 2) * lam.max()
            lam, Z = lam[good], Z[:, good]
            A = (S @ Z) / lam[None, :] @ (S @ Z).T                  # (K, K)
            self.factors.append((U, V, Bt, A))   # float64: converted once, not per solve
            self.kept.append(int(keep.sum()))
            self.rank.append(int(good.sum()))

    def __call__(self, basis, c, *, pilots: int = 1):
        if basis is not self.basis or pilots != self.pilots:
            raise RuntimeError("UnionSolver called with another basis or pilot count")
        tc = to_torch(c)
        B = len(self.factors)
        R = tc.shape[0] // B
        out = []
        for e, (U, V, Bt, A) in enumerate(self.factors):
            ce = tc[e * R:(e + 1) * R].double()                       # (R, n)
            t = U @ ce.T                                              # U c: (Σ(k+1), R)
            a = A @ (Bt @ t)                                          # (K, R)
            out.append((a.T @ V).to(self.dtype))                      # (R, p)
        return from_torch(torch.cat(out))


def describe(solver: UnionSolver) -> dict:
    """What the union kept, per example: directions of W (of P·k) and singular values of J Q."""
    return dict(union_tau=solver.tau, union_dims=solver.kept, union_rank=solver.rank,
                union_vectors=[int(f[1].shape[0]) for f in solver.factors])


__all__ = ["UnionSolver", "describe"]


if __name__ == "__main__":   # (run as a script it did nothing and said nothing)
    print("benchmarks/krylov_union.py is a module, imported by krylov_depth.py --union; it runs nothing "
          "by itself:\n" + (__doc__ or "").strip().splitlines()[0])
