"""Multinomial logistic regression on sparse or dense features, fitted by L-BFGS.

The objective is the one scikit-learn's ``LogisticRegression`` minimises,
``sum_i w_i * CE_i + ||W||^2 / (2 C)`` with an unpenalised bias, so that ``C``
means the same thing here as there: smaller is stronger regularisation, and
its effect shrinks as the data grow. The start is zero and L-BFGS has no
randomness, so the same data give the same weights.
"""

from __future__ import annotations

import numpy as np


def fit_softmax_lbfgs(x, y: np.ndarray, *, c: float, classes: int, sample_weight: np.ndarray | None = None,
                      max_iter: int = 1000, tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``(d, classes)`` and bias ``(classes,)`` for features ``x`` (numpy or scipy sparse, ``(n, d)``)."""
    from scipy.optimize import minimize

    n, d = x.shape
    y = np.asarray(y, dtype=int)
    if len(y) != n:
        raise ValueError(f"{n} feature rows but {len(y)} labels")
    if c <= 0:
        raise ValueError(f"C must be positive, got {c}")
    sw = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    onehot = np.zeros((n, classes))
    onehot[np.arange(n), y] = 1.0
    x = x.astype(np.float64) if hasattr(x, "tocsr") else np.asarray(x, dtype=np.float64)
    xt = x.T.tocsr() if hasattr(x, "tocsr") else x.T

    def loss_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w = theta[: d * classes].reshape(d, classes)
        b = theta[d * classes:]
        logits = np.asarray(x @ w) + b
        logits -= logits.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(logits).sum(axis=1))
        log_p = logits - log_z[:, None]
        loss = -float((sw * (onehot * log_p).sum(axis=1)).sum()) + float((w * w).sum()) / (2 * c)
        g = (np.exp(log_p) - onehot) * sw[:, None]
        grad_w = np.asarray(xt @ g) + w / c
        return loss, np.concatenate([grad_w.ravel(), g.sum(axis=0)])

    result = minimize(loss_grad, np.zeros(d * classes + classes), jac=True, method="L-BFGS-B",
                      options={"maxiter": max_iter, "gtol": tol})
    theta = result.x
    return theta[: d * classes].reshape(d, classes).astype(np.float32), theta[d * classes:].astype(np.float32)


__all__ = ["fit_softmax_lbfgs"]
