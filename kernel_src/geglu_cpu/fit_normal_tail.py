"""Fits the polynomial Q of the CPU kernel's exact GELU (geglu_cpu.cpp, ``normal_cdf``):

    Phi(-a) = exp(-a^2 / 2) * t * Q(t),   t = 1 / (1 + 0.26 a),   a = |x| in [0, 13.2]

Q is a degree-8 polynomial whose relative error is minimised (Lawson's iteratively reweighted least
squares, a minimax fit) with Q(1) = 1/2 imposed, so that Phi(0) = 1/2; its fp32 constant term is then
nudged so that the fp32 sum of the coefficients (Horner's rule at t = 1) is exactly 0.5. Prints the
coefficients highest degree first, as the C++ evaluates them, and the fit's relative error (2.0e-8).

    python3 kernel_src/geglu_cpu/fit_normal_tail.py          # numpy and mpmath (torch brings mpmath)

t = 1 / (1 + c a) maps [0, inf) onto (0, 1], where the Mills ratio Phi(-a) / phi(a) is smooth, and
t * Q(t) -> c * Q(0) matches its 1 / a decay; c = 0.26 was the best of a scan over [0.12, 0.40]
(degree 8: 2e-8, against 1.2e-7 at degree 7 and 7e-7 at degree 6).
"""

from __future__ import annotations

import mpmath
import numpy as np

C, DEGREE, A_MAX = float(np.float32(0.26)), 8, 13.2


def lawson(basis: np.ndarray, target: np.ndarray, weight: np.ndarray, iters: int = 400):
    """Coefficients minimising max |weight * (basis @ c - target)|, and that maximum."""
    b, y = basis * weight[:, None], target * weight
    lam = np.full(len(y), 1.0 / len(y))
    best = (None, np.inf)
    for _ in range(iters):
        root = np.sqrt(lam)
        c, *_ = np.linalg.lstsq(b * root[:, None], y * root, rcond=None)
        r = np.abs(b @ c - y)
        if r.max() < best[1]:
            best = (c, r.max())
        lam = lam * (r + 1e-30)
        lam /= lam.sum()
    return best


def main() -> None:
    mpmath.mp.dps = 30
    a = np.unique(np.concatenate([np.linspace(0, A_MAX, 6000),
                                  A_MAX * (1 - np.cos(np.linspace(0, np.pi / 2, 3000)))]))
    tail = np.array([float(mpmath.ncdf(-v)) for v in a])
    t = 1 / (1 + C * a)
    q = tail / (np.exp(-a * a / 2) * t)
    # Q(t) = 1/2 + sum_k c_k (t^k - 1), k = 1..DEGREE: Q(1) = 1/2 for any c.
    basis = np.vander(t, DEGREE + 1, increasing=True)[:, 1:] - 1
    c, err = lawson(basis, q - 0.5, 1 / q)
    coeffs = np.concatenate([[0.5 - c.sum()], c]).astype(np.float32)

    def horner_at_one(cs: np.ndarray) -> np.float32:
        acc = cs[-1]
        for k in range(DEGREE - 1, -1, -1):
            acc = np.float32(acc + cs[k])
        return acc

    while (s := horner_at_one(coeffs)) != np.float32(0.5):
        coeffs[0] = np.nextafter(coeffs[0], np.float32(np.inf if s < 0.5 else -np.inf))
    print(f"relative error of the fit: {err:.2e}")
    for v in coeffs[::-1]:
        print(f"  {v:.9e}f")


if __name__ == "__main__":
    main()
