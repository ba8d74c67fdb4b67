"""Paper 001 side by side (issue 51): `make paper001` runs figure 2 (`make paper001-fig2`,
bench/paper001_fig2.py) and figure 3 (`make paper001-fig3`, bench/paper001_fig3.py) and writes
bench/results/paper001.json, whose summary table carries, claim by claim, what the detailed pages
established (docs/secure-aggregation.md for figure 2, docs/private-training.md for figure 3):
reproduced, or differs with the cause. bench/paper_pages.py renders it into docs/papers/001.md.

The numbers come from the committed full runs (bench/results/paper001_fig2.json,
paper001_fig3.json, paper001_fig3_poisson.json). A full `make paper001` reruns both (10 and 18
minutes here) and so refreshes them; `make paper001 ARGS=--quick` runs each target's --quick
version (figure 2: 10 runs, the committed JSON left alone; figure 3: coarse grid, 2 runs, written
to paper001_fig3_quick.json) to show the commands work and how long they take, and keeps the
summary on the committed full runs. Every number a summary row states, and its verdict, is computed
from those files (VERDICT_RULE; tests/test_paper001_pages.py rebuilds it from altered runs).

    .venv/bin/python bench/paper001.py [--quick] [--no-run]   # --no-run: only rebuild the JSON
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "paper001.json"
FIG2 = "docs/secure-aggregation.md (paper 001 figure 2)"
FIG3 = "docs/private-training.md (paper 001 figure 3)"
#: the paper's runs per point: figure 2 "the mean values across 10 runs", figure 3 "standard
#: deviation across 5 runs" (section 5)
PAPER_FIG2_RUNS, PAPER_FIG3_RUNS = 10, 5


def run_target(target: str, quick: bool) -> float:
    """`make TARGET [ARGS=--quick]`: the existing target and its script; the seconds it took."""
    began = time.perf_counter()
    subprocess.run(["make", "-C", str(ROOT), target, *(["ARGS=--quick"] if quick else [])], check=True,
                   env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "ARGS")})
    return time.perf_counter() - began


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _point(fig2: dict, dist: str, n: int, b: int, eps: float, estimator: str) -> dict:
    return next(p for p in fig2["points"] if (p["distribution"], p["n"], p["b"], p["epsilon"], p["estimator"])
                == (dist, n, b, eps, estimator))


def span(values, digits: int = 1) -> str:
    """The smallest and largest of `values` as "a-b" at `digits` decimals (one number when they
    round alike): how the summary states a range it computed."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def chance_sd(run_sd: float, runs: int, paper_runs: int) -> float:
    """The standard deviation of (our mean over `runs` runs) minus (the paper's mean over
    `paper_runs` runs of the same experiment), for a quantity whose one-run sd is `run_sd`:
    run_sd * sqrt(1/runs + 1/paper_runs). A number the paper prints is reproduced when ours lies
    within one such sd of it (VERDICT_RULE)."""
    return run_sd * math.sqrt(1.0 / runs + 1.0 / paper_runs)


def gap_sd(*run_sds: float) -> float:
    """One run's sd of a sum or difference of independently run methods' numbers."""
    return math.sqrt(sum(sd * sd for sd in run_sds))


def verdict(agrees: bool) -> str:
    return "reproduced" if agrees else "differs"


#: how a row's verdict follows from the numbers (stated on the page)
VERDICT_RULE = ("a number the paper prints is reproduced when ours lies within one sd of the chance difference between "
                "our mean and the paper's mean over its own runs (10 for figure 2, 5 for figure 3: "
                "sd_run * sqrt(1/ours + 1/theirs)); an order or a bound it states, when ours holds it (\"below\": by more "
                "than the standard error of our gap; \"within x\": at most x plus that chance sd; \"up to one sd\": "
                "within the larger run-to-run sd)")


