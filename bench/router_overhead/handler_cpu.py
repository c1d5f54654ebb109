"""The router's own CPU per request of a generation route, in this process: the app's hot-path handlers
(create_app) on a router whose worker stream is a stub yielding every token at once, each response
pumped to a write that does nothing. What is left is the route's own code (parse, convert, template,
job, output shaping, events, store), without the HTTP parsing and the gRPC call every route shares.
Used by responses.py to compare /v1/responses with /v1/chat/completions.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

from pdorch.config import Config, DiscoveryConfig, ModelConfig
from proto.pdorch.v1 import worker_pb2 as pb


class StubbedHandlers:
    def __init__(self, model_dir: Path):
        from engine.tokenizer import Tokenizer
        from router.http.app import create_app

        cfg = Config(model=ModelConfig(page_size=16, max_context_tokens=0),
                     discovery=DiscoveryConfig(mode="static", prefill=("127.0.0.1:1",), decode=("127.0.0.1:2",)))
        app = create_app(cfg, Tokenizer.from_dir(model_dir), model_dir)
        svc = app.state.service
        svc.dispatcher.stream = _stub_stream  # NOTE: the lifespan never runs: no worker is connected
        self.handlers = app.hot_routes.handlers

    async def cpu_us(self, path: str, body: dict, requests: int) -> float:
        """CPU µs per request of `requests` streamed through the route's handler."""
        from router.http.hot_path import HotRequest
        from router.http.sse import is_last

        handler, raw = self.handlers[path.encode()], json.dumps(body).encode()
        headers = [(b"content-type", b"application/json")]

        gc.collect()
        t0 = time.process_time()
        for _ in range(requests):
            response = await handler(HotRequest(path, headers), raw)
            try:
                async for event in response.events:  # as the hot path writes them (here: to nothing)
                    if is_last(event):
                        break
            finally:
                await response.close()
        return (time.process_time() - t0) / requests * 1e6


async def _stub_stream(job):
    n = job.sampling.max_tokens
    for i in range(n):
        yield [pb.GenerateResponse(request_id=job.request_id, token_ids=[1000 + i], text=f" w{i}",
                                   prompt_tokens=len(job.token_ids), finish_reason="length" if i == n - 1 else "")]
