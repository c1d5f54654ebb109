"""The profile file: per-replica latency and throughput measured by `pdorch bench profile` (JSON, version 1).

    {"version": 1, "model": "...", "device": "cpu", "created": "<ISO-8601 UTC>",
     "prefill": [{"prompt_tokens": 512, "tokens_per_s": 9000.0, "ttft_s": 0.057}, ...],
     "decode":  [{"batch": 8, "context_tokens": 1024, "tokens_per_s": 160.0, "itl_s": 0.05}, ...]}

A prefill point is ONE prefill replica given uncached prompts of `prompt_tokens` tokens: `ttft_s` the median TTFT
of one such request alone, `tokens_per_s` the prompt tokens per second it sustains back to back. A decode point is
ONE decode replica running `batch` streams of about `context_tokens` context: `tokens_per_s` generated over all
streams, `itl_s` the p90 inter-token latency.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROFILE_VERSION = 1


class ProfileError(ValueError):
    """The profile file is missing or malformed; the message names the file and the field."""


@dataclass(frozen=True)
class PrefillPoint:
    prompt_tokens: int
    tokens_per_s: float
    ttft_s: float


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context_tokens: int
    tokens_per_s: float
    itl_s: float


@dataclass(frozen=True)
class Profile:
    model: str
    device: str
    created: str
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]


def load_profile(path: str | Path) -> Profile:
    """The profile at `path`; ProfileError naming the file and the field on bad input."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ProfileError(f"{path}: cannot read the profile: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not valid JSON: {e}") from None
    return profile_from_dict(data, str(path))


def profile_from_dict(data: Any, where: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    if data.get("version") != PROFILE_VERSION:
        raise ProfileError(f"{where}: field 'version' must be {PROFILE_VERSION}, got {data.get('version')!r}")
    strings = {k: _string(data, k, where) for k in ("model", "device", "created")}
    prefill = tuple(PrefillPoint(_number(p, "prompt_tokens", f"{where}: prefill[{i}]", int),
                                 _number(p, "tokens_per_s", f"{where}: prefill[{i}]", float),
                                 _number(p, "ttft_s", f"{where}: prefill[{i}]", float))
                    for i, p in enumerate(_points(data, "prefill", where)))
    decode = tuple(DecodePoint(_number(p, "batch", f"{where}: decode[{i}]", int),
                               _number(p, "context_tokens", f"{where}: decode[{i}]", int),
                               _number(p, "tokens_per_s", f"{where}: decode[{i}]", float),
                               _number(p, "itl_s", f"{where}: decode[{i}]", float))
                   for i, p in enumerate(_points(data, "decode", where)))
    return Profile(prefill=tuple(sorted(prefill, key=lambda p: p.prompt_tokens)),
                   decode=tuple(sorted(decode, key=lambda p: (p.context_tokens, p.batch))), **strings)


def save_profile(profile: Profile, path: str | Path) -> None:
    """Whole or not at all: a planner reading the file never sees half of it."""
    data = {"version": PROFILE_VERSION, "model": profile.model, "device": profile.device,
            "created": profile.created, "prefill": [asdict(p) for p in profile.prefill],
            "decode": [asdict(p) for p in profile.decode]}
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _string(data: dict, key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ProfileError(f"{where}: field '{key}' must be a string, got {value!r}")
    return value


def _points(data: dict, key: str, where: str) -> list:
    points = data.get(key)
    if not isinstance(points, list) or not points:
        raise ProfileError(f"{where}: field '{key}' must be a non-empty list of points")
    for i, p in enumerate(points):
        if not isinstance(p, dict):
            raise ProfileError(f"{where}: {key}[{i}] must be an object")
    return points


def _number(point: dict, key: str, where: str, kind: type) -> Any:
    value = point.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (kind is int and not isinstance(value, int)):
        noun = "a positive integer" if kind is int else "a positive number"
        raise ProfileError(f"{where}: field '{key}' must be {noun}, got {value!r}")
    return kind(value)
