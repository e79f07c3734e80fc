"""Redis CPU per request of CHECKALL and composite rules against one and two CHECKs
(docs/PERFORMANCE.md, "Several limits at once"): run a daemon on a standalone Redis
with the rules `burst` (token_bucket), `daily` (fixed_window) and `api` (all_of both),
socket /tmp/pol-bench/rl.sock, the Redis port in the file ./port; this reads Redis's
INFO commandstats around 64,000 requests of each kind over 10^6 keys."""
import socket, subprocess, sys
port = open('port').read().strip()
def stats():
    out = subprocess.run(['redis-cli','-p',port,'INFO','commandstats'],capture_output=True,text=True).stdout
    for l in out.splitlines():
        if l.startswith('cmdstat_evalsha:'):
            d = dict(kv.split('=') for kv in l.split(':',1)[1].split(','))
            return int(d['calls']), int(d['usec'])
    return 0, 0
def run(lines_fn, n, batch=64):
    s = socket.socket(socket.AF_UNIX); s.connect('/tmp/pol-bench/rl.sock')
    f = s.makefile('rb')
    c0, u0 = stats()
    sent = 0
    while sent < n:
        payload = ''.join(lines_fn(sent + i) for i in range(batch))
        s.sendall(payload.encode())
        for _ in range(payload.count('\n')):
            f.readline()
        sent += batch
    c1, u1 = stats()
    s.close()
    return c1 - c0, u1 - u0
N = 64000
keys = 1000000
for name, fn in [
    ('one CHECK', lambda i: f'CHECK burst k{(i*7919)%keys}\n'),
    ('two pipelined CHECKs', lambda i: f'CHECK burst k{(i*7919)%keys}\nCHECK daily k{(i*7919)%keys}\n'),
    ('composite of two (one script)', lambda i: f'CHECK api k{(i*7919)%keys}\n'),
    ('CHECKALL of two', lambda i: f'CHECKALL burst k{(i*7919)%keys} 1 daily k{(i*7919)%keys} 1\n'),
]:
    calls, usec = run(fn, N)
    print(f'{name}: {N} requests, {calls} EVALSHA, Redis {usec/N:.2f} µs per request ({usec/max(calls,1):.2f} µs per EVALSHA)')
