"""`atropos view`: render scored groups (jsonl or parquet; a file, a run dir, several runs) to one HTML page.

Flow: paths -> `readers.expand_inputs` -> `readers.iter_groups` (bad lines become warnings) ->
`writers.html.render_html` -> RUN/index.html, FILE-stem.html, or --out. Token-only rollouts (API batches,
ManagedServer groups: tokens, no messages) show as text decoded by `--tokenizer NAME` (loaded first: a name
that cannot be loaded fails at once), else by the run's own tokenizer (its config.yaml, else the groups'
`meta.model`), else as token ids. `--serve` then serves that page on 127.0.0.1 with the stdlib HTTP server,
guarded like every server (`httpserve.GuardedHTTPServer`), re-rendering it on every load of `/`, so a reload
shows a run that is still being written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from atropos_cli.cli.common import cli_errors, console, err_console
from atropos_cli.cli.options import AllowedHosts
from atropos_cli.errors import AtroposError
from atropos_cli.httpguard import HostPolicy
from atropos_cli.httpserve import GuardedHandler, GuardedHTTPServer

if TYPE_CHECKING:  # the readers are imported when a command runs, not for `--help`
    from atropos_cli.formats.reader import BadRecord, SourcedGroup

MAX_WARNINGS = 20
_SUFFIXES = (".gz", ".jsonl", ".json", ".parquet")


class ViewResult(NamedTuple):
    path: Path
    groups: int
    rollouts: int
    failures: int
    bad: list[BadRecord]


def default_out(inputs: list[str], files: list[Path]) -> Path:
    """RUN/index.html for one run dir, DIR/STEM.html for one file, ./view.html for several."""
    if len(inputs) == 1 and Path(inputs[0]).expanduser().is_dir():
        return Path(inputs[0]).expanduser() / "index.html"
    if len(files) == 1:
        name = files[0].name
        for suffix in _SUFFIXES:
            name = name.removesuffix(suffix)
        return files[0].with_name(f"{name}.html")
    return Path("view.html")


def default_title(inputs: list[str], files: list[Path]) -> str:
    if len(files) == 1:
        return f"atropos: {inputs[0] if len(inputs) == 1 else files[0]}"
    return f"atropos: {len(files)} sources"


def count_failures(files: list[Path]) -> int:
    """Failed rollouts recorded beside each run's groups file (RUN/failures.jsonl, one per line)."""
    from atropos_cli.formats.reader import RUN_FILES

    total = 0
    for directory in {f.parent for f in files if f.name in RUN_FILES}:
        failures = directory / "failures.jsonl"
        if failures.is_file():
            with failures.open("rb") as handle:
                total += sum(1 for line in handle if line.strip())
    return total


def render_view(
    inputs: list[str], out: Path | None, title: str | None = None, tokenizer: str | None = None
) -> ViewResult:
    """Read `inputs`, write the page and say what went into it."""
    from atropos_cli.formats.html import render_html
    from atropos_cli.formats.reader import expand_inputs, iter_groups

    files = expand_inputs(inputs)
    out_path = out if out is not None else default_out(inputs, files)
    bad: list[BadRecord] = []
    counts = [0, 0]

    def counted() -> Iterator[SourcedGroup]:
        for sourced in iter_groups(files, on_bad=bad.append):
            counts[0] += 1
            counts[1] += sourced.group.size
            yield sourced

    failures = count_failures(files)
    title = title or default_title(inputs, files)
    decode = _decoder(files, tokenizer)
    render_html(counted(), out_path, title=title, failures=failures, bad_records=bad, decode=decode)
    return ViewResult(out_path, counts[0], counts[1], failures, bad)


def _decoder(files: list[Path], tokenizer: str | None) -> Any:
    """`tokenizer` (loaded now, so a bad name fails before any page is written), else the tokenizer of the
    first run among `files` (its config.yaml), else the first group's `meta.model`; None: token ids shown."""
    from atropos_cli.formats.html import names_decoder, run_decoder

    if tokenizer is not None:
        from atropos_cli.inference.tokenizer import load_tokenizer

        loaded = load_tokenizer(tokenizer)
        return lambda ids: loaded.decode(ids)
    for f in files:
        for config in (f.parent / "config.yaml", Path(f"{f.with_suffix('')}.config.yaml")):
            if config.is_file():
                return run_decoder(config)
    return names_decoder([_first_model(files)])


