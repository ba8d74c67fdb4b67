"""One session engine (protocol.engine.Session) for both backends (issue 38, point 1).

Every registered method runs on both backends from the same scenario with the sites' noise in
the explicit seeded mode, and the two transcripts are compared one to one: for every session,
the phases in order, and in each phase the requests, the answers and the dropouts. Values that
are random by design whatever the seed (X25519 public keys, sealed ciphertexts, masked vectors:
every `bytes` value) are compared by length; a shuffled phase's answers by their multiset, as
the shuffler's permutation comes from the OS. Plus the engine's own rules, in-process as over
sockets: a short shuffled batch is withheld, a site joining with n < 1 is a dropout.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import quorum
from protocol.codecs.shuffle import Shuffle
from protocol.engine import Session, join_problem
from protocol.inprocess import drive
from protocol.methods import METHODS
from runner.study import run_study

SEEDED = {"trials": 1, "sites.policy.noise": "seeded", "faults": [], "attacks": []}
SCENARIOS = [  # between them, every method Quorum ships, at small settings
    ("tests/scenarios/tiny.yaml", {}),
    ("scenarios/shuffle-vs-local.yaml", {"sites.count": 12, "data.n": 6000}),
    ("scenarios/secagg-ddg.yaml", {"sites.count": 8}),
    ("scenarios/paper004/mwu-3-centres.yaml", {}),
    ("scenarios/paper004/quantiles-3-centres.yaml", {}),
    ("scenarios/paper001/fig3-small.yaml", {"sites.count": 12, "sites.heterogeneity.held_out": 4, "data.n": 3000,
                                            "methods.*.rounds": 2, "methods.*.held_out": 4,
                                            "methods.*.clients_per_round": 6}),
    ("scenarios/fedtype-blobs.yaml", {"sites.count": 4, "data.n": 1200, "methods.*.rounds": 1,
                                      "methods.*.fraction": 1.0}),
]


def normal(value):
    """A value with what is random by design replaced by its shape: bytes by their length,
    containers walked, numpy as Python."""
    if isinstance(value, bytes):
        return ("bytes", len(value))
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normal(v) for v in value]
    if isinstance(value, np.ndarray):
        return normal(value.tolist())
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


#: SecAgg+ phases whose answers are random by design whatever the seed (the masked inputs y_u =
#: x_u + masks, uniform on the ring; the Shamir shares of fresh seeds and keys): compared by
#: their shape (keys, kinds and lengths), not their values
MASKED = {"mask", "unmask"}


def masked(value):
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
            return ("integers", len(items))
        return [masked(v) for v in items]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return "integer"
    return normal(value)


def comparable(transcript, shuffled: bool):
    phases = []
    for record in transcript:
        answers = ([repr(v) for v in sorted(map(repr, (normal(a) for a in record.answers.values())))] if shuffled
                   else {site: masked(v) if str(record.phase).rstrip("0123456789-").rsplit("-", 1)[-1] in MASKED
                         else normal(v) for site, v in record.answers.items()})
        dropped = {site: reason for site, reason in record.dropped.items()}
        phases.append((record.phase, normal(record.requests), answers, dropped))
    return phases


def same(a, b, path="", loose=False) -> str | None:
    """Where two normalised transcripts differ (None: nowhere). Floats agree to 1e-6, or `loose`ly
    within training noise (1e-2 relative, 1e-3 absolute) for learning methods, where torch's
    summation order differs between a site process and the harness's threads."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(set(a) ^ set(b))}"
        return next((d for k in a if (d := same(a[k], b[k], f"{path}.{k}", loose))), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: lengths {len(a)} and {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := same(x, y, f"{path}[{i}]", loose))), None)
    if isinstance(a, float) and isinstance(b, float):
        close = (a == b or (math.isnan(a) and math.isnan(b))
                 or math.isclose(a, b, rel_tol=1e-2 if loose else 1e-6, abs_tol=1e-3 if loose else 1e-9))
        return None if close else f"{path}: {a} and {b}"
    return None if a == b else f"{path}: {str(a)[:200]} and {str(b)[:200]}"




@pytest.mark.parametrize("path, overrides", SCENARIOS, ids=[p for p, _ in SCENARIOS])
def test_every_method_has_the_same_transcript_on_both_backends(path, overrides, tmp_path, one_torch_thread):
    scenario = quorum.load_scenario(path, {**SEEDED, **overrides}).to_dict()
    kept = {}
    for backend in ("inprocess", "processes"):
        kept[backend] = []
        run_study(scenario, tmp_path / backend, backend=backend, transcripts=kept[backend])
    labels = [m["label"] for m in scenario["methods"]]
    assert [label for _, label, _ in kept["processes"]] == labels == [label for _, label, _ in kept["inprocess"]]
    for (_, label, inproc), (_, _, procs), spec in zip(kept["inprocess"], kept["processes"], scenario["methods"]):
        shuffled = METHODS[spec["name"]].codec_class().route == "shuffler"
        learning = METHODS[spec["name"]].data == "examples"
        difference = same(comparable(inproc, shuffled), comparable(procs, shuffled), label, loose=learning)
        assert difference is None, difference
    assert any(transcript for _, _, transcript in kept["processes"]), "no method asked anything"


