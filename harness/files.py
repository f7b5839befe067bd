"""Reading user and stored files with bounded cost: every YAML or JSON file the tool reads comes here.

Spaces, baselines, result records, reference answers, history files and the packaged workload and
quality catalogues are input the tool does not control (hand-edited, damaged, hostile). Reading
one must cost at most a bounded amount of time and memory and fail with one line that names the
file, the key path where known and the reason:
- size: a file over `max_bytes` is refused before it is read; only regular files are read (a FIFO
  or /dev/zero would block or never end);
- text: not UTF-8 names the byte offset and line;
- nesting: deeper than `max_depth` is refused while parsing (never a RecursionError later);
- YAML aliases: the document is composed into a node graph first and its size *with every alias
  expanded* is counted in linear time; a "billion laughs" file (each level repeating the one
  below) is refused before anything walks the expanded tree, and a recursive alias is refused;
- numbers: an integer literal too long for Python to convert is a named error, not a traceback.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_YAML_BYTES = 1 << 20  # 1 MiB: a space file is a few KB
MAX_JSON_BYTES = 64 << 20  # result records hold raw samples (a few MB for long runs)
MAX_DEPTH = 64
MAX_NODES = 200_000  # scalars + containers once every alias is expanded
MAX_EXPANDED_BYTES = 16 << 20  # the text those values hold once expanded (a space file is a few KB)


class InputError(ValueError):
    """A file could not be read as the tool needs it; str() is one line naming the file and why."""

    def __init__(self, source: str, reason: str, key_path: str | None = None):
        self.source = source
        self.reason = " ".join(reason.split())  # one line, whatever the parser said
        self.key_path = key_path
        where = f"{source}: {key_path}" if key_path else source
        super().__init__(f"{where}: {self.reason}")


def read_bytes(path: str | Path, max_bytes: int) -> bytes:
    """The file's bytes, refusing non-regular files and files over `max_bytes`."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO must not block
    except FileNotFoundError:
        raise InputError(str(p), "cannot read: no such file") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(str(p), "is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(str(p), "not a regular file (a pipe or device is never read)")
        if info.st_size > max_bytes:
            raise InputError(str(p), f"too large ({info.st_size} bytes; the limit is {max_bytes})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)  # the file may have grown since fstat
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InputError(str(p), f"too large (over {max_bytes} bytes)")
    return data


def decode(data: bytes, source: str) -> str:
    """UTF-8 text (a BOM is accepted); an error names the byte offset and the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(source, f"not UTF-8 text ({exc.reason} at byte {exc.start}, line {line})") from None


def read_text(path: str | Path, max_bytes: int = MAX_YAML_BYTES) -> str:
    return decode(read_bytes(path, max_bytes), str(path))


# ---- YAML -----------------------------------------------------------------------------------------

class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting while composing (before Python's recursion limit)."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                mark = self.peek_event().start_mark
                raise InputError("", f"nested deeper than {self.max_depth} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> Any:
        """A key written twice is an error (PyYAML keeps the last silently: a lost parameter)."""
        node = super().compose_mapping_node(anchor)
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise InputError("", f"key {key.value!r} appears twice in one mapping "
                                         f"(line {key.start_mark.line + 1})")
                seen.add((key.tag, key.value))
        return node


def _expanded_size(root: yaml.Node, source: str, max_nodes: int, max_bytes: int = MAX_EXPANDED_BYTES) -> int:
    """Nodes in the tree once every alias is expanded, counted once per distinct node (memoized),
    so that the count itself stays linear in the file while the expansion may be exponential; and
    the text it expands to, since a few aliases of one long string fill memory under any node cap
    (a 600 KB string aliased 100,000 times: 60 GB in 200,000 nodes)."""
    sizes: dict[int, int] = {}
    text: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: (node, children done?)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(c)] for c in _children(node))
            if total > max_nodes:
                raise InputError(source, f"expands to more than {max_nodes} values (nested YAML aliases? "
                                         f"line {node.start_mark.line + 1})")
            chars = len(node.value) if isinstance(node, yaml.ScalarNode) else sum(text[id(c)] for c in _children(node))
            if chars > max_bytes:
                raise InputError(source, f"expands to more than {max_bytes >> 20} MiB of text (YAML aliases of a "
                                         f"long value? line {node.start_mark.line + 1})")
            sizes[key], text[key] = total, chars
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise InputError(source, f"recursive YAML alias (line {node.start_mark.line + 1})")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def parse_yaml(text: str, source: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """Safe YAML with bounded nesting and alias expansion. One document; an empty one is None."""
    try:
        loader = _BoundedLoader(text)  # the reader checks characters here already
    except yaml.YAMLError as exc:
        raise InputError(source, f"not valid YAML: {exc}") from None
    loader.max_depth = max_depth
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, source, max_nodes)
        return loader.construct_document(node)
    except InputError as exc:
        raise InputError(source, exc.reason) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(source, f"not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(source, f"not valid YAML: {exc}") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer literal with 5000 digits
        raise InputError(source, f"not valid YAML: {_number_reason(exc)}") from None
    except RecursionError:
        raise InputError(source, "nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path, max_bytes: int = MAX_YAML_BYTES, max_depth: int = MAX_DEPTH,
              max_nodes: int = MAX_NODES) -> Any:
    return parse_yaml(read_text(path, max_bytes), str(path), max_depth, max_nodes)


# ---- JSON -----------------------------------------------------------------------------------------

def _check_json_tree(data: Any, source: str, max_depth: int) -> None:
    """Nesting depth, checked without recursion (code that walks the data later may recurse)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise InputError(source, f"nested deeper than {max_depth} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _constant(name: str) -> float:
    # NaN and Infinity are not JSON; Python writes them for float('nan') (json.dumps default), so we
    # read them back as numbers rather than refusing files the tool itself wrote.
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def parse_json(text: str, source: str, max_depth: int = MAX_DEPTH) -> Any:
    if not text.strip():
        raise InputError(source, "empty file (partial write?)")
    try:
        data = json.loads(text, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"corrupted or partial JSON ({exc.msg} at line {exc.lineno}, "
                                 f"column {exc.colno})") from None
    except RecursionError:
        raise InputError(source, f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # an integer with thousands of digits
        raise InputError(source, f"corrupted JSON ({_number_reason(exc)})") from None
    _check_json_tree(data, source, max_depth)
    return data


def load_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    return parse_json(read_text(path, max_bytes), str(path), max_depth)


def load_jsonl(path: str | Path, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """One JSON value a line (history files); an error names the file and the line."""
    rows = []
    for n, line in enumerate(read_text(path, max_bytes).splitlines(), 1):
        if line.strip():
            rows.append(parse_json(line, f"{path}:{n}", max_depth))
    return rows


def _number_reason(exc: Exception) -> str:
    text = str(exc)
    return "a number with more digits than Python converts (4300)" if "digits" in text else text


def key_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """('engines', 'vllm', 'args', 0) -> 'engines.vllm.args[0]'."""
    out = ""
    for item in loc:
        out += f"[{item}]" if isinstance(item, int) else (("." if out else "") + str(item))
    return out or "(top level)"
