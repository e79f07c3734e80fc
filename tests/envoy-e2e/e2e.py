#!/usr/bin/env python3
"""Envoy in front of ratelimitd, end to end (run by tests/envoy-e2e/run.sh).

Starts a Redis, ratelimitd with [envoy] listen and limits.yaml, and a real Envoy whose
HTTP listener asks ratelimitd over gRPC (envoy.filters.http.ratelimit, x-ratelimit-*
headers on, failure_mode_deny false); its upstream is a second Envoy listener answering
200. All on loopback, ports picked free. Checks, through Envoy:
  limit       5 requests of one user get 200 with x-ratelimit-remaining 4..0, the 6th 429
              with x-ratelimit-limit / -remaining / -reset;
  ietf headers  [envoy] ietf_headers: RateLimit-Policy and RateLimit on the 200s and the 429;
  shadow      a shadow_mode limit lets everything through, and the metrics count it;
  outage      Redis killed: every request still answered by ratelimitd (Envoy's
              ratelimit.error and failure_mode_allowed stay 0), limits still enforced
              (locally), and the p99 through Envoy within redis.timeout_ms + 5 ms
              (reported as skipped, with the figure and the load, on an overloaded
              machine);
  recovery    Redis back: decisions in Redis again.
Prints each check with its figure, then `envoy-e2e: N passed, M failed, K skipped`.
Every process it starts is killed by pid on exit.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_MS = 25
procs = []
results = []  # (name, "pass" | "fail" | "skip", figure)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, cmd, tmp):
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    procs.append((name, p))
    return p


def stop_all():
    for _, p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def wait_port(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def get(conn, path, user):
    t = time.perf_counter()
    conn.request("GET", path, headers={"x-user-id": user})
    r = conn.getresponse()
    r.read()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, time.perf_counter() - t


def http_text(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", path)
    body = c.getresponse().read().decode()
    c.close()
    return body


def metric(port, name, **labels):
    total = 0.0
    for line in http_text(port, "/metrics").splitlines():
        if not line.startswith(name) or line[len(name)] not in "{ ":
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def envoy_stat(admin, name):
    stats = json.loads(http_text(admin, "/stats?format=json&filter=" + name))["stats"]
    return sum(s.get("value", 0) for s in stats if s.get("name") == name)


def check(name, ok, figure):
    results.append((name, "pass" if ok else "fail", figure))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {figure}", flush=True)


def overloaded():
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    return load > 1.5 * cores, f"load average {load:.1f}, {cores} cores"


def fresh_minute():
    """Waits while fewer than 10 s of the current minute are left (limits are per minute)."""
    left = 60 - time.time() % 60
    if left < 10:
        time.sleep(left + 0.2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--envoy", required=True)
    ap.add_argument("--redis-server", default="redis-server")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rld-envoy-e2e-")
    try:
        run(args, tmp)
    finally:
        stop_all()
        failed = any(r[1] == "fail" for r in results)
        if failed:
            for name in ("ratelimitd", "envoy"):
                path = os.path.join(tmp, name + ".log")
                if os.path.exists(path):
                    print(f"--- {name}.log (tail)")
                    print("".join(open(path).readlines()[-25:]))
        shutil.rmtree(tmp, ignore_errors=True)
    n = lambda s: sum(1 for r in results if r[1] == s)
    print(f"envoy-e2e: {n('pass')} passed, {n('fail')} failed, {n('skip')} skipped")
    return 1 if n("fail") else 0


def run(args, tmp):
    ports = {k: free_port() for k in ("REDIS", "RLS", "METRICS", "LISTEN", "UPSTREAM", "ADMIN")}
    redis_cmd = [args.redis_server, "--port", str(ports["REDIS"]), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", tmp]
    redis = start("redis", redis_cmd, tmp)
    if not wait_port(ports["REDIS"]):
        check("start", False, "redis-server did not listen")
        return
    os.makedirs(os.path.join(tmp, "envoy"))
    shutil.copy(os.path.join(HERE, "limits.yaml"), os.path.join(tmp, "envoy", "rides.yaml"))
    with open(os.path.join(tmp, "ratelimitd.toml"), "w") as f:
        f.write(f"""[server]
socket = "{tmp}/ratelimitd.sock"

[redis]
mode = "standalone"
nodes = ["127.0.0.1:{ports['REDIS']}"]
timeout_ms = {TIMEOUT_MS}

[fallback]
hosts = 1

[metrics]
listen = "127.0.0.1:{ports['METRICS']}"

