"""What each site spent of its privacy budget: privacy.csv and the summary's `privacy` section.

Read from the sites' own accounts (sites.storage.read_account; protocol.accounting), never from
what the coordinator asked: a refused request spent nothing, a K-anonymous table sent again
unchanged spent nothing new.

privacy.csv, one row per site and method label, then one `total` row per site:
    site, method, releases (answers that released something), reused (K-anonymous tables sent
    again unchanged), refused (requests the budget refused), non_private (answers with no formal
    privacy), kanon_tables (distinct K-anonymous tables), epsilon_basic / delta_basic (sums,
    basic composition), epsilon_composed (the budget's composition rule at its delta), scope,
    noise ("os": privacy noise from the OS CSPRNG; otherwise the words saying that the releases
    replay from the scenario seed and are not private, protocol.noise.NOT_PRIVATE).
Under scope `records` every row gives the worst record: the releases one of the site's records
went into (their basic sums and their composition), whatever trial they came in; under scope
`dataset`, the whole run.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from runner.outputs import csv_cell
from protocol.accounting import Budget, SiteAccount, basic_composition
from protocol.noise import NOT_PRIVATE
from protocol.sessions import method_session
from sites.storage import AccountCorrupt, account_path, read_account

COLUMNS = ["site", "method", "releases", "reused", "refused", "non_private", "kanon_tables", "epsilon_basic",
           "delta_basic", "epsilon_composed", "composition", "delta", "scope", "noise"]


def session_labels(labels: list[str], trials: int) -> dict[int, str]:
    return {method_session(t, i): label for t in range(trials) for i, label in enumerate(labels)}


def privacy_rows(accounts: dict[str, SiteAccount], labels: dict[int, str]) -> list[dict]:
    rows = []
    for site, account in sorted(accounts.items()):
        by_method = defaultdict(list)
        for record in account.records:
            by_method[labels.get(record["session"], record["method"])].append(record)
        for method, records in sorted(by_method.items()):
            rows.append({"site": site, "method": method, **_counts(account, records)})
        rows.append({"site": site, "method": "total", **_counts(account, account.records)})
    return rows


def _counts(account: SiteAccount, records: list[dict]) -> dict:
    histories = account.histories(records)
    worst = [basic_composition(e, account.budget.delta) for e in histories]
    eps, delta = max((e for e, _ in worst), default=0.0), max((d for _, d in worst), default=0.0)
    composed = max((account.composed(e) for e in histories), default=0.0)
    return {"releases": sum(r["kind"] != "refused" and not r["reused"] for r in records),
            "reused": sum(bool(r["reused"]) for r in records),
            "refused": sum(r["kind"] == "refused" for r in records),
            "non_private": sum(r["kind"] == "none" for r in records),
            "kanon_tables": len({(r["data"], r["key"]) for r in records if r["kind"] == "kanon"}),
            "epsilon_basic": eps, "delta_basic": delta, "epsilon_composed": composed,
            "composition": account.budget.composition, "delta": account.budget.delta,
            "scope": account.budget.scope,
            "noise": NOT_PRIVATE if any(r.get("noise") == "seeded" for r in records) else "os"}


def read_accounts(workdir: Path, site_ids: list[str], budget: Budget) -> dict[str, SiteAccount]:
    """The accounts the sites left on this host's storage (sites elsewhere keep theirs); one that
    cannot be read whole is left out of the report (its site refuses to serve: sites.storage)."""
    accounts = {}
    for site in site_ids:
        if account_path(workdir, site).exists():
            try:
                accounts[site] = SiteAccount(budget, read_account(workdir, site))
            except AccountCorrupt:
                continue
    return accounts


def write_privacy(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: csv_cell(row[k]) for k in COLUMNS})


def privacy_summary(rows: list[dict], budget: Budget, seeded: bool = False) -> dict:
    """The summary's `privacy` section: the budget, and over sites the largest spend and counts;
    `noise` says where the privacy noise came from, with a `warning` when it was seeded (the
    scenario's policy said so, or a site's account did)."""
    totals = [r for r in rows if r["method"] == "total"]
    seeded = seeded or any(r["noise"] != "os" for r in totals)
    noise = {"noise": "seeded", "warning": NOT_PRIVATE} if seeded else {"noise": "os"}
    finite = [r["epsilon_composed"] for r in totals if math.isfinite(r["epsilon_composed"])]
    return {"budget": {"scope": budget.scope, "epsilon": budget.epsilon, "delta": budget.delta,
                       "composition": budget.composition, "kanon_releases": budget.kanon_releases},
            "sites_reported": len(totals),
            "epsilon_composed_max": max(finite, default=None) if len(finite) == len(totals) else "inf",
            "epsilon_basic_max": max((r["epsilon_basic"] for r in totals), default=None),
            "refused": sum(r["refused"] for r in totals), "reused": sum(r["reused"] for r in totals),
            "kanon_tables_max": max((r["kanon_tables"] for r in totals), default=0),
            "non_private_max": max((r["non_private"] for r in totals), default=0), **noise,
            "averaged_over": {"epsilon_composed_max": f"the largest over the {len(totals)} sites that reported, of each "
                                                      f"site's spend composed over its {budget.scope} scope",
                              "refused": "a sum over the sites", "reused": "a sum over the sites",
                              "non_private_max": "the largest over the sites"}}


def privacy_line(section: dict) -> str:
    """One line for the terminal: the most any site spent, and what its budget refused or reused."""
    b = section["budget"]
    limit = "no limit" if b["epsilon"] is None else f"budget {b['epsilon']:g}"
    per = "over the run" if b["scope"] == "dataset" else "per record"
    text = (f"privacy: each site spent at most epsilon {_fmt(section['epsilon_composed_max'])} "
            f"({b['composition']} at delta {b['delta']:g}, {per}; {limit})")
    if section["non_private_max"]:
        text += f", and up to {section['non_private_max']} answers with no formal privacy (raw values)"
    if section["kanon_tables_max"]:
        text += f", {section['kanon_tables_max']} K-anonymous table(s)"
    if section["refused"] or section["reused"]:
        text += f"; {section['refused']} requests refused, {section['reused']} tables sent again unchanged"
    text += " (privacy.csv)"
    if section.get("noise") == "seeded":
        text = f"WARNING: {section['warning']}\n" + text
    return text


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