def _first_model(files: list[Path]) -> str | None:
    from atropos_cli.formats.reader import iter_groups

    for sourced in iter_groups(files, on_bad=lambda bad: None):
        return sourced.group.meta.model if sourced.group.meta is not None else None
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_line(result: ViewResult) -> str:
    line = f"rendered {_plural(result.groups, 'group')} ({_plural(result.rollouts, 'rollout')}) to {result.path}"
    if result.bad:
        line += f"; skipped {_plural(len(result.bad), 'bad line')}"
    if result.failures:
        line += f"; {_plural(result.failures, 'failed rollout')} in failures.jsonl"
    return line


def _print_warnings(result: ViewResult) -> None:
    for bad in result.bad[:MAX_WARNINGS]:
        err_console.print(f"warning: {bad.location}: {bad.reason}", markup=False, soft_wrap=True)
    if len(result.bad) > MAX_WARNINGS:
        err_console.print(f"warning: ... and {len(result.bad) - MAX_WARNINGS} more bad lines", soft_wrap=True)


class _ViewServer(GuardedHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        inputs: list[str],
        out: Path,
        title: str | None,
        allowed: list[str],
        tokenizer: str | None = None,
    ) -> None:
        super().__init__(address, _ViewHandler, hosts=HostPolicy(address[0], allowed))
        self.inputs, self.out, self.title, self.tokenizer = inputs, out, title, tokenizer
        self.lock = threading.Lock()

    def page(self) -> bytes:
        with self.lock:  # one render at a time: they share the output file
            render_view(self.inputs, self.out, self.title, self.tokenizer)
            return self.out.read_bytes()


class _ViewHandler(GuardedHandler):
    server: _ViewServer

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.split("?", 1)[0] not in ("/", "/index.html"):
            self.send_error(404, "not found: the viewer is served at /")
            return
        try:
            body = self.server.page()
        except AtroposError as exc:
            # The inputs changed under us (deleted, replaced by something that is not rollouts).
            self.send_error(500, "cannot render the viewer", exc.message)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        """Quiet: the command prints its URL once; per-request logs would bury it."""


def serve(
    inputs: list[str],
    out: Path,
    title: str | None,
    host: str,
    port: int,
    allowed: list[str] | None = None,
    tokenizer: str | None = None,
) -> None:
    server = _ViewServer((host, port), inputs, out, title, allowed or [], tokenizer)
    console.print(
        f"serving http://{host}:{server.server_port}/ (re-rendered on each reload; Ctrl-C to stop)", soft_wrap=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.server_close()


def view_command(
    paths: Annotated[list[str], typer.Argument(help="Run directories, groups .jsonl/.parquet files, or quoted globs.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Where to write the page. Default: RUN/index.html, FILE.html, or ./view.html."),
    ] = None,
    serve_page: Annotated[
        bool, typer.Option("--serve", help="Serve the page over HTTP, re-rendered on each reload.")
    ] = False,
    port: Annotated[int, typer.Option("--port", help="Port for --serve (0 = any free port).")] = 8080,
    host: Annotated[str, typer.Option("--host", help="Address for --serve.")] = "127.0.0.1",
    allowed_host: AllowedHosts = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="Decode token-only groups (API batches, ManagedServer groups) with this tokenizer (a shipped "
            "model, a local directory or a hub id). Default: the run's own (config.yaml, else meta.model).",
        ),
    ] = None,
) -> None:
    """Render scored groups to one self-contained HTML page (search, score filter, keyboard navigation)."""
    with cli_errors():
        result = render_view(paths, out, tokenizer=tokenizer)
        _print_warnings(result)
        console.print(summary_line(result), soft_wrap=True, markup=False)
        if serve_page:
            serve(paths, result.path, None, host, port, allowed_host, tokenizer)


def register(app: typer.Typer) -> None:
    app.command("view")(view_command)