[envoy]
listen = "127.0.0.1:{ports['RLS']}"
config_dir = "{tmp}/envoy"
ietf_headers = true
""")
    start("ratelimitd", [args.daemon, "--config", os.path.join(tmp, "ratelimitd.toml")], tmp)
    conf = open(os.path.join(HERE, "envoy.yaml.in")).read()
    for k, v in ports.items():
        conf = conf.replace(f"@{k}@", str(v))
    with open(os.path.join(tmp, "envoy.yaml"), "w") as f:
        f.write(conf)
    start("envoy", [args.envoy, "-c", os.path.join(tmp, "envoy.yaml"), "--concurrency", "1",
                    "--use-dynamic-base-id", "-l", "warning"], tmp)
    if not (wait_port(ports["RLS"]) and wait_port(ports["METRICS"])):
        check("start", False, "ratelimitd did not listen")
        return
    if not (wait_port(ports["ADMIN"], 60) and wait_port(ports["LISTEN"], 60)):
        check("start", False, "envoy did not listen")
        return
    conn = http.client.HTTPConnection("127.0.0.1", ports["LISTEN"], timeout=5)
    metrics, admin = ports["METRICS"], ports["ADMIN"]
    user = f"u{os.getpid()}"

    # limit: 5 x 200 then 429, with the headers Envoy builds from current_limit.
    fresh_minute()
    got = [get(conn, "/api", user) for _ in range(6)]
    remaining = [h.get("x-ratelimit-remaining") for _, h, _ in got]
    statuses = [s for s, _, _ in got]
    last = got[-1][1]
    ok = (statuses == [200] * 5 + [429] and remaining == ["4", "3", "2", "1", "0", "0"]
          and last.get("x-ratelimit-limit", "").startswith("5") and "x-ratelimit-reset" in last)
    check("limit", ok, f"statuses {statuses}, x-ratelimit-remaining {remaining}, "
          f"429 headers limit={last.get('x-ratelimit-limit')!r} reset={last.get('x-ratelimit-reset')!r}")
    # [envoy] ietf_headers: the IETF pair, on the 200s and on the 429.
    policy = [h.get("ratelimit-policy") for _, h, _ in got]
    state = [h.get("ratelimit") for _, h, _ in got]
    check("ietf headers", all(p == '"default";q=5;w=60' for p in policy)
          and state[0].startswith('"default";r=4;t=') and state[-1].startswith('"default";r=0;t='),
          f"RateLimit-Policy {policy[0]!r} .. {policy[-1]!r}, RateLimit {state[0]!r} .. {state[-1]!r}")

    # shadow: 5 x 200 over a limit of 2; 3 counted as shadow_over_limit.
    statuses = [get(conn, "/shadow", user)[0] for _ in range(5)]
    shadowed = metric(metrics, "ratelimitd_envoy_descriptors_total", code="shadow_over_limit")
    check("shadow", statuses == [200] * 5 and shadowed == 3,
          f"statuses {statuses}, ratelimitd_envoy_descriptors_total{{code=shadow_over_limit}} {shadowed:g}")

    # outage: Redis killed mid-run, between two requests of one stream of 500.
    err0 = envoy_stat(admin, "cluster.upstream.ratelimit.error")
    fm0 = envoy_stat(admin, "cluster.upstream.ratelimit.failure_mode_allowed")
    local0 = metric(metrics, "ratelimitd_decisions_total", source="local")
    took, codes = [], set()
    for i in range(500):
        if i == 100:
            os.kill(redis.pid, signal.SIGKILL)
            redis.wait()
        s, _, t = get(conn, "/bulk", f"{user}-{i % 50}")
        codes.add(s)
        if i >= 100:
            took.append(t)
    outage_user = f"{user}-outage"
    fresh_minute()
    limited = [get(conn, "/api", outage_user)[0] for _ in range(6)]
    err = envoy_stat(admin, "cluster.upstream.ratelimit.error") - err0
    fm = envoy_stat(admin, "cluster.upstream.ratelimit.failure_mode_allowed") - fm0
    local = metric(metrics, "ratelimitd_decisions_total", source="local") - local0
    check("outage answered", codes == {200} and err == 0 and fm == 0 and local >= 400,
          f"500 requests, Redis killed after the 100th: statuses {sorted(codes)}, Envoy ratelimit.error +{err:g}, "
          f"failure_mode_allowed +{fm:g}; ratelimitd local decisions +{local:g}")
    check("outage enforced", limited == [200] * 5 + [429], f"a new user during the outage: {limited}")
    took.sort()
    p50, p99 = took[len(took) // 2] * 1000, took[len(took) * 99 // 100] * 1000
    bound = TIMEOUT_MS + 5
    figure = f"p50 {p50:.2f} ms, p99 {p99:.2f} ms through Envoy with Redis down (bound {bound} ms)"
    busy, load = overloaded()
    if p99 > bound and busy:
        results.append(("outage p99", "skip", figure))
        print(f"SKIP outage p99: {figure}; {load} (over 1.5 x cores: the bound is not checked)")
    else:
        check("outage p99", p99 <= bound, f"{figure}; {load}")

    # recovery: Redis back (empty) on the same port; decisions in Redis again.
    start("redis", redis_cmd, tmp)
    wait_port(ports["REDIS"])
    before = metric(metrics, "ratelimitd_decisions_total", source="redis")
    t0 = time.time()
    back = False
    while time.time() - t0 < 15 and not back:
        get(conn, "/bulk", user)
        back = metric(metrics, "ratelimitd_decisions_total", source="redis") > before
        time.sleep(0.05)
    check("recovery", back, f"decisions in Redis again {time.time() - t0:.1f} s after it restarted")


if __name__ == "__main__":
    sys.exit(main())
