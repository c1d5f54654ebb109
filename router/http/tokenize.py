"""/tokenize and /detokenize, in vLLM's shape (SGLang's keys too where they differ): the router's own
tokenizer and chat template, the ones generation uses, so a client counts what a request will cost."""

from __future__ import annotations

from pydantic import BaseModel, Field
from starlette.requests import Request

from router.errors import bad_request
from router.http.bodies import _CFG, ChatMessage, Tool, parse
from router.http.chat_prompt import chat_prompt_ids
from router.http.formats import json_response


class TokenizeRequest(BaseModel):
    model_config = _CFG
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (as vLLM)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # as on chat completions (router/http/chat_prompt.py)
    chat_template: str | None = None  # refused, as on chat completions
    tools: list[Tool] | None = None
    chat_template_kwargs: dict | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = _CFG
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


def add_routes(app, svc, auth) -> None:
    @app.post("/tokenize", summary="Tokens of a prompt or of chat messages (vLLM's /tokenize)")
    async def tokenize(request: Request):
        auth.check_client(request.headers.get("authorization"))
        req = parse(TokenizeRequest, await request.body())
        svc.served.check(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of `prompt` or `messages`", param="prompt")
        if req.messages is not None:
            kwargs = dict(req.chat_template_kwargs or {})
            if req.tools:
                kwargs["tools"] = [t.model_dump(exclude_none=True) for t in req.tools]
            ids = chat_prompt_ids(svc.chat, req, kwargs)
        else:
            ids = svc.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False)
        strs = [svc.tokenizer.id_to_token(t) for t in ids] if req.return_token_strs else None
        return json_response({"count": len(ids), "max_model_len": svc.context_limit(), "tokens": ids,
                              "token_strs": strs})

    @app.post("/detokenize", summary="Text of token ids (vLLM's /detokenize; SGLang's `text` too)")
    async def detokenize(request: Request):
        auth.check_client(request.headers.get("authorization"))
        req = parse(DetokenizeRequest, await request.body())
        svc.served.check(req.model)
        vocab = svc.tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"tokens must be ids in [0, {vocab}), got {bad[0]}", param="tokens")
        text = svc.tokenizer.decode(req.tokens)
        return json_response({"prompt": text, "text": text})

