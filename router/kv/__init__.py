"""The router's KV part: which worker holds which pages, learned from the workers' KV events.

    watch.py         the subscription to each worker's KV events (WatchKV streams)
    index.py         the per-worker page index those events build
    holders.py       the index's hash -> holders map (one address, or a mask of worker slots)
    worker_kv.py     the index's record of one worker (and one routing-time guess)
    index_stats.py   the index's numbers for /workers and the metrics
    store_claims.py  which pages the store holds, as the workers' writes and evictions said
    loads.py         each worker's load, from its events and the requests routed since
    candidates.py    the workers a prompt could reuse pages on, and how many
    choice.py        the choice among them: reuse weighed against load
"""
