"""Quorum's command line: run scenarios, plan FedCP-QQ orders, validate files, start a site.

A thin layer over the Python API (the `quorum` package): each command parses its options,
calls the API and prints what it returns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from quorum.scenario import ScenarioError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Quorum: federated conformal prediction and statistics over ZeroMQ."""


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Run directory (default runs/NAME-TIMESTAMP).")
@click.option("--trials", type=click.IntRange(min=1), help="Override the scenario's number of trials.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a scenario field, e.g. --set sites.count=10 (repeatable).")
@click.option("--backend", type=click.Choice(["processes", "inprocess"]), default="processes",
              show_default=True, help="processes: site processes over ZeroMQ, in real time; inprocess: the same pump over an "
                   "in-memory transport, on a virtual clock (network time).")
@click.option("--keep-work", is_flag=True, help="Keep each trial's site shards and model under DIR/work.")
@click.option("--resume", is_flag=True, help="Continue the run in --out after its coordinator was killed.")
def run(scenario, out, trials, overrides, backend, keep_work, resume):
    """Run SCENARIO and write results.csv, summary.json, events.jsonl, ledger.csv, trace.json,
    timeline.png and the scenario as run."""
    import quorum
    import quorum.runs

    overrides = list(overrides) + ([f"trials={trials}"] if trials else [])
    spec = _load_or_exit(scenario, overrides)
    if resume and not out:
        raise click.UsageError("--resume needs the --out directory of the run to continue")
    try:
        quorum.runs.check_backend(spec, backend)
    except ScenarioError as exc:
        _print_problems(exc.in_file(scenario))
        sys.exit(2)
    out = Path(out) if out else quorum.runs.default_directory(spec.name)
    _run_with_progress(spec, out, lambda progress: quorum.run(
        spec, out, backend=backend, progress=progress, keep_work=keep_work, resume=resume))


@cli.command()
@click.option("--scenario", "scenario", required=True, type=click.Path(dir_okay=False))
@click.option("--bind", required=True, help="Where sites connect, e.g. tcp://0.0.0.0:5555.")
@click.option("--out", type=click.Path(file_okay=False), help="Run directory (default runs/NAME-TIMESTAMP).")
@click.option("--keys", "key_dir", type=click.Path(file_okay=False), help="Key directory (default DIR/keys, created).")
@click.option("--plain", is_flag=True, help="No CurveZMQ (debugging only).")
@click.option("--hello-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for every site to connect.")
@click.option("--trials", type=click.IntRange(min=1))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE")
@click.option("--resume", is_flag=True)
def coordinator(scenario, bind, out, key_dir, plain, hello_timeout, trials, overrides, resume):
    """Run the coordinator for sites started by hand (`run.py site`), e.g. on other hosts."""
    import quorum
    import quorum.runs

    overrides = list(overrides) + ([f"trials={trials}"] if trials else []) + [
        f"runtime.bind={bind}", f"runtime.deadlines.hello={hello_timeout}",
        f"runtime.security={'plain' if plain else 'curve'}"] + ([f"runtime.keys={key_dir}"] if key_dir else [])
    spec = _load_or_exit(scenario, overrides)
    out = Path(out) if out else quorum.runs.default_directory(spec.name)
    security = 'plain' if plain else 'CURVE, keys in ' + (key_dir or str(out / 'keys'))

    def listening(endpoint):  # the port actually bound when --bind ends in ':*'
        click.echo(f"listening at {endpoint} ({security}); waiting for {spec['sites']['count']} sites: "
                   f"run.py site --connect {endpoint.replace('0.0.0.0', 'THIS-HOST')} ...", err=True)
        sys.stderr.flush()
    _run_with_progress(spec, out, lambda progress: quorum.run(
        spec, out, progress=progress, resume=resume, external_sites=True, on_listening=listening))


