"""Free TCP ports for local servers: store_client's helper (store_client depends on nothing in pdorch)."""

from store_client.ports import free_port, free_port_run

__all__ = ["free_port", "free_port_run"]
