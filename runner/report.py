"""Aggregates of results.csv per method, and the summary table shown in the terminal."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np

#: the level at which the paper 004 tests' rejection rates are reported (section 4.6: type I error, power)
REJECT_AT = 0.05


def summarize(rows: list[dict]) -> dict[str, dict]:
    by_method: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    out = {}
    for method, items in by_method.items():
        finite = [r for r in items if r["status"] == "ok"]
        cov = np.array(_numbers(finite, "coverage"))  # none for paper 004's tests and estimates
        size = np.array([float(r["size"]) for r in finite if r["coverage"] not in ("", "nan")])
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
            "quantile_error_mean": _mean_of(items, "quantile_error"),
            "epsilon_obtained_max": _max_of(items, "epsilon_obtained"),
            **_test_summary(finite),
            **_estimate_summary(finite),
            **_learning_summary(finite),
        }
        out[method]["averaged_over"] = averaged_over(out[method])
    return out


def averaged_over(stats: dict) -> dict[str, str]:
    """What each aggregate of a method's summary is taken over, in words with its count (so that
    coverage_mean over the ok trials is not read as the results table's mean over every row)."""
    ok, trials = stats["ok"], stats["trials"]
    left_out = trials - ok
    over_ok = (f"the {ok} trials with status ok (finite threshold); the {left_out} infinite, aborted or "
               f"shortfall trials are left out (an infinite set covers every point at infinite size)"
               if left_out else f"all {trials} trials (every one ok)")
    notes = {}
    for key in stats:
        if key.startswith(("coverage_", "size_")) or key in ("p_value_median", "p_value_q25", "reject_rate",
                                                               "reject_rate_se", "estimate_errors", "accuracy_trial_sd") \
                or (key.endswith("_mean") and key[:-5] in (*LEARNING_KEYS, "accuracy_site_sd")):
            notes[key] = over_ok
    notes["guarantee_mean"] = f"the trials of all {trials} that report a guarantee (ok and infinite)"
    notes["quantile_error_mean"] = f"the trials of all {trials} that report a quantile error"
    notes["epsilon_obtained_max"] = f"the largest over the trials of all {trials} that report one"
    return {key: notes[key] for key in stats if key in notes}


LEARNING_KEYS = ("accuracy", "global_accuracy", "proxy_accuracy", "set_coverage")


def _learning_summary(rows: list[dict]) -> dict:
    """Paper 002's learning sessions: the final accuracies' mean over trials (each a mean over the
    sites' test splits), and the spread over sites averaged over trials."""
    if not _numbers(rows, "accuracy"):
        return {}
    out = {f"{key}_mean": _mean_of(rows, key) for key in LEARNING_KEYS}
    out["accuracy_trial_sd"] = float(np.std(_numbers(rows, "accuracy")))
    out["accuracy_site_sd_mean"] = _mean_of(rows, "accuracy_sd")
    return out


def learning_table(summary: dict[str, dict], costs: dict[str, dict]):
    from rich.table import Table

    table = Table(title="Federated learning: final test accuracy per site (mean over sites, then trials)")
    for column in ("method", "ok/abort", "accuracy", "sd over sites", "global", "proxy", "set coverage", "bytes"):
        table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
    for method, s in summary.items():
        cost = costs.get(method, {}).get("bytes_per_trial")
        table.add_row(method, f"{s['ok']}/{s['aborted']}", _fmt(s.get("accuracy_mean")),
                      _fmt(s.get("accuracy_site_sd_mean")), _fmt(s.get("global_accuracy_mean")),
                      _fmt(s.get("proxy_accuracy_mean")), _fmt(s.get("set_coverage_mean")),
                      "-" if cost is None else f"{cost:,.0f}")
    return table


def _test_summary(rows: list[dict]) -> dict:
    """Paper 004 tests: the p-value distribution (quartiles) and the rejection rate at 0.05 (the
    type I error under the null, the power otherwise), with its binomial standard error."""
    p = np.array(_numbers(rows, "p_value"))
    if not p.size:
        return {}
    rate = float(np.mean(p < REJECT_AT))
    return {"p_value_q25": float(np.quantile(p, 0.25)), "p_value_median": float(np.median(p)),
            "reject_rate": rate, "reject_rate_se": float(np.sqrt(rate * (1 - rate) / p.size))}


def _estimate_summary(rows: list[dict]) -> dict:
    """Paper 004 section 5.4: per level, bias, sd and MSE of the normalized errors over trials."""
    errors = defaultdict(list)
    for row in rows:
        if row.get("estimate_errors") not in (None, "", "nan"):
            for level, value in json.loads(row["estimate_errors"]).items():
                errors[level].append(value)
    if not errors:
        return {}
    return {"estimate_errors": {level: {"bias": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None,
                                        "mse": float(np.mean(np.square(v)))} for level, v in errors.items()}}


