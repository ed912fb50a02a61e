"""A scripted stand-in LLM: a function of the rendered prompt decides the reply.

It honours stop strings (kept in the output, nothing after them), counts words as tokens and
records every batch it receives, so tests can drive any method deterministically.
"""
from __future__ import annotations

from collections.abc import Callable

from inference.backends.chat import plain_chat
from methods.llm import Completion, GenerationRequest, GenerationResult, LLMBackend


def prompt_text(request: GenerationRequest) -> str:
    if isinstance(request.prompt, str):
        return request.prompt
    if request.prompt and isinstance(request.prompt[0], int):
        return " ".join(map(str, request.prompt))
    return plain_chat(request.prompt)


class FakeLLM(LLMBackend):
    name = "fake"

    def __init__(self, respond: Callable[[str], str]):
        self.respond = respond
        self.batches: list[int] = []
        self.prompts: list[str] = []

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append(len(requests))
        results = []
        for request in requests:
            text = prompt_text(request)
            self.prompts.append(text)
            reply = self.respond(text)
            finish, stop_string = "length", None
            cut = min(((reply.find(s) + len(s), s) for s in request.stop if s in reply), default=None)
            if cut is not None:
                reply, finish, stop_string = reply[: cut[0]], "stop", cut[1]
            words = reply.split()
            if cut is None and len(words) > request.max_tokens:
                reply = " ".join(words[: request.max_tokens])
            elif cut is None:
                finish = "eos"
            completion = Completion(reply, list(range(len(reply.split()))), [0.0] * len(reply.split()), finish,
                                    stop_string)
            results.append(GenerationResult([completion], list(range(len(text.split())))))
        return results
