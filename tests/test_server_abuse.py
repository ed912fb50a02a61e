"""The retrieval server under abuse, over real loopback sockets with small configured caps: large
and many headers, slowloris heads and bodies, idle connections, too many connections, requests
whose work or response is too large, a maximal request beside small ones, and TLS."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from server_helpers import QUERIES, as_json, index_dir, local, private_cache, reference, serve  # noqa: F401

from envs.retrieval.batching import AsyncBatcher
from envs.retrieval.remote import RemoteRetriever
from envs.retrieval.server import RetrievalServer, ServerLimits, uvicorn_app
from envs.retrieval.server_protocol import RepeatedWarnings
from envs.types import Hit

BODY = json.dumps({"queries": ["capital of Japan"], "k": 2}).encode()


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 5.0) -> bytes:
    """Send ``head`` and ``body`` on a fresh connection; what came back before the server closed it
    (or a reset cut it short: a server closing with unread bytes resets the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            for start in range(0, len(head), 4096):
                sock.sendall(head[start:start + 4096])
            sock.sendall(body)
        except OSError:
            pass
        return read_until_closed(sock)


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


def search_head(extra: str = "", length: int = len(BODY)) -> bytes:
    return f"POST /search HTTP/1.1\r\nhost: x\r\n{extra}content-length: {length}\r\nconnection: close\r\n\r\n".encode()


def test_a_header_over_the_cap_is_refused_and_the_server_keeps_serving(local):
    with serve(local, max_header_bytes=8192) as running:
        assert raw_request(running.port, search_head(f"x-small: {'a' * 4000}\r\n"), BODY).startswith(b"HTTP/1.1 200")
        started = time.perf_counter()
        answer = raw_request(running.port, search_head(f"x-big: {'a' * 1_000_000}\r\n"), BODY)
        assert time.perf_counter() - started < 2
        assert not answer.startswith(b"HTTP/1.1 200")  # refused: 431, or a reset once the cap was passed
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431") and b"max_header_bytes=8192" in answer
        assert httpx.post(f"{running.url}/search", content=BODY, trust_env=False).status_code == 200


def test_too_many_header_lines_get_431(local):
    with serve(local, max_headers=20) as running, httpx.Client(base_url=running.url, trust_env=False) as http:
        many = {f"x-h{i}": "1" for i in range(30)}
        refused = http.post("/search", content=BODY, headers=many)
        assert refused.status_code == 431 and "max_headers=20" in refused.json()["error"]
        assert http.post("/search", content=BODY).status_code == 200


def slow_sender(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    """Sends ``data`` one byte every ``every`` seconds (a slowloris), until refused or stopped."""
    for byte in data:
        if stop.wait(every):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


def test_slow_and_silent_clients_are_dropped_while_normal_clients_keep_their_latency(local):
    limits = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "keep_alive_s": 1.0}
    with serve(local, **limits) as running:
        stop, socks, threads = threading.Event(), [], []
        for i in range(12):  # slow heads, slow bodies, silent connections
            sock = socket.create_connection(("127.0.0.1", running.port), timeout=5)
            if i % 3 == 1:
                sock.sendall(search_head(length=500))  # a whole head, then a body that trickles
            if i % 3 != 2:
                payload = search_head(length=500) + b"x" * 500 if i % 3 == 0 else b"x" * 500
                threads.append(threading.Thread(target=slow_sender, args=(sock, payload, 0.1, stop), daemon=True))
            socks.append(sock)
        for thread in threads:
            thread.start()
        started = time.perf_counter()
        latencies = []
        with httpx.Client(base_url=running.url, trust_env=False, timeout=5) as http:
            while time.perf_counter() - started < 2.5:
                sent = time.perf_counter()
                assert http.post("/search", content=BODY).status_code == 200
                latencies.append(time.perf_counter() - sent)
                time.sleep(0.05)
        answers = [read_until_closed(sock) for sock in socks]  # every one was closed by the server
        waited = time.perf_counter() - started
        stop.set()
        for sock in socks:
            sock.close()
    assert waited < 4  # all dropped within the 1 s deadlines (read_until_closed returned)
    assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) >= 8
    assert all(b"200 OK" not in a for a in answers)
    assert max(latencies) < 0.5 and len(latencies) > 20


