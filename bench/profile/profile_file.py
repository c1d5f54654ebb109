"""The profile file the planner reads (the agreed format, version 1):

    {"version": 1, "model": ..., "device": ..., "created": "<ISO-8601 UTC>",
     "prefill": [{"prompt_tokens", "tokens_per_s", "ttft_s"}, ...],
     "decode":  [{"batch", "context_tokens", "tokens_per_s", "itl_s"}, ...]}

Built here from the measured points; the planner's own loader (profile_from_dict) checks it and
save_profile writes it.
"""

from __future__ import annotations

import datetime

VERSION = 1
PREFILL_FIELDS = ("prompt_tokens", "tokens_per_s", "ttft_s")
DECODE_FIELDS = ("batch", "context_tokens", "tokens_per_s", "itl_s")


def profile_dict(model: str, device: str, prefill: list[dict], decode: list[dict]) -> dict:
    created = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {"version": VERSION, "model": model, "device": device, "created": created,
            "prefill": [{k: p[k] for k in PREFILL_FIELDS} for p in sorted(prefill, key=lambda p: p["prompt_tokens"])],
            "decode": [{k: d[k] for k in DECODE_FIELDS}
                       for d in sorted(decode, key=lambda d: (d["context_tokens"], d["batch"]))]}
