"""Scenario files: every shipped file validates; bad ones get file, field and expectation."""

from pathlib import Path

import pytest
import yaml

from quorum import load_scenario
from specs.schema import ScenarioError, apply_overrides
from tests.test_data import HAVE_DATASETS

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").rglob("*.yaml")) + sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenarios_validate(path):
    if "source: real" in path.read_text() and not HAVE_DATASETS:
        with pytest.raises(ScenarioError, match="data.dir"):
            load_scenario(path).to_dict()
        pytest.skip("the real data sets are not beside the checkout")
    assert load_scenario(path).to_dict()["name"]


def test_quickstart_is_the_papers_synthetic_setting():
    s = load_scenario(ROOT / "scenarios" / "quickstart.yaml").to_dict()
    assert (s["sites"]["count"], s["sites"]["sizes"], s["sites"]["heterogeneity"]["kind"]) == (50, "equal", "none")
    assert s["data"] == {"source": "synthetic", "generator": "romano2019", "n": 2000, "n_test": 5000, "options": {}}
    assert int(s["split"]["calibration"] * s["data"]["n"]) // 50 == 20
    assert s["model"]["kind"] == "cqr_forest" and s["model"]["params"]["n_estimators"] == 1000
    assert s["alpha"] == 0.1 and s["trials"] == 20
    assert [m["name"] for m in s["methods"]] == ["fedcp_qq", "fedcp_avg", "centralized"]


def write(tmp_path, data):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def base():
    return yaml.safe_load((ROOT / "tests" / "scenarios" / "tiny.yaml").read_text())


@pytest.mark.parametrize("mutate,field,fragment", [
    (lambda d: d["sites"].update(count="four"), "sites.count", "an integer >= 1"),
    (lambda d: d["sites"].update(cuont=4), "sites.cuont", "did you mean 'count'"),
    (lambda d: d.pop("name"), "name", "(required)"),
    (lambda d: d.update(alpha=1.5), "alpha", "a number > 0 and < 1"),
    (lambda d: d["model"].update(kind="svm"), "model.kind", "one of 'classifier', 'cqr_forest', 'cqr_net', 'examples', 'ridge'"),
    (lambda d: d["methods"].append({"name": "fedcp_qqq"}), "methods[6].name", "one of"),
    (lambda d: d["methods"].append({"name": "fedcp_qq"}), "methods", "distinct labels"),
    (lambda d: d["sites"].update(sizes=[10, 10]), "sites.sizes", "one size per site (4 values)"),
    (lambda d: d["sites"].update(sizes="unequal"), "sites.sizes", "'equal', a positive integer"),
    (lambda d: d["sites"].update(sizes={"distribution": "zipf"}), "sites.sizes.distribution", "one of 'lognormal', 'uniform'"),
    (lambda d: d["sites"].update(sizes={"distribution": "uniform", "low": 9, "high": 3}), "sites.sizes.high", "at least low = 9"),
    (lambda d: d["sites"].update(sizes={"distribution": "lognormal", "median": 50}), "sites.sizes.sigma", "(required)"),
    (lambda d: d["split"].update(train=0.9), "split", "fractions adding up to at most 1"),
    (lambda d: d["sites"].update(count=500), "sites", "at most 160 calibration points"),
    (lambda d: d["data"].update(generator="friedman"), "data.generator", "one of 'classification_blobs', 'paper001_chi2', 'paper001_label_shift', 'paper001_uniform', 'paper004_gamma', 'paper004_shift', 'romano2019'"),
    (lambda d: d["runtime"]["deadlines"].update(respond=0), "runtime.deadlines.respond", "a number > 0"),
    (lambda d: d["model"].update(params={"trees": 3}), "model.params.trees", "no field 'trees'"),
    (lambda d: d["methods"][3].update(epsilon=-1), "methods[3].epsilon", "a number > 0"),
    (lambda d: d["methods"][3]["bins"].update(hi="max"), "methods[3].bins.hi", "a number or 'training'"),
    (lambda d: d["methods"][3].pop("epsilon"), "methods[3].epsilon", "(required)"),
])
def test_errors_name_file_field_and_expectation(tmp_path, mutate, field, fragment):
    data = base()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ScenarioError) as excinfo:
        load_scenario(path).to_dict()
    message = str(excinfo.value)
    assert message.startswith(f"{path}: field '{field}': expected")
    assert fragment in message