def test_an_idle_kept_alive_connection_is_closed_after_keep_alive_s(local):
    with serve(local, keep_alive_s=0.5) as running:
        with socket.create_connection(("127.0.0.1", running.port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            started = time.perf_counter()
            answer = read_until_closed(sock)
            assert answer.startswith(b"HTTP/1.1 200") and time.perf_counter() - started < 2


def test_connections_beyond_max_connections_get_503(local):
    with serve(local, max_connections=3) as running:
        held = [socket.create_connection(("127.0.0.1", running.port), timeout=5) for _ in range(3)]
        try:
            time.sleep(0.1)
            refused = httpx.post(f"{running.url}/search", content=BODY, trust_env=False)
            assert refused.status_code == 503
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.1)
        assert httpx.post(f"{running.url}/search", content=BODY, trust_env=False).status_code == 200


def test_the_work_and_the_response_of_one_request_are_capped(local):
    with TestClient(uvicorn_app(local, ServerLimits(max_hits_per_request=20))) as client:
        refused = client.post("/search", json={"queries": QUERIES[:3], "k": 7})
        assert refused.status_code == 413 and "21 hits" in refused.json()["error"]
        assert "max_hits_per_request=20" in refused.json()["error"]
        assert client.post("/search", json={"queries": QUERIES[:4], "k": 5}).status_code == 200
        assert client.post("/retrieve", json={"queries": QUERIES[:3], "topk": 7}).status_code == 413
    with TestClient(uvicorn_app(local, ServerLimits(max_response_bytes=2000))) as client:
        refused = client.post("/search", json={"queries": QUERIES[:4], "k": 5})
        assert refused.status_code == 413 and "max_response_bytes=2000" in refused.json()["error"]
        assert client.post("/passages", json={"rows": list(range(8)) * 4}).status_code == 413
        assert client.post("/search", json={"queries": QUERIES[:1], "k": 1}).status_code == 200


def test_the_remote_retriever_splits_a_batch_by_the_hits_cap(local, reference):
    with serve(local, max_hits_per_request=6) as running, RemoteRetriever(running.url) as remote:
        assert remote.search(QUERIES, 3) == reference.search(QUERIES, 3)  # 8 queries x 3: 4 requests of 2
        assert running.served()["requests_search"] == 4


class SlowRecorder:
    """Each search takes ``delay`` seconds; records the queries of each call."""

    corpus: list = []

    def __init__(self, delay: float = 0.05):
        self.delay, self.calls = delay, []

    def search(self, queries, k):
        self.calls.append(list(queries))
        time.sleep(self.delay)
        return [[Hit(0, q, q, q, 1.0, r) for r in range(1, k + 1)] for q in queries]


def test_a_maximal_request_takes_turns_with_small_ones():
    """A 64-query request of long queries is searched in slices; a small request that arrives
    while it runs is answered after one slice, not after the whole large request."""
    recorder = SlowRecorder()
    big = [f"long query {i} " + "x" * 990 for i in range(64)]  # ~1,000 characters each

    async def go():
        batcher = AsyncBatcher(recorder, max_batch=256, max_wait_ms=0, max_slice_chars=4000)
        large = asyncio.create_task(batcher.search(big, 2))
        await asyncio.sleep(0.02)  # the first slice is being searched
        sent = time.perf_counter()
        small = await batcher.search(["small"], 2)
        waited = time.perf_counter() - sent
        result = await large
        await batcher.close()
        return small, waited, result

    small, waited, result = asyncio.run(go())
    assert [[h.id for h in row] for row in result] == [[q, q] for q in big]  # whole, in order
    assert small[0][0].id == "small" and waited < 0.5  # the large request alone takes 16 x 0.05 s
    assert max(len(call) for call in recorder.calls) <= 4 and len(recorder.calls) >= 16
    assert any("small" in call for call in recorder.calls[:3])


def test_tls_when_given_a_key_and_certificate(local, reference, tmp_path):
    ssl = pytest.importorskip("ssl")
    key_file, cert_file = self_signed(tmp_path)
    server = RetrievalServer(local, "127.0.0.1", 0, ssl_keyfile=str(key_file), ssl_certfile=str(cert_file)).start()
    with server:
        assert server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert_file))
        with httpx.Client(base_url=server.url, verify=context, trust_env=False) as http:
            got = http.post("/search", json={"queries": ["capital of Japan"], "k": 2}).json()["results"]
        assert got == [[as_json(h) for h in reference.search(["capital of Japan"], 2)[0]]]
        with RemoteRetriever(server.url, ca_file=str(cert_file)) as remote:
            assert remote.search(QUERIES[:2], 3) == reference.search(QUERIES[:2], 3)
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on the TLS port
            httpx.post(f"http://127.0.0.1:{server.port}/search", content=BODY, trust_env=False, timeout=3)
    with pytest.raises(ValueError, match="both a key file and a certificate"):
        RetrievalServer(local, "127.0.0.1", 0, ssl_certfile=str(cert_file))


def self_signed(folder):
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""
    import datetime
    import ipaddress

    crypto = pytest.importorskip("cryptography")  # noqa: F841
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    key_file, cert_file = folder / "key.pem", folder / "cert.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


def test_a_flood_of_bad_requests_is_logged_once_per_interval():
    flood = RepeatedWarnings(every=0.2)

    def record(message="Invalid HTTP request received."):
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 0, message, (), None)

    assert [flood.filter(record()) for _ in range(5)] == [True, False, False, False, False]
    assert flood.filter(record("something else"))
    time.sleep(0.25)
    summary = record()
    assert flood.filter(summary) and "(4 more in the last 0.2 s)" in summary.getMessage()
