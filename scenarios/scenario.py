"""The scenario format: what a scenario file may contain, overridden and validated (the one loader
is quorum.load_scenario, a typed Scenario over `override_scenario` and `validate_scenario`).

Top-level fields (see README, "Scenario format"):
    name, description, seed, trials, alpha
    data      source-specific fields (data.sources.SOURCES[source].PARAMS)
    split     train / calibration / test fractions
    sites     count, sizes ("equal" or a list of n_j), heterogeneity, budget (each site's own
              privacy budget, protocol.accounting.BUDGET_FIELDS), policy (what each site serves,
              protocol.policy.POLICY_FIELDS: in a local run it stands in for the site operators'
              own files; a method it refuses is a validation error)
    model     kind, device, params (models.MODELS[kind].PARAMS)
    methods   a list of {name, label, ...method parameters} (protocol.methods.METHODS[name].PARAMS)
    runtime   bind address, per-phase deadlines, transport security (curve or plain), key directory,
              placement (sites per OS process) and launcher (this machine, or a Ray cluster)
    faults    scripted faults (transport.faults)
    attacks   a coordinator that attacks its own sites (coordinator.adversary)
"""

from __future__ import annotations

from pathlib import Path

from coordinator.adversary import ATTACK_FIELDS, attack_problem
from data.heterogeneity import HETEROGENEITY_FIELDS
from data.sources import SOURCES
from data.split import site_sizes
from models import MODELS
from protocol.accounting import BUDGET_FIELDS, Budget, SiteAccount
from protocol.engine import MAX_PLANNED_N
from protocol.methods import METHODS
from protocol.policy import POLICY_FIELDS, SitePolicy
from specs.plugins import PluginError, is_import_path
from specs.schema import Problems, ScenarioError, apply_overrides, read_yaml, validate
from transport.faults import FAULT_FIELDS, check_fault
from transport.links import NETWORK_FIELDS, network_problems

SCENARIO_FIELDS = {
    "name": {"type": "str"},
    "description": {"type": "str", "default": ""},
    "seed": {"type": "int", "min": 0, "default": 0},
    "trials": {"type": "int", "min": 1, "default": 1},
    "alpha": {"type": "float", "gt": 0, "lt": 1, "default": 0.1},
    "data": {"type": "any"},
    "split": {"type": "map", "fields": {
        "train": {"type": "float", "gt": 0, "lt": 1, "default": 0.4},
        "calibration": {"type": "float", "gt": 0, "lt": 1, "default": 0.4},
        "test": {"type": "float", "ge": 0, "lt": 1, "default": 0.2},
    }},
    "sites": {"type": "map", "fields": {
        "count": {"type": "int", "min": 1},
        "sizes": {"type": "sizes", "default": "equal"},
        "heterogeneity": {"type": "map", "fields": HETEROGENEITY_FIELDS},
        "budget": {"type": "map", "fields": BUDGET_FIELDS},
        "policy": {"type": "map", "fields": POLICY_FIELDS},
    }},
    "model": {"type": "any"},
    "methods": {"type": "list", "min_len": 1, "of": {"type": "any"}},
    "faults": {"type": "list", "of": {"type": "map", "fields": FAULT_FIELDS}, "default": []},
    # a coordinator that attacks its own sites (coordinator.adversary): site-side defences tested
    "attacks": {"type": "list", "of": {"type": "map", "fields": ATTACK_FIELDS}, "default": []},
    # the sites' links and when they are online (transport.links), emulated at the coordinator
    "network": {"type": "map", "fields": NETWORK_FIELDS},
    "runtime": {"type": "map", "fields": {
        "bind": {"type": "str", "default": "tcp://127.0.0.1:*"},
        "shuffler_bind": {"type": "str", "default": "tcp://127.0.0.1:*"},
        "security": {"type": "str", "choices": ["curve", "plain"], "default": "curve"},
        "keys": {"type": "str", "default": ""},  # a key directory; empty: new keys for each run
        "placement": {"type": "map", "fields": {  # how many sites each OS process serves (runner.processes)
            "sites_per_process": {"type": "int_or", "choices": ["auto"], "min": 1, "default": "auto"},
        }},
        "launcher": {"type": "map", "fields": {  # where the site hosts run (runner.ray_hosts)
            "kind": {"type": "str", "choices": ["local", "ray"], "default": "local"},
            "address": {"type": "str", "default": "auto"},  # ray: auto | local | HOST:PORT | ray://HOST:PORT
            "hosts": {"type": "int_or", "choices": ["auto"], "min": 1, "default": "auto"},
            "resources": {"type": "map", "fields": {  # what each host actor asks Ray for
                "num_cpus": {"type": "float", "ge": 0, "default": 1.0},
                "num_gpus": {"type": "float", "ge": 0, "default": 0.0},
            }},
        }},
        # the largest calibration size a site may announce at join: a larger one is a dropout (at
        # most what the planners hold, protocol.engine.MAX_PLANNED_N)
        "max_n": {"type": "int", "min": 1, "max": MAX_PLANNED_N, "default": MAX_PLANNED_N},
        # the clock deadlines and links run by (transport.clock): auto is virtual in-process (network
        # time, faster than real time), real over processes (whose sites answer in real time)
        "clock": {"type": "str", "choices": ["auto", "virtual", "real"], "default": "auto"},
        "deadlines": {"type": "map", "fields": {
            "hello": {"type": "float", "gt": 0, "default": 60.0},
            "join": {"type": "float", "gt": 0, "default": 120.0},
            "respond": {"type": "float", "gt": 0, "default": 30.0},
        }},
    }},
}
DEVICES = ["auto", "cpu", "cuda"]


