"""The I/O leases of a prefill task (IOLeases, pdorch/worker/leases.py), by name.

A task starts each kind of I/O at most once, so the name alone says what is in flight:

    STORE_LOAD   the store load of the prefix pages L1 lacked (prefix.py; the prefetch policy
                 gives it back early when it gives up on the load: prefetch.py)
    DECODE_READ  the read of the prefix pages D's pool holds into ours (pusher thread)
    STORE_SAVE   the write-back of the computed pages, with the backfill (persistence.py)
    PUSH         the transfer of the prompt pages into D's pages (pusher thread)
"""

from __future__ import annotations

STORE_LOAD = "store_load"
DECODE_READ = "decode_read"
STORE_SAVE = "store_save"
PUSH = "push"
