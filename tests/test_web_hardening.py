"""The web fetcher against hostile peers: a page or search reply that trickles (a total deadline),
IPv6 addresses that embed a private IPv4 one (NAT64, 6to4), names that do not resolve, a redirect
that would carry the search API key to another host, and an oversized search reply. Everything
stays on loopback or in an httpx MockTransport (``loopback_only``)."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from test_web_retriever import loopback_only  # noqa: F401  (autouse: no test leaves loopback)

from envs.retrieval.web import WebRetriever, parse_web_spec
from envs.retrieval.web_http import TransientError, fetch_page, non_public_address, page_client, send_json

PUBLIC = "93.184.216.34"  # a public address, as a literal: no name lookup


class Trickle:
    """A loopback server that answers every connection with ``head`` at once (or trickled with
    ``slow_head``) and then ``body`` one byte every ``every`` seconds."""

    def __init__(self, head: bytes, body: bytes, every: float = 0.2, slow_head: bool = False):
        self.head, self.body, self.every, self.slow_head = head, body, every, slow_head
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            try:
                if not self.slow_head:
                    conn.sendall(self.head)
                for byte in (self.head if self.slow_head else b"") + self.body:
                    if self.stop.wait(self.every):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def trickle(body_kind: str, slow_head: bool = False) -> Trickle:
    body = b"x" * 60
    head = (f"HTTP/1.1 200 OK\r\ncontent-type: {body_kind}\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    return Trickle(head, body, slow_head=slow_head)


@pytest.mark.parametrize("slow_head", [False, True], ids=["slow body", "slow head"])
def test_a_trickling_page_is_cut_at_the_total_deadline(slow_head):
    server = trickle("text/plain", slow_head)
    try:
        with page_client(1.0, private_pages=True) as client:  # 1 s per read, a byte every 0.2 s
            started = time.perf_counter()
            page = fetch_page(client, f"{server.url}/page", 100_000)
            took = time.perf_counter() - started
    finally:
        server.close()
    assert took < 2.0, took  # the whole page would take 12 s
    assert page.error.startswith("transient: ") and "total deadline of 1 s" in page.error


def test_a_trickling_search_reply_is_cut_at_the_total_deadline():
    server = trickle("application/json")
    try:
        with httpx.Client(timeout=1.0) as client:
            started = time.perf_counter()
            with pytest.raises(TransientError, match="total deadline of 1 s"):
                send_json(client, httpx.Request("GET", f"{server.url}/search"))
            assert time.perf_counter() - started < 2.0
    finally:
        server.close()


EMBEDDING_PRIVATE = [  # (IPv6 address, the private IPv4 address it leads to; None: refused as a whole)
    ("64:ff9b::7f00:1", "127.0.0.1"), ("64:ff9b::a00:1", "10.0.0.1"), ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
    ("2002:a00:1::1", "10.0.0.1"), ("2002:7f00:1::", "127.0.0.1"), ("2002:c0a8:101::1", "192.168.1.1"),
    ("::7f00:1", "127.0.0.1"), ("::ffff:10.0.0.1", None), ("64:ff9b:1::a00:1", None)]


def test_nat64_and_6to4_addresses_are_judged_by_the_ipv4_address_they_embed():
    def handler(request):
        raise AssertionError(f"fetched {request.url}")

    with page_client(5.0, httpx.MockTransport(handler)) as client:
        for address, embedded in EMBEDDING_PRIVATE:
            reason = non_public_address(address, 80)
            assert reason is not None and (embedded is None or f"embedding {embedded}" in reason), address
            assert "non-public address" in fetch_page(client, f"http://[{address}]/", 1000).error
    assert non_public_address("64:ff9b::808:808", 80) is None  # 8.8.8.8 through NAT64
    assert non_public_address("2002:808:808::1", 80) is None  # and through 6to4


def test_a_name_that_does_not_resolve_is_refused(monkeypatch):
    def unresolvable(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)

    def handler(request):
        raise AssertionError(f"fetched {request.url}")

    with page_client(5.0, httpx.MockTransport(handler)) as client:
        page = fetch_page(client, "http://rebinding.example/", 1000)
    assert page.error.startswith("refused: rebinding.example does not resolve")


def serper(handler, options: str = "") -> WebRetriever:
    spec = f"web:serper:http://{PUBLIC}/search?rps=0&fetch=false&retries=0&cache=off"
    spec += f"&{options}" if options else ""
    return WebRetriever(parse_web_spec(spec), transport=httpx.MockTransport(handler))


def test_the_api_key_is_not_sent_to_another_host_on_a_redirect(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "k3y")
    seen = []

    def handler(request):
        seen.append((str(request.url), request.headers.get("x-api-key")))
        if request.url.path == "/search":
            return httpx.Response(307, headers={"location": "/moved"})  # same origin: the key stays
        if request.url.path == "/moved":
            return httpx.Response(307, headers={"location": "http://203.0.113.9/collect"})  # elsewhere
        return httpx.Response(200, json={"organic": [{"link": "https://example.org/", "title": "t", "snippet": "s"}]})

    with serper(handler) as retriever:
        (hits,) = retriever.search(["anything"], k=1)
    assert hits[0].text == "s"
    assert seen == [(f"http://{PUBLIC}/search", "k3y"), (f"http://{PUBLIC}/moved", "k3y"),
                    ("http://203.0.113.9/collect", None)]


def test_a_search_reply_over_the_cap_is_a_failed_search(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "k3y")
    huge = json.dumps({"organic": [{"link": f"https://example.org/{i}", "title": "t" * 100, "snippet": "s" * 100}
                                   for i in range(20_000)]}).encode()

    with serper(lambda request: httpx.Response(200, content=huge), "max_reply_bytes=100000") as retriever:
        assert retriever.search(["anything"], k=3) == [[]]
        assert retriever.stats.failed_searches == 1 and "over 100000 bytes" in retriever.errors[0]["error"]
