"""Command line: deploy · plan · validate · list · verify · promote · prune · compare · serve · schema.
Exit codes: 0 signed off / up to date, 1 sign-off failed (compare: a regression beyond the budget), 2 user
error (one line per problem on stderr), 3 internal error (traceback). With --json, one JSON document goes to
stdout and the human display to stderr."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from pipeline import __version__
from pipeline.core.errors import PipelineError

Result = tuple[int, dict[str, Any] | None]  # exit code, JSON document (for --json)


class _Parser(argparse.ArgumentParser):
    """argparse, plus "did you mean" for a mistyped subcommand (exit 2 as before)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(2))
            close = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else f" (commands: {', '.join(choices)})"
            message = f"unknown command '{match.group(1)}'{hint}"
        super().error(message)


def _recipe_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("recipe", help="a recipe path, or a name under recipes/")
    cmd.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one recipe key (value parsed as YAML); repeatable",
    )


def _json_argument(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--json", action="store_true", help="one JSON document on stdout; the human display goes to stderr"
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m pipeline", description=__doc__)
    parser.add_argument("--version", action="version", version=f"deploy-pipeline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("deploy", "export, validate, benchmark, select and sign off a new version"),
        ("plan", "print each stage as fresh or stale, and why"),
        ("validate", "check the recipe and this machine (schema and pre-flight), nothing else"),
        ("list", "list the versions of a recipe"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        _recipe_arguments(cmd)
        _json_argument(cmd)
        if name in ("deploy", "plan"):
            cmd.add_argument(
                "--rebench",
                action="store_true",
                help="measure again: deploy then makes a new version (plan only says what would run)",
            )
            cmd.add_argument(
                "--retry-failed", action="store_true", help="run variants that failed before again"
            )
        if name == "deploy":
            cmd.add_argument(
                "-q", "--quiet", action="store_true", help="the result lines only: no progress, no table"
            )
            cmd.add_argument(
                "-v", "--verbose", action="store_true", help="every message a stage reports, on its own line"
            )
            cmd.add_argument(
                "--promote",
                action="store_true",
                help="make this version latest even though --set changes the recipe (a candidate otherwise)",
            )
    _add_verify(sub)
    prune = sub.add_parser(
        "prune", help="remove old versions: all but the N newest, the promoted ones and latest"
    )
    _recipe_arguments(prune)
    prune.add_argument("--keep", type=int, required=True, metavar="N", help="the newest versions to keep")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    _json_argument(prune)
    promote = sub.add_parser(
        "promote", help="make a signed-off version latest (a candidate, or an older one)"
    )
    _recipe_arguments(promote)
    promote.add_argument("version", help="vNNNN")
    _json_argument(promote)
    compare = sub.add_parser("compare", help="compare two versions: speed, accuracy, environment")
    compare.add_argument("a", help="baseline: vNNNN, latest, NAME/vNNNN or a version folder")
    compare.add_argument("b", help="candidate: same forms as A")
    compare.add_argument(
        "--recipe", help="recipe whose store holds bare version names (default: ./artifacts)"
    )
    _json_argument(compare)
    _add_serve(sub)
    fleet = sub.add_parser(
        "fleet", help="deploy many recipes on many targets (CPU, GPU types) as Ray tasks, into one store"
    )
    fleet.add_argument("fleet", help="the fleet file (recipes, targets, the shared store's root)")
    _json_argument(fleet)
    schema = sub.add_parser("schema", help="print the recipe's JSON Schema (for editors)")
    schema.add_argument("--output", metavar="FILE", help="write it to FILE instead of stdout")
    return parser


def _add_verify(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "verify", help="re-hash a version against its manifest (exit 0 intact, 1 damaged: files listed)"
    )
    cmd.add_argument(
        "recipe",
        help="a recipe path, or a name under recipes/ (names the output root and name); or a version folder "
        "(a copy too), or the recipe.yaml inside one: that folder is verified",
    )
    cmd.add_argument("version", nargs="?", default="latest", help="vNNNN or latest (default)")
    cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    _json_argument(cmd)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "serve", help="serve a version's winner behind a Triton server (PyTriton): HTTP and gRPC on localhost"
    )
    _recipe_arguments(cmd)
    cmd.add_argument("version", nargs="?", default="latest", help="vNNNN or latest (default)")
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        cmd.add_argument(f"--{name}-port", type=int, default=port, help=f"default {port}; 0: any free port")


def _serve(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.release.serve import serve

    loaded = _load(args)
    ports = (args.http_port, args.grpc_port, args.metrics_port)
    say = lambda line: console.print(line, highlight=False, soft_wrap=True)  # noqa: E731
    return serve(loaded.recipe, args.version, ports, say), None


def _verify(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.core.errors import Problem
    from pipeline.release.store import MANIFEST, VERSION_RE, Store

    given = Path(args.recipe)
    copied = given.parent if given.name == "recipe.yaml" else given  # a version's own recipe names its folder
    if args.version == "latest" and (copied / MANIFEST).is_file() and not args.overrides:
        return _verified(copied, str(copied), console)
    loaded = _load(args)
    store = Store(Path(loaded.recipe.output.root), loaded.recipe.name)
    if args.version == "latest":
        folder = store.latest()
        if folder is None:
            raise PipelineError(
                problems=[Problem(str(store.base / "latest"), "", "no signed-off version to verify")]
            )
    else:
        folder = store.base / args.version
        if not VERSION_RE.match(args.version) or not folder.is_dir():
            known = ", ".join(store.versions()) or "none"
            raise PipelineError(problems=[Problem(str(folder), "", f"no such version (versions: {known})")])
    return _verified(folder, f"{loaded.recipe.name}/{folder.name}", console)


def _verified(folder: Path, shown: str, console: Console) -> Result:
    from pipeline.release.store import verify_folder
    from pipeline.release.triton import config_problems

    damage = verify_folder(folder) + config_problems(folder)
    for line in damage:
        console.print(f"damaged: {shown}/{line}", highlight=False, soft_wrap=True)
    if damage:
        console.print(f"{shown}: {len(damage)} damaged file(s)", highlight=False)
    else:
        console.print(f"ok: {shown} matches its manifest", highlight=False)
    return (1 if damage else 0), {"version": folder.name, "path": str(folder), "damaged": damage}


def _load(args: argparse.Namespace, defer: bool = False):
    """defer: leave cross-field problems to the pre-flight check, which reports them with its own."""
    from pipeline.recipe.loader import load, resolve_recipe_path

    return load(resolve_recipe_path(args.recipe), args.overrides, defer_cross_field=defer)


def _validate(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.check.gates import gate_rows, undetermined
    from pipeline.preflight import checks as preflight
    from pipeline.release.manifest import resolved_recipe

    loaded = _load(args, defer=True)
    kinds = preflight.check(loaded)  # each output's kind, from pre-flight's run of the model
    gates = gate_rows(loaded.recipe, kinds)
    console.print(_gate_table(gates))
    unknown = undetermined(gates)
    if unknown:
        console.print(
            f"the gates of {', '.join(unknown)} depend on their dtype and shape, which no run of the model told: "
            "integer outputs gate max_abs = 0 (exact) and one value per sample gates max_abs ≤ "
            "sqrt(1/cosine² - 1) × spread, cosine informational in both",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"{loaded.path}: ok", highlight=False)
    resolved = resolved_recipe(loaded)
    return 0, {"recipe": str(loaded.path), "name": loaded.recipe.name, "resolved": resolved, "gates": gates}


def _gate_table(gates: list[dict[str, Any]]) -> Any:
    """The accuracy gates every artifact is judged by, per precision and output, as the deploy applies them
    (scale: max(1, |reference|); spread: the output's standard deviation over the held-out samples)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Accuracy gates (what fails an artifact)", title_justify="left")
    for column in ("precision", "output", "gates", "informational"):
        table.add_column(column, overflow="fold")
    for row in gates:
        kind = row["kind"] if row["kind"] in ("integer", "one value per sample") else None
        output = f"{row['output']} ({kind})" if kind else row["output"]
        table.add_row(
            *(Text(cell) for cell in (row["precision"], output, row["text"], row["informational_text"]))
        )
    return table


def _list(args: argparse.Namespace, console: Console) -> Result:
    """Every version with its verdict, each verified against its manifest first: a damaged version is marked
    damaged (with why), never shown as signed off, whatever its files say."""
    from pipeline.core.stored import Damaged, read_stored
    from pipeline.release.disk import usage
    from pipeline.release.promotion import promoted_versions
    from pipeline.release.store import Store, verify_folder

    loaded = _load(args)
    store = Store(Path(loaded.recipe.output.root), loaded.recipe.name)
    latest = store.latest()
    promoted = promoted_versions(store)
    rows = []
    for version in store.versions():
        folder = store.base / version
        damage = verify_folder(folder)
        disk = usage(folder)
        try:
            manifest = (read_stored(folder / "manifest.json") or {}) if not damage else {}
            winner = read_stored(folder / "winner.json") if not damage else None
        except Damaged as exc:
            damage, manifest, winner = [str(exc)], {}, None
        rows.append(
            {
                "version": version,
                "path": str(folder.resolve()),
                "created": manifest.get("created"),
                "signed_off": bool(manifest.get("signed_off")),
                "headline": manifest.get("headline") if not damage else None,
                "failed": manifest.get("failed") or [],
                "provisional": bool(manifest.get("provisional")),
                "winner": winner["artifact"] if winner else None,
                "latest": bool(latest and latest.name == version),
                "candidate": bool(manifest.get("recipe_changes")),
                "recipe_changes": manifest.get("recipe_changes") or [],
                "overrides": manifest.get("overrides") or [],
                "promoted": version in promoted,
                "bytes": disk.total,
                "own_bytes": disk.own,  # what removing it frees: the rest is shared copy-on-write
                "shared_bytes": disk.shared,
                "damaged": damage,
            }
        )
        if damage:
            state = f"DAMAGED ({len(damage)}: {damage[0][:60]})"
        else:
            state = rows[-1]["headline"] or ("signed off" if rows[-1]["signed_off"] else "NOT signed off")
        own = f", {disk.own / 1e6:.1f} MB own" if disk.own is not None and disk.shared else ""
        console.print(
            f"{version}  {manifest.get('created', '?')}  {state:<32}  {disk.total / 1e6:>6.0f} MB{own}  "
            f"winner {winner['artifact'] if winner else '-'}{_release_marks(rows[-1])}",
            highlight=False,
            soft_wrap=True,
        )
    if not rows:
        console.print(f"no versions yet in {store.base}", highlight=False)
    elif len(rows) > 1 and not any(r["shared_bytes"] for r in rows):
        console.print(
            "each version is a full copy: this file system cannot share bytes copy-on-write (XFS and btrfs "
            "do: there versions share unchanged artifacts, and a write through one never reaches another)",
            highlight=False,
        )
    doc = {"name": loaded.recipe.name, "store": str(store.base.resolve()), "versions": rows}
    return 0, {**doc, "latest": latest.name if latest else None}


def _release_marks(row: dict[str, Any]) -> str:
    """latest, promoted (on purpose), candidate (with the keys its --set changes), the overrides given."""
    marks = ["latest"] if row["latest"] else []
    if row["promoted"] and not row["latest"]:
        marks.append("promoted")
    if row["candidate"]:
        marks.append(f"candidate: --set changes {', '.join(row['recipe_changes'])}")
    shown = [o for o in row["overrides"] if not o.startswith(("output.", "tracking."))]
    if shown and not row["candidate"]:
        marks.append(f"--set {' '.join(shown)}")
    return f" ({'; '.join(marks)})" if marks else ""


def _plan(args: argparse.Namespace, console: Console) -> Result:
    loaded = _load(args, defer=True)  # a recipe's error is said before torch is imported (about 2 s)
    from pipeline.run import deploy

    verdicts = deploy.plan(loaded, console, rebench=args.rebench, retry_failed=args.retry_failed)
    stages = [{"name": stage.name, "fresh": verdict.fresh, "why": verdict.why} for stage, verdict in verdicts]
    return 0, {"name": loaded.recipe.name, "stages": stages}


def _deploy(args: argparse.Namespace, console: Console) -> Result:
    loaded = _load(args, defer=True)  # a recipe's error is said before torch is imported (about 2 s)
    from pipeline.run import deploy

    display = deploy.Display(_progress_console(args), args.quiet, args.verbose)
    outcome = _settled(
        deploy.run_deploy(loaded, console, args.rebench, args.retry_failed, args.promote, display)
    )
    return outcome.exit_code, outcome.document(loaded.recipe.name)


def _settled(outcome: Any) -> Any:
    """A deploy's exit code is trusted only from an Outcome that names an existing version: the one it
    published, or the one it found up to date. A deploy that returned anything else is a bug (exit 3 with
    this message), never an exit 0 that nothing backs."""
    from pipeline.run.deploy import Outcome

    if not isinstance(outcome, Outcome):
        raise RuntimeError(
            f"the deploy returned {type(outcome).__name__} without publishing a version or saying up to date"
        )
    if not outcome.version.is_dir():
        raise RuntimeError(f"the deploy's outcome names {outcome.version}, which is no version folder")
    return outcome


def _promote(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.release.promotion import promote
    from pipeline.release.store import Store

    loaded = _load(args)
    store = Store(Path(loaded.recipe.output.root), loaded.recipe.name)
    before, folder = promote(store, args.version, loaded.recipe.output.lock_timeout_s)
    name = loaded.recipe.name
    if before == args.version:
        console.print(f"{name}/latest is already {args.version}", highlight=False)
    else:
        console.print(f"promoted: {name}/latest -> {args.version} (was {before or 'none'})", highlight=False)
    return 0, {"name": name, "latest": args.version, "previous": before, "path": str(folder.resolve())}


def _prune(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.core.errors import Problem
    from pipeline.release.prune import prune
    from pipeline.release.store import Store

    if args.keep < 0:
        raise PipelineError(problems=[Problem("--keep", "", f"must be 0 or more (got {args.keep})")])
    loaded = _load(args)
    store = Store(Path(loaded.recipe.output.root), loaded.recipe.name)
    done = prune(store, args.keep, loaded.recipe.output.lock_timeout_s, args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    name = loaded.recipe.name
    removed = ", ".join(done.removed) or "no version"
    console.print(
        f"{verb} {removed} and {done.cache_entries} cache entries: {done.freed_bytes / 1e6:.1f} MB",
        highlight=False,
    )
    kept = ", ".join(f"{v} ({why})" for v, why in sorted(done.kept.items()))
    console.print(f"kept {kept or 'nothing'} of {name}", highlight=False)
    return 0, {
        "name": name,
        "removed": done.removed,
        "kept": done.kept,
        "cache_entries": done.cache_entries,
        "freed_bytes": done.freed_bytes,
        "dry_run": args.dry_run,
    }


def _compare(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.release.compare import compare_command

    return compare_command(args.a, args.b, args.recipe, console)


def _fleet(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.fleet.driver import run_fleet

    outcome = run_fleet(Path(args.fleet), _progress_console(args))
    verdict = "every deploy signed off" if outcome.exit_code == 0 else "not every deploy signed off"
    console.print(
        f"fleet {outcome.report.name}: {verdict}; report: {outcome.paths['markdown']}", highlight=False
    )
    return outcome.exit_code, outcome.report.to_json() | {"report": outcome.paths}


def _schema(args: argparse.Namespace, console: Console) -> Result:
    from pipeline.recipe.json_schema import schema_text
    from pipeline.runners.registry import runtimes

    text = schema_text(list(runtimes()))
    if args.output:
        Path(args.output).write_text(text)
        console.print(f"wrote {args.output}", highlight=False)
    else:
        sys.stdout.write(text)
    return 0, None


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], Result]] = {
    "deploy": _deploy,
    "plan": _plan,
    "validate": _validate,
    "list": _list,
    "verify": _verify,
    "promote": _promote,
    "prune": _prune,
    "compare": _compare,
    "serve": _serve,
    "fleet": _fleet,
    "schema": _schema,
}


class _Display(Console):
    """A console whose reader may leave: `plan | head -3` closes the pipe, and the command goes on (a deploy
    still publishes) with the rest of its display dropped, instead of dying mid-way on the closed pipe.

    Text is printed as it is, not read as Rich markup: what it prints holds recipe values, paths and errors,
    and markup ate a list value (`[onnx-fp32]`) from `compare` and `[tensorrt-rtx]` from a failure's advice.
    A line with colour asks for markup and escapes what it quotes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
            os.close(devnull)


def _progress_console(args: argparse.Namespace) -> Console:
    """A deploy's progress goes to stderr, the result to stdout (with --json both are on stderr already)."""
    return _Display(file=sys.stderr) if sys.stderr.isatty() else _Display(file=sys.stderr, width=120)


def _console(as_json: bool) -> Console:
    """Bound to the real stream now: stages redirect sys.stdout into their logs while they run, and a console
    that looked sys.stdout up at each write would draw the live display into those logs."""
    stream = sys.stderr if as_json else sys.stdout
    return (
        _Display(file=stream) if stream.isatty() else _Display(file=stream, width=120)
    )  # logs, CI: no wrapping


def _emit(
    stream: TextIO,
    args: argparse.Namespace,
    code: int,
    doc: dict[str, Any] | None,
    errors: list[str],
    problems: list[dict[str, Any]],
) -> None:
    """`errors`: the lines printed on stderr; `problems`: the same, located (Problem.located), where the
    error came with places."""
    payload = {"command": args.command, "exit_code": code, **(doc or {})}
    if errors:
        payload["errors"] = errors
    if problems:
        payload["problems"] = problems
    stream.write(json.dumps(payload, indent=2, default=str) + "\n")


INTERRUPTED = "interrupted: nothing was published (the work folder may be resumed by the next deploy)"
BUG = "internal error: this is a bug in the pipeline (exit 3)"


def main(argv: list[str] | None = None) -> int:
    from pipeline.core.json_stdout import json_stdout
    from pipeline.core.user_code import interrupts_watched
    from pipeline.preflight.model_child import allow_fork

    allow_fork()
    _import_from_the_working_folder()

    args = _parser().parse_args(argv)
    as_json = getattr(args, "json", False)
    with json_stdout(as_json) as stdout, interrupts_watched():
        code, doc, errors, problems = _run(args, _console(as_json))
        if as_json:
            _emit(stdout, args, code, doc, errors, problems)
    return code


def _import_from_the_working_folder() -> None:
    """A model's module is importable from the folder the tool runs in, as the README says, whichever way the
    tool was started: `python -m pipeline` puts that folder first on the import path, the installed
    `deploy-pipeline` script does not put it there at all. It goes last, so that the script still runs the
    installed tool beside a user's own pipeline.py."""
    from pipeline.core.packages import on_import_path

    here = os.path.realpath(os.getcwd())
    if not on_import_path(here):
        sys.path.append(here)


def _run(
    args: argparse.Namespace, console: Console
) -> tuple[int, dict[str, Any] | None, list[str], list[dict[str, Any]]]:
    """The command's exit code, JSON document and error lines. Whatever ends it, it ends here with a message:
    a user error (2), a Ctrl-C (130), or a bug (3), which includes a sys.exit or a KeyboardInterrupt that no
    boundary around the model's code turned into that code's failure (pipeline/core/user_code.py)."""
    from pipeline.core.user_code import interrupted_by_signal

    try:
        code, doc = COMMANDS[args.command](args, console)
    except PipelineError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return exc.exit_code, None, exc.lines(), [p.located() for p in exc.problems[:20]]
    except KeyboardInterrupt:
        if not interrupted_by_signal():
            return _bug(f"KeyboardInterrupt raised during `{args.command}` without a Ctrl-C")
        print(INTERRUPTED, file=sys.stderr)
        return 130, None, [INTERRUPTED], []
    except SystemExit as exc:
        return _bug(f"sys.exit({'' if exc.code is None else repr(exc.code)}) called during `{args.command}`")
    except Exception:  # noqa: BLE001 - the top-level boundary: a bug, shown with its traceback
        return _bug(None)
    return code, doc, [], []


def _bug(what: str | None) -> tuple[int, None, list[str], list[dict[str, Any]]]:
    traceback.print_exc()
    lines = [f"internal error: {what}: the command did not finish (exit 3)"] if what else []
    lines.append(BUG)
    for line in lines:
        print(line, file=sys.stderr)
    return 3, None, lines, []
