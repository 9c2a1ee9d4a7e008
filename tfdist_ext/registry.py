"""Name registries with one Keras-style `get()` for every configurable option.

Every option of `tfdist_ext.Strategy` (all-reduce algorithm, compression, sync
policy, bucketing planner) is a frozen dataclass registered under a short name.
A user may pass the name, a dict ``{"name": ..., **kwargs}`` (so options can come
from a config file or the command line) or an instance; `Registry.get` turns all
three into an instance and reports anything else with the list of valid names.

Example:
    >>> SYNC = Registry("sync")
    >>> @SYNC.register("local_sgd")
    ... @dataclasses.dataclass(frozen=True)
    ... class LocalSGD:
    ...     period: int = 8
    >>> SYNC.get({"name": "local_sgd", "period": 4})
    LocalSGD(period=4)
"""

import dataclasses
from typing import Any, Callable, Dict, Optional, Type


class Registry:
    """Maps names to configuration classes for one option of the strategy.

    Args:
        option: The keyword argument of `tfdist_ext.Strategy` this registry
            serves (used in error messages), e.g. ``"compression"``.
        base: Optional base class whose instances `get` also accepts when
            their class is not registered (user-written compressors).
    """

    def __init__(self, option: str, base: Optional[Type] = None):
        self.option = option
        self.base = base
        self._classes: Dict[str, Type] = {}

    def register(self, name: str) -> Callable[[Type], Type]:
        """Class decorator that registers `cls` under `name`."""

        def decorator(cls: Type) -> Type:
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(
                    f"{self.option} name {name!r} is already registered to "
                    f"{self._classes[name].__qualname__}; pick another name."
                )
            self._classes[name] = cls
            if "name" not in vars(cls):  # a registered parent's name is not inherited
                cls.name = name
            return cls

        return decorator

    def unregister(self, name: str) -> None:
        """Removes `name` (a notebook defining its entry again, a test's own entry)."""
        self.class_for(name)
        del self._classes[name]

    def names(self):
        """Registered names, sorted."""
        return sorted(self._classes)

    def class_for(self, name: str) -> Type:
        """The class registered under `name`; a ValueError lists valid names."""
        if name not in self._classes:
            raise ValueError(
                f"Unknown {self.option} {name!r}. Valid names: "
                f"{', '.join(repr(n) for n in self.names())}. Pass one of them, "
                f"a dict {{'name': ..., **options}}, or a configuration object."
            )
        return self._classes[name]

    def get(self, identifier: Any, default: Optional[str] = None) -> Any:
        """Returns the configuration instance that `identifier` describes.

        Args:
            identifier: A registered name, a dict with key ``"name"`` and the
                class's keyword arguments, an instance of a registered class
                (or of `base`), or None (then `default` is used).
            default: Name used when `identifier` is None.

        Raises:
            ValueError: Unknown name, or a dict whose keys the class rejects.
            TypeError: Any other kind of identifier.
        """
        if identifier is None:
            if default is None:
                return None
            identifier = default
        accepted = tuple(self._classes.values()) + ((self.base,) if self.base else ())
        if isinstance(identifier, accepted):
            return identifier
        if isinstance(identifier, str):
            return self.class_for(identifier)()
        if isinstance(identifier, dict):
            if "name" not in identifier:
                raise ValueError(
                    f"Argument `{self.option}` got the dict {identifier!r} with "
                    f"no 'name' key. Use e.g. {{'name': "
                    f"{self.names()[0]!r}, ...}}; valid names: "
                    f"{', '.join(repr(n) for n in self.names())}."
                )
            kwargs = dict(identifier)
            cls = self.class_for(kwargs.pop("name"))
            fields = {f.name for f in dataclasses.fields(cls) if f.init}
            unknown = sorted(set(kwargs) - fields)
            if unknown:
                raise ValueError(
                    f"Argument `{self.option}`: {cls.__name__} got unknown "
                    f"option(s) {unknown}. Allowed: {sorted(fields) or 'none'}."
                )
            return cls(**kwargs)
        raise TypeError(
            f"Argument `{self.option}` must be a name, a dict or a "
            f"configuration object; received {identifier!r} of type "
            f"{type(identifier).__name__}. Valid names: "
            f"{', '.join(repr(n) for n in self.names())}."
        )


def positive_int(option: str, value: Any, minimum: int = 1) -> int:
    """Validates an integer option at least `minimum`; returns it.

    Raises:
        ValueError: naming `option`, the value received and what is allowed.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"Argument `{option}` must be an integer >= {minimum}; received "
            f"{value!r}."
        )
    return value


def boolean(option: str, value: Any) -> bool:
    """Validates a flag that must be exactly True or False; returns it.

    Raises:
        ValueError: naming `option` and the value received.
    """
    if not isinstance(value, bool):
        raise ValueError(f"Argument `{option}` must be True or False; received {value!r}.")
    return value


def seconds(option: str, value: Any, advice: str = "") -> float:
    """Validates a duration option: a number of seconds >= 0 (0 waits forever).

    Raises:
        ValueError: naming `option`, the value received and what is allowed,
            followed by `advice`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(
            f"Argument `{option}` must be a number of seconds >= 0 (0 waits forever); "
            f"received {value!r}." + (f" {advice}" if advice else ""))
    return float(value)
