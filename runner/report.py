"""Aggregates of results.csv per method, and the summary table shown in the terminal."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from protocol.inert import MAX_NAME_CHARS, inert
from results import RESULTS, Outcome
from results.base import fmt as _fmt


def family_of(row: dict) -> type[Outcome]:
    """The result family of a results.csv row (its `result` column)."""
    return RESULTS.load(row.get("result") or "outcome")


def summarize(rows: list[dict]) -> dict[str, dict]:
    """summary.json's `methods`: per method label, what its result family makes of its rows."""
    by_method: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    return {method: family_of(items[0]).summarize(items) for method, items in by_method.items()}


def result_tables(methods: dict[str, dict], alpha: float) -> list:
    """The terminal tables of a run's results: one per result family, its methods in order."""
    by_family: dict[str, dict[str, dict]] = defaultdict(dict)
    for label, stats in methods.items():
        by_family[stats["result"]][label] = stats
    tables = [RESULTS.load(name).table(group, alpha) for name, group in by_family.items()]
    return [table for table in tables if table is not None]


def sweep_table(rows: list[dict], swept: list[str]) -> list:
    """sweep.csv's rows as the terminal shows them: per combination and method, its result
    family's utility (the family's HEADLINE) beside privacy and cost; a table per family."""
    from rich.table import Table

    by_family: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_family[row["result"]].append(row)
    tables = []
    for name, items in by_family.items():
        headline = RESULTS.load(name).HEADLINE
        utility = " and ".join(title for title, _, _ in headline) or f"{name} results"
        table = Table(title=f"Sweep: {utility} (means over each run's ok trials) against privacy and bytes")
        for column in (*swept, "method", "privacy", "epsilon", "ok", *(title for title, _, _ in headline),
                       "up B/site", "bytes/trial"):
            table.add_column(column, justify="left" if column in (*swept, "method", "privacy") else "right")
        for row in items:
            table.add_row(*[str(row[key]) for key in swept], row["method"], row["privacy"], _fmt(row["epsilon"], 2),
                          f"{row['ok']}/{row['trials']}", *(_fmt(row.get(key), digits) for _, key, digits in headline),
                          _fmt(row["bytes_up_per_site"], 1), _fmt(row["bytes_per_trial"], 0))
        tables.append(table)
    return tables


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
    spans: dict = {}  # (trial, session) -> [first sent, last arrival]: the session's time on the network
    wire: dict = defaultdict(float)  # (trial, site) -> seconds its messages spent on their link
    for row in rows:
        nbytes, trial = int(row["bytes"]), row["trial"]
        moment = row.get("ts") or 0.0  # an older ledger may have no times at all
        sent, arrived = float(row.get("sent") or moment), float(row.get("arrived") or moment)
        span = spans.setdefault((trial, row["session"]), [sent, arrived])
        span[0], span[1] = min(span[0], sent), max(span[1], arrived)
        wire[(trial, row["site"])] += arrived - sent
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
        "seconds_per_trial": sum(end - start for start, end in spans.values()) / trials,
        "wire_seconds_per_site_mean": float(np.mean(list(wire.values()))) if wire else 0.0,
        "averaged_over": {
            "seconds_per_trial": f"the {trials} trials: each session from its first message handed to a link to "
                                 f"its last arrival, summed per trial, then the mean",
            "wire_seconds_per_site_mean": f"the {len(wire)} (trial, site) pairs: the seconds their messages spent "
                                          f"on their links, summed",
            "bytes_up_per_site_mean": f"the {len(sites)} (trial, site) pairs that sent or received a message",
            "bytes_up_per_site_max": f"the largest of the {len(sites)} (trial, site) pairs",
            "bytes_per_trial": f"the {trials} trials with a message (a sum per trial, then the mean)",
            "overhead_up": "all trials: 8 x bytes up / information bits sent up",
        },
    }


WIRE_COLUMNS = ["trial", "method", "phase", "site", "link", "bytes_down", "bytes_up", "down_s", "up_s", "at_site_s"]


def wire_rows(rows: list[dict]) -> list[dict]:
    """wire.csv: per trial, method, phase and site, the bytes each way, the seconds its messages
    spent on the site's link each way (`down_s`, `up_s`: from handed over to delivered) and the
    seconds between its request arriving and its answer leaving the site (`at_site_s`)."""
    out: dict[tuple, dict] = {}
    for row in rows:
        if not row["method"]:
            continue
        key = (row["trial"], row["method"], row["phase"], row["site"])
        item = out.setdefault(key, {"trial": row["trial"], "method": row["method"], "phase": row["phase"],
                                    "site": row["site"], "link": row.get("link", ""), "bytes_down": 0, "bytes_up": 0,
                                    "down_s": 0.0, "up_s": 0.0, "_reached": None, "_left": None})
        moment = row.get("ts") or 0.0
        sent, arrived = float(row.get("sent") or moment), float(row.get("arrived") or moment)
        direction = row["direction"]
        item[f"bytes_{direction}"] += int(row["bytes"])
        item[f"{direction}_s"] += arrived - sent
        if direction == "down":
            item["_reached"] = arrived if item["_reached"] is None else min(item["_reached"], arrived)
        else:
            item["_left"] = sent if item["_left"] is None else max(item["_left"], sent)
    for item in out.values():
        reached, left = item.pop("_reached"), item.pop("_left")
        item["at_site_s"] = round(left - reached, 6) if reached is not None and left is not None else None
        item["down_s"], item["up_s"] = round(item["down_s"], 6), round(item["up_s"], 6)
    return list(out.values())


