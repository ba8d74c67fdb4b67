"""Data sources, splits, site sizes and heterogeneity partitions (issue 8, points 1-3)."""

from __future__ import annotations

import numpy as np
import pytest

from data.heterogeneity import HETEROGENEITY_FIELDS, assign_sites, dirichlet_partition, site_shifts
from data.real import DatasetMissing, default_directory, load_csv, load_real
from data.sources import SOURCES
from data.split import site_sizes, split_indices, standardize
from specs.schema import validate

HAVE_DATASETS = (default_directory() / "README.md").exists()
needs_datasets = pytest.mark.skipif(not HAVE_DATASETS, reason=f"no real data sets in {default_directory()}")


@needs_datasets
@pytest.mark.parametrize("name, rows, features", [
    ("bio", 45730, 9), ("bike", 10886, 18), ("community", 1994, 100), ("star", 2161, 39), ("concrete", 1030, 8)])
def test_real_data_sets_have_the_documented_shapes(name, rows, features):
    X, y = load_real(name)
    assert X.shape == (rows, features) and y.shape == (rows,)
    assert np.isfinite(X).all() and np.isfinite(y).all()


@needs_datasets
def test_real_targets_follow_the_preparation_recipe():
    import pandas as pd

    directory = default_directory()
    _, y = load_real("star")
    raw = pd.read_csv(directory / "STAR.csv").dropna()
    scores = ["readk", "read1", "read2", "read3", "mathk", "math1", "math2", "math3"]
    np.testing.assert_allclose(np.sort(y), np.sort(raw[scores].sum(axis=1).to_numpy()))
    _, y = load_real("bio")
    np.testing.assert_array_equal(y, pd.read_csv(directory / "CASP.csv")["RMSD"].to_numpy())


def test_a_missing_data_directory_is_named(tmp_path):
    with pytest.raises(DatasetMissing, match=str(tmp_path)):
        load_real("concrete", tmp_path)


def test_csv_source(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label,t\n1,2,x,0.5\n3,,y,1.5\n5,6,x,2.5\n")
    X, y = load_csv(path, "t", ["a"])
    np.testing.assert_array_equal(X[:, 0], [1, 3, 5])
    X, y = load_csv(path, "t", ["a", "b"])  # the row with a missing b is dropped
    np.testing.assert_array_equal(y, [0.5, 2.5])
    with pytest.raises(ValueError, match="no column 'target'"):
        load_csv(path, "target")
    with pytest.raises(ValueError, match="label are not numeric"):
        load_csv(path, "t")
    with pytest.raises(DatasetMissing, match="no CSV file"):
        load_csv(tmp_path / "nope.csv", "t")
    params = {"path": str(path), "target": "label", "features": ["a"], "task": "classification",
              "scale_response": False}
    dataset = SOURCES["csv"].load(params, np.random.default_rng(0))
    np.testing.assert_array_equal(dataset.y, [0, 1, 0])  # labels coded 0..K-1
    assert dataset.task == "classification"


@pytest.mark.parametrize("name, task, shape", [("diabetes", "regression", (442, 10)),
                                               ("digits", "classification", (1797, 64))])
def test_sklearn_sources(name, task, shape):
    dataset = SOURCES["sklearn"].load({"name": name}, np.random.default_rng(0))
    assert dataset.X.shape == shape and dataset.task == task
    if task == "classification":
        assert set(np.unique(dataset.y)) == set(range(10))


def test_split_is_disjoint_with_the_papers_fractions_and_fresh_per_trial():
    a = split_indices(1000, 0.4, 0.4, 0.2, np.random.default_rng(1))
    b = split_indices(1000, 0.4, 0.4, 0.2, np.random.default_rng(2))
    assert [len(p) for p in a] == [400, 400, 200]
    assert len(np.unique(np.concatenate(a))) == 1000
    assert not np.array_equal(a[0], b[0])


def test_standardize_uses_training_statistics_only():
    rng = np.random.default_rng(0)
    train, other = rng.normal(3, 2, (500, 3)), rng.normal(10, 1, (100, 3))
    train_s, other_s = standardize(train, other)
    np.testing.assert_allclose(train_s.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(train_s.std(axis=0), 1, atol=1e-12)
    np.testing.assert_allclose(other_s, (other - train.mean(axis=0)) / train.std(axis=0))


def test_site_sizes():
    assert site_sizes("equal", 3, 10) == [3, 3, 3]
    assert site_sizes(7, 4, 100) == [7, 7, 7, 7]
    table1 = [698, 476, 326]  # paper 004 table 1, three centres
    assert site_sizes(table1, 3, 2000) == table1
    drawn = site_sizes({"distribution": "lognormal", "median": 50.0, "sigma": 1.0, "min": 5, "max": 400,
                        "seed": 3}, 200, 10**6)
    assert min(drawn) >= 5 and max(drawn) <= 400 and 30 < np.median(drawn) < 80
    assert drawn == site_sizes({"distribution": "lognormal", "median": 50.0, "sigma": 1.0, "min": 5,
                                "max": 400, "seed": 3}, 200, 10**6)  # fixed for a run


def spec(**fields):
    return validate({"type": "map", "fields": HETEROGENEITY_FIELDS}, fields, "h")


def test_sort_partition_gives_each_site_a_block_of_the_feature():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 2)), rng.standard_normal(300)
    parts = assign_sites(spec(kind="sort", feature=1), X, y, [100, 50, 150], rng)
    assert [len(p) for p in parts] == [100, 50, 150]
    blocks = [X[p, 1] for p in parts]
    assert blocks[0].max() < blocks[1].min() and blocks[1].max() < blocks[2].min()
    mixed = assign_sites(spec(kind="sort", feature=1, strength=0.0), X, y, [100, 50, 150], rng)
    assert abs(np.mean(X[mixed[0], 1]) - np.mean(X[mixed[2], 1])) < 0.4  # strength 0: no shift


