"""The I/O leases of a prefill task (IOLeases, pdorch/worker/leases.py), by name.

A task starts each kind of I/O at most once, so the name alone says what is in flight. Each lease is
taken and given back in the one module that starts that I/O:

    STORE_LOAD   the store load of the prefix pages L1 lacked (admission.py; given back early when
                 the prefetch policy gives up on the load)
    DECODE_READ  the read of the prefix pages D's pool holds into ours (admission.py; pusher thread)
    STORE_SAVE   the write-back of the computed pages, with the backfill (persistence.py)
    PUSH         the transfer of the prompt pages into D's pages (push_phase.py; pusher thread)
"""

from __future__ import annotations

STORE_LOAD = "store_load"
DECODE_READ = "decode_read"
STORE_SAVE = "store_save"
PUSH = "push"