def _run_with_progress(spec, out, start):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from quorum import RunDirectoryError
    from quorum.runs import ResumeError
    from runner.limits import MachineLimits
    from transport.kernel_links import KernelLinksUnavailable

    typed = spec.spec()
    spec = spec.to_dict()
    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(f"[bold]{spec['name']}[/]: {spec['sites']['count']} sites, {spec['trials']} trials, "
                  f"methods {', '.join(m['label'] for m in spec['methods'])} -> {out}")
    if typed.seeded_noise:
        console.print(f"[bold red]WARNING: {typed.noise}[/] (sites.policy.noise: seeded)")
    sessions = spec["trials"] * len(spec["methods"])
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("sessions", total=sessions)

        def progress(trial, label, row):
            bar.update(task, advance=1, description=f"trial {trial + 1}/{spec['trials']} {label:<12}")

        try:
            run = start(progress)
        except (ResumeError, RunDirectoryError, KernelLinksUnavailable, MachineLimits) as exc:
            raise click.ClickException(str(exc)) from None
    for shown in run.report():  # each result family's table, communication, sites, privacy, attacks
        console.print(shown)
    console.print(f"{run.summary['trials']} trials in {run.summary['seconds']:.1f} s; outputs in {out}/ "
                  f"(timeline: timeline.png, trace.json)")


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--grid", "grids", multiple=True, required=True, metavar="KEY=V1,V2,...",
              help="A swept field and its values (repeatable; the product is run).")
@click.option("--out", type=click.Path(file_okay=False), help="Sweep directory (default runs/NAME-sweep-TIMESTAMP).")
@click.option("--trials", type=click.IntRange(min=1), help="Override the scenario's number of trials.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Fixed overrides for every run.")
@click.option("--backend", type=click.Choice(["processes", "inprocess"]), default="processes", show_default=True)
def sweep(scenario, grids, out, trials, overrides, backend):
    """Run SCENARIO over the product of --grid values; write sweep.csv and cost/utility plots."""
    import quorum
    import quorum.runs

    overrides = list(overrides) + ([f"trials={trials}"] if trials else [])
    spec = _load_or_exit(scenario, overrides)
    out = Path(out) if out else quorum.runs.default_directory(spec.name, "sweep")
    try:
        rows = quorum.sweep(spec, list(grids), out, backend=backend,
                            progress=lambda i, n, label: click.echo(f"[{i}/{n}] {label}"))
    except ScenarioError as exc:
        _print_problems(exc)
        sys.exit(2)
    except quorum.RunDirectoryError as exc:
        raise click.ClickException(str(exc)) from None
    _print_sweep(rows)
    click.echo(f"{len(rows)} rows in {out}/sweep.csv; plots: " +
               ", ".join(sorted(p.name for p in out.glob("*.png"))))


def _print_sweep(rows) -> None:
    """The sweep's comparison (a table per result family)."""
    import quorum.runs
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 150)
    for table in quorum.runs.sweep_report(rows):
        console.print(table)


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The PNG file to write.")
def plot(runs, out):
    """Pool the results of several RUNS (e.g. one per data set) into one coverage and set-size
    box plot per method, one point per trial of each run (paper 000 figure 4)."""
    import quorum

    try:
        written, rows = quorum.pool_plot(list(runs), out)
    except (quorum.RunDirectoryError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{rows} rows from {len(runs)} run(s) -> {written}")


@cli.command()
@click.option("--alpha", type=float, required=True, help="Miscoverage level, in (0, 1).")
@click.option("--sites", "m", type=click.IntRange(min=1), help="Number of sites m (equal sizes, with --n).")
@click.option("--n", "n", type=click.IntRange(min=1), help="Calibration points per site (equal sizes).")
@click.option("--sizes", help="Comma-separated n_1,...,n_m for unequal sizes (instead of --sites/--n).")
@click.option("--optimize", is_flag=True, help="Choose every site's order (reports the paper rule's coverage too).")
@click.option("--dropouts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Plan so that any m - D answering sites still admit a valid k.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@click.option("--table", is_flag=True, help="Equal sizes: also give the full table M, indexed [ell-1][k-1].")
def plan(alpha, m, n, sizes, optimize, dropouts, as_json, table):
    """Orders (ell, k) of FedCP-QQ and their exact coverage (paper 000, eq. 5-6, appendix A.1).

    Equal sizes (--sites, --n): eq. 6. Unequal (--sizes): the paper's rule
    ell_j = ceil((1-alpha)(n_j+1)), or with --optimize per-site orders closest to 1 - alpha.
    """
    import quorum
    import quorum.runs

    if sizes is not None:
        try:
            sizes = [int(v) for v in sizes.split(",")]
        except ValueError:
            raise click.BadParameter("expected comma-separated integers", param_hint="--sizes") from None
    try:
        result = quorum.plan(alpha, m, n, sizes, optimize=optimize, dropouts=dropouts, table=table)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result))
        return
    _print_plan(result)


