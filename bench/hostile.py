#!/usr/bin/env python3
# Copyright idem authors. SPDX-License-Identifier: Apache-2.0
"""Hostile clients against a running `idem provider`, and what a legitimate
client sees meanwhile (doc/reliability.md, "Hostile clients").

  idem provider --api-key sk_a:acct_a --listen 127.0.0.1:8080 --store sqlite:/tmp/p.db --quiet &
  python3 bench/hostile.py --url http://127.0.0.1:8080 --attack slowloris --connections 256

--attack slowloris: CONNECTIONS connections from 127.0.0.2 that each send one
header line every half second and never end their head (a closed one is
opened again). --attack flood: CONNECTIONS connections from 127.0.0.3 that
send nothing (reopened when closed) and a thread that connects and closes at
once, over and over. --attack none: no attack. Then REQUESTS POST /charges,
one fresh connection each, from 127.0.0.1, each waiting at most TIMEOUT
seconds; prints how many were answered 201, p50, p99 and max latency.
"""
import argparse
import http.client
import socket
import sys
import threading
import time
import urllib.parse

BODY = '{"amount":4000,"currency":"usd","customer":"cus_1"}'


def connect(source, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((source, 0))
        s.connect((host, port))
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        return None


def closed(s):
    try:
        while True:
            if s.recv(4096) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def slowloris(host, port, n, stop):
    conns = [None] * n
    steps = [0] * n
    while not stop.is_set():
        for i in range(n):
            if conns[i] is not None and closed(conns[i]):
                conns[i].close()
                conns[i] = None
            if conns[i] is None:
                conns[i] = connect("127.0.0.2", host, port)
                steps[i] = 0
                if conns[i] is None:
                    continue
            piece = b"POST /charges HTTP/1.1\r\nHost: x\r\n" if steps[i] == 0 else b"X-Slow-%d: a\r\n" % steps[i]
            steps[i] += 1
            try:
                conns[i].send(piece)
            except OSError:
                pass
        stop.wait(0.5)
    for s in conns:
        if s is not None:
            s.close()


def flood(host, port, n, stop):
    def hold():
        conns = [None] * n
        while not stop.is_set():
            for i in range(n):
                if conns[i] is not None and closed(conns[i]):
                    conns[i].close()
                    conns[i] = None
                if conns[i] is None:
                    conns[i] = connect("127.0.0.3", host, port)
            stop.wait(0.02)
        for s in conns:
            if s is not None:
                s.close()

    def churn():
        while not stop.is_set():
            s = connect("127.0.0.3", host, port)
            if s is not None:
                s.close()

    threads = [threading.Thread(target=hold), threading.Thread(target=churn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--attack", choices=["slowloris", "flood", "none"], default="slowloris")
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=15)
    ap.add_argument("--api-key", default="sk_a")
    ap.add_argument("--warmup", type=float, default=3, help="seconds of attack before the first request")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port

    stop = threading.Event()
    attacker = None
    if args.attack != "none":
        target = slowloris if args.attack == "slowloris" else flood
        attacker = threading.Thread(target=target, args=(host, port, args.connections, stop))
        attacker.start()
        time.sleep(args.warmup)

    latencies, answered, failures = [], 0, {}
    run = str(int(time.time() * 1000))
    for i in range(args.requests):
        start = time.monotonic()
        try:
            c = http.client.HTTPConnection(host, port, timeout=args.timeout, source_address=("127.0.0.1", 0))
            c.request("POST", "/charges", BODY, {"Authorization": "Bearer " + args.api_key,
                                                 "Idempotency-Key": '"legit-%s-%d"' % (run, i),
                                                 "Content-Type": "application/json"})
            status = c.getresponse().status
            c.close()
            if status == 201:
                answered += 1
            else:
                failures[str(status)] = failures.get(str(status), 0) + 1
        except (OSError, http.client.HTTPException) as e:
            failures[type(e).__name__] = failures.get(type(e).__name__, 0) + 1
        latencies.append((time.monotonic() - start) * 1000)
    stop.set()
    if attacker:
        attacker.join()
    latencies.sort()
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))]
    print("attack %s (%d connections): %d/%d answered 201, failures %s, p50 %.1f ms, p99 %.1f ms, max %.1f ms"
          % (args.attack, args.connections if args.attack != "none" else 0, answered, args.requests, failures or "none",
             q(0.5), q(0.99), latencies[-1]))
    return 0 if answered == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
