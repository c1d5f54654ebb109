"""The router's chat templates end to end against stand-in workers: the default model's tool-blind template
(SmolLM2's) and the built-in one that renders its tool turns, `model.chat_template` (and its errors at
start), the request fields `continue_final_message` and `chat_template`, and what `pdorch status` says.
Expected token ids come from transformers' apply_chat_template on the same template and messages."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import httpx
import pytest

from engine.chat_prompts import ChatPrompts
from engine.tokenizer import Tokenizer
from pdorch.config import ModelConfig
from pdorch.config_loader import ConfigError, load_config
from pdorch.launcher import ServeError, chat_template_summary
from pdorch.local_stack.processes import free_port
from pdorch.local_stack.router import router_config
from pdorch.status import fetch_status, render_status
from router.http.chat_prompt import chat_prompts

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASKED = [{"role": "user", "content": "Weather in Oslo?"}]
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "minus three degrees and snow"}
# A ChatML template of the operator's own: a fixed system line, nothing else of SmolLM2's.
OWN = ("{{ '<|im_start|>system\nOperator template<|im_end|>\n' }}{% for m in messages %}"
       "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
       "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def transformers_ids(model_dir, messages: list[dict], template: str | None = None, **kwargs) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    theirs = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    return list(theirs.apply_chat_template(messages, chat_template=template, tokenize=True, **kwargs)["input_ids"])


def chat(r, body: dict) -> httpx.Response:
    return httpx.post(r.url + "/v1/chat/completions", json={"max_tokens": 2, **body}, timeout=20)


def with_model(cfg, **keys):
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **keys))


def test_the_default_models_tool_turns_reach_the_prompt_through_the_builtin_template(pd_router, tiny_model_dir):
    r, _, d = pd_router
    turns = [*ASKED, CALLED, ANSWERED]
    out = chat(r, {"messages": turns, "tools": [WEATHER]})
    assert out.status_code == 200, out.text
    sent = list(d.behavior.calls[-1].token_ids)
    builtin = ChatPrompts.load(Tokenizer.from_dir(tiny_model_dir)).setup.builtin.source()
    as_transformers = [*ASKED, {**CALLED, "tool_calls": [{**CALLED["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": {"city": "Oslo"}}}]}, ANSWERED]  # arguments as an object (template_messages)
    assert sent == transformers_ids(tiny_model_dir, as_transformers, builtin, tools=[WEATHER],
                                    add_generation_prompt=True)
    tok = Tokenizer.from_dir(tiny_model_dir)
    text = tok.decode(sent)
    assert "<tool_response>\nminus three degrees and snow\n</tool_response>" in text and '"name": "get_weather"' in text
    empty = chat(r, {"messages": [*ASKED, CALLED, {**ANSWERED, "content": ""}], "tools": [WEATHER]}).json()
    assert out.json()["usage"]["prompt_tokens"] >= empty["usage"]["prompt_tokens"] + 5  # the result's tokens
    plain = chat(r, {"messages": ASKED}).json()  # no tools: SmolLM2's own template, as it was
    assert plain["usage"]["prompt_tokens"] == len(transformers_ids(tiny_model_dir, ASKED, add_generation_prompt=True))


def test_status_says_which_template_renders_tool_turns_and_which_parser_reads_calls(pd_router, tiny_model_dir):
    r, _, _ = pd_router
    chat_template = fetch_status(r.url)["chat_template"]  # pdorch status: the router's admin /workers
    assert chat_template["source"] == "checkpoint" and chat_template["ignores"] == ["tools", "tool calls"]
    assert chat_template["tool_template"] == "chatml_hermes.jinja" and chat_template["tool_call_parser"] == "hermes"
    text = render_status({"url": r.url, "workers": [], "tokens": {}, "chat_template": chat_template})
    assert "tool turns use the built-in chatml_hermes.jinja" in text and "tool calls read by hermes" in text
    cfg = load_config(None, {"model.source": str(tiny_model_dir)}, environ={})
    assert "chatml_hermes.jinja" in chat_template_summary(cfg)  # what pdorch serve says at start


def test_a_parser_set_to_another_format_than_the_builtin_writes_is_warned_of(tiny_model_dir):
    chat_setup = chat_prompts(Tokenizer.from_dir(tiny_model_dir), ModelConfig())
    from router.http.chat_prompt import chat_status

    assert "warning" not in chat_status(chat_setup, "hermes")
    warned = chat_status(chat_setup, "llama3_json")
    assert "llama3_json" in warned["warning"] and "hermes" in warned["warning"]
    assert "WARNING:" in render_status({"url": "u", "workers": [], "tokens": {}, "chat_template": warned})


def test_model_chat_template_overrides_the_checkpoints(standins, make_router, tiny_model_dir, tmp_path):
    path = tmp_path / "own.jinja"
    path.write_text(OWN)
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], cfg=with_model(router_config([p.address], [d.address],
                                                                           policy="round_robin"),
                                                             chat_template=str(path)))
    assert chat(r, {"messages": ASKED}).status_code == 200
    assert list(d.behavior.calls[-1].token_ids) == transformers_ids(tiny_model_dir, ASKED, OWN,
                                                                    add_generation_prompt=True)
    tokenized = httpx.post(r.url + "/tokenize", json={"messages": ASKED}, timeout=10).json()
    assert tokenized["tokens"] == list(d.behavior.calls[-1].token_ids)
    assert httpx.get(r.url + "/workers", timeout=10).json()["chat_template"]["source"] == str(path)


@pytest.mark.parametrize("content, words", [
    (None, "cannot read"),
    ("{% for m in messages %}{{ m['content'] }", "does not compile"),
    ("{{ raise_exception('only system prompts') }}", "only system prompts"),
])
def test_a_bad_model_chat_template_is_a_config_error_naming_the_key(tiny_model_dir, tmp_path, content, words):
    path = tmp_path / "bad.jinja"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=words) as bad:
        chat_prompts(Tokenizer.from_dir(tiny_model_dir), ModelConfig(chat_template=str(path)))
    assert str(bad.value).startswith("model.chat_template: ")
    cfg = load_config(None, {"model.source": str(tiny_model_dir), "model.chat_template": str(path)}, environ={})
    with pytest.raises(ServeError, match="model.chat_template") as serve:  # pdorch serve, before any child
        chat_template_summary(cfg)
    assert words in str(serve.value)


def test_the_router_process_stops_at_start_on_a_bad_model_chat_template(tiny_model_dir, tmp_path):
    out = subprocess.run([sys.executable, "-m", "router", "--set", f"model.source={tiny_model_dir}",
                          "--set", f"model.chat_template={tmp_path / 'missing.jinja'}",
                          "--set", f"router.port={free_port()}", "--set", "router.metrics_port=0",
                          "--set", "discovery.mode=static"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stderr
    assert "invalid configuration" in out.stderr and "model.chat_template: cannot read" in out.stderr


def test_continue_final_message_continues_the_last_message_as_transformers(pd_router, tiny_model_dir):
    r, _, d = pd_router
    prefill = [*ASKED, {"role": "assistant", "content": "It is minus"}]
    out = chat(r, {"messages": prefill, "continue_final_message": True, "add_generation_prompt": False})
    assert out.status_code == 200, out.text
    expected = transformers_ids(tiny_model_dir, prefill, continue_final_message=True, add_generation_prompt=False)
    assert list(d.behavior.calls[-1].token_ids) == expected
    assert Tokenizer.from_dir(tiny_model_dir).decode(expected).endswith("<|im_start|>assistant\nIt is minus")
    tokenized = httpx.post(r.url + "/tokenize", json={"messages": prefill, "continue_final_message": True,
                                                      "add_generation_prompt": False}, timeout=10).json()
    assert tokenized["tokens"] == expected


@pytest.mark.parametrize("fields, param, words", [
    ({"continue_final_message": True}, "continue_final_message", "cannot both be true"),
    ({"chat_template": "{{ messages }}"}, "chat_template", "model.chat_template"),
    ({"chat_template_kwargs": {"chat_template": "{{ messages }}"}}, "chat_template_kwargs", "model.chat_template"),
])
def test_template_fields_that_cannot_be_honoured_are_a_400_naming_the_field(pd_router, fields, param, words):
    r, _, d = pd_router
    before = len(d.behavior.calls)
    for path in ("/v1/chat/completions", "/tokenize"):
        resp = httpx.post(r.url + path, json={"messages": ASKED, "max_tokens": 2, **fields}, timeout=10)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == param and words in err["message"]
    assert len(d.behavior.calls) == before  # nothing reached a worker
