"""Where in a JSON schema a fault lies: the deepest sub-schema that fails on its own, as a JSON
pointer (`/properties/a/items`), for the message of a schema the constraint engine rejects."""
from __future__ import annotations

from typing import Callable, Iterator

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "additionalItems", "unevaluatedProperties", "unevaluatedItems")


def _pointer(key) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def children(node: dict, path: str) -> Iterator[tuple[str, object]]:
    """The sub-schemas of a schema node, each with its JSON pointer."""
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield f"{path}/{key}/{_pointer(name)}", sub
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield f"{path}/{key}/{i}", sub
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield f"{path}/{key}", node[key]


def deepest(schema: dict, rejected: Callable[[dict], bool], budget: int) -> str:
    """The pointer of the deepest sub-schema `rejected` fails, following the first failing child at
    each level; "" when no part fails alone. At most `budget` sub-schemas are tried."""
    left = [budget]

    def walk(node: dict, path: str) -> str:
        for sub_path, sub in children(node, path):
            if left[0] <= 0:
                break
            if isinstance(sub, dict):
                left[0] -= 1
                if rejected(sub):
                    return walk(sub, sub_path)
        return path

    return walk(schema, "")
