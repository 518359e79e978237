"""Benchmark of API-key authentication (docs/auth.md) and of the IOLoop while scrypt runs
(docs/architecture.md, "Threads and the event loop").

Not a test: it prints numbers, compared against targets, for docs/performance.md. One run measures:

1. GIL probe (in-process, no server): the lag of an asyncio loop while 20 scrypt derivations run
   in a 1- and a 2-thread pool, for `cryptography`'s `Scrypt.derive` (what vllm_use.keys.material uses),
   for `hashlib.scrypt` with the same parameters, and for two controls as long as one
   derivation: `time.sleep` (releases the GIL, no CPU) and a C loop that holds the GIL. If a
   derivation held the GIL, the loop would stall like the second control.
2. Repeat authentication (in-process): `Authenticator.authenticate` of a key already verified
   once, on a temporary Database; median of 10,000 calls (target ≤ 0.1 ms).
3. A real `vllm-use serve` child (tests.conftest.start_server) on loopback:
   (a) the first request with each of 20 new admin.read keys (one scrypt each) against its
       repeat, `POST /api/test`, one keep-alive connection;
   (b) the p99 of `GET /healthz`, sent one after another on a keep-alive connection, alone and
       while rounds of 20 first-time authentications (20 new keys, 20 connections) run
       concurrently (target ≤ 5 ms under load).

Each round's 20 keys have distinct prefixes, so they stay within the Authenticator's bounds (one
derivation per prefix, 64 admitted in all; docs/auth.md): none is refused. Raising the round size
past 64 would measure 429 `auth_busy` refusals, not scrypt.

Clients are raw keep-alive sockets, so client-side Python barely shows in the numbers.
Run: `make bench` (or `.venv/bin/python tools/bench_auth.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.server import ADMIN_TOKEN, start_server  # noqa: E402
from vllm_use.clock import now_ms  # noqa: E402
from vllm_use.keys import material  # noqa: E402
from vllm_use.keys.authenticator import Authenticator  # noqa: E402
from vllm_use.storage import ApiKeyTable, Database  # noqa: E402

REPEAT_TARGET_MS = 0.1
HEALTHZ_P99_TARGET_MS = 5.0


# --- small helpers -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def ms(ns: int) -> float:
    return ns / 1e6


class Conn:
    """One HTTP/1.1 keep-alive connection over a raw socket: minimal client-side work."""

    def __init__(self, base_url: str) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(
        self, method: str, path: str, token: str | None = None, body: bytes = b""
    ) -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        header, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length"
        )
        while len(self.buf) < length:
            self._recv()
        payload, self.buf = self.buf[:length], self.buf[length:]
        return status, payload

    def timed(self, method: str, path: str, token: str | None = None, body: bytes = b"") -> float:
        """Milliseconds for one request; fails loudly on an unexpected status."""
        started = time.perf_counter_ns()
        status, payload = self.request(method, path, token, body)
        elapsed = ms(time.perf_counter_ns() - started)
        if status != 200:
            raise SystemExit(f"{method} {path} answered {status}: {payload[:300]!r}")
        return elapsed

    def _recv(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


# --- 1. GIL probe ------------------------------------------------------------------------------

SALT = b"0123456789abcdef"
SECRET = b"vu_" + b"A" * 48


def derive_cryptography() -> None:
    material.derive(SECRET.decode(), SALT)


def derive_hashlib() -> None:
    hashlib.scrypt(
        SECRET,
        salt=SALT,
        n=material.SCRYPT_N,
        r=material.SCRYPT_R,
        p=material.SCRYPT_P,
        maxmem=64 << 20,
        dklen=material.HASH_LEN,
    )


def gil_holder(n: int) -> Callable[[], None]:
    """A C loop that never releases the GIL (sum over a range): what a blocking derivation would be."""

    def hold() -> None:
        sum(range(n))

    return hold


def sleeper(seconds: float) -> Callable[[], None]:
    """Releases the GIL and uses no CPU: the floor of what a thread pool costs the loop."""

    def nap() -> None:
        time.sleep(seconds)

    return nap


def median_time_ms(fn: Callable[[], None], runs: int = 10) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter_ns()
        fn()
        samples.append(ms(time.perf_counter_ns() - started))
    return statistics.median(samples)


async def loop_lag(fn: Callable[[], None] | None, jobs: int, workers: int) -> tuple[list[float], float]:
    """Lag (ms) of 1 ms timers on this loop while `jobs` calls of `fn` run in a `workers`-thread pool."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            started = time.perf_counter_ns()
            await asyncio.sleep(0.001)
            lags.append(ms(time.perf_counter_ns() - started) - 1.0)

    task = asyncio.create_task(ticker())
    started = time.perf_counter_ns()
    if fn is None:
        await asyncio.sleep(0.3)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, fn) for _ in range(jobs)))
    wall = ms(time.perf_counter_ns() - started)
    done.set()
    await task
    return lags, wall