def figure2_rows(fig2: dict, time_here: str) -> list[list]:
    flat, thm2 = "flat, estimated n", "hierarchical, theorem 2 as printed"
    cmd = "make paper001-fig2"
    paper = {(q["plot"], q["estimator"], q["epsilon"]): q["value"] for q in fig2["paper"]}
    left = tuple(fig2["paper_panels"]["left"][0])
    right = [tuple(p) for p in fig2["paper_panels"]["right"]]
    panels = sorted({(p["distribution"], p["n"], p["b"]) for p in fig2["points"]})

    def ours(panel, eps, est):
        """(worst of 10-run means, mean of each run's worst, sd of one 10-run group's worst, its
        chance sd against the paper's one group of 10 runs)."""
        p = _point(fig2, *panel, eps, est)
        groups = p["worst_of_means_groups"]
        return (p["worst_of_means_mean"], p["worst_mean"], p["worst_of_means_std"],
                p["worst_of_means_std"] * math.sqrt(1.0 + 1.0 / groups))

    name = {"uniform": "Unif", "chi2": "chi^2(4)"}
    label = lambda panel: f"{name[panel[0]]}, {panel[1]}, {panel[2]}"  # noqa: E731
    below5 = [panel for panel in panels if ours(panel, 5.0, flat)[0] < paper[("left", flat, 5.0)]]
    where = f"left plot = {label(left)}, " + (
        f"the only panel of the {len(panels)} where flat is below 0.01 at epsilon 5" if below5 == [left] else
        f"one of the {len(below5)} of {len(panels)} panels where flat is below 0.01 at epsilon 5" if left in below5 else
        f"flat is below 0.01 at epsilon 5 on {len(below5)} of the {len(panels)} panels, not on this one")

    def against(value, target, chance):
        return (f"{abs(value - target):.3f} from the paper's {target:g}, "
                f"{'within' if abs(value - target) <= chance else 'beyond'} one chance sd ({chance:.3f})")

    rows = []
    f1, f1w, _, c1 = ours(left, 1.0, flat)
    f5, f5w, _, _ = ours(left, 5.0, flat)
    t1, t1w, _, ct = ours(left, 1.0, thm2)
    why = ("{against}; the paper's order, the worst level of " + str(PAPER_FIG2_RUNS) + "-run means (max_p mean_runs, never larger than the mean "
           "of each run's worst, which gives {first}); " + where + "; details in " + FIG2)
    rows.append(["Figure 2 left: flat histogram, estimated n, at epsilon 1", f"{paper[('left', flat, 1.0)]:.2f}",
                 f"{f1:.3f}", verdict(abs(f1 - paper[("left", flat, 1.0)]) <= c1),
                 why.format(against=against(f1, paper[("left", flat, 1.0)], c1), first=f"{f1w:.3f}"), cmd, time_here])
    rows.append(["Figure 2 left: flat, estimated n, at epsilon 5", f"below {paper[('left', flat, 5.0)]:.2f}", f"{f5:.3f}",
                 verdict(f5 < paper[("left", flat, 5.0)]),
                 why.format(against=f"{'below' if f5 < paper[('left', flat, 5.0)] else 'not below'} "
                                    f"{paper[('left', flat, 5.0)]:g}", first=f"{f5w:.3f}"), cmd, time_here])
    rows.append(["Figure 2 left: hierarchical at epsilon 1", f"{paper[('left', thm2, 1.0)]:.2f}",
                 f"{t1:.3f} (theorem 2 as printed; exact sensitivities {ours(left, 1.0, 'hierarchical')[0]:.3f})",
                 verdict(abs(t1 - paper[("left", thm2, 1.0)]) <= ct),
                 f"the paper's {paper[('left', thm2, 1.0)]:g} is the hierarchical estimator with theorem 2's sensitivity "
                 "as printed; "
                 + why.format(against=against(t1, paper[("left", thm2, 1.0)], ct), first=f"{t1w:.3f}"), cmd, time_here])
    pf, pt = paper[("right", flat, 1.0)], paper[("right", thm2, 1.0)]
    fits = {panel: (abs(ours(panel, 1.0, flat)[0] - pf) <= ours(panel, 1.0, flat)[3],
                    abs(ours(panel, 1.0, thm2)[0] - pt) <= ours(panel, 1.0, thm2)[3]) for panel in right}
    both = [panel for panel in right if all(fits[panel])]
    closest = min(right, key=lambda panel: abs(ours(panel, 1.0, flat)[0] - pf) / ours(panel, 1.0, flat)[3]
                  + abs(ours(panel, 1.0, thm2)[0] - pt) / ours(panel, 1.0, thm2)[3])
    fmt = lambda est: ", ".join(f"{ours(p, 1.0, est)[0]:.3f} ({label(p)})" for p in right)  # noqa: E731
    right_why = (f"the right plot is an n = {'/'.join(sorted({str(p[1]) for p in right}))} panel the text does not name; {len(both)} of the {len(right)} candidates "
                 f"have both values within one chance sd of {pf:.2f} and {pt:.2f}"
                 + (f" ({'; '.join(label(p) for p in both)})" if both else "")
                 + f"; nearest in sds: {label(closest)} (chance sd {ours(closest, 1.0, flat)[3]:.3f} flat, "
                 f"{ours(closest, 1.0, thm2)[3]:.3f} hierarchical); " + FIG2)
    rows.append(["Figure 2 right: flat, estimated n, at epsilon 1", f"{pf:.2f}", fmt(flat), verdict(bool(both)),
                 right_why, cmd, time_here])
    rows.append(["Figure 2 right: hierarchical at epsilon 1", f"{pt:.2f}", fmt(thm2), verdict(bool(both)),
                 "as above (theorem 2 as printed); " + right_why, cmd, time_here])
    order = [ours(panel, 1.0, flat)[0] <= ours(panel, 1.0, thm2)[0] for panel in panels]
    rows.append(["Figure 2: flat beats hierarchical at small epsilon", f"flat (error {paper[('left', flat, 1.0)]:g}) "
                 f"vastly outperforms hierarchical ({paper[('left', thm2, 1.0)]:g}) at epsilon 1", f"flat below hierarchical (theorem 2 as printed) at epsilon 1 on "
                 f"{sum(order)} of {len(panels)} panels", verdict(all(order)),
                 "flat's worst-of-means error at or below hierarchical's on every panel" if all(order)
                 else f"hierarchical is below flat on {len(panels) - sum(order)} panels: see " + FIG2,
                 cmd, time_here])
    a, aw, sa, _ = ours(left, 10.0, flat)
    b, bw, sb, _ = ours(left, 10.0, thm2)
    close = abs(a - b) <= max(sa, sb)
    pa, pb = _point(fig2, *left, 10.0, flat), _point(fig2, *left, 10.0, thm2)
    swd = max(pa["worst_std"], pb["worst_std"])
    rows.append(["Figure 2: at epsilon >= 10 all methods within one sd", "yes",
                 f"left panel at 10: flat {a:.3f} (sd {sa:.3f}) vs theorem 2 {b:.3f} (sd {sb:.3f})", verdict(close),
                 f"{abs(a - b):.3f} apart, {'within' if close else 'beyond'} the larger sd, in the paper's order (worst "
                 f"of {PAPER_FIG2_RUNS}-run means, sd of such a group); in the mean of each run's worst they are "
                 f"{'' if abs(aw - bw) <= swd else 'not '}({aw:.3f} against {bw:.3f}, sd {swd:.3f}): " + FIG2,
                 cmd, time_here])
    return rows