def _short_list(values: list, shown: int = 12) -> str:
    """All values when few; otherwise the first ones and how many more (--json has them all)."""
    if len(values) <= shown:
        return ",".join(map(str, values))
    return ",".join(map(str, values[:shown])) + f",... ({len(values) - shown} more; --json lists all)"


def _print_plan(result: dict) -> None:
    if result["ell"] is None:
        click.echo(result["reason"])
        return
    ell = result["ell"]
    ell_text = _short_list(ell) if isinstance(ell, list) else str(ell)
    where = (f"m={result['m']} n={result['n']}" if "n" in result
             else f"m={result['m']} sizes={_short_list(result.get('sizes') or [])}")
    click.echo(f"{where} alpha={result['alpha']} ({result['rule']}, dropouts={result['dropouts']}): "
               f"ell*={ell_text} k*={result['k']} coverage={result['coverage']:.12f}")
    if "coverage_paper_rule" in result:
        click.echo(f"paper rule: k={result['k_paper_rule']} coverage={result['coverage_paper_rule']}")
    if result.get("conditional"):
        c = result["conditional"]
        click.echo(f"theorem 3.3: with probability >= {1 - c['delta']:g}, miscoverage <= {c['miscoverage_bound']:.6f}")
    for row_index, row in enumerate(result.get("M", []), start=1):
        click.echo(f"ell={row_index:>4}: " + " ".join(f"{v:.4f}" for v in row))


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE")
def validate(scenario, overrides):
    """Check SCENARIO without running it; every problem is listed, not only the first."""
    spec = _load_or_exit(scenario, list(overrides)).to_dict()
    click.echo(f"{scenario}: OK ({spec['name']}: {spec['sites']['count']} sites, {spec['trials']} trials, "
               f"methods {', '.join(m['label'] for m in spec['methods'])})")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--network", "networks", multiple=True, required=True, metavar="PROFILE|FILE.yaml",
              help="A network to predict over (repeatable): a profile's name, every site on it (a preset such as "
                   "mobile-4g, or one of the scenario's own), or a YAML file of a `network:` section.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the table as CSV.")
def predict(run_dir, networks, as_csv):
    """How long each session of RUN_DIR would take over other networks, and the dropouts their
    deadlines would cause, replayed from the run's ledger: nothing runs again."""
    import quorum

    try:
        table = quorum.predict(run_dir, *networks)
    except (quorum.ScenarioError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_csv:
        click.echo(table.to_csv(index=False), nl=False)
        return
    from rich.console import Console
    from rich.table import Table

    shown = Table(title=f"Predicted session seconds (and dropouts) of {run_dir}")
    for column in table.columns:
        shown.add_column(str(column), justify="left" if column == "method" else "right")
    for row in table.itertuples(index=False):
        shown.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row])
    Console(width=None if sys.stdout.isatty() else 150).print(shown)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--trial", type=click.IntRange(min=0), help="The trial to draw (default: the first with a dropout, "
              "refusal or fault, else the first).")
