"""Aggregates of results.csv per method, and the summary table shown in the terminal."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def summarize(rows: list[dict]) -> dict[str, dict]:
    by_method: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    out = {}
    for method, items in by_method.items():
        finite = [r for r in items if r["status"] == "ok"]
        cov = np.array([float(r["coverage"]) for r in finite])
        size = np.array([float(r["size"]) for r in finite])
        guarantee = [float(r["guarantee"]) for r in items if r["guarantee"] not in ("", "nan")]
        out[method] = {
            "codec": items[0]["codec"],
            "privacy": items[0].get("privacy", "none"),
            "epsilon": float(items[0]["epsilon"]) if items[0].get("epsilon") not in (None, "") else None,
            "trials": len(items),
            "ok": len(finite),
            "infinite": sum(r["status"] == "infinite" for r in items),
            "aborted": sum(r["status"] == "aborted" for r in items),
            "coverage_mean": _stat(np.mean, cov),
            "coverage_std": _stat(np.std, cov),
            "coverage_min": _stat(np.min, cov),
            "size_mean": _stat(np.mean, size),
            "size_median": _stat(np.median, size),
            "guarantee_mean": float(np.mean(guarantee)) if guarantee else None,
        }
    return out


def _stat(fn, values):
    return float(fn(values)) if values.size else None


def summary_table(summary: dict[str, dict], alpha: float):
    from rich.table import Table

    table = Table(title=f"Per-method results (target coverage {1 - alpha:g})")
    for column in ("method", "codec", "privacy", "ok/inf/abort", "coverage", "sd", "min", "guarantee",
                   "size", "size median"):
        table.add_column(column, justify="left" if column in ("method", "codec", "privacy") else "right",
                         no_wrap=True)
    for method, s in summary.items():
        privacy = "-" if s["privacy"] == "none" else f"eps={s['epsilon']:g} {s['privacy']}"
        table.add_row(method, s["codec"], privacy, f"{s['ok']}/{s['infinite']}/{s['aborted']}",
                      _fmt(s["coverage_mean"]), _fmt(s["coverage_std"]), _fmt(s["coverage_min"]),
                      _fmt(s["guarantee_mean"]), _fmt(s["size_mean"]), _fmt(s["size_median"]))
    return table


def _fmt(value, digits=4):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"