def _tails(fig3: dict, key: str) -> tuple[float, float]:
    """The mean over runs of the clients a round in the tail, and of the clients sampled."""
    runs = fig3["runs"][key]
    return float(np.mean([r["tail_mean"] for r in runs])), float(np.mean([r["sampled_mean"] for r in runs]))


def figure3_rows(fig3: dict, poisson: dict, time_here: str) -> list[list]:
    s, ps = fig3["summary"], poisson["summary"]
    claim = fig3["paper"]
    cmd = "make paper001-fig3"
    runs, paper_runs = fig3["setting"]["runs"], PAPER_FIG3_RUNS
    eps_all = [int(e) if float(e).is_integer() else e for e in fig3["setting"]["epsilons"]]
    p90 = lambda key, src=s: src[key]["p90_pct"]  # noqa: E731
    mean = lambda key, src=s: src[key]["mean_pct"]  # noqa: E731
    sd90 = lambda key: s[key]["p90_sd"]  # noqa: E731
    sdm = lambda key: s[key]["mean_sd"]  # noqa: E731
    chance = lambda *sds: chance_sd(gap_sd(*sds), runs, paper_runs)  # noqa: E731
    se = lambda *sds: gap_sd(*sds) / math.sqrt(runs)  # noqa: E731
    variants = (("flat", "dp_delta_fl_flat"), ("hierarchical", "dp_delta_fl_hier"))
    private = [k for k in s if "@" in k]
    ratio = [s[k]["sigma_update"] / ps[k]["sigma_update"] for k in private]
    tail5 = [_tails(fig3, f"{v}@5") for _, v in variants]
    tail_all = [_tails(fig3, f"{v}@{e}")[0] for _, v in variants for e in eps_all]
    cause = (f"our accounting: {tail5[0][1]:.0f} of {fig3['setting']['training']:,} clients sampled without "
             "replacement, a client replaced (Wang, Balle, Kasiviswanathan 2019), where the paper uses Zhu and Wang's Poisson add/remove bound: "
             f"{span(ratio)} times more noise (sigma ours / Poisson's, over the private runs); under it the losses clip "
             f"into the top bin and DP-Δ-FL's tail at epsilon 5 is {span([t for t, _ in tail5])} of "
             f"{tail5[0][1]:.0f} clients a round ({span(tail_all, 0)} over epsilon; non-private Δ-FL: "
             f"{_tails(fig3, 'delta_fl')[0]:.1f}), i.e. DP-FedAvg with a slightly larger sigma. ")
    rows = []

    gap = p90("fedavg") - p90("delta_fl")
    gse = se(sd90("fedavg"), sd90("delta_fl"))
    rows.append(["Figure 3: without privacy, Δ-FL's p90 error below FedAvg's", "yes (figure)",
                 f"{p90('delta_fl'):.1f} vs {p90('fedavg'):.1f} ({gap:.1f} pp below)", verdict(gap > gse),
                 f"{gap:.1f} pp below, standard error of the gap {gse:.1f}" + ("" if gap > gse else "; " + FIG3),
                 cmd, time_here])

    g = mean("delta_fl") - mean("fedavg")
    c = chance(sdm("delta_fl"), sdm("fedavg"))
    ok = abs(g - claim["mean_gap_nonprivate"]) <= c
    rows.append(["Figure 3: non-private mean-error gap, Δ-FL minus FedAvg", f"{claim['mean_gap_nonprivate']:g} pp",
                 f"{g:.2f} pp", verdict(ok),
                 f"{abs(g - claim['mean_gap_nonprivate']):.2f} pp from the paper's, {'within' if ok else 'beyond'} one "
                 f"chance sd of two {runs}-run means ({c:.2f}; run-to-run sd {span([sdm('fedavg'), sdm('delta_fl')])} "
                 "pp)" + ("" if ok else ": no cause found beyond chance") + "; " + FIG3, cmd, time_here])

    target = claim["p90_gap_dp_fedavg_minus_dp_delta_fl_at_5"]
    gaps = {v: p90("dp_fedavg@5") - p90(f"{k}@5") for v, k in variants}
    cs = {v: chance(sd90("dp_fedavg@5"), sd90(f"{k}@5")) for v, k in variants}
    ok = all(abs(gaps[v] - target) <= cs[v] for v in gaps)
    pgaps = {e: [p90(f"dp_fedavg@{e}", ps) - p90(f"{k}@{e}", ps) for _, k in variants] for e in eps_all}
    positive = [e for e in eps_all if min(pgaps[e]) > 0]
    rows.append(["Figure 3: DP-Δ-FL's p90 below DP-FedAvg's at epsilon 5", f"{target:g} pp",
                 f"{gaps['flat']:+.1f} (flat) / {gaps['hierarchical']:+.1f} (hierarchical) pp", verdict(ok),
                 f"{span([abs(target - x) for x in gaps.values()])} pp from the paper's, "
                 f"{'within' if ok else 'beyond'} one chance sd ({span(cs.values())}): "
                 + ("" if ok else cause) + "With the paper's Poisson sampling (counterfactual): "
                 f"{pgaps[5][0]:+.1f} / {pgaps[5][1]:+.1f} at 5, positive (both) at epsilon "
                 f"{', '.join(map(str, positive)) or 'none'}; " + FIG3, cmd, time_here])

    bound = claim["dp_delta_fl_p90_within_of_delta_fl_at_5"]
    excess = {v: p90(f"{k}@5") - p90("delta_fl") for v, k in variants}
    cs = {v: chance(sd90(f"{k}@5"), sd90("delta_fl")) for v, k in variants}
    ok = all(excess[v] <= bound + cs[v] for v in excess)
    rows.append([f"Figure 3: DP-Δ-FL's p90 within {bound:g} pp of non-private Δ-FL at epsilon 5", f"within {bound:g} pp",
                 f"{excess['flat']:+.1f} (flat) / {excess['hierarchical']:+.1f} (hierarchical) pp", verdict(ok),
                 f"{span([x - bound for x in excess.values()])} pp beyond {bound:g} pp (chance sd {span(cs.values())}): "
                 + ("" if ok else cause) + f"Poisson counterfactual: {p90('dp_delta_fl_flat@5', ps) - p90('delta_fl'):+.1f}"
                 f" / {p90('dp_delta_fl_hier@5', ps) - p90('delta_fl'):+.1f} pp; " + FIG3, cmd, time_here])

    below = {e: [p90(f"{k}@{e}") < p90("fedavg") for _, k in variants] for e in eps_all}
    pbelow = {e: [p90(f"{k}@{e}", ps) < p90("fedavg") for _, k in variants] for e in eps_all}
    ok = all(below[5])
    some = [e for e in eps_all if any(below[e])]

    def which(table):
        parts = []
        for e in eps_all:
            if all(table[e]):
                parts.append(f"both at {e}")
            elif any(table[e]):
                parts.append(f"{variants[table[e].index(True)][0]} at {e}")
        return ", ".join(parts) or "at no epsilon"

    rows.append(["Figure 3: DP-Δ-FL's p90 below non-private FedAvg's", "yes",
                 f"{p90('dp_delta_fl_flat@5'):.1f} / {p90('dp_delta_fl_hier@5'):.1f} vs {p90('fedavg'):.1f} at epsilon 5 "
                 f"(below at {'epsilon ' + ', '.join(map(str, some)) if some else f'no epsilon of {eps_all[0]}-{eps_all[-1]}'})",
                 verdict(ok),
                 ("below at epsilon 5" if ok else
                  f"by {span([p90(f'{k}@5') - p90('fedavg') for _, k in variants])} pp above at epsilon 5: " + cause)
                 + f"Poisson counterfactual: below FedAvg {which(pbelow)}"
                 + ("" if all(pbelow[5]) else ", not both at 5") + "; " + FIG3, cmd, time_here])

    lo, hi = claim["mean_gap_dp_delta_fl_vs_dp_fedavg"]
    mg = {(e, v): mean(f"{k}@{e}") - mean(f"dp_fedavg@{e}") for e in eps_all for v, k in variants}
    mc = {(e, v): chance(sdm(f"{k}@{e}"), sdm(f"dp_fedavg@{e}")) for e in eps_all for v, k in variants}
    inside = {key: abs(mg[key]) <= hi + mc[key] for key in mg}
    sigma = [s[f"{k}@{e}"]["sigma_update"] / s[f"dp_fedavg@{e}"]["sigma_update"] for e in eps_all for _, k in variants]
    out = [key for key in mg if not inside[key]]
    rows.append([f"Figure 3: DP-Δ-FL's mean error within {lo:g}-{hi:g} pp of DP-FedAvg's", "every epsilon",
                 ", ".join(f"{e}: {mg[(e, 'flat')]:+.1f} / {mg[(e, 'hierarchical')]:+.1f}" for e in eps_all)
                 + " pp (epsilon: flat / hierarchical)", verdict(all(inside.values())),
                 (f"within {hi:g} pp plus one chance sd in {sum(inside.values())} of {len(mg)} (epsilon, histogram) "
                  f"cells" + ("" if not out else
                              f"; beyond it {', '.join(f'{v} at {e}' for e, v in out)}: {span([mg[k] for k in out])} pp "
                              f"worse (chance sd {span([mc[k] for k in out])}): the histogram's share of the budget "
                              f"raises the update's sigma to {span(sigma, 2)} times DP-FedAvg's") + "; " + FIG3),
                 cmd, time_here])

    diff = {e: p90(f"dp_delta_fl_flat@{e}") - p90(f"dp_delta_fl_hier@{e}") for e in eps_all}
    sds = {e: max(sd90(f"dp_delta_fl_flat@{e}"), sd90(f"dp_delta_fl_hier@{e}")) for e in eps_all}
    ok = all(abs(diff[e]) <= sds[e] for e in eps_all)
    rows.append(["Figure 3: flat and hierarchical histograms equal up to one sd", "yes",
                 ", ".join(f"{diff[e]:+.1f}" for e in eps_all) + f" pp p90 (flat minus hierarchical, epsilon "
                 f"{eps_all[0]}-{eps_all[-1]}; sd {span([sd90(f'{k}@{e}') for e in eps_all for _, k in variants])})",
                 verdict(ok), "within the larger run-to-run sd at every epsilon" if ok else "beyond the larger sd at "
                 "epsilon " + ", ".join(str(e) for e in eps_all if abs(diff[e]) > sds[e]) + "; " + FIG3, cmd, time_here])
    return rows