def statistics_table(summary: dict[str, dict]):
    """The terminal table for paper 004 methods (tests and quantile estimates)."""
    from rich.table import Table

    levels = sorted({lv for s in summary.values() for lv in s.get("estimate_errors", {})}, key=float)
    tests = any("p_value_median" in s for s in summary.values())
    title = [f"tests (reject at p < {REJECT_AT:g})"] if tests else []
    title += ["quantile estimates (MSE x 1e3 of (Q-hat - Q) / sd)"] if levels else []
    table = Table(title="Paper 004 " + " and ".join(title))
    columns = ["method", "privacy", "ok/abort", *(["p median", "p q25", "reject"] if tests else []),
               *[f"MSE {lv}" for lv in levels]]
    for column in columns:
        table.add_column(column, justify="left" if column in ("method", "privacy") else "right", no_wrap=True)
    for method, s in summary.items():
        if "p_value_median" not in s and "estimate_errors" not in s:
            continue
        mse = [s.get("estimate_errors", {}).get(lv, {}).get("mse") for lv in levels]
        p_columns = [_fmt(s.get("p_value_median")), _fmt(s.get("p_value_q25")), _fmt(s.get("reject_rate"), 3)]
        table.add_row(method, s["privacy"], f"{s['ok']}/{s['aborted']}", *(p_columns if tests else []),
                      *["-" if v is None else f"{1e3 * v:.2f}" for v in mse])
    return table


def _numbers(items, key) -> list[float]:
    return [float(r[key]) for r in items if r.get(key) not in (None, "", "nan")]


def _mean_of(items, key):
    values = _numbers(items, key)
    return float(np.mean(values)) if values else None


def _max_of(items, key):
    values = _numbers(items, key)
    return float(np.max(values)) if values else None


def _stat(fn, values):
    return float(fn(values)) if values.size else None


def summary_table(summary: dict[str, dict], alpha: float):
    from rich.table import Table

    table = Table(title=f"Per-method results (target coverage {1 - alpha:g}; coverage and size over the ok trials)")
    for column in ("method", "codec", "privacy", "ok/inf/abort", "coverage", "sd", "min", "guarantee",
                   "size", "size median"):
        table.add_column(column, justify="left" if column in ("method", "codec", "privacy") else "right",
                         no_wrap=True)
    for method, s in summary.items():
        privacy = ("-" if s["privacy"] == "none" else s["privacy"] if s["epsilon"] is None
                   else f"eps={s['epsilon']:g} {s['privacy']}")
        table.add_row(method, s["codec"], privacy, f"{s['ok']}/{s['infinite']}/{s['aborted']}",
                      _fmt(s["coverage_mean"]), _fmt(s["coverage_std"]), _fmt(s["coverage_min"]),
                      _fmt(s["guarantee_mean"]), _fmt(s["size_mean"]), _fmt(s["size_median"]))
    return table


def sweep_table(rows: list[dict], swept: list[str]):
    """sweep.csv's rows as the terminal shows them: per combination and method, utility beside
    privacy and cost."""
    from rich.table import Table

    table = Table(title="Sweep: coverage and size (means over each run's ok trials) against privacy and bytes")
    for column in (*swept, "method", "privacy", "epsilon", "ok", "coverage", "size", "up B/site", "bytes/trial"):
        table.add_column(column, justify="left" if column in (*swept, "method", "privacy") else "right")
    for row in rows:
        table.add_row(*[str(row[key]) for key in swept], row["method"], row["privacy"], _fmt(row["epsilon"], 2),
                      f"{row['ok']}/{row['trials']}", _fmt(row["coverage_mean"]), _fmt(row["size_mean"]),
                      _fmt(row["bytes_up_per_site"], 1), _fmt(row["bytes_per_trial"], 0))
    return table


