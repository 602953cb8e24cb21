"""Write the values table of charts/pipeline-server/README.md from values.yaml's `# --` comments.

    python scripts/chart_values_table.py          # rewrite the table in the README
    python scripts/chart_values_table.py --check  # fail if it is stale or a value is undocumented

The convention is helm-docs': a `# -- text` comment (continued by `# text` lines) right above
a key documents it; a documented map is one row with its whole default. Every value must be
documented itself or sit under a documented map.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "pipeline-server"
START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$")
DOC = re.compile(r"^\s*# -- ?(.*)$")
MORE = re.compile(r"^\s*# ?(.*)$")


def documented_values(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(key path, description) in file order, and the keys that lack a description."""
    rows: list[tuple[str, str]] = []
    undocumented: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    pending: list[str] | None = None
    for line in text.splitlines():
        if m := DOC.match(line):
            pending = [m.group(1)]
            continue
        if pending is not None and (m := MORE.match(line)) and line.lstrip().startswith("#"):
            pending.append(m.group(1))
            continue
        m = KEY.match(line)
        if not m or line.lstrip().startswith("-"):
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        under_documented = any(documented for _, _, documented in stack)
        path = ".".join([k for _, k, _ in stack] + [key])
        if pending is not None and not under_documented:
            rows.append((path, " ".join(pending)))
        elif not under_documented and rest and not rest.startswith("#"):
            undocumented.append(path)
        stack.append((indent, key, pending is not None or under_documented))
        pending = None
    return rows, undocumented


def lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def table(values_text: str) -> tuple[str, list[str]]:
    rows, undocumented = documented_values(values_text)
    values = yaml.safe_load(values_text)
    lines = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for path, text in rows:
        default = json.dumps(lookup(values, path), separators=(", ", ": "))
        described = text.replace("|", "\\|")
        lines.append(f"| `{path}` | `{default}` | {described} |")
    return "\n".join(lines) + "\n", undocumented


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; change nothing")
    args = parser.parse_args()
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    body, undocumented = table((CHART / "values.yaml").read_text())
    if undocumented:
        print(f"values without a `# --` comment: {', '.join(undocumented)}", file=sys.stderr)
        return 1
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    updated = f"{head}{START}\n{body}{END}{tail}"
    if updated == readme:
        return 0
    if args.check:
        print(f"{readme_path} is stale: run python scripts/chart_values_table.py", file=sys.stderr)
        return 1
    readme_path.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
