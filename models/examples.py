"""No model: each site holds labelled examples and trains its own networks (paper 002's federated
learning, protocol.methods.fedtype). A site's data are an (n_j, d + 1) array: the standardized
features, then the class label.

There is nothing to fit centrally and no prediction set to evaluate against a central test set:
each site splits its examples into training, test and conformal sets (learning.train.SPLIT)
and reports its own test accuracies.
"""

from __future__ import annotations

import numpy as np

from models.base import DataOnly


class Examples(DataOnly):
    kind = "examples"
    task = "classification"
    data = "examples"
    score = "lac"  # unused: scores() is overridden
    no_sets = "examples data have no central prediction sets (sites report test accuracies)"

    def scores(self, X, y):
        """(features..., label) per point."""
        return np.column_stack([np.asarray(X, dtype=float), np.asarray(y, dtype=float)])
