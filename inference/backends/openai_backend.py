"""The ``openai`` backend: any OpenAI-compatible HTTP server (``vllm serve``, a hosted API).

Chat prompts go to ``/v1/chat/completions``; text and token-id prompts to ``/v1/completions``.
Requests run concurrently (at most ``concurrency`` in flight); timeouts, connection errors, 429
and 5xx are retried with exponential back-off; any other 4xx, or running out of retries, gives
``"error"`` completions carrying the server's message rather than an exception.

With ``vllm_extensions`` (default: on, except for api.openai.com) the body also carries vLLM's
``top_k``, ``include_stop_str_in_output``, ``return_token_ids`` and ``return_tokens_as_token_ids``,
and a chat ending in an assistant message is continued (``continue_final_message``), not closed,
and a request's ``regex`` as ``structured_outputs: {"regex": ...}`` (guided decoding, vLLM >= 0.11).
What comes back, field by field:

- ``text``: as sent. A server that strips the matched stop string but names it (vLLM's
  ``stop_reason``) gets it appended again; a server that does not name it (hosted APIs) leaves
  the text as it is, with ``finish_reason="stop"`` and ``stop_string=None``.
- ``finish_reason``: ``"stop"`` with ``stop_string`` when a stop string is named; ``"eos"`` when
  the server is vLLM (the choice has a ``stop_reason`` key) and none was; ``"length"``.
- ``token_ids``: vLLM's ``token_ids``, else logprob tokens of the form ``token_id:N``, else ``[]``
  (plain token strings are not ids without the model's tokenizer). ``prompt_token_ids`` likewise.
- ``logprobs``: the per-token log-probabilities the server returns, else ``[]``.

``base_url`` is the API root, with or without the trailing ``/v1``.

Counting: the server's tokenizer is not here, so observation caps and document-token counts are in
whitespace words unless ``tokenizer`` names the served model's tokenizer (a Hugging Face id or a
local folder; ``--model.options.tokenizer Qwen/QwQ-32B``), which then counts them in tokens
(:attr:`count_tokenizer`). Prompts are sent as text either way; ``metrics.json`` says which unit.

Thinking: ``thinking="on"|"off"`` sends ``chat_template_kwargs: {"enable_thinking": ...}`` with
chat requests (vLLM and SGLang servers pass it to the chat template; ``"auto"``: nothing sent).
A server that returns the thinking apart (a vLLM reasoning parser: ``reasoning_content`` or
``reasoning``) gets it put back in front of the text as ``<think>...</think>``, so the trace keeps
it and :mod:`methods.thinking` separates it as for every other backend.
"""
from __future__ import annotations

import asyncio
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

try:
    import httpx
except ImportError:  # huggingface_hub (a transformers dependency) ships the same API as httpx2
    import httpx2 as httpx  # type: ignore[no-redef]

from inference.backends.chat import THINKING_SWITCH, thinking_setting
from methods.llm import Completion, GenerationRequest, GenerationResult, LLMBackend

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class HTTPFailure(Exception):
    """A response that will not succeed on retry (or the last of the retries)."""


