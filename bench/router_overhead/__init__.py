"""The router-overhead study: what the pdorch router adds to a request against a fast stand-in
worker, next to SGLang's Rust router and a control (the least a Python router does), and where
that cost goes. One entry, `python -m bench.router_overhead` (__main__.py): by default the
comparison (compare.py, on the processes of targets.py: stand-ins, http_standin.py, the routers,
floor.py; load from load_client.py); sub-commands ttft-path (ttft_path.py, marks set by
ttft_tracer.py), pick and http-layer. docs/benchmarks.md, "Router overhead", has the results.
"""
