"""`search schema`: the JSON Schema of a space file, from the pydantic models (search/space/schema.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from search.exit_codes import Exit
from search.space.schema import json_schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"


def cmd_schema(args: argparse.Namespace) -> int:
    if args.out:
        Path(args.out).write_text(schema_text())
    else:
        print(schema_text(), end="")
    return Exit.PASS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("schema", help="print the JSON Schema of a space file (for editors: the shipped copy is "
                                      "spaces/space.schema.json)")
    p.add_argument("-o", "--out", metavar="FILE", help="write it to FILE instead of stdout")
    p.set_defaults(func=cmd_schema)