def override_scenario(raw: dict, overrides: list[str] | tuple[str, ...] | dict,
                      skipped: list[str] | None = None) -> dict:
    """A scenario as written with overrides applied (specs.schema.apply_overrides), where
    `methods.*.FIELD` sets FIELD in the methods that have it and notes the others in `skipped`, and
    an override of `trials` that shortens the run leaves out the faults and attacks of the trials
    it removes, noting each (validation refuses, in a file, a rule for a trial it does not run)."""
    skipped = [] if skipped is None else skipped
    data = apply_overrides(raw, overrides if isinstance(overrides, dict) else list(overrides), _has_field, skipped)
    keys = set(overrides) if isinstance(overrides, dict) else {str(o).split("=", 1)[0].strip() for o in overrides}
    if "trials" in keys and isinstance(data.get("trials"), int):
        for field in ("faults", "attacks"):
            if isinstance(data.get(field), list):
                data[field] = _within_trials(data[field], data["trials"], field, skipped)
    return data


def _within_trials(rules: list, trials: int, field: str, skipped: list[str]) -> list:
    """The rules of `field` that can still fire in trials 0..trials-1, a rule's later trials cut."""
    kept = []
    for index, rule in enumerate(rules):
        when = rule.get("trials", "all") if isinstance(rule, dict) else "all"
        wanted = [when] if isinstance(when, int) else when if isinstance(when, list) else None
        if wanted is None or not all(isinstance(t, int) for t in wanted):
            kept.append(rule)  # 'all', or malformed: validation names it
            continue
        inside = [t for t in wanted if t < trials]
        if not inside:
            skipped.append(f"trials={trials}: {field}[{index}] (trials {when}) left out: the run has trials "
                           f"0..{trials - 1}")
            continue
        kept.append(rule if len(inside) == len(wanted) else {**rule, "trials": inside})
    return kept


def _has_field(path: str, item, field: str) -> bool:
    """Whether a list item can take `field`: a method only one its class has (PARAMS, name, label)."""
    if path != "methods" or not isinstance(item, dict):
        return True
    try:
        cls = METHODS.load(item.get("name"))
    except PluginError:
        return True  # validation names the unknown method
    return field in cls.PARAMS or field in ("name", "label")


def validate_scenario(raw: dict) -> dict:
    """The scenario with defaults filled in; ScenarioError (ScenarioErrors when several) naming
    every problem: each field is checked whatever its neighbours hold, then, when all fields
    are sound, the checks across fields."""
    if not isinstance(raw, dict):
        raise ScenarioError("(top level)", "a mapping of scenario fields", raw)
    problems = Problems()
    scenario = problems.attempt(validate, {"type": "map", "fields": SCENARIO_FIELDS}, raw, "")
    data = problems.attempt(_select, "data", "source", SOURCES, raw.get("data"))
    model = problems.attempt(_validate_model, raw.get("model"))
    methods = raw.get("methods")
    methods = [problems.attempt(_validate_method, i, spec)
               for i, spec in enumerate(methods if isinstance(methods, list) else [])]
    problems.raise_any()
    scenario.update(data=data, model=model, methods=methods)
    for problem in _cross_checks(scenario):
        problems.add(problem)
    problems.raise_any()
    return scenario


def method_params(spec: dict) -> dict:
    """The keyword arguments of a validated method entry (everything but name and label)."""
    return {key: value for key, value in spec.items() if key not in ("name", "label")}


