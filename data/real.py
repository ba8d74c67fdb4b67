"""The five real regression data sets of paper 000 (section 5.2), prepared as the reference CQR
experiments did (../shared/datasets/README.md), and any CSV with a target column.

The files are never copied into the repository: they are read from a directory, by default
../shared/datasets beside the checkout (or $QUORUM_DATASETS).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DATASETS = ("bio", "bike", "community", "star", "concrete")
STAR_SCORES = ["readk", "read1", "read2", "read3", "mathk", "math1", "math2", "math3"]
STAR_CATEGORICAL = ["gender", "ethnicity", "stark", "star1", "star2", "star3", "lunchk", "lunch1", "lunch2",
                    "lunch3", "schoolk", "school1", "school2", "school3", "degreek", "degree1", "degree2",
                    "degree3", "ladderk", "ladder1", "ladder2", "ladder3", "tethnicityk", "tethnicity1",
                    "tethnicity2", "tethnicity3"]


class DatasetMissing(FileNotFoundError):
    """A real data set's files are not where the scenario says."""


def default_directory() -> Path:
    return Path(os.environ.get("QUORUM_DATASETS", REPO.parent / "shared" / "datasets"))


FILES = {"bio": ["CASP.csv"], "bike": ["bike_train.csv"], "star": ["STAR.csv"], "concrete": ["Concrete_Data.csv"],
         "community": ["communities.data", "communities_attributes.csv"]}


def missing_files(name: str, directory: Path) -> list[str]:
    """The files of data set `name` that `directory` lacks."""
    if name not in FILES:
        raise ValueError(f"unknown data set {name!r}; expected one of {', '.join(DATASETS)}")
    return [f for f in FILES[name] if not (directory / f).exists()]


def csv_columns(path: str | Path) -> list[str]:
    """The header of a CSV file (DatasetMissing if there is no file)."""
    import pandas as pd

    if not Path(path).exists():
        raise DatasetMissing(f"no CSV file at {path}")
    return [str(c) for c in pd.read_csv(path, nrows=0).columns]


def load_real(name: str, directory: str | Path | None = None, with_ids: bool = False):
    """(X, y) of one of DATASETS, as float64 (read once per process and directory; copies), and with
    `with_ids` each row's identity: the file row it came from (file_row_ids), whatever this
    loader derives from it, so that the `csv` source naming the same file names the same people."""
    directory = Path(directory) if directory else default_directory()
    X, y, ids = _load_real(name, directory.resolve())
    return (X.copy(), y.copy(), ids.copy()) if with_ids else (X.copy(), y.copy())


