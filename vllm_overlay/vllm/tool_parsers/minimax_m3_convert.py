# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Schema-driven value conversion for the ``minimax_m3`` tool parser.

Parameter values arrive as a tree of tags (:class:`Node`); they are turned
into JSON values by the tool's JSON schema (the rules are listed in the
docstring of :mod:`vllm.tool_parsers.minimax_m3_series_tool_parser`).
"""

import json
import math
from collections.abc import Sequence
from typing import Any

import regex as re

from vllm.logger import init_logger

logger = init_logger(__name__)

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_FAIL = object()


# --------------------------------------------------------------- conversion
def _json_or_fail(text: str) -> Any:
    def _no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return _FAIL


def resolve_schema(schema: Any, defs: dict) -> dict:
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        name = ref.rsplit("/", 1)[-1]
        target = defs.get(name) if ref.startswith("#/") else None
        seen += 1
        if not isinstance(target, dict) or seen > 16:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return rest
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema if isinstance(schema, dict) else {}


def _types(schema: dict, defs: dict) -> list[str]:
    """Type names allowed by a schema, in the order given."""
    out: list[str] = []

    def add(t: str) -> None:
        if t not in out:
            out.append(t)

    t = schema.get("type")
    if isinstance(t, str):
        add(t)
    elif isinstance(t, list):
        for x in t:
            if isinstance(x, str):
                add(x)
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            for x in _types(resolve_schema(sub, defs), defs):
                add(x)
    if not out:
        values = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
        for v in values:
            add(_type_of(v))
        if "properties" in schema or "additionalProperties" in schema:
            add("object")
        if "items" in schema:
            add("array")
    if schema.get("nullable") is True:
        add("null")
    return out


def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return "string"


def _branch(schema: dict, defs: dict, type_name: str) -> dict:
    """The (sub)schema describing values of ``type_name``."""
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            sub = resolve_schema(sub, defs)
            if type_name in _types(sub, defs):
                return sub
    return schema


class Node:
    """One tag of a parameter value: leaf text or nested children.  ``tag``
    is None while the name of a value whose opening tag was lost is not yet
    known (it is set from the closing tag)."""

    __slots__ = ("tag", "text", "children")

    def __init__(self, tag: str | None):
        self.tag = tag
        self.text = ""
        self.children: list[Node] = []


def _group(children: list[Node]) -> list[tuple[str, list[Node]]]:
    """Adjacent same-tag siblings form one group; later repeats are dropped."""
    groups: list[tuple[str, list[Node]]] = []
    seen: set[str] = set()
    for child in children:
        if groups and groups[-1][0] == child.tag:
            groups[-1][1].append(child)
        elif child.tag in seen:
            logger.debug("minimax_m3: ignoring repeated key %r", child.tag)
        else:
            seen.add(child.tag)
            groups.append((child.tag, [child]))
    return groups


def _scalar(text: str, types: list[str], schema: dict) -> Any:
    s = text.strip()
    for value in schema.get("enum") or []:
        if not isinstance(value, (dict, list)) and (
            (isinstance(value, str) and value in (text, s))
            or (not isinstance(value, str) and json.dumps(value) == s)
        ):
            return value
    low = s.lower()
    if "null" in types and low in ("null", "none"):
        return None
    if "boolean" in types and low in ("true", "false"):
        return low == "true"
    if "integer" in types or "number" in types:
        number = _number(s, integral="number" not in types)
        if number is not None:
            return number
    if "object" in types:
        if not s:
            return {}
        v = _json_or_fail(s)
        if isinstance(v, dict):
            return v
    if "array" in types:
        if not s:
            return []
        v = _json_or_fail(s)
        if isinstance(v, list):
            return v
    if "null" in types and not s and "string" not in types:
        return None
    if types and "string" not in types:
        logger.debug("minimax_m3: %r does not match schema types %s", text, types)
    return text


def _number(s: str, integral: bool) -> int | float | None:
    """A decimal literal as int/float; None if it is not one (or not
    integral when ``integral``).  NaN/Infinity are not JSON numbers."""
    try:
        if _INT_RE.match(s):
            return int(s)
        if _FLOAT_RE.match(s):
            f = float(s)
            if math.isfinite(f) and (f.is_integer() or not integral):
                return int(f) if integral else f
    except (ValueError, OverflowError):  # e.g. more digits than int() allows
        pass
    return None


def _array_items(node: Node, items: Any, defs: dict) -> list[Any]:
    if node.children:
        if all(c.tag == "item" for c in node.children):
            return [_convert(c, items, defs) for c in node.children]
        return [_convert(node, items, defs)]
    s = node.text.strip()
    if not s:
        return []
    v = _json_or_fail(s)
    if isinstance(v, list):
        return v
    return [_convert(node, items, defs)]


def _items_schema(schema: dict, defs: dict) -> Any:
    return _branch(schema, defs, "array").get("items")


def _convert(node: Node, schema: Any, defs: dict) -> Any:
    schema = resolve_schema(schema, defs)
    types = _types(schema, defs)
    if node.children:
        all_items = all(c.tag == "item" for c in node.children)
        if "array" in types and (all_items or "object" not in types):
            return _array_items(node, _items_schema(schema, defs), defs)
        if "object" in types:
            return _convert_object(node.children, _branch(schema, defs, "object"), defs)
        return _convert_object(node.children, {}, defs)
    if "array" in types:
        s = node.text.strip()
        if "null" in types and s.lower() in ("null", "none"):
            return None
        v = _json_or_fail(s) if s else []
        if isinstance(v, list):
            return v
        others = [t for t in types if t not in ("array", "string")]
        if others:
            value = _scalar(node.text, others, schema)
            if value is not node.text:
                return value
        if types[0] == "array" or "string" not in types:
            return [_convert(node, _items_schema(schema, defs), defs)]
        return node.text
    return _scalar(node.text, types, schema)


def convert_group(nodes: list[Node], schema: Any, defs: dict) -> Any:
    if len(nodes) == 1:
        return _convert(nodes[0], schema, defs)
    schema = resolve_schema(schema, defs)
    if "array" in _types(schema, defs):
        items = _items_schema(schema, defs)
        out: list[Any] = []
        for n in nodes:
            out.extend(_array_items(n, items, defs))
        return out
    return [_convert(n, schema, defs) for n in nodes]


def _convert_object(children: list[Node], schema: dict, defs: dict) -> Any:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties")
    extra = extra if isinstance(extra, dict) else {}
    if not props and not extra and all(c.tag == "item" for c in children):
        return [_convert(c, {}, defs) for c in children]
    return {
        tag: convert_group(nodes, props.get(tag, extra), defs)
        for tag, nodes in _group(children)
    }


def tool_schemas(tools: Sequence[Any] | None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for tool in tools or []:
        name = params = None
        fn = getattr(tool, "function", None)
        if fn is not None:  # ChatCompletionToolsParam
            name, params = getattr(fn, "name", None), getattr(fn, "parameters", None)
        elif isinstance(tool, dict):
            fn = tool.get("function", tool)
            name, params = fn.get("name"), fn.get("parameters")
        else:  # Responses FunctionTool
            name, params = (
                getattr(tool, "name", None),
                getattr(tool, "parameters", None),
            )
        if isinstance(name, str) and name not in out:
            out[name] = params if isinstance(params, dict) else {}
    return out


def is_plain_string(schema: Any, defs: dict) -> bool:
    """Whether values of ``schema`` are always the raw text (type ``string``
    only, no ``enum``/``const``/``nullable``): such values can be streamed
    while they are generated."""
    schema = resolve_schema(schema, defs)
    return (
        _types(schema, defs) == ["string"]
        and "enum" not in schema
        and "const" not in schema
    )
