#!/usr/bin/env python3
"""Sends lesson 10's server the hostile requests of its review, one row each, and prints what it
answered and what its memory did (loopback only; bounded in count and time).

    tools/hostile_clients.py --port P --pid PID

PID is the server's process (`./course serve` prints nothing of it: `pgrep -f lesson10_serve`).
Each row prints the status the server sent (0: none before it closed), the seconds it took, and
the server's resident memory (VmRSS) after it. The same rows are asserted, in process, by the
ServerHostile tests in tests/common/server_test.cpp; this is the view from outside, with memory.
"""
import argparse
import socket
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def exchange(port, data, body=b"", wait_for_answer_first=False, seconds=10, until_close=False):
    """Sends data (then body), reads until the server closes or (unless until_close) a whole answer
    came; the last status and everything read."""
    s = socket.create_connection(("127.0.0.1", port), timeout=seconds)
    out = b""
    try:
        try:
            s.sendall(data)
        except OSError:  # the server refused and closed while this was still sending: read its answer
            pass
        if wait_for_answer_first:
            out += s.recv(65536)
            if not out.startswith(b"HTTP/1.1 100"):
                body = b""
        if body:
            try:
                s.sendall(body)
            except OSError:
                pass
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            head, _, rest = out.rpartition(b"\r\n\r\n")
            if not until_close and b"Content-Length:" in head and b"HTTP/1.1 100" not in head[-200:]:
                length = int(head.split(b"Content-Length:")[-1].split(b"\r\n")[0])
                if len(rest) >= length:
                    break
    finally:
        s.close()
    statuses = [int(line.split()[1]) for line in out.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    statuses = [x for x in statuses if x != 100]
    return statuses[-1] if statuses else 0, out


def post(path, headers, length=None):
    h = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers
    if length is not None:
        h += f"Content-Length: {length}\r\n"
    return (h + "\r\n").encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--pid", type=int, required=True)
    args = ap.parse_args()
    port, pid = args.port, args.pid
    good = b'{"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 2}'
    js = "Content-Type: application/json\r\n"
    print(f"server RSS at the start: {rss_kb(pid)} kB")

    def row(n, what, fn):
        t0 = time.monotonic()
        status = fn()
        print(f"| {n} | {what} | {status} | {time.monotonic() - t0:.2f} s | {rss_kb(pid)} kB |")

    print("| # | what a client did | answer | time | server RSS after |")
    print("| --- | --- | --- | --- | --- |")
    big = b"x" * (398 << 10)
    row(1, "398 KB body with Content-Encoding: gzip",
        lambda: exchange(port, post("/v1/completions", js + "Content-Encoding: gzip\r\n", len(big)), big)[0])
    row(2, "Transfer-Encoding: chunked plus Content-Length, 20 MB sent",
        lambda: exchange(port, post("/v1/completions", js + "Transfer-Encoding: chunked\r\n", 200 << 20),
                         b"f" * (20 << 20))[0])

    def slow_clients():
        socks = []
        for _ in range(140):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        ok = 0
        for _ in range(8):  # a header line every 3 s from each, while /health is asked 8 times
            for s in socks:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            t0 = time.monotonic()
            status, _ = exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", seconds=2)
            ok += status == 200 and time.monotonic() - t0 < 1
            time.sleep(3)
        for s in socks:
            s.close()
        return f"/health {ok} of 8 within 1 s"
    row(3, "140 sockets sending a header line every 3 s", slow_clients)

    def hang_up():
        before = metric(port, "course_generation_tokens_total")
        body = b'{"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 200, "temperature": 1}'
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(post("/v1/completions", js, len(body)) + body)
            s.close()
        time.sleep(2)
        return f"{metric(port, 'course_generation_tokens_total') - before:.0f} tokens generated for 40 gone clients"
    row(4, "40 non-streaming clients that hang up at once", hang_up)
    many = "".join(f"X-{i}: v\r\n" for i in range(1 << 20)).encode()
    row(5, "1,048,576 headers", lambda: exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")[0])
    bad = b'{"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": 5}}'
    row(6, '"response_format": {"type": 5}',
        lambda: exchange(port, post("/v1/chat/completions", js, len(bad)) + bad)[0])
    row(7, "JSON as Content-Type: text/plain",
        lambda: exchange(port, post("/v1/completions", "Content-Type: text/plain\r\n", len(good)) + good)[0])

    def pipelined():
        status, out = exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post("/v1/completions", js, len(good)) +
                               good + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", until_close=True)
        return f"{out.count(b'HTTP/1.1 200')} of 3 answered"
    row(8, "3 pipelined requests on one connection", pipelined)
    row(9, "Expect: 100-continue with a 3 MB body",
        lambda: exchange(port, post("/v1/completions", js + "Expect: 100-continue\r\n", 3 << 20), b"x" * (3 << 20),
                         wait_for_answer_first=True)[0])
    form = b"a=" + b"x" * 9214
    row(10, "a 9 KB form body",
        lambda: exchange(port, post("/v1/completions", "Content-Type: application/x-www-form-urlencoded\r\n",
                                    len(form)), form)[0])

    def refusals():
        got = [exchange(port, post("/v1/completions", js), b"x" * (400 << 10))[0] for _ in range(10)]
        got += [exchange(port, post("/v1/completions", js, 3 << 20), b"x" * (3 << 20))[0] for _ in range(10)]
        return f"{sum(g in (411, 413) for g in got)} of 20 refusals (411, 413) heard"
    row(11, "refusals while the client still sends its body", refusals)
    deep = b'{"model": "tiny-fortunes", "prompt": "hi", "stop": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    row(12, "JSON 100,000 levels deep in a typed field",
        lambda: exchange(port, post("/v1/completions", js, len(deep)) + deep)[0])
    row(13, "HTTP/1.0", lambda: exchange(port, b"GET /health HTTP/1.0\r\n\r\n")[0])
    row(14, "a GET announcing a 2 MB body",
        lambda: exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")[0])

    def never_read():
        chat = (b'{"model": "tiny-fortunes", "messages": [{"role": "user", "content": "The"}], "max_tokens": 200, '
                b'"logprobs": true, "top_logprobs": 20}')
        socks = []
        for _ in range(50):  # 20 pipelined long answers each, never read
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.connect(("127.0.0.1", port))
            s.sendall((post("/v1/chat/completions", js, len(chat)) + chat) * 20)
            socks.append(s)
        time.sleep(15)  # past the write deadline (--request-timeout, 10 s by default)
        # The server's count, not the clients' view: a closed socket still delivers what it queued.
        open_now = metric(port, "course_http_connections") - 1  # (less the one asking)
        for s in socks:
            s.close()
        return f"{50 - open_now:.0f} of 50 closed by the server"
    row(15, "50 clients asking for 20 long answers each and reading none", never_read)
    print(f"server RSS at the end: {rss_kb(pid)} kB")


def metric(port, name):
    _, out = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


if __name__ == "__main__":
    main()
