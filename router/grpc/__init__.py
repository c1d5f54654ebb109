"""The router's own lean gRPC client for the decode workers' Generate streams, on HTTP/2 frames it
builds itself: `stream.py` (the channel; why not grpc.aio is its docstring), `conn.py` (one
connection: SETTINGS, GOAWAY, keepalive), `slots.py` (its stream limit), `call.py` (one call),
`http2.py` (frames). Nothing here knows the router's HTTP side."""
