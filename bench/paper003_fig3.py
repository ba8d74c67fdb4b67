"""Paper 003 figure 3 (section 4.1) on offline data: a private or non-private model, calibrated by
private or non-private split conformal prediction, four cells of coverage and set size.

Paper 003 (Angelopoulos, Bates, Zrnic, Jordan, "Private prediction sets") trains the stock
convolutional network of Opacus's CIFAR-10 example twice, with DP-SGD at (epsilon, delta) =
(8, 1e-5) and without (`--disable-dp`), and over random splits of CIFAR-10's validation set
(n = 5000 calibration points, the rest for testing) calibrates each with split conformal
prediction and with its private algorithm 3 (epsilon 8 in its code, cifar10/experiment1.py), at
alpha = 0.1, with the LAC score 1 - f(x)_y. CIFAR-10 is not on this machine, nor can it be
fetched: the stand-in is scikit-learn's digits (1,797 images of 8 x 8 pixels, 10 classes) with
a small CNN of the same shape as Opacus's example (convolutions, ReLU, average pooling, a
linear head; no batch norm, which DP-SGD cannot use), scaled to 8 x 8 inputs.

Everything below is Quorum's own code: the models are models.classifier.Classifier with the CNN
as their network, trained by models.torch_nets (plain: Adam with early stopping) or, with
`dp_sgd` set, by models.dp_sgd (Opacus's DP-SGD, the noise multiplier from its accountant);
calibration is protocol.methods' `centralized` (split conformal, eq. 2 of paper 000) and
`private_cp` (paper 003 algorithm 3 with m* and gamma* of its appendix C, the exponential
mechanism's draw from the OS), each the method's own combine() on the pooled calibration scores.

Per model seed (`--models`, default 5): the rows are shuffled, of the first `--train` (1,000) the
last `--temperature-rows` (200) are held out to fit each model's softmax temperature and the rest
(800) train both models, and the other 797 are split at random `--trials` times (default 200) into
n = 398 calibration and 399 test points (the paper's half and half of its held-out set). Writes
bench/results/paper003_fig3.json and prints the markdown table.

Temperature scaling, as the paper's code does it: cifar10/experiment1.py's experiment() fits
T = platt_logits(dataset_precomputed) and calibrates on softmax(logits / T) (the paper's text does
not mention it; its section 4 says only that its public repository reproduces the experiments).
The paper fits T on its whole held-out set, the 10,000 CIFAR-10 validation images that are then
split into calibration and test points, a non-private use of the calibration data that its
privacy accounting (algorithm 3's epsilon) does not cover. Ours fits T on rows that are neither
calibration nor DP-SGD training rows, so it spends neither privacy budget: they stand for the
public validation data a deployment would tune on, and cost the models 200 of their 1,000
training rows (`--temperature-rows 0`: no temperature, the models trained on all 1,000).

    .venv/bin/python bench/paper003_fig3.py             # make paper003-fig3
    .venv/bin/python bench/paper003_fig3.py --models 1 --trials 20 --epochs 5   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from learning.uarl import fit_temperature, softmax  # noqa: E402
from models.classifier import Classifier  # noqa: E402
from models.dp_sgd import DP_SGD_FIELDS, opacus_version  # noqa: E402
from protocol.methods import METHODS  # noqa: E402
from models.scores import SCORES  # noqa: E402
from protocol.methods.base import Planned  # noqa: E402

OUT = ROOT / "bench" / "results" / "paper003_fig3.json"
ALPHA = 0.1
MODEL_EPSILON, MODEL_DELTA = 8.0, 1e-5
#: paper 003's own words and its code's settings (figure 3, section 4.1, appendix C, cifar10/experiment1.py)
PAPER = {
    "data": "CIFAR-10: models trained on its 50,000 training images; 1,000 random splits (100 in its code) of the "
            "10,000 validation images into n = 5000 calibration points and the rest for testing",
    "model": "the stock CNN of Opacus's CIFAR-10 example, Opacus's suggested DP-SGD settings, (epsilon, delta) = "
             "(8, 1e-5); the non-private model the same with --disable-dp",
    "calibration_epsilon": 8.0, "alpha": 0.1, "score": "LAC, 1 - softmax_y (after temperature scaling)",
    "temperature": "cifar10/experiment1.py, experiment(): T = platt_logits(dataset_precomputed), SGD with lr 0.01 from "
                   "T = 1.3 for at most 10 epochs (batches of 1,024) on the NLL of all 10,000 validation images, the "
                   "calibration points among them; scores = (logits / T).softmax(dim=1)",
    "accuracy": {"non-private model": 0.73, "private model": 0.67},
    "reading": "figure 3 gives histograms only, no table: coverage concentrates just above 0.9 in all four cells; "
               "\"the price of private conformal prediction is very low, as evidenced by the minuscule increase in set "
               "size caused by private conformal prediction. However, the private model training causes a larger set "
               "size due to the private model's comparatively poor performance\" (section 4.1)",
}


class DigitsCNN(Classifier):
    """Classifier whose network is a small CNN on the 8 x 8 digit images (rows of 64 pixels)."""

    def build(self):
        import torch.nn as nn

        width = self.params["hidden"]
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),            # 4 x 4
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),    # 2 x 2
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(2 * width, self.classes),
        ).to(self._device())


def train_models(X, y, seed: int, args) -> dict:
    """The non-private and the DP-SGD model on the same rows and initial weights' seed."""
    models = {}
    for name, dp_sgd in (("non-private", None), ("DP-SGD", {
            **{k: f.get("default") for k, f in DP_SGD_FIELDS.items()}, "epsilon": MODEL_EPSILON,
            "delta": MODEL_DELTA, "clip": args.clip, "epochs": args.epochs, "batch_size": args.batch_size,
            "lr": args.dp_lr})):
        model = DigitsCNN(device=args.device, hidden=args.width, layers=1, dropout=0.0, epochs=args.plain_epochs,
                          batch_size=args.batch_size, lr=1e-2, weight_decay=0.0, patience=20, score="lac",
                          raps_lambda=0.0, raps_k=0)
        model.n_classes = 10
        model.dp_sgd = dp_sgd
        began = time.perf_counter()
        model.fit(X, y, ALPHA, np.random.default_rng([seed, 3, 0]))
        models[name] = (model, time.perf_counter() - began)
    return models