def test_yaml_syntax_errors_give_the_line(tmp_path):
    path = write(tmp_path, "name: x\nsites: {count: 4\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: .*valid YAML at line \d+"):
        load_scenario(path).to_dict()


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="a readable scenario file"):
        load_scenario(tmp_path / "nope.yaml").to_dict()


def test_overrides_reach_nested_fields_and_list_items():
    data = apply_overrides(base(), ["sites.count=8", "methods.0.label=qq", "runtime.deadlines.join=5.5"])
    assert data["sites"]["count"] == 8 and data["methods"][0]["label"] == "qq"
    assert data["runtime"]["deadlines"]["join"] == 5.5
    with pytest.raises(ScenarioError, match="a list index below 6"):
        apply_overrides(base(), ["methods.7.label=x"])
    with pytest.raises(ScenarioError, match="dotted.key=value"):
        apply_overrides(base(), ["sites.count"])


def test_defaults_are_filled_in():
    s = load_scenario(ROOT / "tests" / "scenarios" / "tiny.yaml").to_dict()
    assert s["model"]["device"] == "auto" and s["model"]["params"]["alphas"]
    assert s["methods"][0] == {"name": "fedcp_qq", "label": "fedcp_qq", "planner": "auto", "dropouts": 0}
    assert s["runtime"]["bind"] == "tcp://127.0.0.1:*"


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    """Issue 24: independent problems in different sections all come back, in file order, each
    naming the file and the field; the first stays readable as a single problem."""
    from specs.schema import ScenarioErrors

    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["alpha"] = 2
    data["sites"]["count"] = 0
    data["runtime"] = {"deadlines": {"respond": -1}}
    data["model"]["kind"] = "forest"
    data["methods"][0]["epsilonn"] = 1
    data["methods"].append({"name": "fedcp_q"})
    path = write(tmp_path, data)
    with pytest.raises(ScenarioErrors) as caught:
        load_scenario(path).to_dict()
    fields = [p.field for p in caught.value.problems]
    assert fields == ["alpha", "sites.count", "runtime.deadlines.respond", "model.kind",
                      "methods[0].epsilonn", "methods[3].name"]
    lines = str(caught.value).splitlines()
    assert len(lines) == 6 and all(line.startswith(f"{path}: field '") for line in lines)
    assert caught.value.field == "alpha"  # read as one problem: the first


def test_checks_across_fields_report_every_problem(tmp_path):
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["split"] = {"train": 0.6, "calibration": 0.4, "test": 0.2}  # adds up to 1.2
    data["methods"].append({"name": "fedcp_qq"})  # a second entry with the same label
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, data)).to_dict()
    assert [p.field for p in caught.value.problems] == ["split", "split.test", "methods"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_validated_scenario_validates_again_to_itself(path):
    """What scenario.yaml in a run directory holds (defaults filled in, nulls included) is a
    scenario that validates to itself, so the API and --resume can take it back."""
    from scenarios.scenario import validate_scenario

    if "source: real" in path.read_text() and not HAVE_DATASETS:
        pytest.skip("the real data sets are not beside the checkout")
    once = load_scenario(path).to_dict()
    assert validate_scenario(yaml.safe_load(yaml.safe_dump(once))) == once


def test_a_fault_phase_that_no_method_has_is_refused_with_the_choices():
    """Issue 37, point 3: `phase: reponse` validated and silently never fired."""
    from scenarios.scenario import validate_scenario
    from quorum import load_scenario
    from specs.schema import ScenarioError

    raw = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "faults-site-crash.yaml").to_dict()
    raw["faults"] = [{"action": "crash", "sites": "site-001", "phase": "reponse"},
                     {"action": "crash", "sites": "site-002", "phase": "mask", "method": "fedcp_qq"}]
    with pytest.raises(ScenarioError) as caught:
        validate_scenario(raw)
    problems = {p.field: str(p) for p in caught.value.problems}
    assert "hello, join, respond" in problems["faults[0].phase"] and "'reponse'" in problems["faults[0].phase"]
    assert "a phase of the run or of fedcp_qq" in problems["faults[1].phase"]