def _component(registry, name, path: str) -> type:
    """The class a scenario field names: a registered name or an import path (specs.plugins)."""
    if isinstance(name, str) and (name in registry or is_import_path(name)):
        try:
            return registry.load(name)
        except PluginError as exc:
            raise ScenarioError(path, f"a {registry.kind} that loads ({exc})", name) from None
    validate({"type": "str", "choices": sorted(registry)}, name, path)  # names the choices
    raise AssertionError("unreachable: validate refuses what is not registered")


def _select(path: str, key: str, registry, value) -> dict:
    if not isinstance(value, dict):
        raise ScenarioError(path, "a mapping", value)
    source = _component(registry, value.get(key), f"{path}.{key}")
    fields = {key: {"type": "str"}, **source.PARAMS}
    return validate({"type": "map", "fields": fields}, value, path)


def _validate_model(value) -> dict:
    if not isinstance(value, dict):
        raise ScenarioError("model", "a mapping with 'kind'", value)
    model = _component(MODELS, value.get("kind"), "model.kind")
    fields = {"kind": {"type": "str"}, "device": {"type": "str", "choices": DEVICES, "default": "auto"},
              "params": {"type": "map", "fields": model.PARAMS}}
    if value.get("dp_sgd") is not None:  # DP-SGD training (models.dp_sgd); absent or null: plain training
        from models.dp_sgd import DP_SGD_FIELDS
        from models.torch_nets import TorchModel

        if not issubclass(model, TorchModel):
            raise ScenarioError("model.dp_sgd", f"a model trained by gradient descent in torch (classifier, "
                                f"cqr_net); {value.get('kind')} is not", value["dp_sgd"])
        fields["dp_sgd"] = {"type": "map", "fields": DP_SGD_FIELDS}
    return validate({"type": "map", "fields": fields}, {k: v for k, v in value.items()
                                                         if not (k == "dp_sgd" and v is None)}, "model")


def _validate_method(index: int, value) -> dict:
    path = f"methods[{index}]"
    if not isinstance(value, dict):
        raise ScenarioError(path, "a mapping with 'name'", value)
    method = _component(METHODS, value.get("name"), f"{path}.name")
    fields = {"name": {"type": "str"}, "label": {"type": "str", "default": method.name}, **method.PARAMS}
    return validate({"type": "map", "fields": fields}, value, path)


def plugin_paths(scenario: dict) -> dict[str, list[str]]:
    """The classes a validated scenario names by import path (registered names are left out):
    what a site process must load to know them by name as the harness does."""
    named = {"data": [scenario["data"]["source"]], "models": [scenario["model"]["kind"]],
             "methods": [method["name"] for method in scenario["methods"]]}
    return {kind: paths for kind, names in named.items() if (paths := [n for n in names if is_import_path(n)])}


def load_plugins(paths: dict[str, list[str]]) -> None:
    """Load (and so register by name) the classes plugin_paths gave; PluginError if one fails."""
    registries = {"data": SOURCES, "models": MODELS, "methods": METHODS}
    for kind, names in paths.items():
        for name in names:
            registries[kind].load(name)


