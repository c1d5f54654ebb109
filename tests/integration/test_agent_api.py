"""Agent traffic through the API (structured outputs, tool calls) on the real stack: the official
`openai` client -> the real router -> D -> P (tiny random-weights model, real mooncake_master,
decode offload on), and a grammar-constrained stream whose decode worker is killed mid-way.

Random weights are the harshest model for a grammar: whatever the logits, the output must parse.
The schemas bound every value (enums, fixed array lengths) so a random model ends within max_tokens.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from engine.chat_prompts import ChatPrompts
from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import cluster_router, wait_until
from pdorch.local_stack.workers import WorkerCluster, make_config
from store_client.master import MasterProcess
from tests.integration.fault_helpers import iter_sse, kill_serving_decode
from tests.integration.test_agent_tools import streamed_calls

PURE_CLIENT = {"store": {"global_segment_size_mb": 0}}  # a killed decode worker's segment holds nothing
WORDS = {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "minItems": 24, "maxItems": 24}
REPORT = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]},
                                           "words": {**WORDS, "minItems": 3, "maxItems": 3}},
          "required": ["ok", "level", "words"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {
                                                "unit": {"enum": ["c", "f"]}, "days": {"enum": [1, 2, 3]}},
                                                "required": ["unit", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
MODEL = None  # the served model (the router answers for its own)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("agent_api")
    master = MasterProcess(log_dir=str(tmp)).start()
    c = WorkerCluster(make_config(tmp, tiny_model_dir, master, decode={"offload_generated_kv": True}), tmp, master)
    with c.stopped_on_failure():
        c.wait_ready(c.spawn_worker("prefill"), *[c.spawn_worker("decode", sections=PURE_CLIENT) for _ in range(2)])
    yield c
    c.stop()


@pytest.fixture(scope="module")
def router(cluster, tiny_model_dir):
    r = cluster_router(cluster, tiny_model_dir)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def fits_report(value) -> bool:
    return (set(value) == {"ok", "level", "words"} and isinstance(value["ok"], bool) and value["level"] in ("low", "high")
            and len(value["words"]) == 3 and set(value["words"]) <= {"alpha", "beta", "gamma"})


def test_json_schema_output_parses_and_fits_streamed_and_not(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
    for seed in (1, 2):
        out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=120, temperature=1.0,
                                             seed=seed, response_format=fmt)
        assert out.choices[0].finish_reason == "stop", out
        assert fits_report(json.loads(out.choices[0].message.content))
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=120, temperature=1.0,
                                                seed=seed, response_format=fmt, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == out.choices[0].message.content  # seeded: the same draw streamed or not


def test_a_named_tool_choice_returns_a_call_whose_arguments_fit(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice=choice,
                                         max_tokens=60, temperature=0)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and msg.content is None
    (call,) = msg.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and args["unit"] in ("c", "f") and args["days"] in (1, 2, 3)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK],
                                            tool_choice=choice, max_tokens=60, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == args
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_required_tool_choice_returns_calls_of_listed_tools(client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=80, temperature=0)
    (call,) = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict) and (call.function.name == "get_time" or set(args) == {"unit", "days"})
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK],
                                            tool_choice="required", parallel_tool_calls=False, max_tokens=80,
                                            temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    assert streamed_calls(chunks) == [(call.function.name, call.function.arguments)]


def test_auto_tool_choice_reads_a_call_the_model_wrote_in_its_familys_format(client):
    """The tiny model has SmolLM2's ChatML template, which ignores tools: its tool turns go through the
    built-in ChatML template, whose call format is hermes' <tool_call> (engine/tool_templates.py), and the
    parser follows it. A random model writes no call by itself, so a regex makes it write one (a regex
    with "auto" tools constrains the whole output, as on vLLM)."""
    call = r'<tool_call>\n\{"name": "get_time", "arguments": \{\}\}\n</tool_call>'
    kwargs = {"model": MODEL, "messages": MESSAGES, "tools": [WEATHER, CLOCK], "max_tokens": 40, "temperature": 0,
              "extra_body": {"regex": call}}
    out = client.chat.completions.create(**kwargs)
    (got,) = out.choices[0].message.tool_calls
    assert (got.function.name, json.loads(got.function.arguments)) == ("get_time", {})
    assert out.choices[0].finish_reason == "tool_calls" and out.choices[0].message.content is None
    chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    assert not any(c.choices[0].delta.content for c in chunks)  # held back: it was a call
    assert streamed_calls(chunks) == [("get_time", "{}")] and chunks[-1].choices[0].finish_reason == "tool_calls"
    prose = client.chat.completions.create(**{**kwargs, "extra_body": {"regex": "Sunny, [0-9]{2} degrees"}})
    assert prose.choices[0].message.tool_calls is None and prose.choices[0].finish_reason == "stop"


def test_a_tool_result_turn_reaches_the_prompt(client, tiny_model_dir):
    turns = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "minus three degrees and snow"}]
    out = client.chat.completions.create(model=MODEL, messages=turns, tools=[WEATHER], max_tokens=4, temperature=0)
    # the template as transformers would be given it: the call's arguments as an object, the tool's reply;
    # SmolLM2's template ignores tools, so the built-in one renders the turn (engine/chat_prompts.py)
    expected = ChatPrompts.load(Tokenizer.from_dir(tiny_model_dir)).encode(
        [MESSAGES[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": {"unit": "c"}}}]},
         {"role": "tool", "content": "minus three degrees and snow", "tool_call_id": "call_7"}],
        tools=[WEATHER])
    assert out.usage.prompt_tokens == len(expected)
    without = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=4,
                                             temperature=0)
    assert out.usage.prompt_tokens >= without.usage.prompt_tokens + 5  # "minus three degrees and snow" is in


def test_a_tool_loop_round_trips_through_the_default_models_template(client, tiny_model_dir):
    """Call, result, answer: the call the model wrote comes back in the next prompt as it wrote it (the
    built-in template writes what the parser read), the result is in that prompt, and the loop ends in text."""
    call = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"unit": "c", "days": 2\}\}\n</tool_call>'
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK], max_tokens=160,
                                           temperature=0, extra_body={"regex": call})
    assert first.choices[0].finish_reason == "tool_calls", first
    (called,) = first.choices[0].message.tool_calls
    history = MESSAGES + [first.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": called.id, "content": "minus three degrees and snow"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, CLOCK], max_tokens=40,
                                            temperature=0, extra_body={"regex": "Cold, [0-9] degrees"})
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.tool_calls is None
    tok = Tokenizer.from_dir(tiny_model_dir)
    asked = ChatPrompts.load(tok).render(MESSAGES, tools=[WEATHER, CLOCK])
    answered = ChatPrompts.load(tok).render(
        [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [{"id": called.id, "type": "function",
                                                                          "function": {"name": "get_weather",
                                                                                       "arguments": {"unit": "c", "days": 2}}}]},
         history[-1]], tools=[WEATHER, CLOCK])
    assert answered.startswith(asked)  # the first turn's prompt is the second's prefix (its KV is reused)
    assert answered[len(asked):].startswith('<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c", "days": 2}}')
    assert "minus three degrees and snow" in answered
    assert second.usage.prompt_tokens == len(tok.encode(answered, add_special_tokens=False))


def test_chat_logprobs_are_log_probabilities_greedy_picks_the_best_and_stream_agrees(client):
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "logprobs": True,
              "top_logprobs": 3, "extra_body": {"ignore_eos": True}}
    out = client.chat.completions.create(**kwargs)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 12
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.logprob == max(a.logprob for a in t.top_logprobs) == t.top_logprobs[0].logprob  # greedy
        assert t.top_logprobs[0].token == t.token and bytes(t.bytes).decode() == t.token
    streamed = [lp for c in client.chat.completions.create(**kwargs, stream=True)
                if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]


def test_completions_and_generate_logprobs(client, router):
    out = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) <= 2 for t in lp.top_logprobs)
    assert lp.token_logprobs[0] == max(lp.top_logprobs[0].values())
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == out.choices[0].text
    body = {"text": "The sea is", "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True,
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}
    meta = httpx.post(router.url + "/generate", json=body, timeout=120).json()["meta_info"]
    tokens = meta["output_token_logprobs"]
    assert [t[1] for t in tokens] == httpx.post(router.url + "/generate", json=body, timeout=120).json()["output_ids"]
    assert all(t[0] <= 0 and isinstance(t[2], str) for t in tokens) and len(meta["output_top_logprobs"][0]) == 2
    assert tokens[0][0] == meta["output_top_logprobs"][0][0][0]


def test_logit_bias_and_min_tokens_hold_on_p_and_d(client, router, tiny_model_dir):
    """The first token is P's, the rest D's: a +100 bias makes every one of them the biased token;
    a +100 bias on EOS with min_tokens=5 ends the output right after 5 tokens."""
    tok = Tokenizer.from_dir(tiny_model_dir)
    (hello,) = tok.encode(" hello", add_special_tokens=False)
    out = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0,
                                    logit_bias={str(hello): 100}, extra_body={"ignore_eos": True})
    assert out.choices[0].text == " hello" * 6
    eos = tok.eos_token_ids[0]
    body = {"text": "The sea is", "sampling_params": {"max_new_tokens": 20, "temperature": 0, "min_new_tokens": 5,
                                                      "logit_bias": {str(eos): 100}}}
    meta = httpx.post(router.url + "/generate", json=body, timeout=120).json()
    assert meta["output_ids"][:5] != [eos] * 5 and eos not in meta["output_ids"][:5]
    assert meta["meta_info"]["completion_tokens"] == 6 and meta["output_ids"][5] == eos, meta
    # a penalty moves greedy output off the token it repeats (vLLM: logit -= frequency x count)
    plain = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    penalised = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=12, temperature=0,
                                          frequency_penalty=2.0, presence_penalty=2.0,
                                          extra_body={"ignore_eos": True}).choices[0].text
    ids = tok.encode(penalised, add_special_tokens=False)
    assert penalised != plain and len(set(ids)) >= len(set(tok.encode(plain, add_special_tokens=False)))


def test_sglang_generate_follows_a_regex(router):
    body = {"text": "Code:", "sampling_params": {"regex": r"[A-F]{4}-\d{3}", "max_new_tokens": 30, "temperature": 1.0}}
    r = httpx.post(router.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"[A-F]{4}-\d{3}", r.json()["text"]), r.json()


@pytest.mark.parametrize("fields, param, words", [
    ({"extra_body": {"regex": "a(b"}}, "regex", "Regex parsing error"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                           "minProperties": "two"}}}},
     "response_format.json_schema.schema", "invalid json_schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "no tool named 'nope'"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "must be in [0, 20]"),
    ({"n": 1000}, "n", "router.max_n"),
    ({"frequency_penalty": 3.0}, "frequency_penalty", "must be in [-2, 2]"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "not in the model's vocabulary"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "keys must be token ids"),
])
def test_bad_agent_input_is_a_400_naming_the_field(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, **fields)
    err = e.value.body
    assert err["param"] == param and words in err["message"] and "Traceback" not in err["message"], err


def test_a_grammar_stream_resumed_after_its_decode_worker_died_still_parses(cluster, router):
    """kill -9 the decode worker after 12 streamed tokens: the new workers advance their matchers by
    the tokens already streamed (SamplingParams.resumed_tokens) and the whole output parses; under greedy
    it equals an uninterrupted run."""
    # NOTE: long enough (~500 tokens) that the stream is still on its decode worker when the client has
    # read 12 chunks: a slow client may read far behind the router
    words = {**WORDS, "minItems": 120, "maxItems": 120}
    body = {"model": None, "messages": MESSAGES, "max_tokens": 1000, "temperature": 0, "stream": True,
            "logprobs": True, "top_logprobs": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": words}}}
    logprobs: dict[bool, list[float]] = {True: [], False: []}

    def run(kill_after: int | None) -> str:
        pieces, killed = [], False
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200, resp.read()
            for ev in iter_sse(resp.iter_lines()):
                assert "error" not in ev, ev
                pieces.append(ev["choices"][0]["delta"].get("content") or "")
                logprobs[kill_after is not None] += [t["logprob"] for t in
                                                     (ev["choices"][0]["logprobs"] or {"content": []})["content"]]
                if kill_after is not None and not killed and len(pieces) >= kill_after:
                    assert not ev["choices"][0]["finish_reason"]
                    kill_serving_decode(router, cluster)
                    killed = True
        assert kill_after is None or killed
        return "".join(pieces)

    resumed = run(kill_after=12)
    got = json.loads(resumed)
    assert len(got) == 120 and set(got) <= {"alpha", "beta", "gamma"}
    text = httpx.get(router.url + "/metrics", timeout=30).text
    assert re.search(r'^pdorch_router_failovers_total\{outcome="resumed"\} 1\.0$', text, re.MULTILINE), text[-2000:]
    wait_until(lambda: sum(w["healthy"] for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]
                           if w["role"] == "decode") == 1, 30, "the dead decode worker marked unhealthy")
    assert run(kill_after=None) == resumed
    # every token's logprob came through the join: the first from the new prefill worker
    assert len(logprobs[True]) == len(logprobs[False]) > 120 and all(v <= 0 for v in logprobs[True])
    assert max(abs(a - b) for a, b in zip(logprobs[True], logprobs[False])) < 1e-3


PROMPT = [(i * 37) % 800 + 40 for i in range(45)]  # token ids: a prompt of its own (nothing cached)


def test_echoed_prompt_logprobs_equal_the_decoded_tokens_logprobs(client, router):
    """Greedy: generate 6 tokens from PROMPT, then echo PROMPT + those tokens. P's every-row prefill
    gives the last 6 positions the logprobs D's decode steps gave them (another code path)."""
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    gen = router_tokens(router, out.choices[0].text, PROMPT)
    decoded = out.choices[0].logprobs.token_logprobs
    for attempt in range(2):  # the second time the prompt's pages are cached: the logprobs are computed anyway
        echo = client.completions.create(model=MODEL, prompt=PROMPT + gen, max_tokens=1, temperature=0,
                                         logprobs=2, echo=True)
        lp = echo.choices[0].logprobs
        assert len(lp.tokens) == len(PROMPT) + len(gen) + 1 and lp.token_logprobs[0] is None
        assert lp.top_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
        assert lp.token_logprobs[len(PROMPT):len(PROMPT) + 6] == pytest.approx(decoded, abs=1e-4), attempt
        assert echo.usage.prompt_tokens_details.cached_tokens == 0  # prompt logprobs: nothing reused
        assert echo.choices[0].text.startswith(lp.tokens[0])
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT + gen, max_tokens=1, temperature=0, logprobs=2, echo=True, stream=True))
    assert text == echo.choices[0].text