def _fmt(value, digits=4):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def communication(rows: list[dict]) -> dict[str, dict]:
    """Per method label: bytes per site up and down (mean and max over sites and trials), bytes,
    messages, rounds and information bits per trial, the overhead of wire bytes over the
    information sent up, and bytes per phase. Trial setup (open/join) and connection traffic
    (handshake, hello, shutdown) are reported under their own keys."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        key = row["method"] or ("trial setup" if row["phase"] == "join" else "connection")
        groups[key].append(row)
    return {key: _cost(items) for key, items in groups.items()}


def _cost(rows: list[dict]) -> dict:
    up, down = defaultdict(int), defaultdict(int)
    per_trial_bytes, per_trial_messages, per_trial_bits = defaultdict(int), defaultdict(int), defaultdict(int)
    phases_per_trial, phase_bytes = defaultdict(set), defaultdict(int)
    for row in rows:
        nbytes, trial = int(row["bytes"]), row["trial"]
        (up if row["direction"] == "up" else down)[(trial, row["site"])] += nbytes
        per_trial_bytes[trial] += nbytes
        per_trial_messages[trial] += 1
        per_trial_bits[trial] += int(row["info_bits"])
        phases_per_trial[(trial, row["session"])].add(row["phase"])
        phase_bytes[row["phase"]] += nbytes
    trials = max(len(per_trial_bytes), 1)
    sites = set(up) | set(down)
    up_values = np.array([up[key] for key in sites], dtype=float)
    down_values = np.array([down[key] for key in sites], dtype=float)
    total_up = float(up_values.sum())
    bits = float(sum(per_trial_bits.values()))
    return {
        "bytes_up_per_site_mean": float(up_values.mean()) if sites else 0.0,
        "bytes_up_per_site_max": float(up_values.max()) if sites else 0.0,
        "bytes_down_per_site_mean": float(down_values.mean()) if sites else 0.0,
        "bytes_down_per_site_max": float(down_values.max()) if sites else 0.0,
        "bytes_per_trial": float(sum(per_trial_bytes.values())) / trials,
        "messages_per_trial": float(sum(per_trial_messages.values())) / trials,
        "rounds_per_trial": float(sum(len(p) for p in phases_per_trial.values())) / trials,
        "info_bits_per_trial": bits / trials,
        "overhead_up": (8.0 * total_up / bits) if bits else None,
        "bytes_per_phase_per_trial": {phase: b / trials for phase, b in sorted(phase_bytes.items())},
        "averaged_over": {
            "bytes_up_per_site_mean": f"the {len(sites)} (trial, site) pairs that sent or received a message",
            "bytes_up_per_site_max": f"the largest of the {len(sites)} (trial, site) pairs",
            "bytes_per_trial": f"the {trials} trials with a message (a sum per trial, then the mean)",
            "overhead_up": "all trials: 8 x bytes up / information bits sent up",
        },
    }


def communication_table(costs: dict[str, dict]):
    from rich.table import Table

    table = Table(title="Communication per trial (ZMTP bytes at the coordinator's socket)")
    for column in ("method", "rounds", "up B/site", "up max", "down B/site", "bytes", "messages",
                   "info bits", "overhead"):
        table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
    for key, c in costs.items():
        table.add_row(key, f"{c['rounds_per_trial']:g}", f"{c['bytes_up_per_site_mean']:.1f}",
                      f"{c['bytes_up_per_site_max']:.0f}", f"{c['bytes_down_per_site_mean']:.1f}",
                      f"{c['bytes_per_trial']:.0f}", f"{c['messages_per_trial']:g}",
                      f"{c['info_bits_per_trial']:.0f}",
                      "-" if c["overhead_up"] is None else f"{c['overhead_up']:.1f}x")
    return table


def sites_line(summary: dict) -> str:
    """One line on the sites: their sizes, where they scored, and how they differ."""
    h = summary["heterogeneity"]
    sizes = [site["n"] for site in h["sites"].values()]
    if not sizes:
        return "sites: none joined"
    if len(set(sizes)) == 1:
        shown = f"n_j = {sizes[0]} each"
    elif len(sizes) <= 12:
        shown = f"n_j = {', '.join(map(str, sizes))} (total {sum(sizes)})"
    else:
        shown = f"n_j from {min(sizes)} to {max(sizes)} (total {sum(sizes)})"
    text = f"sites: {len(sizes)}, {shown}; scored on {', '.join(summary['site_devices'])}"
    placed = summary.get("placement")
    if placed:
        text += (f"; {placed['processes']} process(es) of {placed['sites_per_process']} site(s)"
                 f" ({placed['why'].split(':')[0]})")
    if h["kind"] != "none":
        text += f"; heterogeneity {h['kind']}"
        if h["spread"] is not None:
            text += f", spread of site median scores {h['spread']:.3f}"
    if h["proposition_34_tv"] is not None:
        text += f"; proposition 3.4 coverage-loss bound {h['proposition_34_tv']:.4f}"
    elif h.get("proposition_34_why"):
        text += f"; proposition 3.4 bound not estimated: {h['proposition_34_why']}"
    return text
