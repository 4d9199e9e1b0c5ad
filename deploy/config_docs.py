"""Write docs/configuration.md from the settings classes: every variable, type, default, description.

The settings classes are the one owner of configuration; this page is derived from them, so it
cannot drift (``tests/unit/test_docs.py`` fails when the committed page differs from what this
module renders). Sources: ``shared/settings.py`` and every ``settings.py`` under ``services/``. A field's
description is its attribute docstring (or ``Field(description=...)``)::

    python -m deploy.config_docs            # rewrite docs/configuration.md
    python -m deploy.config_docs --check    # exit 1 when the page is out of date
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic_settings import BaseSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGE = REPO_ROOT / "docs" / "configuration.md"
REGENERATE = ".venv/bin/python -m deploy.config_docs"

HEADER = f"""# Configuration

Every setting comes from the environment; none is read from a file. The settings classes are
typed and frozen (pydantic-settings), and their defaults are the local stack's (`make up`), so a
development machine needs none of them. Variable names are case-insensitive; booleans take
`true`/`false` (or `1`/`0`).

This page is generated from the settings classes by `{REGENERATE}`; do not edit
it by hand. A unit test fails when it is out of date. To add a setting, add a field with a
docstring to the class that owns it and run the command.

Outside development (`BATCHSTREAM_ENVIRONMENT` other than `development` or `test`) every service
refuses to start while `BATCHSTREAM_API_KEYS`, `BATCHSTREAM_S3_SECRET_KEY` or
`BATCHSTREAM_KAFKA_SIGNING_KEY` still holds the local default.
"""


def settings_modules() -> list[ModuleType]:
    """``shared.settings`` and each service's ``settings`` module, in a stable order."""
    names = ["shared.settings"]
    services = REPO_ROOT / "services"
    names += [
        ".".join(path.relative_to(services.parent).with_suffix("").parts)
        for path in sorted(services.glob("**/settings.py"))
    ]
    return [importlib.import_module(name) for name in names]


def settings_classes(module: ModuleType) -> Iterator[type[BaseSettings]]:
    """Settings classes defined in ``module``, in the order they are defined."""
    for value in vars(module).values():
        if (
            inspect.isclass(value)
            and issubclass(value, BaseSettings)
            and value is not BaseSettings
            and value.__module__ == module.__name__
        ):
            yield value


def own_fields(cls: type[BaseSettings]) -> list[str]:
    """Fields the class declares itself (inherited ones are documented where declared)."""
    declared = inspect.get_annotations(cls)
    return [name for name in cls.model_fields if name in declared]


def env_name(cls: type[BaseSettings], field: str) -> str:
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def type_name(annotation: Any) -> str:
    if inspect.isclass(annotation):
        return annotation.__name__
    # "int | None" would split a table cell at its pipe.
    return str(annotation).replace("typing.", "").replace(" | None", ", optional")


def default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f"`{value}`" if value else "(empty)"
    if isinstance(value, int):
        return f"`{value}`"
    return f"`{value!r}`" if value is not None else "(none)"


def markdown(text: str | None) -> str:
    """A docstring as one table cell: one line, Markdown code spans, no bare pipes."""
    flat = " ".join((text or "").split())
    return flat.replace("``", "`").replace("|", "\\|")


def source_path(cls: type[BaseSettings]) -> str:
    return Path(inspect.getfile(cls)).resolve().relative_to(REPO_ROOT).as_posix()


def undocumented() -> list[str]:
    """Environment variables whose field has no description."""
    missing = []
    for module in settings_modules():
        for cls in settings_classes(module):
            missing += [env_name(cls, f) for f in own_fields(cls) if not cls.model_fields[f].description]
    return missing


def render() -> str:
    """The whole page, grouped by variable prefix (one section per dependency or service)."""
    sections: dict[str, list[type[BaseSettings]]] = {}
    for module in settings_modules():
        for cls in settings_classes(module):
            prefix = str(cls.model_config.get("env_prefix", ""))
            sections.setdefault(prefix, []).append(cls)
    parts = [HEADER]
    for prefix in sorted(sections, key=_section_order):
        parts.append(_section(prefix, sections[prefix]))
    return "\n".join(parts)


# Section titles by variable prefix; a prefix not named here is its own title.
TITLES = {
    "BATCHSTREAM_": "Every service",
    "BATCHSTREAM_KAFKA_": "Kafka",
    "BATCHSTREAM_MONGO_": "MongoDB",
    "BATCHSTREAM_S3_": "Object storage",
    "BATCHSTREAM_API_": "api",
    "BATCHSTREAM_QUOTA_": "Quotas",
    "BATCHSTREAM_INFERENCE_": "Inference worker",
    "BATCHSTREAM_AGGREGATOR_": "Aggregator",
}


def _section_order(prefix: str) -> int:
    """Titled sections in ``TITLES`` order wherever their classes live; the others after them."""
    order = list(TITLES)
    return order.index(prefix) if prefix in order else len(order)


def _section(prefix: str, classes: list[type[BaseSettings]]) -> str:
    lines = [f"## {TITLES.get(prefix, prefix)}", "", f"Variables `{prefix}*`.", ""]
    for cls in classes:
        doc = markdown(inspect.cleandoc(cls.__doc__ or ""))
        where = f"`{cls.__name__}` in `{source_path(cls)}`"
        lines.append(f"{where}: {doc}" if doc else where)
        lines.append("")
    lines += ["| Variable | Type | Default | Description |", "|---|---|---|---|"]
    for cls in classes:
        for field in own_fields(cls):
            info = cls.model_fields[field]
            default = info.get_default(call_default_factory=True)
            lines.append(
                f"| `{env_name(cls, field)}` | {type_name(info.annotation)} | {default_text(default)} "
                f"| {markdown(info.description)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.config_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != page:
            print(f"{PAGE.relative_to(REPO_ROOT)} is out of date; run: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