def figure3_table(fig3: dict) -> dict:
    s = fig3["summary"]
    label = {"fedavg": "FedAvg", "delta_fl": "Δ-FL", "dp_fedavg": "DP-FedAvg", "dp_delta_fl_flat": "DP-Δ-FL flat",
             "dp_delta_fl_hier": "DP-Δ-FL hierarchical"}
    rows = [["none", label[k], f"{s[k]['p90_pct']:.2f} ± {s[k]['p90_sd']:.2f}", f"{s[k]['mean_pct']:.2f} ± {s[k]['mean_sd']:.2f}"]
            for k in ("fedavg", "delta_fl")]
    for e in (3, 5, 10, 15, 20):
        for k in ("dp_fedavg", "dp_delta_fl_flat", "dp_delta_fl_hier"):
            v = s[f"{k}@{e}"]
            rows.append([e, label[k], f"{v['p90_pct']:.2f} ± {v['p90_sd']:.2f}", f"{v['mean_pct']:.2f} ± {v['mean_sd']:.2f}"])
    return {"name": "figure3", "title": "Figure 3: test clients' errors in percent, mean ± sd over 5 runs "
            "(bench/results/paper001_fig3.json)", "columns": ["epsilon", "method", "p90 error", "mean error"], "rows": rows}


def load() -> dict:
    """The committed runs the summary is built from: {"fig2": ..., "fig3": ..., "poisson": ...}."""
    return {key: json.loads((RESULTS / name).read_text()) for key, name in
            (("fig2", "paper001_fig2.json"), ("fig3", "paper001_fig3.json"), ("poisson", "paper001_fig3_poisson.json"))}


