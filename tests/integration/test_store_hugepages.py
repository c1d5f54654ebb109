"""The chart's `hugepages` sets MC_STORE_USE_HUGEPAGE / MC_STORE_HUGEPAGE_SIZE on the workers: Mooncake's
store client really takes its segment from huge pages when they are set (before, nothing set them,
and the huge pages a pod reserved went unused).

A real mooncake_master and a store client set up in a child process, with and without the variables.
Where the machine has no huge pages reserved (vm.nr_hugepages 0, as here), the setup with them fails
(the allocation is refused) and without them succeeds; with huge pages reserved both succeed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from store_client.master import MasterProcess

SETUP = textwrap.dedent("""
    import sys
    from mooncake.store import MooncakeDistributedStore
    rc = MooncakeDistributedStore().setup("127.0.0.1", sys.argv[1], 32 << 20, 8 << 20, "tcp", "", sys.argv[2])
    print("setup rc", rc, flush=True)
    sys.exit(0 if rc == 0 else 3)
""")


def _setup(master: MasterProcess, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MC_STORE_")}
    return subprocess.run([sys.executable, "-c", SETUP, master.metadata_url, master.master_address],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False)


def test_mooncake_takes_the_segment_from_huge_pages_when_told(tmp_path):
    reserved = int(Path("/proc/sys/vm/nr_hugepages").read_text())
    with MasterProcess(log_dir=str(tmp_path)) as master:
        plain = _setup(master)
        assert plain.returncode == 0, plain.stdout + plain.stderr
        assert "Using hugepage size" not in plain.stdout + plain.stderr
        huge = _setup(master, MC_STORE_USE_HUGEPAGE="1", MC_STORE_HUGEPAGE_SIZE="2MB")
        out = huge.stdout + huge.stderr
        assert "Using hugepage size: 2MB" in out
        if reserved == 0:
            assert huge.returncode != 0, out  # no huge pages to take the 32 MiB segment from
        else:
            assert huge.returncode == 0, out
