"""Paper 004 table 1's group sizes in the section 4.6 scenarios: with paper004_shift's
exact_groups, every centre holds exactly n_l controls and n_l treatments (data.split.group_partition);
without it, the data are byte-identical to what they were before the option existed."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest

from data.heterogeneity import assign_sites, treatment_group
from data.split import group_partition
from data.synthetic import paper004_shift
from quorum import load_scenario
from scenarios.scenario import validate_scenario
from specs.schema import ScenarioError
from world.trial import WorldSpec, build_trial

TABLE_1 = {  # paper 004 table 1: n_l per group at each centre
    3: [698, 476, 326],
    5: [492, 368, 276, 208, 156],
    10: [307, 250, 208, 172, 143, 118, 98, 81, 67, 56],
}
#: sha256 of trial 0's and trial 1's shards and test set for mwu-3-centres with options {delta: 0.1},
#: computed with the code before exact_groups existed
BEFORE = "afa9c55162742c2cbcc9fcadd6f2bf1ada68853832ecbf51362bea209c279707"


def scenario(centres: int, options: dict | None = None) -> dict:
    spec = load_scenario(f"scenarios/paper004/mwu-{centres}-centres.yaml").to_dict()
    if options is not None:
        spec = copy.deepcopy(spec)
        spec["data"]["options"] = options
        spec = validate_scenario(spec)
    return spec


def fingerprint(spec: dict) -> str:
    digest = hashlib.sha256()
    for trial in (0, 1):
        world = build_trial(WorldSpec.of(spec), trial)
        for site in sorted(world.shards):
            X, y = world.shards[site]
            digest.update(site.encode() + np.ascontiguousarray(X).tobytes() + np.ascontiguousarray(y).tobytes())
        digest.update(np.ascontiguousarray(world.y_test).tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("centres", sorted(TABLE_1))
def test_each_centre_holds_exactly_table_1s_numbers_per_group(centres):
    spec = scenario(centres)
    assert spec["data"]["options"]["exact_groups"] is True
    assert spec["sites"]["sizes"] == [2 * n for n in TABLE_1[centres]]
    for trial in (0, 3):
        world = build_trial(WorldSpec.of(spec), trial)
        treated = [int(treatment_group(X).sum()) for X, _ in world.shards.values()]
        controls = [len(y) - t for t, (_, y) in zip(treated, world.shards.values())]
        assert treated == TABLE_1[centres] and controls == TABLE_1[centres]


def test_without_the_option_groups_are_drawn_and_the_data_are_as_before():
    off = scenario(3, {"delta": 0.1})
    assert fingerprint(off) == BEFORE
    assert fingerprint(scenario(3, {"delta": 0.1, "exact_groups": False})) == BEFORE
    world = build_trial(WorldSpec.of(off), 0)
    treated = [int(treatment_group(X).sum()) for X, _ in world.shards.values()]
    assert treated != TABLE_1[3]  # about, not exactly, table 1's numbers
    assert fingerprint(scenario(3)) != BEFORE


def test_group_partition_gives_half_of_each_site_from_each_group_and_refuses_too_few():
    rng = np.random.default_rng(0)
    groups = np.arange(40) % 3 == 0  # 14 treatments, 26 controls
    indices = np.arange(100, 140)
    parts = group_partition(indices, groups, [7, 10, 4], rng)
    chosen = np.concatenate(parts)
    assert len(set(chosen.tolist())) == len(chosen) and set(chosen.tolist()) <= set(indices.tolist())
    is_treated = dict(zip(indices.tolist(), groups.tolist()))
    assert [sum(is_treated[i] for i in p) for p in parts] == [4, 5, 2]  # odd n_j: the extra one is treated
    assert [len(p) for p in parts] == [7, 10, 4]
    with pytest.raises(ValueError, match="15 treatment points"):
        group_partition(indices, groups, [10, 10, 10], rng)
    with pytest.raises(ValueError, match="random partition"):
        assign_sites({"kind": "sort", "feature": 0, "strength": 1.0}, groups[:, None].astype(float),
                     np.zeros(40), [7, 10, 4], rng, exact_groups=True)


def test_the_generator_draws_exactly_half_of_each_group_in_random_order():
    X, y = paper004_shift(101, np.random.default_rng(1), delta=0.0, exact_groups=True)
    assert X[:, 0].sum() == 51 and set(np.unique(X[:, 0])) == {0.0, 1.0}
    assert np.any(np.diff(X[:, 0]) < 0)  # shuffled, not sorted
    a, b = paper004_shift(50, np.random.default_rng(2)), paper004_shift(50, np.random.default_rng(2), exact_groups=False)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_scenarios_refuse_an_exact_groups_that_is_not_a_switch():
    spec = load_scenario("scenarios/paper004/mwu-3-centres.yaml").to_dict()
    with pytest.raises(ScenarioError, match=r"data.options.exact_groups"):
        validate_scenario({**spec, "data": {**spec["data"], "options": {"delta": 0.1, "exact_groups": 1}}})
