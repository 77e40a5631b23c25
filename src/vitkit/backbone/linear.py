"""A linear probe of frozen features: scikit-learn's multinomial ``LogisticRegression``
(L-BFGS, L2), as DINOv2's ``eval/log_regression.py`` and CLIP's linear probes do it.

The features go in as they are, in float64, not standardised (neither DINOv2 nor CLIP
standardises; the penalty C is searched instead). C is chosen on a held-out tenth of the
training split (a seeded permutation, as DINOv2 holds out 10% of the training set) over
a log-spaced grid, 1e-4..1e4 by default; the probe is then refitted with that C on the whole
training split and scored on the validation split (top-1 and top-5).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from vitkit.backbone.knn import topk_hits
from vitkit.errors import ConfigError, DataError
from vitkit.util.numbers import check_number

GRID = tuple(float(c) for c in np.logspace(-4, 4, 9))
HOLDOUT = 0.1
MAX_ITER = 1000


def parse_grid(text: str | None) -> tuple[float, ...]:
    """``"0.01,1,100"`` -> (0.01, 1.0, 100.0), the values of C searched; None: :data:`GRID`."""
    if text is None:
        return GRID
    try:
        grid = [float(c) for c in text.split(",")]
    except ValueError:
        raise ConfigError(f"--c-grid takes positive numbers like 0.01,1,100; got {text!r}"
                          ) from None
    return tuple(check_number("--c-grid", c, positive=True) for c in grid)


def logistic(C: float, max_iter: int = MAX_ITER):
    """The estimator every fit here uses."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=C, max_iter=max_iter)


def _fit(C: float, x: np.ndarray, y: np.ndarray, max_iter: int):
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf = logistic(C, max_iter).fit(x, y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return clf, converged


def scores(clf, x: np.ndarray, num_classes: int) -> np.ndarray:
    """(m, D) -> class probabilities (m, num_classes); classes the probe never saw get 0."""
    out = np.zeros((len(x), num_classes))
    out[:, clf.classes_] = clf.predict_proba(x)
    return out


def holdout_split(n: int, *, fraction: float = HOLDOUT, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(fit indices, held-out indices) of n training rows: a seeded permutation, its first
    ``fraction`` held out (at least one row, at most n - 1)."""
    order = np.random.default_rng(seed).permutation(n)
    held = min(max(1, int(n * fraction)), n - 1)
    return np.sort(order[held:]), np.sort(order[:held])


def linear_probe(train: np.ndarray, train_labels: np.ndarray, val: np.ndarray,
                 val_labels: np.ndarray, *, grid: Sequence[float] = GRID,
                 holdout: float = HOLDOUT, seed: int = 0, max_iter: int = MAX_ITER,
                 num_classes: int | None = None, return_classifier: bool = False):
    """Choose C on a held-out part of the training features (n, D), refit on all of them,
    score the validation features (m, D): top-1 and top-5 in %, the sweep, the chosen C
    (and, with ``return_classifier``, the fitted ``LogisticRegression``: (record, clf))."""
    x = np.asarray(train, dtype=np.float64)
    y = np.asarray(train_labels)
    if len(np.unique(y)) < 2:
        raise DataError(f"a linear probe needs two classes or more in the training features; "
                        f"they hold {len(np.unique(y))}")
    classes = int(num_classes or max(int(y.max()), int(np.max(val_labels))) + 1)
    fit, held = holdout_split(len(x), fraction=holdout, seed=seed)
    if len(np.unique(y[fit])) < 2:
        raise DataError("the training features left after holding out a tenth for choosing C "
                        "hold one class; give more training images")
    sweep = []
    for C in grid:
        clf, converged = _fit(C, x[fit], y[fit], max_iter)
        hit = topk_hits(scores(clf, x[held], classes), y[held], 1)
        sweep.append({"C": C, "holdout_top1": 100.0 * float(hit.mean()),
                      "converged": converged})
    chosen = max(sweep, key=lambda r: r["holdout_top1"])  # the first (smallest C) of ties
    clf, converged = _fit(chosen["C"], x, y, max_iter)
    s = scores(clf, np.asarray(val, dtype=np.float64), classes)
    notes = [] if converged else [f"the final fit at C={chosen['C']:g} did not converge in "
                                  f"{max_iter} iterations"]
    record = {"protocol": "scikit-learn LogisticRegression (L-BFGS, L2, multinomial) on the "
                          "features as they are (not standardised), float64; C chosen on a "
                          f"held-out {holdout:.0%} of the training split (seed {seed}), then "
                          "refitted on the whole training split",
              "C": chosen["C"], "max_iter": max_iter, "holdout": int(len(held)),
              "top1": 100.0 * float(topk_hits(s, val_labels, 1).mean()),
              "top5": 100.0 * float(topk_hits(s, val_labels, 5).mean()),
              "sweep": sweep, "converged": converged, "notes": notes}
    return (record, clf) if return_classifier else record