def communication_table(costs: dict[str, dict], timed: bool = False):
    """The communication table; `timed` (a run over a scenario's network) adds the seconds per
    trial on the network and each site's seconds on its link."""
    from rich.table import Table

    title = "Communication per trial (ZMTP bytes at the coordinator's socket" + ("; seconds on the network)"
                                                                                  if timed else ")")
    table = Table(title=title)
    for column in ("method", "rounds", "up B/site", "up max", "down B/site", "bytes", "messages",
                   "info bits", "overhead", *(("time s", "wire s/site") if timed else ())):
        table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
    for key, c in costs.items():
        table.add_row(key, f"{c['rounds_per_trial']:g}", f"{c['bytes_up_per_site_mean']:.1f}",
                      f"{c['bytes_up_per_site_max']:.0f}", f"{c['bytes_down_per_site_mean']:.1f}",
                      f"{c['bytes_per_trial']:.0f}", f"{c['messages_per_trial']:g}",
                      f"{c['info_bits_per_trial']:.0f}",
                      "-" if c["overhead_up"] is None else f"{c['overhead_up']:.1f}x",
                      *((f"{c['seconds_per_trial']:.3f}", f"{c['wire_seconds_per_site_mean']:.3f}") if timed else ()))
    return table


def network_line(network: dict | None) -> str | None:
    """One line on the run's network (summary.json's `network`), or None for loopback."""
    if not network or not (network.get("emulated") or network.get("mode") == "kernel"):
        return None
    shown = []
    for name, p in network["profiles"].items():
        loss = f", loss {p['loss']:g}" if p["loss"] else ""
        rates = " / ".join(f"{p[key]:g}" if p[key] else "unlimited" for key in ("down_mbps", "up_mbps"))
        shown.append(f"{name} ({p['sites']} sites: {p['latency_ms']:g} ms, {rates} Mbit/s down / up{loss})")
    extra = network["availability"]
    online = (f"; availability windows at {extra['sites_with_windows']} sites" if extra["sites_with_windows"] else "") + \
             (f"; traces at {extra['sites_with_traces']} sites" if extra["sites_with_traces"] else "")
    kernel = network.get("kernel_links")
    where = (f"real kernel links: {kernel['qdiscs']} in namespace {kernel['namespace']}" if kernel
             else "emulated at the coordinator's socket")
    return f"network ({where}): {', '.join(shown)}{online}"


def run_report(summary: dict) -> list:
    """What the terminal shows after a run: each result family's table, the communication table,
    the sites' line, the privacy line, a line per attack. The lines are rich `Text`, which
    never reads markup, and what a peer chose in them (devices, refusal reasons) is inert
    (protocol.inert): a site cannot colour, rewrite or add a line of the report, nor stop it
    with malformed markup."""
    from rich.text import Text

    from runner.privacy import privacy_line

    shown = result_tables(summary["methods"], summary["alpha"])
    network = summary.get("network") or {}
    timed = bool(network.get("emulated") or network.get("mode") == "kernel")
    if summary["communication"]:
        shown.append(communication_table(summary["communication"], timed))
    lines = [sites_line(summary), privacy_line(summary["privacy"])]
    model = summary.get("model") or {}
    if model.get("training") == "DP-SGD":  # the model's privacy beside the calibration's
        from models.dp_sgd import model_line

        lines.insert(1, model_line(model, calibration_words(model.get("calibration", []))))
    if timed:
        lines.append(network_line(summary["network"]))
    lines += [attack_line(attack) for attack in summary.get("attacks", [])]
    return shown + [Text(line) for line in lines]


def calibration_words(entries: list[dict]) -> str:
    """The methods' calibration privacy in words: 'private_cp epsilon 1 (central), centralized non-private'."""
    words = [f"{inert(e['method'], MAX_NAME_CHARS)} " + (f"epsilon {e['epsilon']:g} ({e['privacy']})"
                                                         if isinstance(e.get("epsilon"), (int, float)) else "non-private")
             for e in entries]
    return ", ".join(words) or "none"


def attack_line(attack: dict) -> str:
    """One line on an attack of a scenario's adversarial coordinator: what the sites did, in
    their own (inert) words."""
    return (f"attack {inert(attack['attack'])} on {inert(attack['method'])} (trial {attack['trial']}): "
            f"{attack['answered']} answered, {attack['refused']} refused; "
            f"{inert(attack['finding'] or attack['reasons'])}")


def sites_line(summary: dict) -> str:
    """One line on the sites: their sizes, where they scored and where the model and the sites
    trained (runner.devices), and how they differ."""
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
    if summary.get("devices"):  # where the sites scored, the harness trained and the sites trained (runner.devices)
        from runner.devices import devices_words

        where = inert(devices_words(summary["devices"]))  # the scoring devices as the sites said
    else:  # a summary written before the harness said where training ran
        where = "scored on " + ", ".join(inert(device, MAX_NAME_CHARS) for device in summary["site_devices"])
    text = f"sites: {len(sizes)}, {shown}; {where}"
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
