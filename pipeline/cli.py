"""Command line: deploy · plan · validate · list · verify. Exit codes: 0 signed off / up to date, 1 sign-off failed,
2 user error (one line per problem on stderr), 3 internal error (traceback)."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from rich.console import Console

from pipeline.errors import PipelineError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("deploy", "export, validate, benchmark, select and sign off a new version"),
        ("plan", "print each stage as fresh or stale, and why"),
        ("validate", "check the recipe and this machine (schema and pre-flight), nothing else"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("recipe", help="a recipe path, or a name under recipes/")
        cmd.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one recipe key (value parsed as YAML); repeatable",
        )
        if name in ("deploy", "plan"):
            cmd.add_argument("--rebench", action="store_true", help="measure again (makes a new version)")
            cmd.add_argument(
                "--retry-failed", action="store_true", help="run variants that failed before again"
            )
    listing = sub.add_parser("list", help="list the versions of a recipe")
    listing.add_argument("recipe")
    listing.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    _add_verify(sub)
    return parser


def _add_verify(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "verify", help="re-hash a version against its manifest (exit 0 intact, 1 damaged: files listed)"
    )
    cmd.add_argument(
        "recipe", help="a recipe path, or a name under recipes/ (names the output root and name)"
    )
    cmd.add_argument("version", nargs="?", default="latest", help="vNNNN or latest (default)")
    cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")


def _verify(args: argparse.Namespace, console: Console) -> int:
    from pipeline.errors import Problem
    from pipeline.store import VERSION_RE, Store

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
    damage = store.verify(folder)
    shown = f"{loaded.recipe.name}/{folder.name}"
    for line in damage:
        console.print(f"damaged: {shown}/{line}", highlight=False, soft_wrap=True)
    if damage:
        console.print(f"{shown}: {len(damage)} damaged file(s)", highlight=False)
        return 1
    console.print(f"ok: {shown} matches its manifest", highlight=False)
    return 0


def _load(args: argparse.Namespace, defer: bool = False):
    """defer: leave cross-field problems to the pre-flight check, which reports them with its own."""
    from pipeline.recipe_loader import load, resolve_recipe_path

    return load(resolve_recipe_path(args.recipe), args.overrides, defer_cross_field=defer)


def _list(args: argparse.Namespace, console: Console) -> int:
    from pipeline.store import Store, read_json

    loaded = _load(args)
    store = Store(Path(loaded.recipe.output.root), loaded.recipe.name)
    latest = store.latest()
    for version in store.versions():
        manifest_path = store.base / version / "manifest.json"
        manifest = read_json(manifest_path) or {}
        winner = (read_json(store.base / version / "winner.json") or {}).get("artifact", "-")
        mark = " (latest)" if latest and latest.name == version else ""
        state = manifest.get("headline") or ("signed off" if manifest.get("signed_off") else "NOT signed off")
        console.print(
            f"{version}  {manifest.get('created', '?')}  {state:<32}  winner {winner}{mark}", highlight=False
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=120)  # logs and CI: no 80-column wrapping
    try:
        if args.command == "validate":
            from pipeline import preflight

            loaded = _load(args, defer=True)
            preflight.check(loaded)
            console.print(f"{loaded.path}: ok", highlight=False)
            return 0
        if args.command == "list":
            return _list(args, console)
        if args.command == "verify":
            return _verify(args, console)
        from pipeline import deploy

        loaded = _load(args, defer=True)
        if args.command == "plan":
            deploy.plan(loaded, console, rebench=args.rebench, retry_failed=args.retry_failed)
            return 0
        return deploy.deploy(loaded, console, rebench=args.rebench, retry_failed=args.retry_failed)
    except PipelineError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(
            "interrupted: nothing was published (the work folder may be resumed by the next deploy)",
            file=sys.stderr,
        )
        return 130
    except Exception:  # noqa: BLE001 - the top-level boundary: a bug, shown with its traceback
        traceback.print_exc()
        print("internal error: this is a bug in the pipeline (exit 3)", file=sys.stderr)
        return 3
