"""bench/store_io: the KV store's I/O: loads and saves with the scheduler loop beside them (run.py), head
groups, the SSD tier, Mooncake's SSD offload, TTFT by where the prefix comes from, long shared documents."""