def _cross_checks(s: dict):
    """Problems between fields (each a ScenarioError), all of them."""
    split, sites, data = s["split"], s["sites"], s["data"]
    total = split["train"] + split["calibration"] + split["test"]
    if total > 1 + 1e-9:
        yield ScenarioError("split", "fractions adding up to at most 1", total)
    separate_test = bool(data.get("n_test"))
    gives = MODELS[s["model"]["kind"]].data
    if separate_test and split["test"] > 0:
        yield ScenarioError("split.test", "0 when data.n_test draws a separate test set", split["test"])
    if not separate_test and split["test"] == 0 and gives != "examples":  # learning sites test on their own
        yield ScenarioError("split.test", "a positive fraction (the data source has no separate test set)", 0)
    source = SOURCES[data["source"]]
    problem = source.check(data)
    if problem:
        yield ScenarioError(*problem)
        return  # the checks below read the data
    task = source.task(data)
    model_task = MODELS[s["model"]["kind"]].task
    if model_task != task and not (model_task == "two_sample" and task == "regression"):
        yield ScenarioError("model.kind", f"a {task} model for this {task} data (got a {model_task} model)",
                            s["model"]["kind"])
    for index, method in enumerate(s["methods"]):
        wants = METHODS[method["name"]].data
        if wants != gives:
            yield ScenarioError(f"methods[{index}].name", f"a method for the model's data: "
                                f"{method['name']} works on {wants} data, model {s['model']['kind']} gives "
                                f"{gives}", method["name"])
    if sites["heterogeneity"]["kind"] == "dirichlet" and task != "classification":
        yield ScenarioError("sites.heterogeneity.kind", "dirichlet label skew for classification data only",
                            "dirichlet")
    sizes = sites["sizes"]
    if isinstance(sizes, list) and len(sizes) != sites["count"]:
        yield ScenarioError("sites.sizes", f"one size per site ({sites['count']} values)", sizes)
        sizes = "equal"  # for the capacity check below
    rows = source.rows(data)
    capacity = int(split["calibration"] * rows)
    needed = sites["count"] if sizes == "equal" else sum(site_sizes(sizes, sites["count"], capacity))
    if needed > capacity:
        yield ScenarioError("sites", f"at most {capacity} calibration points in all (calibration fraction "
                            f"{split['calibration']:g} x {rows} rows of data)", f"{needed} needed")
    from world.trial import site_ids

    ids = site_ids(sites["count"])
    labels = [m["label"] for m in s["methods"]]
    for index, fault in enumerate(s["faults"]):
        problem = check_fault(fault, ids, f"faults[{index}]")
        if problem:
            field, expectation = problem.split(": ", 1)
            yield ScenarioError(field, expectation)
        if fault["method"] is not None and fault["method"] not in labels:
            yield ScenarioError(f"faults[{index}].method", "one of the methods' labels: " + ", ".join(labels),
                                fault["method"])
        yield from _fault_reach(fault, index, s, labels)
    dp_sgd = s["model"].get("dp_sgd")
    if dp_sgd and dp_sgd["noise"] == "os" and s["runtime"]["launcher"]["kind"] == "ray":
        yield ScenarioError("model.dp_sgd.noise", "seeded with runtime.launcher.kind ray: each Ray host rebuilds "
                            "the trial's model from the seed, and OS noise would give it another model than the "
                            "study's (seeded noise replays, and the outputs say it is not private)", "os")
    yield from _policy_checks(s)
    yield from _budget_checks(s)
    for field, expectation, got in network_problems(s["network"], site_ids(s["sites"]["count"])):
        yield ScenarioError(f"network.{field}", expectation, got)
    for index, attack in enumerate(s["attacks"]):
        if attack["method"] not in labels:
            yield ScenarioError(f"attacks[{index}].method", "one of the methods' labels: " + ", ".join(labels),
                                attack["method"])
            continue
        spec = s["methods"][labels.index(attack["method"])]
        problem = attack_problem(attack, METHODS[spec["name"]](s["alpha"], **method_params(spec)))
        if problem:
            yield ScenarioError(f"attacks[{index}].method", f"{problem} for attack {attack['attack']}",
                                attack["method"])
        if attack["ask"] not in METHODS:
            yield ScenarioError(f"attacks[{index}].ask", "a registered method name", attack["ask"])
        if attack["trials"] != "all" and attack["trials"] >= s["trials"]:
            yield ScenarioError(f"attacks[{index}].trials", f"a trial number below {s['trials']}", attack["trials"])
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        yield ScenarioError("methods", "distinct labels (add 'label:' to tell entries apart)", duplicates)


def _policy_checks(s: dict):
    """A method the sites' policy would refuse, named before the run starts (the sites refuse it
    anyway: this only saves a run that could not succeed)."""
    policy = SitePolicy.from_spec(s["sites"]["policy"])
    if s["trials"] > policy.trials:
        yield ScenarioError("trials", f"at most the {policy.trials} trials the sites' policy opens "
                                      f"(sites.policy.trials)", s["trials"])
    for index, spec in enumerate(s["methods"]):
        try:
            method = METHODS[spec["name"]](s["alpha"], **method_params(spec))
            spend = method.planned_spend(s["sites"]["count"])
        except (TypeError, ValueError) as exc:  # the method's own checks run again when the study builds it
            yield ScenarioError(f"methods[{index}]", f"parameters the method accepts ({exc})", spec["name"])
            continue
        refusal = policy.refusal(spec["name"], spend)
        if refusal is not None:
            yield ScenarioError(f"methods[{index}]", f"a method the sites' policy (sites.policy) allows; {refusal}",
                                spec["label"])
        mode = (spec.get("secagg") or {}).get("mode") if isinstance(spec.get("secagg"), dict) else None
        if mode == "semi-honest" and policy.secagg != "semi-honest":
            yield ScenarioError(f"methods[{index}].secagg.mode", "a secure sum the sites' policy takes part in: the "
                                "semi-honest protocol trusts the coordinator to relay keys and survivors, and sites "
                                "take it only where sites.policy.secagg says semi-honest", mode)


