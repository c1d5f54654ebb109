"""`python -m store_client.clear_all MASTER METADATA PROTOCOL DEVICE HOSTNAME`: clear the Mooncake store.

Run by `/flush_cache?store=true` in a child process (router/http/admin.py, `clear_store`). Connects as a pure
client (no segment contributed), removes every object with `remove_all(force=True)` — force
skips the read leases that `batch_is_exist` grants, which would otherwise keep recently probed
pages — and prints `{"removed": N}`.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    master, metadata, protocol, device, hostname = argv
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(hostname, metadata, 0, 16 << 20, protocol, device, master)
    if rc != 0:
        print(f"store setup failed with code {rc} (master {master}, metadata {metadata})", file=sys.stderr)
        return 1
    removed = store.remove_all(True)  # no close: see __main__
    if removed < 0:
        print(f"remove_all failed with code {removed}", file=sys.stderr)
        return 1
    print(json.dumps({"removed": removed}))
    return 0


if __name__ == "__main__":
    # os._exit, not a return: the Mooncake client's destructor joins its leader-monitor thread, which
    # waits up to 30 s on etcd with HA masters (holding the GIL). This pure client holds no segment,
    # so there is nothing to unmount; the process's exit frees its buffer.
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
