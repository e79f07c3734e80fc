<?php
// The client against a real daemon (counts, pipelining, caller bugs, persistence, restarts,
// stalls), and the example application behind `php -S` answering 429 with the headers.

declare(strict_types=1);

use RateLimitd\Client;
use RateLimitd\Protocol;
use RateLimitd\RequestError;

test('daemon: counts down, denies, maps headers', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        foreach ([4, 3, 2, 1, 0] as $left) {
            $r = $rl->check('api', 'php:count');
            check($r->allowed && $r->limit === 5 && $r->remaining === $left && $r->source === 'local' && $r->error === null, "allow $left");
        }
        $r = $rl->check('api', 'php:count');
        check(!$r->allowed && $r->waitMs > 0, 'deny');
        $h = $r->headers(true);
        // capacity 5 at 0.001/s: 5000 s to refill, the 7th field when the daemon sends it.
        check($h['RateLimit-Policy'] === ($r->windowMs === null ? '"api";q=5' : '"api";q=5;w=5000'), 'policy ' . $h['RateLimit-Policy']);
        check((bool) preg_match('/^"api";r=0;t=\d+$/', $h['RateLimit']), 'RateLimit ' . $h['RateLimit']);
        check($h['Retry-After'] === (string) max(1, intdiv($r->waitMs + 999, 1000)), 'Retry-After');
        check($h['X-RateLimit-Limit'] === '5' && $h['X-RateLimit-Remaining'] === '0', 'X- headers');
        check(!isset($rl->check('api', 'php:other')->headers()['Retry-After']), 'no Retry-After on ALLOW');
        $rl->close();
    } finally {
        $d->stop();
    }
});

test('daemon: pipelining keeps order', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        $checks = array_fill(0, 7, ['api', 'php:pipe', 1]);
        $checks[] = ['api', 'php:pipe2', 2];
        $checks[] = ['fast', 'x', 0];
        $rs = $rl->checkMany($checks);
        check(array_map(fn ($r) => $r->allowed, $rs) === [true, true, true, true, true, false, false, true, true], 'verdicts');
        check($rs[4]->remaining === 0 && $rs[7]->remaining === 3 && $rs[8]->limit === 1000000 && $rs[8]->rule === 'fast', 'tail');
        $rl->close();
    } finally {
        $d->stop();
    }
});

test('daemon: caller bugs throw, keys are encoded', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        foreach ([['nope', 'k', 1, 'RULE'], ['api', 'k', 6, 'COST'], ['two words', 'k', 1, 'RULE'], ['api', '', 1, 'KEY']] as [$rule, $key, $cost, $code]) {
            try {
                $rl->check($rule, $key, $cost);
                check(false, "$rule/$key/$cost should throw");
            } catch (RequestError $e) {
                check($e->errorCode === $code, "want $code, got {$e->errorCode}");
            }
        }
        check(Protocol::encodeKey("user name/é%") === 'user%20name/%C3%A9%25', 'encodeKey');
        check($rl->check('api', "user name/é\n")->allowed, 'odd key allowed');
        check($rl->check('api', 'user name/é', 0)->remaining === 5, 'a different key');
        $rl->close();
    } finally {
        $d->stop();
    }
});

test('daemon: the connection persists across Client objects (php-fpm requests)', function () {
    $d = new Daemon();
    try {
        $stream = fn (Client $c) => (fn () => $this->conn)->call($c);
        $a = new Client($d->socket, 5.0);
        $a->check('fast', 'k');
        $b = new Client($d->socket, 5.0);   // what the next request of this worker creates
        $b->check('fast', 'k');
        check($stream($a) === $stream($b), 'one persistent stream for both');
        $np = new Client($d->socket, 5.0, persistent: false);
        $np->check('fast', 'k');
        check($stream($np) !== $stream($a), 'persistent: false opens its own');
        $np->close();
        $a->close();
    } finally {
        $d->stop();
    }
});

