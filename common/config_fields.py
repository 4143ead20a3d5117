"""Typed, field-naming access to a raw ``config.json`` dict."""

from typing import Any

_MISSING = object()


class ConfigError(ValueError):
    """A config field is missing, mistyped, unsupported or inconsistent with another.

    ``str(error)`` reads ``"<origin>: <field>: <what is wrong>"``.
    """

    def __init__(self, field: str, message: str, origin: str = "config.json"):
        self.field = field
        super().__init__(f"{origin}: {field}: {message}")


class ConfigReader:
    """Reads fields of one raw config dict, remembering which keys were consulted.

    Args:
        raw: the parsed JSON object.
        origin: where it came from, for messages.
    """

    def __init__(self, raw: dict[str, Any], origin: str):
        self.raw = raw
        self.origin = origin
        self.consulted: set[str] = set()

    def error(self, field: str, message: str) -> ConfigError:
        return ConfigError(field, message, self.origin)

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def value(self, key: str, default: Any = _MISSING, aliases: tuple[str, ...] = ()) -> Any:
        """The value of ``key`` (or the first present alias); ``default`` when absent, else an error."""
        for name in (key, *aliases):
            self.consulted.add(name)
            if self.raw.get(name) is not None:
                return self.raw[name]
        if default is _MISSING:
            names = " or ".join((key, *aliases))
            raise self.error(key, f"missing (required: {names})")
        return default

    def integer(
        self, key: str, default: Any = _MISSING, minimum: int = 1, aliases: tuple[str, ...] = ()
    ) -> Any:
        """An integer ``>= minimum`` (``None`` passes through when it is the default)."""
        value = self.value(key, default, aliases)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: Any = _MISSING, positive: bool = True) -> float:
        value = self.value(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a number, got {value!r}")
        if positive and value <= 0:
            raise self.error(key, f"must be > 0, got {value}")
        return float(value)

    def boolean(self, key: str, default: Any = _MISSING, aliases: tuple[str, ...] = ()) -> bool:
        value = self.value(key, default, aliases)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, allowed: tuple[Any, ...], default: Any = _MISSING) -> Any:
        """A value that must be one of ``allowed`` (anything else is unsupported)."""
        value = self.value(key, default)
        if value not in allowed:
            raise self.error(key, f"{value!r} is not supported (supported: {', '.join(map(repr, allowed))})")
        return value