async def gil_probe() -> dict[str, Any]:
    one = median_time_ms(derive_cryptography)
    n = 1_000_000
    while median_time_ms(gil_holder(n), runs=3) < one:
        n *= 2
    jobs = {
        "idle (no jobs)": None,
        "control: time.sleep": sleeper(one / 1000),
        "cryptography Scrypt.derive": derive_cryptography,
        "hashlib.scrypt": derive_hashlib,
        "control: holds the GIL": gil_holder(n),
    }
    out: dict[str, Any] = {"one_derivation_ms": {}, "lag": {}}
    for name, fn in jobs.items():
        if fn is not None:
            out["one_derivation_ms"][name] = median_time_ms(fn)
        for workers in (1, 2):
            if fn is None and workers == 2:
                continue
            lags, wall = await loop_lag(fn, jobs=20, workers=workers)
            out["lag"][(name, workers)] = {
                "p50": statistics.median(lags),
                "p99": pct(lags, 99),
                "max": max(lags),
                "n": len(lags),
                "wall": wall,
            }
    return out


# --- 2. repeat authentication in-process -------------------------------------------------------


def _insert(record: dict[str, Any]) -> None:
    ApiKeyTable.insert(**record).execute()


async def repeat_auth(calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        db = Database(Path(tmp) / "bench.db")
        db.open()
        auth = Authenticator(db, ADMIN_TOKEN)
        try:
            secret, salt = material.new_secret(), secrets.token_bytes(material.SALT_LEN)
            digest = await auth.derive(secret, salt)
            record = {
                "id": material.new_key_id(),
                "name": "bench",
                "prefix": secret[: material.PREFIX_LEN],
                "salt": salt.hex(),
                "hash": digest.hex(),
                "enabled": 1,
                "scopes": json.dumps(["admin.read"]),
                "created_at": now_ms(),
                "last_used_at": None,
            }
            await db.run(_insert, record)
            started = time.perf_counter_ns()
            await auth.authenticate(secret)
            first = ms(time.perf_counter_ns() - started)
            result = {"first_ms": first}
            for label, token in (("key", secret), ("admin", ADMIN_TOKEN)):
                samples = []
                for _ in range(calls):
                    started = time.perf_counter_ns()
                    await auth.authenticate(token)
                    samples.append(ms(time.perf_counter_ns() - started))
                result[f"{label}_p50"] = statistics.median(samples)
                result[f"{label}_p99"] = pct(samples, 99)
            return result
        finally:
            auth.close()
            db.close()


# --- 3. against a real server ------------------------------------------------------------------

TEST_BODY = b"{}"


def first_auth(base_url: str, secrets_: list[str]) -> dict[str, float]:
    conn = Conn(base_url)
    try:
        conn.timed("GET", "/healthz")  # connected and warm
        admin = [conn.timed("POST", "/api/test", ADMIN_TOKEN, TEST_BODY) for _ in range(20)]
        first, second, steady = [], [], []
        for secret in secrets_:
            first.append(conn.timed("POST", "/api/test", secret, TEST_BODY))
            second.append(conn.timed("POST", "/api/test", secret, TEST_BODY))
            # The second request still pays for caches scrypt's 16 MiB flushed; later ones do not.
            steady += [conn.timed("POST", "/api/test", secret, TEST_BODY) for _ in range(3)]
        return {
            "admin_p50": statistics.median(admin),
            "first_p50": statistics.median(first),
            "first_max": max(first),
            "second_p50": statistics.median(second),
            "steady_p50": statistics.median(steady),
        }
    finally:
        conn.close()


def healthz_alone(base_url: str, count: int) -> list[float]:
    conn = Conn(base_url)
    try:
        for _ in range(50):
            conn.timed("GET", "/healthz")
        return [conn.timed("GET", "/healthz") for _ in range(count)]
    finally:
        conn.close()


def healthz_under_load(
    base_url: str, rounds: list[list[str]]
) -> tuple[list[tuple[float, float]], list[float]]:
    """Healthz latencies while each round's keys send `POST /api/test` all at once (one connection each).

    Returns the healthz samples as (start, latency) — start counted from the round's burst — and
    the latencies of the concurrent requests, all in ms.
    """
    probe = Conn(base_url)
    probe.timed("GET", "/healthz")
    samples: list[tuple[float, float]] = []
    auth_times: list[float] = []
    try:
        for batch in rounds:
            conns = [Conn(base_url) for _ in batch]
            for conn in conns:
                conn.timed("GET", "/healthz")  # connections open before the window starts
            barrier = threading.Barrier(len(batch) + 1)
            lock = threading.Lock()

            def one(
                conn: Conn, secret: str, barrier: threading.Barrier = barrier, lock: threading.Lock = lock
            ) -> None:
                barrier.wait()
                elapsed = conn.timed("POST", "/api/test", secret, TEST_BODY)
                with lock:
                    auth_times.append(elapsed)

            threads = [threading.Thread(target=one, args=pair) for pair in zip(conns, batch, strict=True)]
            for thread in threads:
                thread.start()
            barrier.wait()
            burst = time.perf_counter_ns()
            while any(thread.is_alive() for thread in threads):
                start = ms(time.perf_counter_ns() - burst)
                samples.append((start, probe.timed("GET", "/healthz")))
            for thread in threads:
                thread.join()
            for conn in conns:
                conn.close()
    finally:
        probe.close()
    return samples, auth_times


def create_keys(base_url: str, count: int) -> list[str]:
    conn = Conn(base_url)
    try:
        out = []
        for i in range(count):
            body = json.dumps({"name": f"bench {i}", "scopes": ["admin.read"]}).encode()
            status, payload = conn.request("POST", "/api/keys", ADMIN_TOKEN, body)
            if status != 201:
                raise SystemExit(f"POST /api/keys answered {status}: {payload[:300]!r}")
            out.append(json.loads(payload)["secret"])
        return out
    finally:
        conn.close()


# --- report ------------------------------------------------------------------------------------


def verdict(value: float, target: float) -> str:
    return f"{'OK' if value <= target else 'OVER'} (target ≤ {target:g} ms)"


def report_gil(probe: dict[str, Any]) -> None:
    print("1. GIL probe: asyncio loop lag (1 ms timers) while 20 jobs run in a thread pool")
    for name, value in probe["one_derivation_ms"].items():
        print(f"   one job, {name:<28} {value:7.1f} ms")
    print(f"   {'job':<28} {'workers':>7} {'lag p50':>8} {'p99':>7} {'max':>7} {'wall':>6}  (ms)")
    idle_p99 = max(probe["lag"][("idle (no jobs)", 1)]["p99"], 0.01)
    for (name, workers), lag in probe["lag"].items():
        cells = f"{lag['p50']:8.2f} {lag['p99']:7.2f} {lag['max']:7.2f} {lag['wall']:6.0f}"
        print(f"   {name:<28} {workers:>7} {cells}  p99 ×{lag['p99'] / idle_p99:.0f} idle")
    print()


def report_repeat(repeat: dict[str, float], calls: int) -> None:
    print(f"2. Repeat authentication in-process, Authenticator.authenticate × {calls}")
    print(f"   first (scrypt + SQLite)        {repeat['first_ms']:8.2f} ms")
    key = f"p50 {repeat['key_p50']:.4f} ms  p99 {repeat['key_p99']:.4f} ms"
    print(f"   repeat, API key   {key}  {verdict(repeat['key_p50'], REPEAT_TARGET_MS)}")
    print(f"   repeat, admin     p50 {repeat['admin_p50']:.4f} ms  p99 {repeat['admin_p99']:.4f} ms")
    print()


def report_first(first: dict[str, float], count: int) -> None:
    print(f"   (a) POST /api/test, keep-alive, {count} new keys:")
    rows = (
        ("admin token", first["admin_p50"], ""),
        ("first request of a new key", first["first_p50"], f"  (max {first['first_max']:.1f})"),
        ("second request, same key", first["second_p50"], "  (caches cold after scrypt)"),
        ("3rd-5th requests, same key", first["steady_p50"], ""),
        ("first-authentication cost", first["first_p50"] - first["steady_p50"], "  (first − 3rd-5th)"),
    )
    for label, value, note in rows:
        print(f"       {label:<28} p50 {value:7.2f} ms{note}")


def report_healthz(rows: list[tuple[str, list[float]]]) -> None:
    print("   (b) GET /healthz one after another on a keep-alive connection, while bursts of 20")
    print("       concurrent POST /api/test run (one connection each)")
    print(f"       {'load':<38} {'n':>6} {'p50':>6} {'p99':>6} {'max':>6} {'p99/alone':>9}  (ms)")
    idle_p99 = pct(rows[0][1], 99)
    for label, values in rows:
        if not values:
            print(f"       {label:<38} {0:>6}  (no samples)")
            continue
        p99 = pct(values, 99)
        cells = f"{statistics.median(values):6.2f} {p99:6.2f} {max(values):6.2f} {p99 / idle_p99:8.1f}×"
        print(f"       {label:<38} {len(values):>6} {cells}")
    print(f"       p99 under first-time load: {verdict(pct(rows[2][1], 99), HEALTHZ_P99_TARGET_MS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--keys", type=int, default=20, help="fresh keys for the first-authentication median")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of 20 concurrent first authentications")
    parser.add_argument("--calls", type=int, default=10_000, help="repeat authentications in-process")
    parser.add_argument("--healthz", type=int, default=2000, help="healthz requests for the idle p99")
    opts = parser.parse_args()

    print(f"bench_auth: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, scrypt n=2^14 r=8 p=1")
    print()
    report_gil(asyncio.run(gil_probe()))
    report_repeat(asyncio.run(repeat_auth(opts.calls)), opts.calls)

    with tempfile.TemporaryDirectory(prefix="bench-auth-server-") as tmp:
        server = start_server(Path(tmp) / "data")
        try:
            base = server.base_url
            started = time.perf_counter()
            fresh = create_keys(base, opts.keys + 20 * opts.rounds)
            took = time.perf_counter() - started
            print(f"3. Server {base}: created {len(fresh)} admin.read keys in {took:.1f} s")
            report_first(first_auth(base, fresh[: opts.keys]), opts.keys)
            idle = healthz_alone(base, opts.healthz)
            # Control: the same bursts with keys verified in (a), so no scrypt: what a burst alone costs.
            verified = (fresh[: opts.keys] * 20)[:20]
            cached, cached_times = healthz_under_load(base, [verified] * (10 * opts.rounds))
            rest = fresh[opts.keys :]
            loaded, first_times = healthz_under_load(
                base, [rest[i * 20 : (i + 1) * 20] for i in range(opts.rounds)]
            )
            # Once the server has read a burst (as long as the slowest cached burst request took),
            # only scrypt and the completions remain: that tail is the one scrypt could cause.
            settled = max(cached_times)
            report_healthz(
                [
                    ("none (alone)", idle),
                    (f"{10 * opts.rounds} × 20 cached keys (control)", [lat for _, lat in cached]),
                    (f"{opts.rounds} × 20 first-time keys (scrypt)", [lat for _, lat in loaded]),
                    (
                        f"  the same, from {settled:.0f} ms after each burst",
                        [lat for t, lat in loaded if t >= settled],
                    ),
                ]
            )
            print(
                f"       the burst requests themselves: cached p50 {statistics.median(cached_times):.1f} ms;"
                f" first-time p50 {statistics.median(first_times):.0f} ms, max {max(first_times):.0f} ms"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
