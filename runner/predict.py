"""How long a finished run's sessions would take over other networks, from its ledger (issue 39).

A session is its phases in order. From the run's ledger (transport.ledger: every message with
its wire bytes, when it was handed to its link and when it arrived) each phase gives, per site,
the request's bytes, the answer's bytes and when the site answered; between phases, the
coordinator's own time. The sites of a run share the machine: its site processes run on K =
min(cores, processes) CPUs at once, so a site's time in the run is its service time plus its
wait for a CPU. With the answers sorted by when they left, f_1 <= f_2 <= ..., after requests that
reached the sites together at t_0, the service times are s_i = f_i - f_(i-K) (f_i - t_0 for the
first K): a K-server FIFO queue read backwards. Over another network (transport.links) the phase
replays message by message through the same link model as the emulator (FIFO per direction,
serialization, latency, the same seeded jitter and loss draws) and the same K servers:

    request arrives   a_j = link_down(t0, B_req)                 t0: the phase's start
    answer leaves     r_j = max(a_j, a server free) + s_j        in the order the requests arrive
    answer arrives    u_j = link_up(r_j, B_ans)
    phase ends        max_j u_j, or t0 + the deadline when some u_j is later (a dropout)

and a site offline at t0 is a dropout (`offline`). Nothing is re-run: predicting costs seconds
of computation whatever the network. Shuffled phases go by the sealed messages' sizes and the
batch's arrival (the coordinator sees no single sealed message arrive).
"""

from __future__ import annotations

import heapq
import json
from collections import defaultdict
from pathlib import Path

from transport.emulation import LinkEmulator
from transport.ledger import read_ledger
from transport.links import Network

ANSWERS = ("response", "error", "join", "sealed")


def session_times(events_path: Path) -> dict[tuple[int, int], dict]:
    """(trial, session) -> {label, seconds, start (since the coordinator started), end} of every
    method session the run's events.jsonl logs."""
    starts, out, origin = {}, {}, None
    for line in Path(events_path).read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "coordinator_start" and origin is None:
            origin = event["ts"]
        key = (event.get("trial"), event.get("session"))
        if event.get("event") == "session_start":
            starts[key] = event["ts"]
        elif event.get("event") == "session_end" and key in starts:
            out[key] = {"label": event["label"], "seconds": event["ts"] - starts[key], "status": event["status"],
                        "start": starts[key] - (origin or starts[key]), "end": event["ts"] - (origin or starts[key])}
    return out


def site_servers(events_path: Path) -> int:
    """K: how many sites of the run could compute at once, min(the machine's cores, its site
    processes) from events.jsonl (a large number when the run does not say)."""
    cores, processes = None, None
    for line in Path(events_path).read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "placement":
            processes = event.get("processes")
        elif event.get("event") == "run_start" and event.get("cores"):
            cores = event["cores"]
    known = [k for k in (cores, processes) if k]
    return max(1, min(known)) if known else 10**9


def service_times(requests: dict[str, dict], answers: dict[str, dict], servers: int) -> dict[str, float]:
    """Each site's service time in one phase of the run: its answers' times read as the output of
    `servers` FIFO servers fed as the requests reached the sites (see the module's docstring)."""
    order = sorted((float(a["sent"]), site) for site, a in answers.items() if site in requests)
    arrived = sorted(float(requests[site]["arrived"]) for _, site in order)
    out = {}
    for i, (finished, site) in enumerate(order):
        ready = max(float(requests[site]["arrived"]), order[i - servers][0] if i >= servers else 0.0)
        out[site] = max(0.0, finished - max(ready, arrived[0] if arrived else ready))
    return out


def _phases(rows: list[dict]) -> dict[tuple[int, int], list[tuple[str, list[dict]]]]:
    """(trial, session) -> its phases in order, each with its ledger rows."""
    sessions: dict[tuple[int, int], dict[str, list[dict]]] = defaultdict(dict)
    for row in rows:
        if not row["method"] or row["session"] in ("", None):
            continue
        key = (int(row["trial"]), int(row["session"]))
        sessions[key].setdefault(row["phase"], []).append(row)
    return {key: sorted(phases.items(), key=lambda item: min(float(r["sent"]) for r in item[1]))
            for key, phases in sessions.items()}


