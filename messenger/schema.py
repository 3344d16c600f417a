"""Typed message bodies: pydantic v2 models a producer or consumer declares, checked on both sides.

    class OrderCreated(BaseModel):
        schema_version: ClassVar[str] = "2"      # optional: travels in the envelope
        order_id: str
        amount: Decimal

    class OrderProducer(Producer):
        channel = "orders"
        model = OrderCreated                     # or {"ORDER.CREATED": OrderCreated, "*": ...}

    class Orders(Consumer):
        channel = "orders"
        model = (OrderCreatedV1, OrderCreated)   # two versions during a migration

`model` is a model class, a tuple of versions of one message (a producer sends the last), or a
mapping from routing key to either ("*": any other key). pydantic is imported only when a class
declares a model (extra `messenger[typed]`): a producer without one never loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from messenger.errors import InvalidBody, InvalidSettings

#: Message attribute carrying the body model's `schema_version` (absent when it has none).
SCHEMA_VERSION_ATTRIBUTE = "schema_version"
#: The routing key entry of a `model` mapping that matches any key it does not name.
ANY_ROUTING_KEY = "*"


class BodySchema:
    """The models of one producer or consumer class, by routing key and schema version."""

    def __init__(self, owner: str, declared: Any) -> None:
        from pydantic import BaseModel  # only here: classes without a model never load pydantic

        self.owner = owner
        entries = declared if isinstance(declared, Mapping) else {ANY_ROUTING_KEY: declared}
        self.models: dict[str, tuple[Any, ...]] = {}
        for key, models in entries.items():
            versions = tuple(models) if isinstance(models, (tuple, list)) else (models,)
            if not versions or not all(
                isinstance(m, type) and issubclass(m, BaseModel) for m in versions
            ):
                raise InvalidSettings(
                    f"{owner}.model[{key!r}] must be a pydantic BaseModel subclass or a tuple of "
                    f"them (one per schema version), got {models!r}"
                )
            tags = [version_of(m) for m in versions]
            if len(set(tags)) != len(tags):
                raise InvalidSettings(
                    f"{owner}.model[{key!r}]: two models share schema_version; give each "
                    f"version its own (e.g. schema_version: ClassVar[str] = '2')"
                )
            self.models[key] = versions

    @classmethod
    def of(cls, owner: str, declared: Any) -> BodySchema | None:
        """The schema of a class's `model` attribute, or None when it declares none."""
        return None if declared is None else cls(owner, declared)

    def _versions(self, routing_key: str | None) -> tuple[Any, ...]:
        versions = self.models.get(routing_key or "") or self.models.get(ANY_ROUTING_KEY)
        if versions is None:
            raise InvalidBody(
                f"invalid: routing_key: {self.owner} declares no model for {routing_key!r} "
                f"(models for: {', '.join(map(repr, self.models))})"
            )
        return versions

    def dump(self, body: Any, routing_key: str | None) -> tuple[Any, str | None]:
        """Producer side: (the body as JSON-ready data, its schema version). `body` is a model
        instance or data for the newest declared model; InvalidBody names the bad field."""
        from pydantic import ValidationError

        versions = self._versions(routing_key)
        model = type(body) if type(body) in versions else versions[-1]
        try:
            instance = body if type(body) is model else model.model_validate(
                body.model_dump() if hasattr(body, "model_dump") else body)
        except ValidationError as error:
            raise InvalidBody(invalid_reason(error)) from None
        return instance.model_dump(mode="json"), version_of(model)

    def load(self, body: Any, routing_key: str | None, version: str | None) -> Any:
        """Consumer side: the model instance of a received body, by routing key and schema
        version; InvalidBody('invalid: <field>: <error>') when it does not validate."""
        from pydantic import ValidationError

        versions = self._versions(routing_key)
        matching = [m for m in versions if version_of(m) == version]
        if not matching and version is None and len(versions) == 1:
            matching = list(versions)  # an unversioned producer, a consumer with one model
        if not matching:
            accepted = ", ".join(repr(version_of(m)) for m in versions)
            raise InvalidBody(
                f"invalid: schema_version: {version!r} is not one {self.owner} accepts "
                f"({accepted})"
            )
        try:
            return matching[0].model_validate(body)
        except ValidationError as error:
            raise InvalidBody(invalid_reason(error)) from None


def version_of(model: Any) -> str | None:
    """A model's `schema_version` class attribute as text, or None."""
    version = getattr(model, "schema_version", None)
    return None if version is None else str(version)


def invalid_reason(error: Any) -> str:
    """'invalid: <field>: <error>' from a pydantic ValidationError (its first error)."""
    errors = error.errors(include_url=False)
    first = errors[0]
    field = ".".join(str(part) for part in first["loc"]) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"invalid: {field}: {first['msg']}{more}"

