"""Typer options generated from pydantic models, so each setting is declared once.

A field's type, default and help text (its docstring, or `Field(description=...)`) live on the model; a command
names the models it exposes (`ModelOptions`) and gets one option per field, spelled `--field-name` unless the
command keeps an older spelling (`flags={"is_mode": "--is-correction"}`). Booleans get `--x/--no-x`, Literals
become choices (through a str Enum), `list[...]` fields repeatable options. The command function takes them as
`**settings`, and `ModelOptions.given(ctx, settings)` returns only the values typed on the command line, so config
layering stays "field defaults < YAML < CLI" (a flag left at its default never overrides the YAML).
"""

from __future__ import annotations

import enum
import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = ["ModelOptions", "with_options", "field_help", "flag_of", "AllowedHosts", "SHOWN_DEFAULT"]

# `--allowed-host` of every server command (api, inference, view --serve): see `httpguard.HostPolicy`.
AllowedHosts = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host",
        help="A name clients may use in the Host header besides 127.0.0.1/localhost and the bound address "
        "(repeat it; '*': any). Other Host values get 403 (DNS rebinding).",
    ),
]

F = TypeVar("F", bound=Callable[..., Any])
# A field's `json_schema_extra` key: the default `--help` shows when the field's own default is not what a run
# uses (`Field(..., json_schema_extra={SHOWN_DEFAULT: "3e-4 for the shipped model, else 1e-5"})`).
SHOWN_DEFAULT = "cli_default"
_UNIONS = (Union, types.UnionType)


def field_help(info: FieldInfo) -> str:
    """The field's help text on one line (docstrings may wrap)."""
    return " ".join((info.description or "").split())


def flag_of(name: str, flags: Mapping[str, str]) -> str:
    return flags.get(name, "--" + name.replace("_", "-"))


def _literal_choices(annotation: Any) -> list[str] | None:
    """The values of a Literal (or a union of Literals and None), else None."""
    if get_origin(annotation) is Literal:
        return [str(v) for v in get_args(annotation)]
    if get_origin(annotation) in _UNIONS:
        parts = [a for a in get_args(annotation) if a is not type(None)]
        choices = [_literal_choices(a) for a in parts]
        if parts and all(c is not None for c in choices):
            return [v for c in choices for v in c or []]
    return None


def _optional(annotation: Any) -> bool:
    return get_origin(annotation) in _UNIONS and type(None) in get_args(annotation)


def _python_type(name: str, annotation: Any) -> Any:
    """The type Typer should parse: Literals become a str Enum (Typer shows and checks the choices); a number or
    a word (`int | Literal["auto"]`) is read as text, which the model's validation turns into one or the other;
    the rest (`X | None`, lists, tuples) stays as it is."""
    choices = _literal_choices(annotation)
    if choices is None and get_origin(annotation) in _UNIONS:
        parts = [a for a in get_args(annotation) if a is not type(None)]
        if any(get_origin(a) is Literal for a in parts):
            return str | None if _optional(annotation) else str
    if choices is None:
        return annotation
    choice = enum.Enum(name, {value: value for value in choices}, type=str)  # type: ignore[misc]
    return choice | None if _optional(annotation) else choice


def _plain(value: Any) -> Any:
    """A parsed option value as the model wants it: Enum members back to their string."""
    return value.value if isinstance(value, enum.Enum) else value


@dataclass(frozen=True)
class ModelOptions:
    """The options one pydantic model contributes to a command."""

    model: type[BaseModel]
    exclude: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)  # field -> flag spelling, when not --field-name
    panel: str | None = None  # the --help section the options are listed under
    envvars: Mapping[str, str] = field(default_factory=dict)  # field -> environment variable

    def fields(self) -> dict[str, FieldInfo]:
        return {name: info for name, info in self.model.model_fields.items() if name not in self.exclude}

    def parameter(self, name: str, info: FieldInfo) -> inspect.Parameter:
        flag = flag_of(name, self.flags)
        annotation = info.annotation
        default = None if info.default_factory is not None or info.is_required() else info.default  # no Undefined
        bool_flag = annotation is bool or (_optional(annotation) and bool in get_args(annotation))
        names = [f"{flag}/--no-{flag[2:]}"] if bool_flag else [flag]
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        shown = extra.get(SHOWN_DEFAULT)  # a default that depends on other settings, said in words
        option = typer.Option(
            *names,
            help=field_help(info),
            rich_help_panel=self.panel,
            envvar=self.envvars.get(name),
            show_default=str(shown) if shown else default is not None and default != [],
        )
        annotated = Annotated[_python_type(name, annotation), option]  # type: ignore[valid-type]
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotated)

    def parameters(self) -> list[inspect.Parameter]:
        return [self.parameter(name, info) for name, info in self.fields().items()]

    def given(self, ctx: typer.Context, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The values of this model's options that the user typed (or set through their environment variable)."""
        return {
            name: _plain(settings[name])
            for name in self.fields()
            if name in settings and _explicit(ctx.get_parameter_source(name))
        }


def _explicit(source: Any) -> bool:
    """Typed on the command line or set by an environment variable (not the default). By name: Typer may carry
    its own copy of click, whose ParameterSource is another class than `click.core.ParameterSource`."""
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT")


def with_options(*specs: ModelOptions) -> Callable[[F], F]:
    """Give a `def command(ctx, ..., **settings)` one keyword option per field of `specs`, for Typer to read."""

    def wrap(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        generated = [p for spec in specs for p in spec.parameters()]
        names = [p.name for p in own + generated]
        duplicated = {n for n in names if names.count(n) > 1}
        if duplicated:
            raise TypeError(f"{func.__name__}: options declared twice: {sorted(duplicated)}")
        func.__signature__ = signature.replace(parameters=[*own, *generated])  # type: ignore[attr-defined]
        func.__annotations__ = {p.name: p.annotation for p in own + generated} | {"return": None}
        return func

    return wrap