def test_the_scenarios_cover_every_method_quorum_ships():
    names = set()
    for path, overrides in SCENARIOS:
        names |= {m["name"] for m in quorum.load_scenario(path, {**SEEDED, **overrides})["methods"]}
    from protocol.methods import METHODS as registry

    assert set(registry._builtins) <= names, sorted(set(registry._builtins) - names)


def test_a_short_shuffled_batch_is_withheld_in_process_as_by_the_shuffler():
    """Send.minimum: fewer sealed answers than the phase's privacy was planned for release nothing."""
    method = METHODS["fedcp2_qq_shuffle"](0.1, epsilon=5.0, bins={"count": 20, "lo": 0.0, "hi": 5.0})
    rng = np.random.default_rng(0)
    sites = {f"site-{j}": rng.exponential(size=30) for j in range(10)}
    session = Session(method, {s: 30 for s in sites}, np.random.default_rng(1))
    first = Session(method, {s: 30 for s in sites}, np.random.default_rng(1)).start()
    assert first.minimum >= 10 and first.route == "shuffler"
    halves = {s: type(method).site(v, np.random.default_rng(2), s) for s, v in sites.items()}

    def ask(site, phase, body):  # three sites refuse: seven sealed answers, fewer than planned
        if site in ("site-0", "site-1", "site-2"):
            from protocol.methods import RequestError

            raise RequestError("not today")
        encoder, request = Shuffle.for_site(body)
        return encoder.encode(halves[site].answer(phase, request))

    outcome = drive(method, {s: 30 for s in sites}, ask, np.random.default_rng(1), session=session)
    record = session.transcript[0]
    assert record.answers == {}
    assert all("withheld by the shuffler: 7 sealed messages arrived" in record.dropped[f"site-{j}"] for j in range(3, 10))
    assert outcome.status == "aborted"


@pytest.mark.parametrize("n, problem", [(0, True), (-3, True), (1, False), (10**6, False), (10**6 + 1, True),
                                        (True, True), (2.5, True)])
def test_one_join_rule(n, problem):
    assert (join_problem(n, 10**8) is not None) == problem


def test_a_site_joining_with_no_points_is_a_dropout_in_process_too(tmp_path):
    scenario = quorum.load_scenario("tests/scenarios/tiny.yaml", {"trials": 1, "runtime.max_n": 10})
    run = quorum.run(scenario, tmp_path / "run", backend="inprocess")  # every site holds 40 points
    dropouts = run.events.query("event == 'dropout' and phase == 'join'")
    assert len(dropouts) == 4 and dropouts.reason.str.contains("n=40 calibration points").all()
    assert (run.results.status == "aborted").all()


def test_methods_are_built_from_shared_parts_not_from_each_other():
    """Issue 38, point 4: a module of methods imports from another module of methods nothing but
    what its own family's base offers (a method whose name begins its own: fedcp2_qq for
    fedcp2_qq_shuffle, fedtype for fedtype_personal), never a private name; no method class has a
    method of another family or a sibling variant among its ancestors. Shared parts (bins, the
    local-DP bin, secure sums, K-anonymous tables, learning rounds, base's site halves) are
    modules that define no method."""
    import ast
    import importlib
    from pathlib import Path

    defined: dict[str, list[str]] = {}  # method module -> the method names it defines
    for name in METHODS._builtins:
        module = METHODS._builtins[name].split(":")[0].rsplit(".", 1)[1]
        defined.setdefault(module, []).append(name)
    root = Path(__file__).resolve().parent.parent / "protocol" / "methods"
    found = []
    for path in root.glob("*.py"):
        own = defined.get(path.stem, [])
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("protocol.methods.")):
                continue
            other = node.module.rsplit(".", 1)[1]
            found += [f"{path.name} imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if other in defined and other != path.stem and not any(
                    mine.startswith(base) for mine in own for base in defined[other]):
                found.append(f"{path.name} imports {node.module} (methods {defined[other]}), not its family's base")
    classes = {METHODS[name]: name for name in METHODS._builtins}
    for cls, name in classes.items():
        for ancestor in cls.__mro__[1:]:
            if ancestor in classes and not name.startswith(classes[ancestor]):
                found.append(f"{name} descends from {classes[ancestor]}, a method of another family")
    assert not found, found
    assert importlib.import_module("protocol.methods.fedcp2_qq_secagg").FedCP2QQSecAgg.__bases__[0].__name__ == \
        "AmplifiedBins"


def test_no_sans_io_half_reads_the_environment_or_sets_threads():
    """protocol/ (methods, codecs, SecAgg, the engine) reads no environment variable and sets no
    torch threads: the drivers decide (sites.local.one_torch_thread)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "protocol"
    found = [f"{path.relative_to(root)}:{n}" for path in root.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if any(word in line for word in ("os.environ", "getenv", "set_num_threads", "in_site_process"))]
    assert not found, found
