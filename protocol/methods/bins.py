"""The public bins a binned method releases into (local DP, DDG histograms, private CP): the
`bins` parameter's spec, and its bounds, which may name the training split ('training': the
extreme conformity score there, public to whoever trained the model, never taken from the
private calibration data). Shared by every binned method; the bin edges themselves are
stats.dp.Bins."""

from __future__ import annotations

from typing import Mapping

from stats.dp import Bins

BINS_SPEC = {"type": "map", "fields": {
    "count": {"type": "int", "min": 1, "default": 100},
    "lo": {"type": "float_or", "choices": ["training"], "default": 0.0},
    "hi": {"type": "float_or", "choices": ["training"]},
}}


def bins_as_spec(bins: dict | Bins) -> dict:
    """The `bins` parameter as its scenario spec ({lo, hi, count}), also when given as resolved Bins."""
    return {"lo": bins.lo, "hi": bins.hi, "count": bins.count} if isinstance(bins, Bins) else bins


def maybe_bins(spec: dict) -> Bins | dict:
    """The bins of a spec whose bounds are numbers; the spec itself while a bound is 'training'
    (resolved per trial by resolve_bins)."""
    if spec["lo"] == "training" or spec["hi"] == "training":
        return spec
    return Bins(float(spec["lo"]), float(spec["hi"]), int(spec["count"]))


def resolve_bins(spec: dict, public: Mapping[str, float]) -> Bins:
    """Bins whose bounds may be 'training', resolved with the trial's public facts
    (`score_min`, `score_max` of the training split)."""
    lo = public["score_min"] if spec["lo"] == "training" else spec["lo"]
    hi = public["score_max"] if spec["hi"] == "training" else spec["hi"]
    return Bins(float(lo), float(hi), int(spec["count"]))