@click.option("--out", type=click.Path(dir_okay=False), help="The PNG to write (default RUN_DIR/timeline.png).")
def timeline(run_dir, trial, out):
    """Rebuild RUN_DIR/trace.json (open it in ui.perfetto.dev or chrome://tracing) and draw one
    trial's timeline: sites against time, a bar per phase, dropouts, refusals and faults marked."""
    import quorum
    import quorum.runs

    try:
        png = quorum.open_run(run_dir).timeline(trial, out)
    except (quorum.RunDirectoryError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{png} and {Path(run_dir) / 'trace.json'}")


@cli.command()
@click.option("--connect", required=True, help="Coordinator endpoint, e.g. tcp://HOST:PORT.")
@click.option("--site-id", "site_ids", multiple=True, help="A site id, e.g. site-007 (repeatable).")
@click.option("--site-ids", "site_range", help="A range of site numbers, e.g. 0-9, or ids separated by commas.")
@click.option("--scenario", "scenario", type=click.Path(dir_okay=False),
              help="The scenario: sites build their own data from it and apply its faults.")
@click.option("--workdir", required=True, type=click.Path(file_okay=False),
              help="Where this host keeps its sites' data, models and logs.")
@click.option("--keys", "key_dir", type=click.Path(file_okay=False),
              help="Directory with coordinator.key and, for each site, SITE.key and SITE.key_secret.")
@click.option("--plain", is_flag=True, help="No CurveZMQ (debugging only).")
@click.option("--idle-timeout", type=float, default=3600.0, show_default=True,
              help="Exit after this many seconds without a message.")
@click.option("--sites-per-process", type=click.IntRange(min=1), default=None,
              help="Split the sites over processes of this many (default: one process for all).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, exists=True),
              help="This site operator's own policy and budget (YAML; docs/privacy.md): what the sites "
                   "serve, whatever the coordinator or the scenario asks. Default: the protective defaults "
                   "(epsilon 3 at delta 1e-6 per record in total), never the study's.")
@click.option("--accept-study-policy", is_flag=True,
              help="Serve the scenario's sites.policy and sites.budget instead (printed at start): the "
                   "operator accepts what the study asks for.")
@click.option("--registry", type=click.Path(dir_okay=False, exists=True),
              help="The operators' party registry (JSON, `run.py registry`): the shuffler's public key and "
                   "endpoint, which the sites trust from this file only (docs/shuffling.md).")
def site(connect, site_ids, site_range, scenario, workdir, key_dir, plain, idle_timeout, sites_per_process,
         policy_file, registry, accept_study_policy):
    """Run sites by hand, e.g. on a machine other than the coordinator's: one site host process
    serving all the sites named (--sites-per-process splits them over several)."""
    import quorum

    spec = _load_or_exit(scenario, []) if scenario else None
    ids = list(site_ids) + quorum.site_ids_of(site_range, spec["sites"]["count"] if spec else None)
    if not ids:
        raise click.UsageError("name the sites to run with --site-id or --site-ids")
    if not plain and not key_dir:
        raise click.UsageError("CURVE needs --keys (or --plain for debugging)")
    from quorum.hosting import describe_site_policy, site_policy

    try:
        policy, budget, source = site_policy(policy_file, spec, accept_study_policy)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except ScenarioError as exc:
        _print_problems(exc)
        sys.exit(2)
    click.echo(f"site policy enforced ({source}):")
    for line in describe_site_policy(policy, budget):
        click.echo(f"  {line}")
    try:
        hosts = quorum.serve_sites(connect, ids, workdir, scenario=spec, key_dir=None if plain else key_dir,
                                   idle_timeout=idle_timeout, sites_per_process=sites_per_process,
                                   policy_file=policy_file, registry=registry,
                                   accept_study_policy=accept_study_policy)
    except ScenarioError as exc:
        _print_problems(exc)
        sys.exit(2)
    click.echo(f"started {len(ids)} site(s) in {len(hosts.processes)} process(es) -> {connect}; "
               f"logs in {Path(workdir) / 'logs'}")
    for process in hosts.processes.values():
        process.join()
    codes = hosts.exit_codes()
    click.echo("exit codes: " + ", ".join(f"{site}={code}" for site, code in codes.items()))
    sys.exit(0 if all(code == 0 for code in codes.values()) else 1)


@cli.command()
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False))
@click.option("--scenario", "scenario", type=click.Path(dir_okay=False), help="Create keys for its sites.")
@click.option("--sites", type=click.IntRange(min=1), help="Or: for this many sites (site-000 ...).")
@click.option("--coordinator", "coordinator_only", is_flag=True,
              help="Only the coordinator's key pair: the coordinator's host.")
@click.option("--shuffler", "shuffler_only", is_flag=True, help="Only the shuffler's key pair: the shuffler's host.")
@click.option("--site-ids", "site_range", help="Only these sites' key pairs (e.g. 0-9): a site host's own.")
@click.option("--coordinator-key", type=click.Path(dir_okay=False, exists=True),
              help="With --site-ids: the coordinator's public key file to copy in (coordinator.key).")
