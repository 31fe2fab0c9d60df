"""The guide's generated reference (an mkdocs hook, named in mkdocs.yml).

A reference page holds a marker ``<!-- generated: NAME -->`` where the text drawn from the code goes:

* ``cli``: every command of the ``mergetxn`` click group, walked recursively (usage, help, options);
* ``settings``: the replica settings spec (``replicas.settings.SETTINGS``: flag, environment
  variable, default, range, help);
* ``errors``: the error classes (``mergetxn.errors``), their bases, what each means and the CLI
  exit code it ends a command with; the conflict kinds;
* ``exit-codes``: the CLI's exit codes and their meanings.

So the reference cannot drift from the product: it is the product's own declarations, rendered.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import MISSING
from typing import Any

import click

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")
ROLE = re.compile(r":(?:class|func|data|mod|meth|attr):`~?([^`]+)`")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: each marker replaced by its generated text (an unknown name fails the build)."""
    return MARKER.sub(lambda m: generate(m.group(1)), markdown)


def generate(name: str) -> str:
    makers: dict[str, Callable[[], str]] = {
        "cli": cli_reference,
        "settings": settings_table,
        "errors": errors_table,
        "exit-codes": exit_codes_table,
    }
    if name not in makers:
        raise ValueError(f"unknown generated section {name!r}: one of {', '.join(sorted(makers))}")
    return makers[name]()


def cell(text: object) -> str:
    """``text`` fit for one cell of a Markdown table (reST's roles and double backticks as code)."""
    one_line = " ".join(str(text).split()).replace("|", "\\|")
    return plain(ROLE.sub(r"`\1`", one_line).replace("``", "`"))


def plain(text: str) -> str:
    """``text`` with ``[a][b]`` (as in ``host:port[,host:port...][/chroot]``) kept from reading
    as a Markdown reference link."""
    return text.replace("][", "]\\[")


# -- the command line ---------------------------------------------------------------------------


def root_group() -> click.Group:
    import mergetxn.cli as cli_module

    group = getattr(cli_module, "cli", None)
    if isinstance(group, click.Group):
        return group
    found = [v for v in vars(cli_module).values() if isinstance(v, click.Group) and v.name == "cli"]
    if not found:
        raise RuntimeError("mergetxn.cli has no click group named cli")
    return found[0]


def commands(
    group: click.Group, path: tuple[str, ...], parent: click.Context
) -> Iterator[tuple[tuple[str, ...], click.Command, click.Context]]:
    for name in sorted(group.list_commands(parent)):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        ctx = click.Context(command, info_name=name, parent=parent)
        yield (*path, name), command, ctx
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name), ctx)


def option_rows(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        rows.append(f"| `{cell(names)}` | {cell(help_text) or 'argument'} |")
    return rows


def command_section(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> str:
    title = " ".join(("mergetxn", *path))
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"{'#' * min(len(path) + 2, 4)} `{title}`", "", f"```text\n{title} {usage}\n```", ""]
    lines += [plain(inspect.cleandoc(command.help or command.short_help or "")), ""]
    if isinstance(command, click.Group):
        subs = [f"`{n}`" for n in sorted(command.list_commands(ctx))]
        lines += [f"Commands: {', '.join(subs)}.", ""]
    rows = option_rows(command, ctx)
    if rows:
        lines += ["| option | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def cli_reference() -> str:
    group = root_group()
    root = click.Context(group, info_name="mergetxn")
    out = [command_section((), group, root)]
    out += [command_section(path, command, ctx) for path, command, ctx in commands(group, (), root)]
    return "\n".join(out)


# -- replica settings ----------------------------------------------------------------------------


def settings_table() -> str:
    from replicas.settings import SETTINGS

    rows = [
        "| setting | flag | environment | default | range | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in SETTINGS.values():
        default = "required" if s.default is MISSING else ("none" if s.default is None else f"`{s.default}`")
        low_high = s.range_text() if s.minimum is not None or s.maximum is not None else ""
        env = f"`{s.env}`" if s.env else ""
        tun = " (tunable)" if s.tunable else ""
        rows.append(f"| `{s.name}`{tun} | `{s.option}` | {env} | {cell(default)} | {cell(low_high)} | {cell(s.help)} |")
    return "\n".join(rows)


# -- errors and exit codes ------------------------------------------------------------------------


def error_classes() -> list[type[BaseException]]:
    import mergetxn.errors as errors_module

    base = errors_module.MergetxnError
    found = {v for v in vars(errors_module).values() if isinstance(v, type) and issubclass(v, base)}
    return sorted(found, key=lambda c: (len(c.__mro__), c.__name__))


def first_paragraph(doc: str | None) -> str:
    return inspect.cleandoc(doc or "").split("\n\n")[0]


def exit_code_of(cls: type[BaseException]) -> int:
    import mergetxn.cli as cli_module

    code: int = cli_module.exit_code(cls.__new__(cls))
    return code


def errors_table() -> str:
    import mergetxn.errors as errors_module

    rows = ["| error | is a | exit code | meaning |", "| --- | --- | --- | --- |"]
    for cls in error_classes():
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__ if b is not object)
        rows.append(f"| `{cls.__name__}` | {bases} | {exit_code_of(cls)} | {cell(first_paragraph(cls.__doc__))} |")
    kinds = ["", "## Conflict kinds", "", "`ConflictError.kind` is one of:", "", "| kind | value |", "| --- | --- |"]
    kinds += [f"| `{k.name}` | `{k.value}` |" for k in errors_module.ConflictKind]
    return "\n".join(rows + kinds)


def exit_codes_table() -> str:
    import mergetxn.cli as cli_module

    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| {code} | {cell(text)} |" for code, text in sorted(cli_module.EXIT_CODES.items())]
    return "\n".join(rows)
