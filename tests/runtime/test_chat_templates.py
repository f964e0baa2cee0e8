"""Chat templates render as transformers' apply_chat_template does ({% break %}, strftime_now,
tools), --chat-template replaces the checkpoint's, and each family's end-of-turn token stops."""

from __future__ import annotations

import json

import pytest
from stemma.bench.tool_schemas import weather_tool
from stemma.runtime.engine import Engine
from stemma.runtime.tokenizer import Tokenizer

from ..fixtures import write_tiny_tokenizer

# The constructs of Llama 3.x templates that a plain Jinja environment rejects.
LLAMA3_STYLE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{%- if tools is not none %}{{- 'Functions:\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) + '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{{- system + '<|eot_id|>' }}"
    "{%- for message in messages %}{%- if loop.index > 3 %}{%- break %}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
TOOLS = [weather_tool()]
MESSAGES = [
    {"role": "system", "content": "Be brief. "},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "dropped by the break"},
]
SPECIALS = ("<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<end_of_turn>")


@pytest.fixture(scope="module")
def llama3_tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama3-tok")
    write_tiny_tokenizer(out, extra_specials=SPECIALS)
    tcfg = {"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps({**tcfg, "chat_template": LLAMA3_STYLE}))
    return out


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_renders_as_transformers_does(llama3_tokenizer_dir, tools):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(llama3_tokenizer_dir))
    want = hf.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True, tokenize=False)
    got = Tokenizer(llama3_tokenizer_dir).apply_chat_template(MESSAGES, True, tools)
    assert got == want
    assert ("get_weather" in got) == (tools is not None) and "dropped" not in got


def test_end_of_turn_tokens_stop(llama3_tokenizer_dir):
    tok = Tokenizer(llama3_tokenizer_dir)
    eot = tok.encode("<|eot_id|>")
    assert len(eot) == 1 and eot[0] in tok.eos_token_ids
    assert tok.encode("<end_of_turn>")[0] in tok.eos_token_ids
    assert tok.encode("<|endoftext|>")[0] in tok.eos_token_ids  # the checkpoint's own eos


def test_chat_template_override_and_stop_in_engine(tiny_llama_dir, tmp_path):
    template = tmp_path / "override.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}>")
    with Engine(str(tiny_llama_dir), dtype="float32", chat_template=str(template)) as engine:
        text = engine.apply_chat_template([{"role": "user", "content": "hi"}])
        assert text == "[user] hi>"
        eos = engine.tokenizer.encode("<|im_end|>")[0]
        out = engine.generate(
            "Paris", {"max_new_tokens": 8, "temperature": 0, "logit_bias": {str(eos): 100.0}}
        )
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["output_ids"] == [eos] and out["text"] == ""


# Gemma 2 refuses a system message; Gemma 3 folds it into the first user turn, so a lone
# system message renders nothing of it. Neither may stop the engine from starting.
GEMMA_TURNS = (
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
GEMMA2_STYLE = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}"
    "{{- raise_exception('System role not supported') }}{%- endif %}"
    "{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}" + GEMMA_TURNS
)
GEMMA3_STYLE = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set first_user_prefix = '' %}"
    "{%- set loop_messages = messages %}{%- endif %}" + GEMMA_TURNS
)
BROKEN = "{{ raise_exception('this template renders nothing') }}"


@pytest.mark.parametrize("template", [GEMMA2_STYLE, GEMMA3_STYLE], ids=["refuses", "folds"])
def test_a_template_without_a_system_role_gets_user_and_assistant_markers(tmp_path, template):
    write_tiny_tokenizer(tmp_path, extra_specials=SPECIALS)
    tcfg = {"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    roles = Tokenizer(tmp_path).chat_roles()
    assert roles is not None and roles.to_dict() == {
        "roles": {
            "user": ["<start_of_turn>user\n", "<end_of_turn>\n"],
            "assistant": ["<start_of_turn>model\n", "<end_of_turn>\n"],
        },
        "default_system_prompt": None,
        "generation_prompt": "<start_of_turn>model\n",
    }


def test_an_engine_starts_whatever_its_template_raises(tiny_llama_dir, tmp_path):
    template = tmp_path / "broken.jinja"
    template.write_text(BROKEN)
    with Engine(str(tiny_llama_dir), dtype="float32", chat_template=str(template)) as engine:
        assert engine.get_model_info()["chat_template"] is None
        out = engine.generate("Paris", {"max_new_tokens": 2, "temperature": 0})
    assert out["meta_info"]["completion_tokens"] == 2
    gemma2 = tmp_path / "gemma2.jinja"
    gemma2.write_text(GEMMA2_STYLE)
    with Engine(str(tiny_llama_dir), dtype="float32", chat_template=str(gemma2)) as engine:
        assert set(engine.get_model_info()["chat_template"]["roles"]) == {"user", "assistant"}