def keys(directory, scenario, sites, coordinator_only, shuffler_only, site_range, coordinator_key):
    """Create CurveZMQ key pairs. Split across hosts (no party holds another's secret key): the
    coordinator's host runs --coordinator, the shuffler's --shuffler, each site host --site-ids
    for its own sites and sends the public SITE.key files to the coordinator's key directory.
    --scenario or --sites makes every pair in one directory (one machine, or tests: whoever holds
    it holds every secret)."""
    import quorum

    ids = quorum.site_ids_of(site_range)
    count = _load_or_exit(scenario, [])["sites"]["count"] if scenario else sites
    if not (coordinator_only or shuffler_only or ids or count):
        raise click.UsageError("give --scenario or --sites (every pair here), --coordinator, --shuffler or --site-ids")
    try:
        click.echo(quorum.make_keys(directory, sites=count, coordinator_only=coordinator_only, site_ids=ids,
                                    coordinator_key=coordinator_key, shuffler_only=shuffler_only))
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.option("--keys", "key_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The public keys the parties sent: coordinator.key, shuffler.key, SITE.key.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The registry file to write (JSON).")
@click.option("--shuffler-endpoint", help="Where the sites reach the shuffler, e.g. tcp://HOST:5600.")
def registry(key_dir, out, shuffler_endpoint):
    """Write the party registry: every party's public key, given to every party (--registry FILE),
    which takes its peers' keys from it and from nowhere else (docs/shuffling.md)."""
    import quorum

    try:
        click.echo(quorum.make_registry(key_dir, out, shuffler_endpoint=shuffler_endpoint))
    except ScenarioError as exc:
        _print_problems(exc)
        sys.exit(2)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.option("--connect", required=True, help="Coordinator endpoint, e.g. tcp://HOST:PORT.")
@click.option("--bind", required=True, help="Where the sites send sealed messages, e.g. tcp://0.0.0.0:5600.")
@click.option("--workdir", required=True, type=click.Path(file_okay=False), help="Where its log goes (logs/).")
@click.option("--keys", "key_dir", type=click.Path(file_okay=False),
              help="The shuffler's own key directory (shuffler.key_secret: run.py keys --shuffler).")
@click.option("--registry", type=click.Path(dir_okay=False, exists=True),
              help="The operators' party registry: the sites it admits, the coordinator's key.")
@click.option("--plain", is_flag=True, help="No CurveZMQ (debugging only).")
@click.option("--idle-timeout", type=float, default=3600.0, show_default=True,
              help="Exit after this many seconds without a message from the coordinator.")
def shuffler(connect, bind, workdir, key_dir, registry, plain, idle_timeout):
    """Run the shuffler by hand, as a party of its own (its operator's host and keys)."""
    import quorum

    if not plain and not (key_dir and registry):
        raise click.UsageError("CURVE needs --keys and --registry (or --plain for debugging)")
    try:
        shuffler = quorum.serve_shuffler(connect, bind, workdir, key_dir=None if plain else key_dir,
                                         registry=registry, idle_timeout=idle_timeout)
    except ScenarioError as exc:
        _print_problems(exc)
        sys.exit(2)
    except (OSError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"shuffler serving at {shuffler.endpoint} -> {connect}; log in {Path(workdir) / 'logs'}")
    shuffler.process.join()
    sys.exit(shuffler.process.exitcode)


@cli.group()
def new() -> None:
    """Start a plugin package from a working template (docs/plugins.md)."""


@new.command("method")
@click.argument("name")
@click.option("--dir", "parent", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Where to create the folder quorum-NAME.")
def new_method(name, parent):
    """Write quorum-NAME/: a method NAME with its codec, a scenario and tests that pass."""
    from quorum.scaffold import ScaffoldError, new_method as scaffold

    try:
        folder = scaffold(name, parent)
    except ScaffoldError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(f"wrote {folder}/ (method {name}); try:\n"
               f"  PYTHONPATH={folder} {Path(sys.executable).name} -m pytest -q {folder}/tests\n"
               f"  PYTHONPATH={folder} python run.py run {folder}/scenario.yaml")


def _load_or_exit(path, overrides):
    """The scenario at `path` with `--set` overrides; every problem printed and exit 2 if any."""
    import warnings

    from quorum import load_scenario

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # printed below, as notes
            scenario = load_scenario(path, overrides)
    except ScenarioError as exc:
        _print_problems(exc)
        sys.exit(2)
    for note in scenario.skipped:
        click.echo(f"note: {note}", err=True)
    return scenario


def _print_problems(exc: ScenarioError) -> None:
    problems = exc.problems
    if len(problems) > 1:
        click.echo(f"error: {len(problems)} problems:", err=True)
    for problem in problems:
        click.echo(f"error: {problem}", err=True)


def main() -> None:
    """The `quorum` console command of an installed Quorum (`python run.py` in a checkout)."""
    cli()
