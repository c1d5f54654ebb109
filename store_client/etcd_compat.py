"""python3-etcd3 0.13.0, mended once for every watcher (the store's leader watch, the router's discovery).
Here because store_client imports nothing of pdorch and the router already imports store_client.

Its watch thread calls `six.itervalues` without importing six when the watch stream ends (etcd down or
restarted). The NameError kills the thread before the callbacks hear about it, so a watch would end
silently: a router would never resync, a worker would never see the next leader. Give it the one
function it uses. Importing this module applies the fix.
"""

from __future__ import annotations

import etcd3.watch

if not hasattr(etcd3.watch, "six"):
    etcd3.watch.six = type("six", (), {"itervalues": staticmethod(lambda d: iter(list(d.values())))})