def request_body(model: str, request: GenerationRequest, vllm_extensions: bool,
                 thinking: bool | None = None) -> tuple[str, dict[str, Any]]:
    """The endpoint path (below ``/v1``) and JSON body for one request; ``thinking`` (chat only):
    ``chat_template_kwargs.enable_thinking`` for the server's chat template (None: not sent)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "n": request.n,
    }
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    if request.allowed_token_ids:
        if not vllm_extensions:
            raise ValueError("allowed_token_ids needs a vLLM-compatible server (vllm_extensions on)")
        body["allowed_token_ids"] = list(request.allowed_token_ids)
    if request.regex is not None:
        if not vllm_extensions:
            raise ValueError("a request's regex (guided decoding) needs a vLLM-compatible server (vllm_extensions on)")
        body["structured_outputs"] = {"regex": request.regex}  # vLLM >= 0.11's field
    if vllm_extensions:
        if request.top_k > 0:
            body["top_k"] = request.top_k
        body.update(include_stop_str_in_output=True, return_token_ids=True, return_tokens_as_token_ids=True)
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        body.update(messages=prompt, logprobs=True)
        if thinking is not None:
            body["chat_template_kwargs"] = {THINKING_SWITCH: thinking}
        last = prompt[-1]  # an assistant message last is continued (a transcript, a continued thinking)
        if vllm_extensions and isinstance(last, dict) and last.get("role") == "assistant":
            body.update(add_generation_prompt=False, continue_final_message=True)
        return "/chat/completions", body
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        body.update(prompt=prompt, logprobs=1)
        return "/completions", body
    raise ValueError(f"unsupported prompt: {type(prompt).__name__}")


def _token_ids_from_strings(tokens: list[str]) -> list[int]:
    """Ids from ``token_id:N`` strings; ``[]`` when any token is a plain string."""
    ids = []
    for token in tokens:
        match = _TOKEN_ID.match(token or "")
        if match is None:
            return []
        ids.append(int(match.group(1)))
    return ids


def completion_from_choice(choice: dict[str, Any], chat: bool) -> Completion:
    """Map one response choice to a :class:`Completion` (see the module docstring)."""
    message = choice.get("message") or {}
    text = (message.get("content") if chat else choice.get("text")) or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") if chat else None
    if isinstance(reasoning, str) and reasoning:
        text = f"<think>{reasoning}</think>{text}"
    logprobs_block = choice.get("logprobs") or {}
    if chat:
        entries = logprobs_block.get("content") or []
        tokens = [e.get("token", "") for e in entries]
        logprobs = [float(e["logprob"]) for e in entries if e.get("logprob") is not None]
    else:
        tokens = logprobs_block.get("tokens") or []
        logprobs = [float(v) for v in logprobs_block.get("token_logprobs") or [] if v is not None]
    token_ids = choice.get("token_ids")
    token_ids = list(token_ids) if token_ids is not None else _token_ids_from_strings(tokens)

    reason = choice.get("finish_reason")
    stop_reason = choice.get("stop_reason")
    if reason == "length":
        return Completion(text, token_ids, logprobs, "length")
    if reason == "stop" and isinstance(stop_reason, str) and stop_reason:
        if not text.endswith(stop_reason):
            text += stop_reason  # the server stripped it; the contract keeps it
        return Completion(text, token_ids, logprobs, "stop", stop_string=stop_reason)
    if reason == "stop" and "stop_reason" in choice:  # vLLM: no stop string, so an end token
        # vLLM reports the end token among the ids and log-probs; the contract leaves it out.
        return Completion(text, token_ids[:-1], logprobs[:-1], "eos")
    if reason == "stop":  # a server that does not say whether a stop string matched
        return Completion(text, token_ids, logprobs, "stop")
    return Completion(text, token_ids, logprobs, "error", error=f"server finish_reason {reason!r}")


def _error_message(response: Any) -> str:
    try:
        data = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:500]}"
    error = data.get("error", data) if isinstance(data, dict) else data
    message = error.get("message", error) if isinstance(error, dict) else error
    return f"HTTP {response.status_code}: {message}"


def load_count_tokenizer(name: str) -> Any:
    """The Hugging Face tokenizer ``name`` (a hub id, or a local folder), for counting tokens.
    ``ValueError`` when it cannot be loaded (offline, only local folders and cached ids load)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"tokenizer {name!r} (the served model's tokenizer, for counting tokens) "
                         f"cannot be loaded: {err}") from err