def predict(run_dir: Path, network: Network, deadline: float | None = None) -> list[dict]:
    """Each method session of the run in `run_dir` over `network`: its label, the seconds it took
    and the seconds predicted, and the dropouts the deadlines would cause (site -> reason).
    `deadline`: the phases' deadline (default: the run's runtime.deadlines.respond)."""
    import yaml

    run_dir = Path(run_dir)
    scenario = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    deadline = scenario["runtime"]["deadlines"]["respond"] if deadline is None else deadline
    measured = session_times(run_dir / "events.jsonl")
    servers = site_servers(run_dir / "events.jsonl")
    links = LinkEmulator(network, started=0.0)  # one clock for the run: seconds since it started
    out, moment, last_end = [], 0.0, 0.0  # the predicted run's clock; the run's end of the last session
    for (trial, session), phases in sorted(_phases(read_ledger(run_dir / "ledger.csv")).items()):
        if (trial, session) not in measured:
            continue
        seen = measured[(trial, session)]
        moment += max(0.0, seen["start"] - last_end)  # the harness's own time between sessions
        last_end = seen["end"]
        clock, dropped, first, previous_end = moment, {}, None, 0.0
        for phase, rows in phases:
            down = {r["site"]: r for r in rows if r["direction"] == "down" and r["type"] in ("request", "open")}
            up = {r["site"]: r for r in rows if r["direction"] == "up" and r["type"] in ANSWERS}
            if not down:
                continue
            began = min(float(r["sent"]) for r in down.values())
            if first is None:
                first = began
            else:  # the coordinator's own time between the end of the last phase and this one
                clock += max(0.0, began - previous_end)
            answered_at, waits = [], False
            service = service_times(down, up, servers)
            reached = []  # (when its request arrives, site), for the sites' CPUs in that order
            for site, request in sorted(down.items(), key=lambda item: float(item[1]["sent"])):
                if not network.online(site, network.clock(clock)):
                    dropped[site] = "offline"
                    continue
                arrived = links.arrival(site, "down", int(request["bytes"]), clock)
                if arrived is None or site not in up:
                    waits = True  # lost on its link, or no answer in the run either: the deadline
                    if arrived is None and site in up:
                        dropped[site] = "lost on its link"
                    continue
                reached.append((arrived, site))
            free = [clock] * min(servers, max(1, len(reached)))  # when each of the K CPUs is free
            for arrived, site in sorted(reached):
                start = max(arrived, heapq.heappop(free))
                ready = start + service.get(site, 0.0)
                heapq.heappush(free, ready)
                back = links.arrival(site, "up", int(up[site]["bytes"]), ready)
                if back is None or back - clock > deadline:
                    waits = True  # the coordinator waits for it until the deadline
                    dropped[site] = (f"no answer within the {phase} deadline ({deadline:g} s)"
                                     if back is not None else "lost on its link")
                    continue
                answered_at.append(back)
            clock = clock + deadline if waits else max(answered_at, default=clock)
            # when the run's coordinator moved on: the last answer, or the deadline when one lacked
            previous_end = (max(float(r["arrived"]) for r in up.values()) if up and set(down) <= set(up)
                            else began + deadline)
        if first is None:
            continue
        overhead = max(0.0, seen["seconds"] - (previous_end - first))  # before the first phase, after the last
        predicted = clock - moment + overhead
        moment += predicted
        out.append({"trial": trial, "session": session, "method": seen["label"], "seconds": round(seen["seconds"], 6),
                    "predicted_seconds": round(predicted, 6), "dropouts": len(dropped), "dropped": dropped})
    return out


def network_named(value, scenario: dict, base: Path | None = None) -> tuple[str, Network]:
    """A network to predict over, and its name: a profile's name (every site on it; a preset or
    one of the scenario's own profiles), a `network:` section (a mapping), or a YAML file holding
    one (its `network:` key, or the section itself). ScenarioError naming the field of a mistake."""
    import yaml

    from specs.schema import ScenarioError, validate
    from transport.links import NETWORK_FIELDS, network_of, network_problems
    from world.trial import site_ids

    name = None
    if isinstance(value, (str, Path)) and Path(value).suffix in (".yaml", ".yml"):
        name, value = Path(value).stem, yaml.safe_load(Path(value).read_text())
        value = value.get("network", value) if isinstance(value, dict) else value
    if isinstance(value, str):
        name, value = value, {"profiles": scenario.get("network", {}).get("profiles", {}), "default": value}
    section = validate({"type": "map", "fields": NETWORK_FIELDS}, value, "network")
    ids = site_ids(scenario["sites"]["count"])
    for field, expectation, got in network_problems(section, ids):
        raise ScenarioError(f"network.{field}", expectation, got)
    return name or section["default"], network_of(section, ids, scenario["seed"], base)


def predict_table(run_dir: Path, networks: list) -> list[dict]:
    """Per method session of the run: the seconds it took, and for each network (see
    network_named) the seconds and dropouts predicted, as columns `NAME s` and `NAME dropouts`."""
    import yaml

    scenario = yaml.safe_load((Path(run_dir) / "scenario.yaml").read_text())
    rows: dict[tuple[int, int], dict] = {}
    for value in networks:
        name, network = network_named(value, scenario)
        for item in predict(run_dir, network):
            row = rows.setdefault((item["trial"], item["session"]), {
                "trial": item["trial"], "method": item["method"], "seconds": item["seconds"]})
            row[f"{name} s"] = item["predicted_seconds"]
            row[f"{name} dropouts"] = item["dropouts"]
    return [rows[key] for key in sorted(rows)]
