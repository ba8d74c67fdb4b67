"""timeline.png: one trial of a run drawn from the same records as trace.json (runner.trace).

Time runs left to right (seconds from the trial's first message); the coordinator's sessions
are the top lane, labelled by method; below it one row per site, a bar per phase from request
to answer, coloured by method (grey: the trial's join). Marks: a red cross where a site dropped
out, an orange diamond where it refused or a message from it was rejected, a black triangle
where a scripted fault met it, a purple dot where its connection was lost; a dashed line where
a phase deadline passed with sites missing. Rows are drawn as one collection, so 1,000 sites
stay legible (site labels thin out to one tick in every few). Every label is a `plot_label`
(protocol.inert): inert, and never parsed as mathtext, whoever chose it.
"""

from __future__ import annotations

from pathlib import Path

from protocol.inert import plot_label
from runner.trace import COORDINATOR, SHUFFLER, Timeline

MARKS = {  # instant category -> (marker, colour, legend)
    "dropout": ("x", "#d62728", "dropout"),
    "rejected": ("D", "#ff7f0e", "refused / rejected"),
    "fault": ("v", "black", "scripted fault"),
}


def draw_timeline(timeline: Timeline, trial: int, out: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    window = timeline.trial_window(trial)
    if window is None:
        raise ValueError(f"trial {trial} is not in this run (trials: {timeline.trials()})")
    start, end = window
    sites = [t for t in timeline.tracks if t not in (COORDINATOR, SHUFFLER)]
    row = {site: i for i, site in enumerate(sites)}
    n = len(sites)
    spans = [s for s in timeline.spans if s.track in row and s.args.get("trial") == trial]
    transfers = [s for s in spans if s.category == "link"]  # messages on emulated links (a scenario's network)
    spans = [s for s in spans if s.category != "link"]
    methods = list(dict.fromkeys(s.category for s in spans if s.category != "join"))
    palette = plt.get_cmap("tab10")
    colour = {m: palette(i % 10) for i, m in enumerate(methods)} | {"join": (0.6, 0.6, 0.6, 1.0)}
    height = 0.8 if n <= 200 else 1.0  # at scale rows touch, so that thin rows still show

    fig, (top, ax) = plt.subplots(2, 1, sharex=True, figsize=(12, 3 + min(7.0, 0.25 * n + 1)),
                                  gridspec_kw={"height_ratios": [1, 6]})
    boxes = [[(s.start - start, row[s.track] - height / 2), (s.end - start, row[s.track] - height / 2),
              (s.end - start, row[s.track] + height / 2), (s.start - start, row[s.track] + height / 2)]
             for s in spans]
    ax.add_collection(PolyCollection(boxes, facecolors=[colour[s.category] for s in spans], linewidths=0,
                                     rasterized=n > 200))
    if transfers:  # each transfer a thin dark band inside its phase's bar: where the links took the time
        thin = height * 0.3
        ax.add_collection(PolyCollection(
            [[(s.start - start, row[s.track] - thin / 2), (s.end - start, row[s.track] - thin / 2),
              (s.end - start, row[s.track] + thin / 2), (s.start - start, row[s.track] + thin / 2)] for s in transfers],
            facecolors=(0.15, 0.15, 0.15, 0.7), linewidths=0, rasterized=n > 200))
    marker_size = 40 if n <= 50 else 18 if n <= 300 else 10
    for category, (marker, tint, _) in MARKS.items():
        hits = [i for i in timeline.instants if i.category == category and i.track in row and start <= i.ts <= end]
        if hits:
            ax.scatter([i.ts - start for i in hits], [row[i.track] for i in hits], marker=marker, c=tint,
                       s=marker_size, zorder=3, linewidths=1.2 if marker == "x" else 0.5)
    lost = [i for i in timeline.instants if i.name == "connection_lost" and i.track in row and start <= i.ts <= end]
    if lost:
        ax.scatter([i.ts - start for i in lost], [row[i.track] for i in lost], marker="o", c="#9467bd",
                   s=marker_size, zorder=3)
    deadlines = [i for i in timeline.instants if i.category == "deadline" and start <= i.ts <= end]
    for i in deadlines:
        for axis in (top, ax):
            axis.axvline(i.ts - start, color="#d62728", linestyle="--", linewidth=0.8)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, max(end - start, 1e-3) * 1.02)
    step = max(1, n // 40)
    ax.set_yticks(range(0, n, step))
    ax.set_yticklabels([plot_label(sites[i]) for i in range(0, n, step)], fontsize=7 if n > 20 else 9)
    ax.set_ylabel(f"sites ({n})" + (f", every {step}th labelled" if step > 1 else ""))
    ax.set_xlabel(f"seconds from the start of trial {trial}")

    sessions = [s for s in timeline.spans if s.track == COORDINATOR and s.category in ("session", "phase")
                and s.args.get("trial") == trial]
    for s in sessions:
        lane = 0 if s.category == "session" else 1
        tint = colour.get(s.args.get("method"), (0.6, 0.6, 0.6, 1.0))
        top.barh(lane, s.end - s.start, left=s.start - start, height=0.7, color=tint, alpha=0.9 if lane else 0.5)
        if lane == 0 and (s.end - s.start) > 0.04 * (end - start):
            top.text((s.start + s.end) / 2 - start, 0, plot_label(s.args.get("method", "")), ha="center", va="center",
                     fontsize=8)
    top.set_yticks([0, 1])
    top.set_yticklabels(["sessions", "phases"], fontsize=8)
    top.set_ylim(1.6, -0.6)
    top.set_title(f"{plot_label(timeline.name, None)}: trial {trial} ({_counts(timeline, start, end)})"
                  + (f"\n{timeline.shown}" if timeline.shown else ""), fontsize=10)

    handles = [Patch(color=colour[m], label=plot_label(m)) for m in ["join", *methods]]
    if transfers:
        handles.append(Patch(color=(0.15, 0.15, 0.15, 0.7), label="message on its link"))
    handles += [Line2D([], [], marker=mk, color=tint, linestyle="", label=text) for mk, tint, text in MARKS.values()]
    handles += [Line2D([], [], marker="o", color="#9467bd", linestyle="", label="connection lost"),
                Line2D([], [], color="#d62728", linestyle="--", label="deadline passed")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _counts(timeline: Timeline, start: float, end: float) -> str:
    inside = [i for i in timeline.instants if start <= i.ts <= end]
    dropouts = sum(1 for i in inside if i.args.get("event") == "dropout")
    faults = sum(1 for i in inside if i.category == "fault")
    deadlines = sum(1 for i in inside if i.category == "deadline")
    return f"{dropouts} dropout(s), {faults} fault mark(s), {deadlines} deadline(s) passed"
