"""No model: each site holds values in two groups (paper 004's setting: control x, treatment y;
a single group for quantile estimation). A site's data are an (n_j, 2) array of (value, group).

The group is the data set's first feature: the generators (e.g. paper004_shift) put a 0/1
indicator there, which the harness standardizes with the training split, so group 1 is the
points above zero (`data.heterogeneity.treatment_group`). A constant feature puts every point in
group 0. There are no prediction sets: methods on these data return statistics (p-values,
quantile estimates), which the harness reports instead of coverage.
"""

from __future__ import annotations

import numpy as np

from data.heterogeneity import treatment_group
from models.base import DataOnly


class TwoSample(DataOnly):
    kind = "two_sample"
    task = "two_sample"
    data = "two_sample"
    score = "absolute_residual"  # unused: scores() is overridden
    no_sets = "two_sample data have no prediction sets to evaluate (methods return statistics)"

    def scores(self, X, y):
        """(value, group) per point."""
        return np.column_stack([np.asarray(y, dtype=float), treatment_group(X).astype(float)])
