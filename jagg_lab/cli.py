"""`key=value` command lines parsed into a dataclass: the one CLI of the non-Hydra entry points.

    @dataclass
    class Args:
        '''What the command does (shown by --help).'''
        n_samples: int = 128  # shown by --help next to the field
        out: str | None = None

    def _main(args: Args) -> int: ...

    def main(argv: list[str] | None = None) -> int:
        return cli.run(_main, Args, "python -m jagg_lab.evaluate", argv)

Values are parsed by OmegaConf (`n=3`, `name=null`, `"seeds=[0,1,2]"`), so they follow the
dataclass's types. `-h` / `--help` prints the dataclass's docstring (or `description`), then
its fields with their types, defaults and trailing comments, and exits 0. A key the
dataclass lacks, a value of the wrong type, a missing required value (`"???"`) or a
ValueError from the dataclass's `__post_init__` (where an entry point checks its values) is
a `UsageError` that names the key; `run` reports it on stderr and exits 2 before any work.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from typing import Callable, Sequence, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

__all__ = ["UsageError", "HelpRequested", "help_text", "parse", "run"]

T = TypeVar("T")

HELP_FLAGS = ("-h", "--help")


class UsageError(ValueError):
    """A command line the schema does not accept; the message names the offending key."""


class HelpRequested(Exception):
    """`-h` / `--help` was given; `text` is what to print."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


def _field_comments(schema: type) -> dict[str, str]:
    """{field: its trailing `# comment`} from the schema's source ({} when there is none)."""
    try:
        source = textwrap.dedent(inspect.getsource(schema))
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        body = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return {}
    comments = {tok.start[0]: tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT}
    out = {}
    for node in getattr(body, "body", []):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = next((n for n in (node.lineno, node.end_lineno) if n in comments), None)
            if line is not None:
                out[node.target.id] = comments[line]
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    return "(required)" if value == "???" else repr(value)


def _type_name(annotation: object) -> str:
    """'int', 'list[int]', 'str | None': as written (a string under postponed annotations) or as Python prints it."""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _docstring(schema: type) -> str:
    """The schema's own docstring; '' for the signature dataclasses writes when there is none."""
    doc = inspect.cleandoc(schema.__doc__ or "")
    return "" if doc.startswith(f"{schema.__name__}(") else doc


def help_text(schema: type, prog: str, description: str | None = None) -> str:
    """Usage line, the description (default: the schema's docstring), then one line per field:
    `name: type = default  comment`."""
    comments = _field_comments(schema)
    rows = [(f"{f.name}: {_type_name(f.type)} = {_default(f)}", comments.get(f.name, "")) for f in dataclasses.fields(schema)]
    width = max((len(left) for left, _ in rows), default=0)
    text = inspect.cleandoc(description) if description else _docstring(schema)
    lines = [f"usage: {prog} [key=value ...]", *(["", text] if text else []), "",
             "arguments (key=value; lists as \"key=[a,b]\", None as key=null):"]
    lines += [f"  {left.ljust(width)}  {comment}".rstrip() for left, comment in rows]
    return "\n".join(lines) + "\n"


def _from_cli(argv: Sequence[str]):
    """OmegaConf.from_cli, with a value YAML cannot read (say an unquoted glob class,
    `"finals=[a=x/*_seed[012]]"`) refused as a UsageError naming its key."""
    try:
        return OmegaConf.from_cli(list(argv))
    except yaml.YAMLError:
        for arg in argv:  # find the argument YAML refused
            try:
                OmegaConf.from_cli([arg])
            except yaml.YAMLError as err:
                key, _, value = arg.partition("=")
                problem = getattr(err, "problem", None) or str(err).splitlines()[0]
                raise UsageError(f"{key}: cannot read the value {value!r} ({problem}); quote a list item that holds "
                                 f"[ ] , or {{ }}, e.g. \"{key}=['...']\"") from None
        raise


def parse(schema: type[T], argv: Sequence[str], *, prog: str, description: str | None = None) -> T:
    """An instance of the dataclass `schema` from `key=value` arguments.

    Raises HelpRequested for -h / --help (anywhere in argv) and UsageError for anything the
    schema refuses, so a caller decides how to exit; `run` does both the usual way.
    """
    if any(arg in HELP_FLAGS for arg in argv):
        raise HelpRequested(help_text(schema, prog, description))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), _from_cli(argv))
        return OmegaConf.to_object(merged)
    except ConfigKeyError as err:
        names = ", ".join(f.name for f in dataclasses.fields(schema))
        raise UsageError(f"unknown key {err.full_key!r} (the keys are {names}; see --help)") from None
    except MissingMandatoryValue as err:
        raise UsageError(f"{err.full_key}: required, pass {err.full_key}=...") from None
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        message = (getattr(err, "msg", None) or str(err)).splitlines()[0]  # the rest repeats the key
        raise UsageError(f"{key}: {message}" if key else message) from None
    except ValueError as err:  # the schema's __post_init__ checks; their messages name the field
        raise UsageError(str(err)) from None


def run(main_fn: Callable[[T], int | None], schema: type[T], prog: str, argv: Sequence[str] | None = None,
        *, description: str | None = None) -> int:
    """Parse argv (default sys.argv[1:]) into `schema` and call `main_fn` with it.

    Returns the exit status: 0 after printing help to stdout, 2 after writing `NAME: error`
    to stderr (NAME: the last word of prog) for a bad command line, else main_fn's return
    value (None counts as 0). Errors raised by main_fn itself propagate.
    """
    try:
        args = parse(schema, sys.argv[1:] if argv is None else argv, prog=prog, description=description)
    except HelpRequested as shown:
        sys.stdout.write(shown.text)
        return 0
    except UsageError as err:
        sys.stderr.write(f"{prog.split()[-1]}: {err}\n")
        return 2
    code = main_fn(args)
    return 0 if code is None else int(code)