test('daemon: fails open while down, reconnects after a restart', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        check($rl->check('api', 'k')->source === 'local', 'up');
        $d->run('stop');
        $r = $rl->check('api', 'k');
        check($r->allowed && $r->source === 'client_fail_open' && $r->error !== null, 'down: ' . json_encode($r));
        $d->run('start');
        $r = $rl->check('api', 'k');
        check($r->source === 'local' && $r->remaining === 4, 'restarted: ' . json_encode($r));
        $d->run('stop');
        $d->run('start');
        check($rl->check('api', 'k')->source === 'local', 'a stale kept connection is replaced');
        $closed = new Client($d->dir . '/none.sock', 0.2, false);
        $r = $closed->check('api', 'k');
        check(!$r->allowed && $r->source === 'client_fail_closed' && $r->headers() === ['Retry-After' => '1'], 'fail closed');
        $rl->close();
    } finally {
        $d->stop();
    }
});

test('daemon: a stalled daemon times out once, no retry', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 0.3);
        check($rl->check('fast', 'k')->source === 'local', 'up');
        $d->run('pause');
        $t0 = microtime(true);
        $r = $rl->check('fast', 'k');
        $took = microtime(true) - $t0;
        check($r->source === 'client_fail_open' && str_contains((string) $r->error, 'timeout'), json_encode($r));
        check($took >= 0.29 && $took < 1.5, "took $took s");
        $d->run('resume');
        check($rl->check('fast', 'k')->source === 'local', 'back');
        $rl->close();
    } finally {
        $d->stop();
    }
});

test('daemon: the example app behind php -S answers 429 with the headers', function () use ($app) {
    check(is_file("$app/vendor/autoload.php"), 'needs the composer-installed app');
    $d = new Daemon();
    $port = 0;
    $sock = stream_socket_server('tcp://127.0.0.1:0');
    $port = (int) substr((string) stream_socket_get_name($sock, false), strlen('127.0.0.1:'));
    fclose($sock);
    $env = ['RATELIMITD_SOCKET' => $d->socket, 'RATELIMITD_RULE' => 'api', 'PATH' => getenv('PATH')];
    $srv = proc_open([PHP_BINARY, '-S', "127.0.0.1:$port", '-t', "$app/public"], [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'], 2 => ['file', '/dev/null', 'w']], $pipes, null, $env);
    try {
        $get = function () use ($port): array {
            $body = @file_get_contents("http://127.0.0.1:$port/", false, stream_context_create(['http' => ['ignore_errors' => true, 'timeout' => 5]]));
            $h = [];
            $status = 0;
            foreach ($http_response_header ?? [] as $line) {
                if (preg_match('#^HTTP/\S+ (\d+)#', $line, $m)) {
                    $status = (int) $m[1];
                } elseif (str_contains($line, ':')) {
                    [$k, $v] = explode(':', $line, 2);
                    $h[strtolower($k)] = trim($v);
                }
            }
            return [$status, $h, $body];
        };
        for ($i = 0; $i < 100 && @fsockopen('127.0.0.1', $port) === false; $i++) {
            usleep(20000);
        }
        for ($i = 1; $i <= 6; $i++) {
            [$status, $h, $body] = $get();
            echo "    request $i: $status RateLimit-Policy: " . ($h['ratelimit-policy'] ?? '') . ' RateLimit: ' . ($h['ratelimit'] ?? '') . ' Retry-After: ' . ($h['retry-after'] ?? '') . "\n";
            if ($i <= 5) {
                check($status === 200 && $body === "hello\n", "request $i: $status $body");
            }
        }
        check($status === 429, "6th: $status");
        check((bool) preg_match('/^"api";q=5(;w=5000)?$/', $h['ratelimit-policy'] ?? ''), 'policy');
        check((bool) preg_match('/^"api";r=0;t=\d+$/', $h['ratelimit'] ?? ''), 'RateLimit');
        check((int) ($h['retry-after'] ?? 0) >= 1, 'Retry-After');
    } finally {
        proc_terminate($srv, 15);
        proc_close($srv);
        $d->stop();
    }
});
