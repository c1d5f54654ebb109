"""Chat templates with tools (engine/chat_template.py, engine/tool_templates.py, engine/chat_prompts.py),
against transformers' `apply_chat_template` on the same template, messages and tokenizer (the fixture
checkpoints' own files, read by PreTrainedTokenizerFast as in tests/unit/test_family_templates.py).

The tool-aware templates below are written here in the shapes of the released ones (Qwen2.5's ChatML with
<tool_call>, Llama 3.1's JSON calls and ipython results, Mistral v0.3's [AVAILABLE_TOOLS] / [TOOL_CALLS] /
[TOOL_RESULTS] with its 9-character call ids); the built-in tool templates are checked the same way."""

from __future__ import annotations

import pytest

from engine.chat_prompts import CHECKPOINT, ChatPrompts
from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.tokenizer import Tokenizer
from engine.tool_templates import BUILTINS, CALLS, RESULTS, TOOLS, builtin_for
from pdorch.local_stack.hf_checkpoints import _CHATML, _LLAMA3, build_checkpoint
from router.http.tool_parsers import parse

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

LLAMA31 = r"""{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
    {%- else %}{{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}
        {%- else %}{{- message.content }}{%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
"""

MISTRAL_V03 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}{%- set loop_messages = messages[1:] %}
{%- else %}{%- set loop_messages = messages %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}{{- '"' + key + '": "' + val + '"' }}{%- else %}{{- '"' + key + '": ' + val|tojson }}{%- endif %}
                    {%- if not loop.last %}{{- ", " }}{%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" }}{%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}{{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}{{- "[INST] " + message["content"] + "[/INST]" }}{%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}{{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}{{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}{%- set content = message.content.content %}
        {%- else %}{%- set content = message.content %}{%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}{{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""
# Mistral v0.1's: no tools, alternating user and assistant only (a tool turn is refused).
MISTRAL_V01 = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
               "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
               "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
               "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
# SmolLM2-135M-Instruct's own template (tokenizer_config.json), copied: each message's content only.
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
           "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
                                                    "where": {"$ref": "#/$defs/Place"}},
                   "required": ["city"], "$defs": {"Place": {"type": "object", "properties": {"lat": {"type": "number"}}}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time, ünïcode and <tags>",
                                          "parameters": {"type": "object", "properties": {}}}}
TOOL_LIST = [WEATHER, CLOCK]


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


ONE_CALL = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("call12345", "get_weather", {"city": "Oslo", "unit": "c"})]},
    {"role": "tool", "content": "minus three and snow", "tool_call_id": "call12345"},
    {"role": "assistant", "content": "It is -3 C and snowing."},
    {"role": "user", "content": "And the time?"},
]
TWO_CALLS = [
    {"role": "user", "content": "Weather in Oslo, and the time?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        _call("callAAAA1", "get_weather", {"city": "Oslo", "where": {"lat": 59.9}}), _call("callBBBB2", "get_time", {})]},
    {"role": "tool", "content": "minus three", "tool_call_id": "callAAAA1"},
    {"role": "tool", "content": "10:42", "tool_call_id": "callBBBB2"},
]
CONTINUED = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": "It is"}]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool_templates")
    return {f: build_checkpoint(f, root / f) for f in ("llama3", "qwen2", "mistral")}


def ours(model_dir, template: str, tmp_path) -> ChatPrompts:
    """The router's chat prompts with `template` as model.chat_template."""
    path = tmp_path / "template.jinja"
    path.write_text(template)
    return ChatPrompts.load(Tokenizer.from_dir(model_dir), str(path))


def transformers_ids(model_dir, template: str, messages: list[dict], **kwargs) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    theirs = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    return list(theirs.apply_chat_template(messages, chat_template=template, tokenize=True, **kwargs)["input_ids"])


AWARE = [("qwen2", QWEN25, [ONE_CALL, TWO_CALLS]), ("llama3", LLAMA31, [ONE_CALL]),
         ("mistral", MISTRAL_V03, [ONE_CALL, TWO_CALLS])]


@pytest.mark.parametrize("family, template, conversations", AWARE, ids=["qwen25", "llama31", "mistral_v03"])
def test_tool_aware_templates_render_tools_calls_and_results_as_transformers(dirs, tmp_path, family, template,
                                                                             conversations):
    chat = ours(dirs[family], template, tmp_path)
    assert chat.setup.ignored == () and chat.setup.builtin is None  # left alone
    for messages in conversations:
        for gen in (True, False):
            got = chat.encode(messages, gen, tools=TOOL_LIST)
            assert got == transformers_ids(dirs[family], template, messages, tools=TOOL_LIST,
                                           add_generation_prompt=gen)
    text = chat.render(ONE_CALL, tools=TOOL_LIST)
    assert "minus three and snow" in text and "get_weather" in text and '"Oslo"' in text


@pytest.mark.parametrize("family, template", [("qwen2", QWEN25), ("llama3", LLAMA31), ("mistral", MISTRAL_V03),
                                              ("qwen2", SMOLLM2)])
