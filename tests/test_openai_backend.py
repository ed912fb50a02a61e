"""OpenAIBackend against a scripted OpenAI-compatible server on 127.0.0.1 (standard library only)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inference.backends.openai_backend import OpenAIBackend, completion_from_choice, request_body
from methods.llm import GenerationRequest


class FakeServer:
    """Answers each POST with ``script(path, body, attempt)`` -> ``(status, json_body, delay_s)``.

    Records every request (path, body, headers) and the largest number handled at once (from arrival
    until the reply is ready).
    """

    def __init__(self, script):
        self.script = script
        self.requests: list[tuple[str, dict, dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((self.path, body, dict(self.headers)))
                    attempt = len(server.requests)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, reply, delay = server.script(self.path, body, attempt)
                    time.sleep(delay)
                finally:
                    # Counted out before the reply leaves: once the client has read it, it may send its
                    # next request before this thread runs again, which must not look like one more
                    # request at once.
                    with server.lock:
                        server.in_flight -= 1
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_reply(content="ok", finish="stop", **extra):
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish, **extra}
    return {"choices": [choice]}


def text_reply(text="ok", finish="length", **extra):
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}]}


def backend(server, **kwargs):
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("timeout_s", 5.0)
    return OpenAIBackend("tiny-model", base_url=server.url, api_key="sk-test", **kwargs)


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


def test_chat_request_body_and_reply_mapping():
    reply = chat_reply(
        "<search>paris</search>",
        stop_reason="</search>",
        token_ids=[5, 6, 7],
        logprobs={"content": [{"token": "token_id:5", "logprob": -0.1}, {"token": "token_id:6", "logprob": -0.2},
                              {"token": "token_id:7", "logprob": -0.3}]},
    )
    reply["prompt_token_ids"] = [1, 2]
    with FakeServer(lambda path, body, attempt: (200, reply, 0)) as server:
        request = GenerationRequest(CHAT, stop=("</search>",), max_tokens=32, temperature=0.7, top_p=0.9, top_k=20,
                                    seed=3, n=1)
        [result] = backend(server).generate([request])
    path, body, headers = server.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "tiny-model" and body["messages"] == CHAT
    assert body["stop"] == ["</search>"] and body["max_tokens"] == 32 and body["n"] == 1
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["seed"] == 3
    assert body["logprobs"] is True and body["top_k"] == 20 and body["include_stop_str_in_output"] is True
    completion = result.completions[0]
    assert completion.text == "<search>paris</search>"
    assert completion.finish_reason == "stop" and completion.stop_string == "</search>"
    assert completion.token_ids == [5, 6, 7] and completion.logprobs == [-0.1, -0.2, -0.3]
    assert result.prompt_token_ids == [1, 2] and result.latency_s > 0


@pytest.mark.parametrize("prompt", ["Question: who?\nAnswer:", [1, 17, 42]])
def test_completions_request_for_text_and_token_ids(prompt):
    reply = text_reply(" Paris", "length",
                       logprobs={"tokens": ["token_id:9", "token_id:4"], "token_logprobs": [-1.0, -2.0]})
    with FakeServer(lambda path, body, attempt: (200, reply, 0)) as server:
        [result] = backend(server).generate([GenerationRequest(prompt, max_tokens=2)])
    path, body, _ = server.requests[0]
    assert path == "/v1/completions"
    assert body["prompt"] == prompt and body["logprobs"] == 1 and "messages" not in body
    assert "top_k" not in body and "stop" not in body and "seed" not in body
    completion = result.completions[0]
    assert completion.text == " Paris" and completion.finish_reason == "length"
    assert completion.token_ids == [9, 4] and completion.logprobs == [-1.0, -2.0]


def test_stop_string_reappended_only_when_server_names_it():
    named = completion_from_choice({"text": "<answer>Paris", "finish_reason": "stop", "stop_reason": "</answer>"},
                                   chat=False)
    assert named.text == "<answer>Paris</answer>" and named.stop_string == "</answer>"
    kept = completion_from_choice({"text": "<answer>Paris</answer>", "finish_reason": "stop",
                                   "stop_reason": "</answer>"}, chat=False)
    assert kept.text == "<answer>Paris</answer>"
    unnamed = completion_from_choice({"message": {"content": "<answer>Paris"}, "finish_reason": "stop"}, chat=True)
    assert unnamed.text == "<answer>Paris" and unnamed.finish_reason == "stop" and unnamed.stop_string is None
    # vLLM names no stop string when the model ended: an end token, which the contract leaves out.
    eos = completion_from_choice({"text": "done", "finish_reason": "stop", "stop_reason": None, "token_ids": [3, 2],
                                  "logprobs": {"tokens": ["token_id:3", "token_id:2"], "token_logprobs": [-0.5, -0.1]}},
                                 chat=False)
    assert eos.finish_reason == "eos" and eos.token_ids == [3] and eos.logprobs == [-0.5]


def test_plain_token_strings_give_no_ids():
    choice = {"message": {"content": "hi"}, "finish_reason": "length",
              "logprobs": {"content": [{"token": "hi", "logprob": -0.4}]}}
    completion = completion_from_choice(choice, chat=True)
    assert completion.token_ids == [] and completion.logprobs == [-0.4]


def test_retries_on_500_and_429_then_succeeds():
    def script(path, body, attempt):
        if attempt == 1:
            return 500, {"error": {"message": "overloaded"}}, 0
        if attempt == 2:
            return 429, {"error": {"message": "slow down"}}, 0
        return 200, chat_reply("fine"), 0

    with FakeServer(script) as server:
        [result] = backend(server, max_retries=3).generate([GenerationRequest(CHAT)])
    assert len(server.requests) == 3
    assert result.completions[0].text == "fine" and result.completions[0].finish_reason == "stop"


def test_gives_up_after_max_retries():
    with FakeServer(lambda path, body, attempt: (503, {"error": {"message": "down"}}, 0)) as server:
        [result] = backend(server, max_retries=2).generate([GenerationRequest(CHAT, n=2)])
    assert len(server.requests) == 3
    assert [c.finish_reason for c in result.completions] == ["error", "error"]
    assert "down" in result.completions[0].error and "3 attempts" in result.completions[0].error


def test_no_retry_on_400_and_error_carries_message():
    reply = {"error": {"message": "This model's maximum context length is 2048 tokens"}}
    with FakeServer(lambda path, body, attempt: (400, reply, 0)) as server:
        [result] = backend(server, max_retries=3).generate([GenerationRequest("x" * 10)])
    assert len(server.requests) == 1
    completion = result.completions[0]
    assert completion.finish_reason == "error" and "maximum context length" in completion.error
    assert "400" in completion.error


def test_timeout_is_retried_then_reported():
    with FakeServer(lambda path, body, attempt: (200, chat_reply(), 1.0)) as server:
        start = time.perf_counter()
        [result] = backend(server, timeout_s=0.2, max_retries=1).generate([GenerationRequest(CHAT)])
        elapsed = time.perf_counter() - start
    assert len(server.requests) == 2
    assert result.completions[0].finish_reason == "error" and "timeout" in result.completions[0].error
    assert elapsed < 2.0


def test_timeout_then_success():
    def script(path, body, attempt):
        return (200, chat_reply("late but fine"), 1.0 if attempt == 1 else 0)

    with FakeServer(script) as server:
        [result] = backend(server, timeout_s=0.3, max_retries=2).generate([GenerationRequest(CHAT)])
    assert len(server.requests) == 2 and result.completions[0].text == "late but fine"


def test_concurrency_limit_is_respected():
    with FakeServer(lambda path, body, attempt: (200, text_reply(body["prompt"]), 0.15)) as server:
        requests = [GenerationRequest(f"q{i}") for i in range(10)]
        results = backend(server, concurrency=3).generate(requests)
    assert [r.text for r in results] == [f"q{i}" for i in range(10)]  # request order kept
    assert server.max_in_flight == 3


def test_agenerate_native_async_and_generate_inside_a_running_loop():
    with FakeServer(lambda path, body, attempt: (200, text_reply(body["prompt"]), 0.05)) as server:
        llm = backend(server, concurrency=2)

        async def main():
            results = await asyncio.gather(*(llm.agenerate(GenerationRequest(f"a{i}")) for i in range(5)))
            inside = llm.generate([GenerationRequest("sync-in-loop")])  # runs in a worker thread
            await llm.aclose()
            return results, inside

        results, inside = asyncio.run(main())
    assert [r.text for r in results] == [f"a{i}" for i in range(5)]
    assert inside[0].text == "sync-in-loop"
    assert server.max_in_flight <= 2


def test_environment_defaults_and_no_key(monkeypatch):
    with FakeServer(lambda path, body, attempt: (200, text_reply(), 0)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "")
        llm = OpenAIBackend("m")
        assert llm.base_url == server.url + "/v1"
        llm.generate([GenerationRequest("hi")])
    assert "Authorization" not in server.requests[0][2]


def test_connection_refused_becomes_error_completion():
    with FakeServer(lambda path, body, attempt: (200, text_reply(), 0)) as server:
        url = server.url
    llm = OpenAIBackend("m", base_url=url, max_retries=1, backoff_s=0.01, timeout_s=1.0)
    [result] = llm.generate([GenerationRequest("hi")])
    assert result.completions[0].finish_reason == "error" and "connection" in result.completions[0].error


def test_hosted_api_gets_no_vllm_extensions():
    request = GenerationRequest(CHAT, top_k=5)
    _, body = request_body("gpt", request, vllm_extensions=False)
    assert not {"top_k", "include_stop_str_in_output", "return_token_ids"} & body.keys()
    assert OpenAIBackend("gpt", base_url="https://api.openai.com/v1", api_key="k").vllm_extensions is False


def test_named_tokenizer_counts_tokens_and_metrics_name_the_unit(tmp_path, retriever, examples):
    """Without the served model's tokenizer the env counts words; with ``tokenizer`` (a local folder
    here: nothing downloads) it counts that tokenizer's tokens, and metrics.json says which."""
    from tiny_models import bpe_tokenizer

    import methods
    from inference.evaluate import count_unit
    from methods.runner import run_questions_sync

    bpe_tokenizer(["The capital of France is Paris."], 300).save_pretrained(tmp_path / "tok")
    method = methods.get("vanilla-rag")
    with FakeServer(lambda path, body, attempt: (200, chat_reply("Paris"), 0)) as server:
        words, counted = backend(server), backend(server, tokenizer=str(tmp_path / "tok"))
        assert words.count_tokenizer is None and counted.count_tokenizer is not None
        assert counted.tokenizer is None  # counting only: prompts are still sent as text
        (by_words,) = run_questions_sync(method, examples[:1], words, retriever)
        (by_tokens,) = run_questions_sync(method, examples[:1], counted, retriever)
    assert by_words["prediction"] == by_tokens["prediction"] == "Paris"
    assert 0 < by_words["doc_tokens"] < by_tokens["doc_tokens"]  # a tiny BPE splits the passages finely
    with pytest.raises(ValueError, match="cannot be loaded"):
        OpenAIBackend("m", tokenizer=str(tmp_path / "missing"))
    assert count_unit({"llm": "openai:m", "llm_options": {}}) == "words"
    assert count_unit({"llm": "openai:m", "llm_options": {"tokenizer": str(tmp_path / "tok")}}) == "tokens"
    assert count_unit({"llm": "hf:smollm2-135m", "llm_options": {}}) == "tokens"