def _budget_checks(s: dict):
    """Releases the sites' budget (sites.budget) could not all make, named before the run starts
    (the sites would refuse the last ones): the DP releases of one trial composed by the budget's
    rule, and of every trial when each trial re-splits the same records (a data file) and the
    budget is kept per record."""
    budget = Budget.from_spec(s["sites"]["budget"])
    if budget.epsilon is None:
        return
    events, names = [], []
    for spec in s["methods"]:
        try:
            spend = METHODS[spec["name"]](s["alpha"], **method_params(spec)).planned_spend(s["sites"]["count"])
        except (TypeError, ValueError):  # named by _policy_checks
            continue
        if spend is not None and spend.kind == "dp":
            events.append((spend.epsilon, spend.delta))
            names.append(f"{spec['label']} ({spend.epsilon:.3g}, {spend.delta:.3g})")
    if not events:
        return
    recurring = (not budget.per_record or SOURCES[s["data"]["source"]].fixed_records) and s["trials"] > 1
    if recurring:
        events = events * s["trials"]
    account = SiteAccount(budget)
    total = account.composed(events)
    if total > budget.epsilon * (1 + 1e-12):
        what = ("one trial" if not recurring else f"{s['trials']} trials (scope dataset)" if not budget.per_record
                else f"{s['trials']} trials over the same records of {s['data']['source']} data")
        yield ScenarioError("sites.budget.epsilon",
                            f"a budget that covers {what}: {', '.join(names)} compose to epsilon {total:.4g} at "
                            f"delta {budget.delta:g} ({budget.composition}); write a larger budget (or "
                            f"'unlimited', knowingly) in sites.budget", budget.epsilon)


SITE_FILE_FIELDS = {**POLICY_FIELDS, "budget": {"type": "map", "fields": BUDGET_FIELDS}}


def default_site_policy() -> tuple[dict, dict]:
    """(policy, budget): the protective defaults, every field filled (protocol.policy,
    protocol.accounting)."""
    spec = validate({"type": "map", "fields": SITE_FILE_FIELDS}, {}, "")
    budget = spec.pop("budget")
    return spec, budget


def load_site_policy(path: str | Path) -> tuple[dict, dict]:
    """A site operator's own file (`run.py site --policy FILE`): the policy fields
    (protocol.policy.POLICY_FIELDS) and a `budget:` map; returns (policy, budget), validated, with
    errors naming the file and field."""
    raw = read_yaml(path)
    try:
        spec = validate({"type": "map", "fields": SITE_FILE_FIELDS}, raw if raw is not None else {}, "")
    except ScenarioError as exc:
        raise exc.in_file(str(path)) from None
    budget = spec.pop("budget")
    return spec, budget


#: phases every run has besides its methods' own (protocol.phases): announcing and joining
RUN_PHASES = ("hello", "join")


def _fault_reach(fault: dict, index: int, s: dict, labels: list[str]):
    """A fault rule that could never fire (issue 37): a trial the run does not have, a fraction of
    sites that selects none, or a phase that neither the run nor the methods it names have, each
    named with the valid choices. (`--trials 2` on a 5-trial file leaves later rules out, with a
    note: override_scenario.)"""
    trials = fault["trials"]
    beyond = [t for t in ([trials] if isinstance(trials, int) else trials if isinstance(trials, list) else [])
              if isinstance(t, int) and t >= s["trials"]]
    if beyond:
        yield ScenarioError(f"faults[{index}].trials", f"trials of this run, 0..{s['trials'] - 1}", trials)
    sites = fault["sites"]
    if isinstance(sites, dict) and isinstance(sites.get("fraction"), (int, float)) \
            and 0 < sites["fraction"] and round(sites["fraction"] * s["sites"]["count"]) == 0:
        yield ScenarioError(f"faults[{index}].sites", f"a fraction that selects at least one of the "
                            f"{s['sites']['count']} sites (at least {0.5 / s['sites']['count']:.3g})", sites)
    if fault["phase"] is None:
        return
    named = [spec for spec in s["methods"] if fault["method"] in (None, spec["label"])]
    tables = [METHODS[spec["name"]].phase_table() for spec in named]
    if fault["phase"] not in RUN_PHASES and not any(fault["phase"] in table for table in tables):
        listed = ", ".join(dict.fromkeys([*RUN_PHASES, *(table.describe() for table in tables)]))
        yield ScenarioError(f"faults[{index}].phase", f"a phase of the run or of "
                            f"{fault['method'] or 'its methods'}: {listed}", fault["phase"])