def build(quick: bool, measured: dict, runs: dict | None = None) -> dict:
    """The results file: every summary row's numbers and verdict computed from `runs` (load()'s
    committed files unless given), by VERDICT_RULE."""
    runs = runs or load()
    fig2, fig3, poisson = runs["fig2"], runs["fig3"], runs["poisson"]
    t2 = f"full {minutes(fig2['seconds'])}" + (f"; quick {minutes(measured['fig2'])}" if "fig2" in measured else "")
    t3 = (f"full {minutes(fig3['timings']['total_s'])}"
          + (f"; quick {minutes(measured['fig3'])}" if "fig3" in measured else ""))
    summary = figure2_rows(fig2, t2) + figure3_rows(fig3, poisson, t3)
    points = fig2["points"]
    e2 = sorted({p["epsilon"] for p in points})
    e3, st3 = fig3["setting"]["epsilons"], fig3["setting"]
    runs_table = {"name": "runs", "title": "The runs behind the numbers",
                  "columns": ["figure", "command", "what it runs", "full run here", "this run", "details"],
                  "rows": [["2", "make paper001-fig2",
                            f"{len({(p['distribution'], p['n'], p['b']) for p in points})} panels x "
                            f"{len({p['estimator'] for p in points})} estimators x epsilon {e2[0]:g}-{e2[-1]:g}, "
                            f"{fig2['setting']['runs']} runs a point, through the mechanism's own code",
                            minutes(fig2["seconds"]),
                            (("quick " if quick else "full ") + minutes(measured["fig2"])) if "fig2" in measured
                            else "not run", FIG2],
                           ["3", "make paper001-fig3", f"FedAvg, Δ-FL, DP-FedAvg, DP-Δ-FL flat and hierarchical, epsilon "
                            f"{e3[0]:g}-{e3[-1]:g}, tuned by coordinate descent over the paper's grids, {st3['runs']} runs "
                            f"of {st3['rounds']:,} rounds", minutes(fig3["timings"]["total_s"]),
                            (("quick " if quick else "full ") + minutes(measured["fig3"])) if "fig3" in measured
                            else "not run", FIG3]]}
    return {"paper": "001", "title": "Private federated quantiles under distributed DP and secure aggregation, "
            "and DP-Δ-FL (figures 2 and 3)", "command": "make paper001", "quick": "make paper001 ARGS=--quick",
            "numbers_from": "the committed full runs: bench/results/paper001_fig2.json, paper001_fig3.json, "
                            "paper001_fig3_poisson.json", "verdict_rule": VERDICT_RULE,
            "this_run": {"quick": quick, "seconds": measured},
            "tables": [{"name": "summary", "title": "Summary", "columns": ["item", "the paper", "ours", "verdict",
                                                                           "why, or the stand-in", "command", "time here"],
                        "rows": summary}, runs_table, figure3_table(fig3)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="run each figure's --quick version")
    parser.add_argument("--no-run", action="store_true",
                        help="only rebuild bench/results/paper001.json (keeping its last run's times)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    measured, quick = {}, args.quick
    if args.no_run and OUT.exists():  # the last run's times stay; the numbers are rebuilt
        quick, measured = (json.loads(OUT.read_text())["this_run"][k] for k in ("quick", "seconds"))
    if not args.no_run:
        measured["fig2"] = round(run_target("paper001-fig2", args.quick), 1)
        measured["fig3"] = round(run_target("paper001-fig3", args.quick), 1)
    sys.path.insert(0, str(ROOT / "bench"))
    from paper_pages import publish

    publish("001", build(quick, measured), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
