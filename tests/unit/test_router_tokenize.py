"""/tokenize and /detokenize (vLLM's shape, SGLang's keys too) against the router with stand-in workers."""

from __future__ import annotations

import httpx


def post(pd_router, path: str, body: dict) -> httpx.Response:
    r, _, _ = pd_router
    return httpx.post(r.url + path, json=body, timeout=30)


def test_a_prompt_and_chat_messages_tokenize_as_generation_would(pd_router, router_tokenizer):
    tok = router_tokenizer
    out = post(pd_router, "/tokenize", {"prompt": "Hello there, sea.", "return_token_strs": True}).json()
    assert out["tokens"] == tok.encode("Hello there, sea.") and out["count"] == len(out["tokens"])
    assert out["token_strs"] == [tok.id_to_token(t) for t in out["tokens"]] and out["max_model_len"] > 0
    msgs = [{"role": "user", "content": "Hi"}]
    chat = post(pd_router, "/tokenize", {"messages": msgs}).json()
    assert chat["tokens"] == tok.encode_chat(msgs) and chat["token_strs"] is None
    back = post(pd_router, "/detokenize", {"tokens": chat["tokens"]}).json()
    assert back["prompt"] == back["text"] == tok.decode(chat["tokens"])


def test_bad_tokenize_input_is_a_400_naming_the_field(pd_router):
    both = post(pd_router, "/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
    bad = post(pd_router, "/detokenize", {"tokens": [1, -5]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    wrong = post(pd_router, "/detokenize", {"tokens": "1 2"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "tokens"
    model = post(pd_router, "/tokenize", {"prompt": "x", "model": "gpt-4"})
    assert model.status_code == 404
