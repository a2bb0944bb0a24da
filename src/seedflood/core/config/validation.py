"""Type validation of one config section by pydantic, with this package's one-line messages.

Owns: `build_section(name, cls, values)`, which checks a mapping of keys against the section
dataclass `cls`'s own annotations (strict: a bool must be a bool, an int must not be a float or a
bool, a float takes an int but never inf/nan, unknown keys are refused) and builds `cls` from the
keys that were set, so the defaults stay the dataclass's own and its `__post_init__` checks the
ranges. A pydantic error is rewritten into one `ConfigError` line naming the key and what is
allowed; with several errors, the one on the key written first is reported.

Assumes: `cls` is a dataclass whose annotations pydantic can check (scalars, Literal, list, dict).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
from pydantic_core import ErrorDetails

from seedflood.core.config.configerror import ConfigError

_STRICT = pydantic.ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


@functools.cache
def fields_model(cls: type) -> type[pydantic.BaseModel]:
    """A pydantic model with the fields and annotations of the section dataclass `cls`.

    Every field defaults to None and is left out of the result unless the input set it, so the
    defaults stay the dataclass's own and `__post_init__` runs (raising ConfigError) on `cls(**set)`.
    """
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {f.name: (hints[f.name], None) for f in dataclasses.fields(cls)}
    return pydantic.create_model(f"{cls.__name__}Fields", __config__=_STRICT, **fields)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def _annotation(cls: type, loc: tuple[int | str, ...]) -> Any:
    """The annotation a pydantic error location points at inside section `cls`."""
    is_key = loc[-1] == "[key]"  # (field, ..., bad_key, "[key]"): the mapping's key type
    tp: Any = typing.get_type_hints(cls)[str(loc[0])]  # loc[0]: the field's name
    for _ in loc[1:-2] if is_key else loc[1:]:
        tp = (typing.get_args(tp) or (Any,))[-1]  # list[X] -> X, dict[K, V] -> V
    return (typing.get_args(tp) or (Any,))[0] if is_key else tp


def _key(name: str, loc: tuple[int | str, ...]) -> str:
    """'section.field', 'section.field[3]' or 'section.field.sub'; a bad mapping key names the mapping."""
    parts = loc[:-2] if loc[-1] == "[key]" else loc
    return name + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


_MESSAGES = {
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
}


def _message(name: str, cls: type, err: ErrorDetails) -> str:
    """One pydantic error as this module's one-line message."""
    loc, kind, value = err["loc"], err["type"], err.get("input")
    if kind in ("extra_forbidden", "invalid_key"):
        allowed = ", ".join(sorted(f.name for f in dataclasses.fields(cls)))
        return f"unknown key '{name}.{loc[0]}' (allowed in {name}: {allowed})"
    key, tp = _key(name, loc), _annotation(cls, loc)
    if kind == "literal_error":
        allowed = ", ".join(map(str, typing.get_args(tp)))
        return f"{key}: must be one of {allowed}; got {value!r}"
    if kind == "list_type":
        (item,) = typing.get_args(tp) or (Any,)
        return f"{key}: must be a list of {_type_name(item)}, got {value!r}"
    what = _MESSAGES.get(kind)
    if what is None:  # a kind this schema does not produce yet: pydantic's own one-line text
        what = str(err["msg"]).splitlines()[0]
    if loc[-1] == "[key]":
        what = "keys " + what
    return f"{key}: {what}, got {value!r}"


def build_section(name: str, cls: type, values: Any) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name}: must be a mapping of keys, got {values!r}")
    try:
        checked = fields_model(cls).model_validate(dict(values))
    except pydantic.ValidationError as e:
        order = {k: i for i, k in enumerate(values)}
        first = min(e.errors(), key=lambda err: order.get(err["loc"][0], len(order)))  # as written
        raise ConfigError(_message(name, cls, first)) from None
    return cls(**{k: getattr(checked, k) for k in checked.model_fields_set})
