"""The batch-level sampling defaults: one definition, its types and ranges checked once.

``RequestDefaults`` is the definition: the part of a request message that carries them, read by
msgspec on the worker's hot path. ``SamplingDefaults`` is the same five fields as a pydantic
model, generated from it, for the api's create parameters, the Batch object and the stored
batch (a 400 at create, with pydantic's error locations). A field set in a request body wins
over these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import msgspec.inspect as mi
from pydantic import BaseModel, Field, create_model, field_validator

TOP_K_NO_LIMIT = -1


def check_top_k(value: int | None) -> int | None:
    """``top_k`` is -1 (no limit) or at least 1; raises ``ValueError`` otherwise."""
    if value is not None and value != TOP_K_NO_LIMIT and value < 1:
        raise ValueError("top_k must be -1 (no limit) or at least 1")
    return value


class RequestDefaults(msgspec.Struct, kw_only=True):
    """Batch-level defaults as a request message carries them (every field present, null when
    unset)."""

    max_decoding_length: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_context_length: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int | None, msgspec.Meta(description="-1 (no limit) or >= 1.")] = None

    def __post_init__(self) -> None:
        check_top_k(self.top_k)


_BOUNDS = ("gt", "ge", "lt", "le")
_PYTHON_TYPES: dict[type[mi.Type], type] = {mi.IntType: int, mi.FloatType: float}


def _pydantic_field(info: mi.Field) -> tuple[Any, Any]:
    """A struct field's annotation and pydantic ``Field``: strict, with its bounds."""
    kind: mi.Type = info.type
    description = None
    if isinstance(kind, mi.Metadata):
        description = (kind.extra_json_schema or {}).get("description")
        kind = kind.type
    assert isinstance(kind, mi.UnionType), info.name  # every default is optional
    (value_type,) = [t for t in kind.types if not isinstance(t, mi.NoneType)]
    bounds = {name: getattr(value_type, name) for name in _BOUNDS}
    field = Field(
        default=None,
        strict=True,
        description=description,
        **{name: bound for name, bound in bounds.items() if bound is not None},
    )
    return _PYTHON_TYPES[type(value_type)] | None, field


_MODEL_DOC = """Batch-level defaults; a field set in a request body wins over these.

The one definition of these five fields: the create parameters, the Batch object and the
request message all use it, so their types and ranges are checked once (a 400 at create)."""


def _top_k(_cls: Any, value: int | None) -> int | None:
    return check_top_k(value)


def _sampling_defaults_model() -> type[BaseModel]:
    info = mi.type_info(RequestDefaults)
    assert isinstance(info, mi.StructType)
    fields: dict[str, Any] = {f.name: _pydantic_field(f) for f in info.fields}
    validators: dict[str, Any] = {"_top_k": field_validator("top_k")(classmethod(_top_k))}
    return create_model(  # type: ignore[call-overload,no-any-return]
        "SamplingDefaults",
        __doc__=_MODEL_DOC,
        __module__=__name__,
        __validators__=validators,
        **fields,
    )


if TYPE_CHECKING:

    class SamplingDefaults(BaseModel):
        """Static view of the generated model (its fields are ``RequestDefaults``')."""

        max_decoding_length: int | None = None
        max_context_length: int | None = None
        temperature: float | None = None
        top_p: float | None = None
        top_k: int | None = None

else:
    SamplingDefaults = _sampling_defaults_model()


def message_defaults(defaults: BaseModel | dict[str, Any] | None) -> RequestDefaults | None:
    """The request message's part for batch defaults given as the pydantic model or a dict."""
    if defaults is None:
        return None
    values = defaults.model_dump() if isinstance(defaults, BaseModel) else defaults
    return msgspec.convert(values, RequestDefaults)
