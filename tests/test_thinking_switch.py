"""The thinking switch: ``enable_thinking`` through the chat template (hf, vllm), the
``chat_template_kwargs`` of OpenAI-compatible servers, and ``--budget``/``--thinking`` in evaluation."""
import json

import pytest
from test_evaluate import argv, setup  # noqa: F401 (fixture)
from tiny_models import tiny_llama, tiny_tokenizer

from inference import evaluate as ev
from inference.backends.chat import render_chat, thinking_setting
from inference.backends.hf import HFBackend
from inference.backends.openai_backend import completion_from_choice, request_body
from methods.llm import GenerationRequest
from methods.thinking import prompt_opens_thinking

# A Qwen3-style template: thinking on by default; off writes an empty, closed block; "on" here also
# opens the block in the prompt (as QwQ-32B's template always does), so both shapes are exercised.
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif enable_thinking is defined %}<think>\n{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_render_chat_passes_the_switch_only_when_set(tokenizer):
    assert render_chat(tokenizer, MESSAGES).endswith("<|assistant|>")
    assert render_chat(tokenizer, MESSAGES, thinking=False).endswith("<think>\n\n</think>\n\n")
    assert render_chat(tokenizer, MESSAGES, thinking=True).endswith("<|assistant|><think>\n")
    assert [thinking_setting(m) for m in ("on", "off", "auto", None, True)] == [True, False, None, None, True]
    with pytest.raises(ValueError, match="thinking must be one of"):
        thinking_setting("maybe")


def test_hf_backend_renders_with_the_switch_and_refuses_a_template_without_one(tokenizer):
    model = tiny_llama(tokenizer)
    request = GenerationRequest(MESSAGES, max_tokens=2)
    tails = {}
    for mode in ("on", "off", "auto"):
        backend = HFBackend(model, tokenizer=tokenizer, device="cpu", thinking=mode)
        (result,) = backend.generate([request])
        tails[mode] = tokenizer.decode(result.prompt_token_ids)
        assert prompt_opens_thinking(MESSAGES, result.prompt_token_ids, tokenizer) == (mode == "on")
    assert tails["off"].endswith("</think>\n\n") and tails["auto"].endswith("<|assistant|>")
    plain = tiny_tokenizer()  # no chat template, so no switch
    with pytest.raises(ValueError, match="enable_thinking"):
        HFBackend(model, tokenizer=plain, device="cpu", thinking="off")
    HFBackend(model, tokenizer=plain, device="cpu", thinking="auto")  # auto never refuses


def test_openai_backend_sends_chat_template_kwargs_and_puts_parsed_reasoning_back():
    request = GenerationRequest(MESSAGES, max_tokens=8)
    _, body = request_body("qwen3", request, vllm_extensions=True, thinking=False)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in request_body("qwen3", request, vllm_extensions=True)[1]
    assert "chat_template_kwargs" not in request_body("qwen3", GenerationRequest("raw", max_tokens=8), True, True)[1]
    partial = MESSAGES + [{"role": "assistant", "content": "<think>so far"}]  # a continued call
    _, body = request_body("qwen3", GenerationRequest(partial, max_tokens=8), vllm_extensions=True)
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    choice = {"message": {"content": "<answer>Paris</answer>", "reasoning_content": "think <search>x</search>"},
              "finish_reason": "length"}
    text = completion_from_choice(choice, chat=True).text
    assert text == "<think>think <search>x</search></think><answer>Paris</answer>"


def test_budget_and_thinking_flags_are_applied_and_recorded(setup, monkeypatch):  # noqa: F811
    seen = {}

    def load_backend(spec, **options):
        seen.update(options)
        return setup["llm"]

    monkeypatch.setattr("inference.evaluate.load_backend", load_backend)
    assert ev.main(argv(setup, "seeds-o1", "--method.budget", "thinking", "--model.thinking", "off",
                        "--data.limit", "1", "--method.options.reader_max_tokens", "300")) == 0
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["budget"] == "thinking" and config["thinking"] == "off" and seen["thinking"] == "off"
    assert config["method_options"]["max_tokens"] == 8192 and config["method_options"]["reader_max_tokens"] == 300
    with pytest.raises(SystemExit, match="contradicts"):
        ev.main(argv(setup, "seeds-o1", "--model.thinking", "on", "--model.options.thinking", "off", "--run.overwrite"))


def test_runs_without_the_flags_keep_their_config(setup):  # noqa: F811
    assert ev.main(argv(setup, "vanilla-rag", "--data.limit", "1")) == 0
    config = json.loads((setup["out"] / "config.json").read_text())
    assert "budget" not in config and "thinking" not in config
    assert config["method_options"]["answer_tokens"] == 32


def test_recipe_file_reads_yaml_off_as_the_thinking_mode(setup, tmp_path):  # noqa: F811
    recipe = tmp_path / "eval.yaml"
    recipe.write_text("budget: paper\nthinking: off\nmethod: kair\n")
    args = ev.resolve_args(["--config", str(recipe), "--run.output_dir", str(tmp_path / "r")])
    assert args.model.thinking == "off" and args.method.budget == "paper"
    assert ev.build_method(args.method).step_tokens == 768
