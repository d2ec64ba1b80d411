"""The Typer CLI: the only place that prints errors or exits. One module per command group."""
