"""An SGLang-compatible HTTP worker for sglang-router's side of the comparison: it streams the same
synthetic tokens as the gRPC stand-in (pdorch/local_stack/standin.py), in SGLang's `/generate` SSE
format, so both routers route to workers that cost the same.

    python -m bench.router_overhead.http_standin --port P [--token-delay-ms 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json


def serve_http_standin(port: int, token_delay_s: float) -> None:
    """An SGLang-compatible HTTP worker with the same synthetic stream as pdorch/local_stack/standin.py."""
    from aiohttp import web

    async def generate(request: web.Request):
        body = await request.json()
        n = max(1, int((body.get("sampling_params") or {}).get("max_new_tokens") or 16))
        prompt = len(body.get("input_ids") or []) or len(body.get("text") or "")
        rid = body.get("rid") or "r"

        def chunk(i: int) -> dict:
            return {"text": "".join(f" w{k}" for k in range(i + 1)), "output_ids": list(range(1000, 1001 + i)),
                    "meta_info": {"id": rid, "prompt_tokens": prompt, "completion_tokens": i + 1, "cached_tokens": 0,
                                  "finish_reason": {"type": "length", "length": n} if i == n - 1 else None}}

        if not body.get("stream"):
            if token_delay_s:
                await asyncio.sleep(token_delay_s * (n - 1))
            return web.json_response(chunk(n - 1))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            if i and token_delay_s:  # between tokens only, like pdorch/local_stack/standin.py
                await asyncio.sleep(token_delay_s)
            await resp.write(b"data: " + json.dumps(chunk(i)).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def ok(request):
        return web.json_response({"status": "ok"})

    async def info(request):
        return web.json_response({"model_path": "standin", "is_generation": True, "page_size": 16})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/health_generate", "/flush_cache"):
        app.router.add_route("*", path, ok)
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        app.router.add_get(path, info)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-delay-ms", type=float, default=40.0, help="delay between tokens")
    args = ap.parse_args(argv)
    serve_http_standin(args.port, args.token_delay_ms / 1000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