def test_response_and_cluster_partitions():
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((200, 3)), rng.standard_normal(200)
    parts = assign_sites(spec(kind="response"), X, y, [50] * 4, rng)
    assert all(y[parts[j]].max() <= y[parts[j + 1]].min() for j in range(3))
    X[:100] += 8.0  # two well separated clouds
    parts = assign_sites(spec(kind="cluster"), X, y, [100, 100], rng)
    assert {tuple(sorted(set(p < 100))) for p in parts} == {(True,), (False,)}


def test_too_many_points_asked_for_is_an_error():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="add up to 30"):
        assign_sites(spec(kind="sort"), np.zeros((20, 1)), np.zeros(20), [10, 20], rng)


def label_mix(labels, parts, classes):
    return np.array([[np.mean(labels[p] == c) for c in range(classes)] for p in parts])


def test_dirichlet_label_skew_keeps_sizes_and_skews_with_small_concentration():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 10, 5000)
    sizes = [300] * 10
    skewed = dirichlet_partition(labels, sizes, 0.1, rng)
    even = dirichlet_partition(labels, sizes, 1000.0, rng)
    for parts in (skewed, even):
        assert [len(p) for p in parts] == sizes
        assert len(np.unique(np.concatenate(parts))) == sum(sizes)  # no point given twice
    # mean over sites of the largest class share: near 1/10 when even, far above when skewed
    assert label_mix(labels, even, 10).max(axis=1).mean() < 0.2
    assert label_mix(labels, skewed, 10).max(axis=1).mean() > 0.5


def test_dirichlet_falls_back_when_a_class_runs_out():
    labels = np.array([0] * 5 + [1] * 95)
    parts = dirichlet_partition(labels, [50, 50], 0.01, np.random.default_rng(0))
    assert sorted(np.concatenate(parts)) == list(range(100))


def test_location_and_scale_shifts_are_per_site_normal_draws():
    shifts = site_shifts(spec(kind="location", sigma=0.5), 4000, np.random.default_rng(0))
    assert abs(np.std(shifts) - 0.5) < 0.02
    assert not site_shifts(spec(kind="sort"), 5, np.random.default_rng(0)).any()


def test_csv_text_target_needs_the_classification_task(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,label\n1,x\n2,y\n")
    with pytest.raises(ValueError, match="set data.task: classification"):
        load_csv(path, "label")


def test_scenarios_name_a_missing_data_file_or_column(tmp_path):
    from scenarios.scenario import validate_scenario
    from specs.schema import ScenarioError

    path = tmp_path / "d.csv"
    path.write_text("a,t\n" + "".join(f"{i},{2 * i}\n" for i in range(10)))

    def scenario(data):
        return validate_scenario({"name": "x", "data": data, "sites": {"count": 1, "policy": {"non_private": "allow"}}, "model": {"kind": "ridge"},
                                  "methods": [{"name": "centralized"}]})

    assert scenario({"source": "csv", "path": str(path), "target": "t"})["data"]["features"] == []
    cases = [({"source": "csv", "path": str(tmp_path / "none.csv"), "target": "t"}, "data.path"),
             ({"source": "csv", "path": str(path), "target": "y"}, "data.target"),
             ({"source": "csv", "path": str(path), "target": "t", "features": ["b"]}, "data.features"),
             ({"source": "real", "name": "bio", "dir": str(tmp_path)}, "data.dir")]
    with pytest.raises(ScenarioError, match="at most 4 calibration points"):  # 0.4 x 10 rows
        validate_scenario({"name": "x", "data": {"source": "csv", "path": str(path), "target": "t"},
                           "sites": {"count": 5, "policy": {"non_private": "allow"}}, "model": {"kind": "ridge"}, "methods": [{"name": "centralized"}]})
    for data, field in cases:
        with pytest.raises(ScenarioError) as error:
            scenario(data)
        assert error.value.field == field