#: L-BFGS iterations for the temperature: learning.uarl's default 10 (lr 0.01) stop near the start 1.3;
#: a few hundred reach the NLL minimum, which the paper's platt_logits descends toward
TEMPERATURE_ITERATIONS = 500


def temperature_scaled(logits: np.ndarray, fit_logits: np.ndarray, fit_labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Paper 003's temperature scaling before calibration (its code, cifar10/experiment1.py,
    experiment(): T = platt_logits(...); scores = (logits / T).softmax(dim=1)): T minimizes the
    negative log-likelihood of softmax(fit_logits / T) on `fit_labels` (Guo et al. 2017, by
    learning.uarl.fit_temperature run to its minimum); returns T and softmax(logits / T). The fit
    rows must be neither calibration nor private training rows, so that T costs no privacy."""
    temperature = fit_temperature(fit_logits, fit_labels, iterations=TEMPERATURE_ITERATIONS)
    return temperature, softmax(logits, temperature)


def calibrate(method, scores: np.ndarray) -> tuple[float, float | None]:
    """The method's own combine() on one pool of calibration scores: its threshold, and for
    private_cp paper 003's theorem 3 bound (results.conformal's coverage_upper_bound column, p_max
    from these scores on the method's bins)."""
    from types import SimpleNamespace

    planned = Planned({"pool": {}})
    outcome = method.combine({"pool": len(scores)}, planned, {"pool": scores}, set(), np.random.default_rng())
    upper, _ = outcome.coverage_upper_bound(SimpleNamespace(world=SimpleNamespace(site_scores={"pool": scores})))
    return outcome.threshold, upper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=5, help="model seeds (each trains both models)")
    parser.add_argument("--trials", type=int, default=200, help="random calibration/test splits per model seed")
    parser.add_argument("--train", type=int, default=1000, help="training and temperature rows (the rest are split)")
    parser.add_argument("--temperature-rows", type=int, default=200,
                        help="of --train, rows held out of training to fit the softmax temperature (0: none)")
    parser.add_argument("--epochs", type=int, default=40, help="DP-SGD epochs (the noise is set for them)")
    parser.add_argument("--plain-epochs", type=int, default=200, help="non-private: at most (early stopping)")
    parser.add_argument("--batch-size", type=int, default=32, help="expected batch size (DP-SGD: Poisson)")
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--dp-lr", type=float, default=1e-2)
    parser.add_argument("--width", type=int, default=32, help="channels of the first convolution")
    parser.add_argument("--calibration-epsilon", type=float, nargs="+", default=[8.0, 1.0],
                        help="private_cp's epsilon(s); the first is the figure's (the paper's code: 8)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import torch
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    began = time.perf_counter()
    digits = load_digits()
    X_all, y_all = digits.data.astype(np.float64) / 16.0, digits.target.astype(int)
    calibrations = {"non-private": METHODS["centralized"](ALPHA)}
    for eps in args.calibration_epsilon:
        label = "private" if eps == args.calibration_epsilon[0] else f"private (epsilon {eps:g})"
        calibrations[label] = METHODS["private_cp"](ALPHA, epsilon=eps, bins={"count": 0, "lo": 0.0, "hi": 1.0})
    cells = {}  # (model, calibration) -> lists
    models_seen = []
    for seed in range(args.models):
        order = np.random.default_rng([seed, 3]).permutation(len(y_all))
        fit_rows = args.train - args.temperature_rows
        train, tune, held = order[:fit_rows], order[fit_rows:args.train], order[args.train:]
        trained = train_models(X_all[train], y_all[train], seed, args)
        for name, (model, seconds) in trained.items():
            if len(tune):
                temperature, probabilities = temperature_scaled(model.forward(X_all[held]), model.forward(X_all[tune]),
                                                                y_all[tune])
            else:
                temperature, probabilities = 1.0, model.base_predictions(X_all[held])
            accuracy = float(np.mean(probabilities.argmax(axis=1) == y_all[held]))
            record = model.training_privacy
            models_seen.append({"seed": seed, "model": name, "accuracy": accuracy, "train_seconds": round(seconds, 2),
                                "device": model.device, "temperature": round(temperature, 4),
                                **({"epsilon": record["epsilon"], "delta": record["delta"],
                                    "noise_multiplier": record["noise_multiplier"], "steps": record["steps"],
                                    "sample_rate": record["sample_rate"]} if record else {})})
            scores = SCORES[model.score][0](y_all[held], probabilities, **model.score_params())
            split_rng = np.random.default_rng([seed, 3, 1])
            for _ in range(args.trials):
                perm = split_rng.permutation(len(held))
                n = len(held) // 2
                cal, test = perm[:n], perm[n:]
                for cal_name, method in calibrations.items():
                    threshold, upper = calibrate(method, scores[cal])
                    coverage, size = model.evaluate(probabilities[test], y_all[held][test], threshold)
                    cell = cells.setdefault((name, cal_name), {"coverage": [], "size": [], "threshold": [],
                                                               "upper": []})
                    if upper is not None:
                        cell["upper"].append(upper)
                    cell["coverage"].append(coverage)
                    cell["size"].append(size)
                    cell["threshold"].append(threshold)
        print(f"model seed {seed}: " + ", ".join(f"{m['model']} accuracy {m['accuracy']:.3f} ({m['train_seconds']} s)"
                                                 for m in models_seen[-2:]), flush=True)
    seconds = time.perf_counter() - began
    table = []
    for (model_name, cal_name), cell in cells.items():
        cov, size = np.array(cell["coverage"]), np.array(cell["size"])
        table.append({"model": model_name, "calibration": cal_name, "trials": int(cov.size),
                      "coverage_mean": float(cov.mean()), "coverage_median": float(np.median(cov)),
                      "coverage_sd": float(cov.std(ddof=1)), "coverage_min": float(cov.min()),
                      "size_mean": float(size.mean()), "size_median": float(np.median(size)),
                      "size_sd": float(size.std(ddof=1)), "size_p90": float(np.quantile(size, 0.9)),
                      "share_size_over_5": float(np.mean(size > 5)),  # splits whose sets hold most labels
                      "threshold_mean": float(np.mean(cell["threshold"])),
                      "threshold_median": float(np.median(cell["threshold"])),
                      # paper 003 theorem 3 with p_max of each split's calibration scores (private cells)
                      "coverage_upper_bound_mean": float(np.mean(cell["upper"])) if cell["upper"] else None,
                      "coverage_upper_bound_min": float(np.min(cell["upper"])) if cell["upper"] else None})
    accuracy = {name: float(np.mean([m["accuracy"] for m in models_seen if m["model"] == name]))
                for name in ("non-private", "DP-SGD")}
    temperature = {name: float(np.mean([m["temperature"] for m in models_seen if m["model"] == name]))
                   for name in ("non-private", "DP-SGD")}
    private_models = [m for m in models_seen if m["model"] == "DP-SGD"]
    result = {
        "what": "paper 003 figure 3 on scikit-learn's digits (stand-in for CIFAR-10): private / non-private model "
                "x private / non-private split conformal calibration",
        "command": "make paper003-fig3  (" + " ".join(["bench/paper003_fig3.py", *sys.argv[1:]]) + ")",
        "seconds": round(seconds, 1), "machine": f"{platform.machine()}, {os.cpu_count()} cores, one torch thread",
        "torch": torch.__version__, "opacus": opacus_version(),
        "alpha": ALPHA, "model_epsilon": MODEL_EPSILON, "model_delta": MODEL_DELTA,
        "calibration_epsilon": args.calibration_epsilon,
        "setup": {"data": "sklearn digits, 1797 images 8x8, pixels / 16", "train_rows": args.train - args.temperature_rows,
                  "temperature_rows": args.temperature_rows,
                  "calibration_n": (len(y_all) - args.train) // 2,
                  "test_n": len(y_all) - args.train - (len(y_all) - args.train) // 2,
                  "model_seeds": args.models, "splits_per_model": args.trials,
                  "cnn": f"conv {args.width}-{2 * args.width}-{2 * args.width} (3x3, ReLU, average pooling), linear head",
                  "dp_sgd": {"epochs": args.epochs, "batch_size": args.batch_size, "clip": args.clip, "lr": args.dp_lr,
                             "optimizer": "Adam", "accountant": "prv", "noise": "os"},
                  "plain": {"epochs_max": args.plain_epochs, "early_stopping": "held-out 10%, patience 20",
                            "optimizer": "Adam", "lr": 1e-2},
                  "score": "LAC (1 - softmax_y), " + (
                      f"softmax(logits / T), T fitted per model on the {args.temperature_rows} temperature rows"
                      if args.temperature_rows else "no temperature scaling")},
        "accuracy": accuracy, "temperature": temperature, "models": models_seen,
        "dp_sgd_epsilon_spent_max": max(m["epsilon"] for m in private_models),
        "cells": table, "paper": PAPER,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\n{seconds:.0f} s; {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


def markdown(result: dict) -> str:
    lines = ["| model | calibration | coverage mean (sd) | min | set size mean (sd) | median | 90th pct | splits > 5 |",
             "|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        model = ("DP-SGD (8, 1e-5)" if c["model"] == "DP-SGD" else "non-private") + \
                f", accuracy {result['accuracy'][c['model']]:.3f}"
        cal = c["calibration"] if c["calibration"] != "private" else \
            f"private (epsilon {result['calibration_epsilon'][0]:g})"
        lines.append(f"| {model} | {cal} | {c['coverage_mean']:.4f} ({c['coverage_sd']:.4f}) | {c['coverage_min']:.3f} "
                     f"| {c['size_mean']:.3f} ({c['size_sd']:.3f}) | {c['size_median']:.3f} | {c['size_p90']:.3f} "
                     f"| {100 * c['share_size_over_5']:.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