class OpenAIBackend(LLMBackend):
    """Completions from an OpenAI-compatible server, many requests in flight at once."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        vllm_extensions: bool | None = None,
        thinking: str | bool | None = None,
        tokenizer: str | None = None,
    ):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.model = model
        root = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.vllm_extensions = "api.openai.com" not in self.base_url if vllm_extensions is None else vllm_extensions
        self.thinking = thinking_setting(thinking)  # sent as chat_template_kwargs (vLLM, SGLang servers)
        # The served model's tokenizer (an HF id or a local folder), for counting only: prompts stay text.
        self.tokenizer_name = tokenizer
        self._count_tokenizer = load_count_tokenizer(tokenizer) if tokenizer else None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that owns the client below
        self._client: Any = None
        self._semaphore: asyncio.Semaphore | None = None

    @property
    def count_tokenizer(self) -> Any:
        """The ``tokenizer`` option's tokenizer (None without one: the env then counts words)."""
        return self._count_tokenizer

    # ------------------------------------------------------------------ connection state
    def _new_client(self) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s),
            headers=headers,
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
        )

    def _state(self) -> tuple[Any, asyncio.Semaphore]:
        """The client and semaphore of the running event loop (both are bound to one loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None:
            self._loop, self._client = loop, self._new_client()
            self._semaphore = asyncio.Semaphore(self.concurrency)
        return self._client, self._semaphore  # type: ignore[return-value]

    # ------------------------------------------------------------------ one request
    async def _post(self, client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries; returns the JSON reply or raises :class:`HTTPFailure`."""
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            delay = self.backoff_s * 2**attempt
            try:
                response = await client.post(self.base_url + path, json=body)
            except httpx.TimeoutException as err:
                last = f"timeout after {self.timeout_s}s ({type(err).__name__})"
            except httpx.TransportError as err:
                last = f"connection error: {type(err).__name__}: {err}"
            else:
                if response.status_code < 300:
                    return response.json()
                last = _error_message(response)
                if response.status_code != 429 and response.status_code < 500:
                    raise HTTPFailure(last)
                retry_after = response.headers.get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    delay = max(delay, min(float(retry_after), 60.0))
            if attempt < self.max_retries:
                await asyncio.sleep(delay)
        raise HTTPFailure(f"{last} (gave up after {self.max_retries + 1} attempts)")

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request (native async; at most ``concurrency`` requests in flight)."""
        client, semaphore = self._state()
        return await self._complete(client, semaphore, request)

    async def _complete(self, client: Any, semaphore: asyncio.Semaphore,
                        request: GenerationRequest) -> GenerationResult:
        start = time.perf_counter()
        try:
            path, body = request_body(self.model, request, self.vllm_extensions, self.thinking)
            async with semaphore:
                reply = await self._post(client, path, body)
            chat = path == "/chat/completions"
            choices = sorted(reply.get("choices") or [], key=lambda c: c.get("index", 0))
            if not choices:
                raise HTTPFailure(f"the server returned no choices: {str(reply)[:300]}")
            completions = [completion_from_choice(c, chat) for c in choices]
            prompt_ids = reply.get("prompt_token_ids") or choices[0].get("prompt_token_ids") or []
            result = GenerationResult(completions, prompt_token_ids=list(prompt_ids))
        except (HTTPFailure, ValueError) as err:
            completions = [Completion("", finish_reason="error", error=str(err)) for _ in range(request.n)]
            result = GenerationResult(completions)
        result.latency_s = time.perf_counter() - start
        return result

    # ------------------------------------------------------------------ many requests
    async def _generate_all(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        semaphore = asyncio.Semaphore(self.concurrency)
        async with self._new_client() as client:
            return list(await asyncio.gather(*(self._complete(client, semaphore, r) for r in requests)))

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request concurrently; callable from sync code or inside a running loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._generate_all(requests))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="openai-generate") as pool:
            return pool.submit(asyncio.run, self._generate_all(requests)).result()

    async def aclose(self) -> None:
        """Close the client used by :meth:`agenerate` (call from the loop that used it)."""
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Drop the :meth:`agenerate` client, closing it on its own loop when that loop is alive."""
        super().close()
        client, loop = self._client, self._loop
        self._client, self._loop = None, None
        if client is None or loop is None or loop.is_closed():
            return  # a finished asyncio.run: its connections went with the loop
        if not loop.is_running():
            loop.run_until_complete(client.aclose())
        elif _running_loop() is loop:
            loop.create_task(client.aclose())
        else:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
