"""Where profiles come from: the shipped ones (by name) or a YAML file."""
from __future__ import annotations

import difflib
import importlib.resources
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .model import Profile, ProfileError
from .resolve import build_profile
from .schema import parse_yaml


def _shipped_dir() -> Any:
    """Directory (Traversable) holding the shipped profiles, installed or in a source checkout."""
    try:
        return importlib.resources.files("tiering.profiles")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "profiles"


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    directory = _shipped_dir()
    return sorted(
        entry.name[: -len(".yaml")]
        for entry in directory.iterdir()
        if entry.name.endswith(".yaml") and entry.is_file()
    )


def _load_text(text: str, source: str, env: Mapping[str, str] | None) -> Profile:
    env = os.environ if env is None else env
    return build_profile(parse_yaml(text, source), source, env)


def _read_file(path: str, env: Mapping[str, str] | None) -> Profile:
    file = Path(os.path.expanduser(str(path)))
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(
            f"{file}: profile file not found; give an existing YAML file or a shipped profile name "
            f"({', '.join(list_profiles())})",
            source=str(file),
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(
            f"{file}: cannot read the profile ({exc}); check the path and its permissions", source=str(file)
        ) from None
    return _load_text(text, str(file), env)


def _is_path(spec: str) -> bool:
    return "/" in spec or spec.endswith((".yaml", ".yml"))


def load_profile(spec: str | None = None, env: Mapping[str, str] | None = None) -> Profile:
    """Load a profile: None or "auto" -> the auto profile; a shipped name; or a path to a YAML file.

    Anything containing "/" or ending in .yaml/.yml is a path; so is any other
    name that is not shipped but names an existing file.  ``env`` (default
    os.environ) is used for ${VAR} expansion and the job id.  Raises
    ProfileError listing every problem of the profile.
    """
    name = "auto" if spec is None else str(spec).strip()
    if _is_path(name):
        return _read_file(name, env)
    shipped = list_profiles()
    if name not in shipped:
        if os.path.isfile(name):
            return _read_file(name, env)
        close = difflib.get_close_matches(name, shipped, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ProfileError(
            f"unknown profile {name!r}: {hint}shipped profiles are {', '.join(shipped)}; "
            f"or give the path to a YAML file (e.g. ./mycluster.yaml)",
            source=name,
        )
    entry = _shipped_dir() / f"{name}.yaml"
    return _load_text(entry.read_text(encoding="utf-8"), str(entry), env)


def check_profile(spec: str, env: Mapping[str, str] | None = None) -> Profile:
    """Load and validate a profile, a file or a shipped name as for `load_profile`
    (what `tiering profile check` runs); raises ProfileError with every problem."""
    return load_profile(spec, env)