def router_tokens(router, text: str, prompt: list[int]) -> list[int]:
    """The ids of a greedy continuation, read back through /generate (the same request)."""
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    out = httpx.post(router.url + "/generate", json=body, timeout=120).json()
    assert out["text"] == text
    return out["output_ids"]


def test_echo_without_logprobs_leads_with_the_prompt_text(client):
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, echo=True, temperature=0)
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0)
    assert out.choices[0].text == "Once upon a time" + plain.choices[0].text


def test_generate_logprob_start_len_gives_the_input_logprobs_from_there(router):
    body = {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    full = httpx.post(router.url + "/generate", json={**body, "logprob_start_len": 0}, timeout=120).json()["meta_info"]
    tail = httpx.post(router.url + "/generate", json={**body, "logprob_start_len": 40}, timeout=120).json()["meta_info"]
    assert len(full["input_token_logprobs"]) == len(PROMPT) and full["input_token_logprobs"][0][0] is None
    assert [t[1] for t in full["input_token_logprobs"]] == PROMPT and full["input_top_logprobs"][0] is None
    assert len(full["input_top_logprobs"][1]) == 2
    assert [t[0] for t in tail["input_token_logprobs"]] == pytest.approx(
        [t[0] for t in full["input_token_logprobs"][40:]], abs=1e-4)
    assert httpx.post(router.url + "/generate", json={**body, "logprob_start_len": 45}, timeout=120).json()[
        "error"]["param"] == "logprob_start_len"