@functools.lru_cache(maxsize=8)
def _load_real(name: str, directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import pandas as pd

    missing = missing_files(name, directory)
    if missing:
        raise DatasetMissing(f"data set {name!r} needs {', '.join(missing)} in {directory} "
                             f"(set data.dir or $QUORUM_DATASETS)")
    if name == "bio":
        frame = pd.read_csv(directory / "CASP.csv")
        return _with_ids(frame, directory / "CASP.csv", frame[[f"F{i}" for i in range(1, 10)]], frame["RMSD"])
    if name == "concrete":
        frame = pd.read_csv(directory / "Concrete_Data.csv")
        return _with_ids(frame, directory / "Concrete_Data.csv", frame.iloc[:, :8], frame.iloc[:, -1])
    if name == "bike":
        frame = pd.read_csv(directory / "bike_train.csv")
        frame = pd.concat([frame, pd.get_dummies(frame["season"], prefix="season"),
                           pd.get_dummies(frame["weather"], prefix="weather")], axis=1)
        stamps = pd.DatetimeIndex(frame["datetime"])
        frame["hour"], frame["day"], frame["month"] = stamps.hour, stamps.day_of_week, stamps.month
        frame["year"] = stamps.year.map({2011: 0, 2012: 1})
        frame = frame.drop(columns=["season", "weather", "datetime", "casual", "registered"])
        return _with_ids(frame, directory / "bike_train.csv", frame.drop(columns=["count"]), frame["count"])
    if name == "community":
        names = pd.read_csv(directory / "communities_attributes.csv", sep=r"\s+")["attributes"]
        frame = pd.read_csv(directory / "communities.data", names=list(names), na_values="?")
        frame = frame.drop(columns=["state", "county", "community", "communityname", "fold"])
        frame["OtherPerCap"] = frame["OtherPerCap"].fillna(frame["OtherPerCap"].mean())
        frame = frame.dropna(axis=1)
        return _with_ids(frame, directory / "communities.data", frame.iloc[:, :100], frame.iloc[:, 100],
                         names=list(names))
    frame = pd.read_csv(directory / "STAR.csv")  # star
    frame = frame.drop(columns=[frame.columns[0]])  # the row id
    for column in STAR_CATEGORICAL:
        frame[column] = frame[column].astype("category").cat.codes.where(frame[column].notna())
    frame = frame.dropna()
    target = frame[STAR_SCORES].sum(axis=1)
    return _with_ids(frame, directory / "STAR.csv", frame.drop(columns=STAR_SCORES), target)


def _with_ids(frame, path: Path, X, y, names=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, y) as float64 and the identity of the file row behind each of `frame`'s rows (its
    index: the row's position in the file, which pandas keeps through drops and derivations)."""
    X, y = _floats(X, y)
    return X, y, file_row_ids(path, names=names)[frame.index.to_numpy()]


def file_row_ids(path: str | Path, names=None) -> np.ndarray:
    """The identity of every row of a CSV file (row_identities of its text, read as text: no
    parsing, missing-value rule or derivation of any loader changes it); `names`: the header of a
    file that has none."""
    import pandas as pd

    frame = pd.read_csv(path, dtype=str, keep_default_na=False, header=None if names else "infer", names=names)
    return row_identities(frame)


def row_identities(frame) -> np.ndarray:
    """Each row's identity (uint64, protocol.accounting.record_ids' width): BLAKE2b over every
    column of the row as read, the columns in the order of their names, so that a study that
    picks other features, another target or another column order still names the same person
    (a site's budget is keyed by it, issue 47)."""
    import hashlib

    columns = sorted(map(str, frame.columns))
    text = frame.rename(columns=str)[columns].astype(str).to_numpy()
    return np.fromiter((int.from_bytes(hashlib.blake2b("\x1f".join(f"{c}={v}" for c, v in zip(columns, row))
                                                       .encode(), digest_size=8).digest(), "little")
                        for row in text), dtype=np.uint64, count=len(text))


def load_csv(path: str | Path, target: str, features: list[str] | None = None,
             classification: bool = False, with_ids: bool = False):
    """A CSV with a header: `target` is y, `features` (default: every other column) X. Rows with
    missing values are dropped; non-numeric feature columns are an error that names them. For
    classification the target's distinct values (numbers or text) are coded 0..K-1 in sorted order.
    Returns (X, y), and with `with_ids` each kept row's identity (file_row_ids: the whole row as
    written, whatever features, target or column order a study picks)."""
    import pandas as pd

    path = Path(path)
    csv_columns(path)
    frame = pd.read_csv(path)
    if target not in frame.columns:
        raise ValueError(f"{path}: no column {target!r} (columns: {', '.join(map(str, frame.columns))})")
    columns = features or [c for c in frame.columns if c != target]
    unknown = [c for c in columns if c not in frame.columns]
    if unknown:
        raise ValueError(f"{path}: no feature column(s) {', '.join(unknown)}")
    frame = frame[columns + [target]].dropna()
    ids = file_row_ids(path)[frame.index.to_numpy()] if with_ids else None
    text = [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]
    if text:
        raise ValueError(f"{path}: feature column(s) {', '.join(text)} are not numeric; encode them or "
                         f"list the numeric ones under data.features")
    if classification:
        X, y = _floats(frame[columns], np.unique(frame[target].to_numpy(), return_inverse=True)[1])
        return (X, y, ids) if with_ids else (X, y)
    if not pd.api.types.is_numeric_dtype(frame[target]):
        raise ValueError(f"{path}: target column {target!r} is not numeric (for class labels set "
                         f"data.task: classification)")
    X, y = _floats(frame[columns], frame[target])
    return (X, y, ids) if with_ids else (X, y)


def _floats(X, y) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64).reshape(-1)