def test_continue_final_message_ends_the_prompt_inside_the_last_message_as_transformers(dirs, tmp_path, family,
                                                                                        template):
    chat = ours(dirs[family], template, tmp_path)
    got = chat.encode(CONTINUED, False, True)
    assert got == transformers_ids(dirs[family], template, CONTINUED, add_generation_prompt=False,
                                   continue_final_message=True)
    assert chat.render(CONTINUED, False, True).endswith("It is")


@pytest.mark.parametrize("family, blind, fmt, ignored", [
    ("qwen2", _CHATML, "chatml", (TOOLS, CALLS)), ("qwen2", SMOLLM2, "chatml", (TOOLS, CALLS)),
    ("llama3", _LLAMA3, "llama3", (TOOLS, CALLS)), ("mistral", MISTRAL_V01, "mistral", (TOOLS, CALLS, RESULTS))])
def test_a_tool_blind_template_is_detected_and_tool_turns_use_the_builtin_as_transformers_renders_it(
        dirs, tmp_path, family, blind, fmt, ignored):
    chat = ours(dirs[family], blind, tmp_path)
    assert chat.setup.builtin is not None and chat.setup.builtin.format == fmt
    assert chat.setup.ignored == ignored  # a result written as a plain turn's content counts as rendered
    builtin = chat.setup.builtin.source()
    for messages in ([*ONE_CALL[1:]], TWO_CALLS):
        assert chat.encode(messages, tools=TOOL_LIST) == transformers_ids(dirs[family], builtin, messages,
                                                                          tools=TOOL_LIST, add_generation_prompt=True)
    plain = [{"role": "user", "content": "Hello"}]  # no tools: the model's own template, as it is
    assert chat.encode(plain) == transformers_ids(dirs[family], blind, plain, add_generation_prompt=True)
    # a tool-result turn: the result is in the prompt, which is longer than the empty turn's
    result_turn = chat.render(ONE_CALL[1:4], tools=TOOL_LIST)
    assert "minus three and snow" in result_turn and "get_weather" in result_turn
    assert len(chat.encode(ONE_CALL[1:4], tools=TOOL_LIST)) > len(chat.encode(ONE_CALL[1:2], tools=TOOL_LIST)) + 10


def test_smollm2s_own_template_ignores_tools_and_calls_and_the_chatml_builtin_stands_in(tiny_model_dir):
    chat = ChatPrompts.load(Tokenizer.from_dir(tiny_model_dir))  # the packaged model's tokenizer_config.json
    assert chat.setup.source == CHECKPOINT and chat.setup.ignored == (TOOLS, CALLS)
    assert chat.setup.builtin.file == "chatml_hermes.jinja" and chat.setup.call_format == "hermes"
    assert "chatml_hermes.jinja" in chat.setup.describe() and "ignores tools and tool calls" in chat.setup.describe()
    with_result = chat.render(ONE_CALL[1:4], tools=TOOL_LIST)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>' in with_result
    assert "<tool_response>\nminus three and snow\n</tool_response>" in with_result
    assert chat.render(ONE_CALL[1:2]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


@pytest.mark.parametrize("builtin", BUILTINS, ids=[b.format for b in BUILTINS])
def test_the_calls_a_builtin_writes_are_the_ones_its_parser_reads_back(builtin):
    """A tool loop round-trips: the assistant turn the built-in writes for the calls, after the generation
    prompt, is what the model writes, and the format's tool-call parser reads the same calls from it."""
    template = ChatTemplate(builtin.source())
    asked = template.render(TWO_CALLS[:1], True, tools=TOOL_LIST)
    answered = template.render(TWO_CALLS[:2], False, tools=TOOL_LIST)
    assert answered.startswith(asked)
    written = answered[len(asked):].removesuffix({"chatml": "<|im_end|>\n", "llama3": "<|eot_id|>"}.get(builtin.format, ""))
    names = [t["function"]["name"] for t in TOOL_LIST]  # the parser reads only the request's tools' calls
    content, calls = parse(builtin.call_format, written.removeprefix("[TOOL_CALLS]"), names)  # a special token: not text
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo", "where": {"lat": 59.9}}'),
                                                      ("get_time", "{}")]
    assert content == ("Let me check." if builtin.format == "chatml" else None)  # JSON formats: calls only


def test_a_template_of_no_known_format_that_ignores_tools_refuses_tool_turns(tiny_model_dir, tmp_path):
    chat = ours(tiny_model_dir, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", tmp_path)
    assert chat.setup.builtin is None and builtin_for(chat._own.source) is None
    assert "requests with tools are refused" in chat.setup.describe()
    assert chat.render([{"role": "user", "content": "hi"}]) == "user: hi\n"  # plain chats are served
    with pytest.raises(ChatTemplateError, match="ignores tools") as refused:
        chat.render([{"role": "user", "content": "hi"}], tools=TOOL_LIST)
    assert refused.value.param == "tools"


def test_the_builtin_templates_are_package_data_of_the_wheel():
    import fnmatch
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["engine"]
    for builtin in BUILTINS:
        assert (root / "engine" / "chat_templates" / builtin.file).is_file()
        assert any(fnmatch.fnmatch(f"chat_templates/{builtin.file}", g) for g in globs), builtin.file
