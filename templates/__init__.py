"""Jinja templates of the HTML pages and of `atropos init-env`; installed as `atropos_cli.templates`."""
