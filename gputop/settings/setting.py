"""What a setting is: its meaning, type, default and sources, and how it reads its value from each.

``gputop.settings`` declares every one; this module is the type they are made of,
and the kinds of value they parse.  Loaded in every training process, like the
registry: the standard library's cheapest only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast

T = TypeVar("T")

Source = Literal["flag", "env", "file", "default"]

OFF_WORDS = frozenset({"0", "off", "false", "no"})
ON_WORDS = frozenset({"1", "on", "true", "yes"})


class SettingError(ValueError):
    """A setting's value that cannot be used; the message is one line for the user."""


@dataclass(frozen=True, kw_only=True)
class Setting(Generic[T]):
    """One setting: what it means, its type and one default, and every place it is read from."""

    key: str  # its name here, in the config file and in doctor's JSON
    meaning: str  # one line, as the README's table shows it
    default: T
    default_text: str = ""  # the default in words, where it is no constant ("derived from the launcher")
    kind: str  # what a value is, in the user's words: "seconds", "port", "path"
    env: str = ""  # the environment variable, if any
    parse: Callable[[str], T] | None = None  # the variable's text to a value; ValueError saying what is wrong
    flags: tuple[str, ...] = ()  # the command-line flags that set it (one for a file's setting has dest ``key``)
    from_file: Callable[[object], T] | None = None  # the config file's value to a value; None: not in the file
    falls_back: bool = False  # a bad value reads as the default; else the variable's reader gets SettingError
    if_bad: str = ""  # what a bad value stops, where it does not fall back
    secret: bool = False  # its value is never shown: "set" or "not set"

    @property
    def name(self) -> str:
        """How a user spells it: the variable, else the config file's key."""
        return self.env or self.key

    def value(self, env: Mapping[str, str] = os.environ) -> T:
        """The environment's value, else the default; a bad one is the default or SettingError (see ``falls_back``).

        Cheap enough for a call per training step: no object is built unless the variable is set.
        """
        text = env.get(self.env, "") if self.env else ""
        if not text or self.parse is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            if self.falls_back:
                return self.default
            raise SettingError(f"{self.env}={text!r} {exc}") from None

    def reading(
        self,
        env: Mapping[str, str] = os.environ,
        flags: Mapping[str, object] | None = None,
        file: Mapping[str, object] | None = None,
    ) -> Reading[T]:
        """Its value in force and where it came from: a flag given, else the environment, the file, the default."""
        given = flags.get(self.key) if flags and self.flags else None
        if given is not None:
            return Reading(self, cast(T, given), "flag")
        text = env.get(self.env, "") if self.env else ""
        if text and self.parse is not None:
            try:
                return Reading(self, self.parse(text), "env")
            except ValueError as exc:
                problem = f"{self.env}={text!r} {exc}; {self.if_bad_words()}"
                return Reading(self, self.default, "default", problem, stops=not self.falls_back)
        if self.from_file is not None and file and self.key in file:
            raw = file[self.key]
            try:
                return Reading(self, self.from_file(raw), "file")
            except ValueError as exc:  # preferences never stop a command: the default, as for a broken file
                return Reading(self, self.default, "default", f"{self.key} = {raw!r} in the config file {exc}; "
                               f"{self.show(self.default)} used")  # fmt: skip
        return Reading(self, self.default, "default")

    def if_bad_words(self) -> str:
        """What a bad value in the environment does, after the line that says it is bad."""
        return f"{self.show(self.default)} used" if self.falls_back else self.if_bad

    def show(self, value: object) -> str:
        """A value as doctor and the README show it; a secret only as set or not."""
        if self.secret:
            return "set" if value else "not set"
        if value is None or value == "":
            return self.default_text or "not set"
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """One setting in force: its value and where that came from."""

    setting: Setting[T]
    value: T
    source: Source
    problem: str = ""  # a bad value passed over, and what was done instead; one line
    stops: bool = False  # the bad value stops what ``setting.if_bad`` says (``value()`` raises for it)

    @property
    def shown(self) -> str:
        return self.setting.show(self.value)


@dataclass(frozen=True)
class InForce:
    """Every setting's reading, in the registry's order."""

    readings: tuple[Reading[Any], ...]
    _by_key: dict[str, Reading[Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {r.setting.key: r for r in self.readings})

    def __getitem__(self, setting: Setting[T]) -> Reading[T]:
        return cast(Reading[T], self._by_key[setting.key])

    def value(self, setting: Setting[T]) -> T:
        return self[setting].value

    def __iter__(self) -> Iterator[Reading[Any]]:
        return iter(self.readings)


# -- kinds of value: each returns the value or raises ValueError saying what is wrong, worded to follow
# "NAME='text' " (the environment) or "key = value in the config file " (the file).


def as_is(value: str) -> str:
    return value


def as_path(value: str) -> Path:
    return Path(value)


def number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError("is not a number") from None


def port(value: str) -> int:
    try:
        chosen = int(value)
    except ValueError:
        raise ValueError("is not a port number") from None
    if not 1 <= chosen <= 65535:
        raise ValueError("is outside 1-65535")
    return chosen


def at_least_one(value: str) -> int:
    """A whole number; below 1 reads as 1."""
    try:
        return max(int(value), 1)
    except ValueError:
        raise ValueError("is not a whole number") from None


def in_range(low: float, high: float, unit: str) -> Callable[[str], float]:
    """A number from ``low`` to ``high``; anything else (NaN too) is wrong."""

    def parse(value: str) -> float:
        try:
            chosen = float(value)
        except ValueError:
            chosen = float("nan")
        if not low <= chosen <= high:  # also NaN
            raise ValueError(f"is not {low:g}-{high:g} {unit}")
        return chosen

    return parse


def number_in_range(low: float, high: float, unit: str) -> Callable[[str], float]:
    """A number (else "is not a number") from ``low`` to ``high``."""
    within = in_range(low, high, unit)

    def parse(value: str) -> float:
        number(value)
        return within(value)

    return parse


def clamped(low: int, high: int) -> Callable[[str], int]:
    """A whole number, brought into ``low`` to ``high``."""

    def parse(value: str) -> int:
        try:
            return max(low, min(int(value), high))
        except ValueError:
            raise ValueError(f"is not a whole number from {low} to {high}") from None

    return parse


def not_zero(value: str) -> bool:
    """On unless ``0``."""
    return value != "0"


def not_off(value: str) -> bool:
    """On unless ``0``, ``off``, ``false`` or ``no``, in any case."""
    return value.strip().lower() not in OFF_WORDS


def auto_on_off(value: str) -> str:
    word = value.strip().lower()
    if word in OFF_WORDS:
        return "off"
    if word in ON_WORDS:
        return "on"
    if word == "auto":
        return "auto"
    raise ValueError("is not auto, on or off")


def positive_number(value: object) -> float:
    """A config file's number above 0 (``true`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError("is not a number greater than 0")
    return float(value)


def name_in_quotes(value: object) -> str:
    """A config file's non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError("is not a name in quotes")
    return value


def true_or_false(value: object) -> bool:
    """A config file's boolean."""
    if not isinstance(value, bool):
        raise ValueError("is not true or false")
    return value
