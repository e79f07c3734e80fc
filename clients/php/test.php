<?php
// Tests of the PHP client against a real daemon (clients/run_tests.sh runs them; needs
// RATELIMITD_BIN). Run: php test.php  (exit status 0 when all pass)
declare(strict_types=1);
require __DIR__ . '/RateLimitd.php';

use RateLimitd\Client;
use RateLimitd\RequestError;
use function RateLimitd\encode_key;
use function RateLimitd\parse_reply;

final class Daemon
{
    public string $dir;
    public string $socket;

    public function __construct()
    {
        $root = getenv('RL_TEST_ROOT') ?: sys_get_temp_dir();
        $this->dir = $root . '/rl-php-' . bin2hex(random_bytes(4));
        mkdir($this->dir);
        $this->socket = $this->dir . '/rl.sock';
        $this->run('start');
    }

    public function run(string $cmd): void
    {
        exec('bash ' . escapeshellarg(__DIR__ . '/../testdaemon.sh') . " $cmd " . escapeshellarg($this->dir) . ' 2>&1', $out, $rc);
        if ($rc !== 0) {
            throw new RuntimeException("testdaemon.sh $cmd: " . implode("\n", $out));
        }
    }
}

function check(bool $cond, string $what): void
{
    if (!$cond) {
        throw new RuntimeException("assertion failed: $what");
    }
}

$tests = [];

$tests['counts down, denies, maps headers, reuses the connection'] = function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        foreach ([4, 3, 2, 1, 0] as $left) {
            $r = $rl->check('api', 'php:count');
            check($r->allowed && $r->limit === 5 && $r->remaining === $left && $r->source === 'local', "allow $left: " . json_encode($r));
        }
        $conn = (fn () => $this->conn)->call($rl);
        $r = $rl->check('api', 'php:count');
        check((fn () => $this->conn)->call($rl) === $conn, 'connection reused');
        check(!$r->allowed && $r->waitMs > 0, 'deny');
        $h = $r->headers();
        check($h['RateLimit-Policy'] === '"api";q=5', 'policy header');
        check((bool) preg_match('/^"api";r=0;t=\d+$/', $h['RateLimit']), 'RateLimit header ' . $h['RateLimit']);
        check($h['X-RateLimit-Limit'] === '5' && $h['X-RateLimit-Remaining'] === '0', 'X- headers');
        check($h['Retry-After'] === (string) intdiv($r->waitMs + 999, 1000), 'Retry-After');
        check(!isset($rl->check('api', 'php:other')->headers()['Retry-After']), 'no Retry-After on ALLOW');
    } finally {
        $d->run('stop');
    }
};

$tests['pipelining keeps order'] = function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        $checks = array_fill(0, 7, ['api', 'php:pipe']);
        $checks[] = ['api', 'php:pipe2', 2];
        $checks[] = ['fast', 'x', 0];
        $rs = $rl->checkMany($checks);
        check(array_map(fn ($r) => $r->allowed, $rs) === [true, true, true, true, true, false, false, true, true], 'verdicts');
        check(array_map(fn ($r) => $r->remaining, array_slice($rs, 0, 5)) === [4, 3, 2, 1, 0], 'remaining');
        check($rs[7]->remaining === 3 && $rs[8]->limit === 1000000 && $rs[8]->rule === 'fast', 'tail');
    } finally {
        $d->run('stop');
    }
};

$tests['request errors throw; keys encoded; extra fields ignored'] = function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        foreach ([['nope', 'k', 1, 'RULE'], ['api', 'k', 6, 'COST']] as [$rule, $key, $cost, $code]) {
            try {
                $rl->check($rule, $key, $cost);
                check(false, "ERR $code expected");
            } catch (RequestError $e) {
                check($e->errorCode === $code, "code $code");
            }
        }
        check($rl->check('api', 'user name/é')->allowed, 'encoded key allowed');
        check(encode_key('user name/é%') === 'user%20name/%C3%A9%25', 'encode_key');
        $r = parse_reply('DENY 20 0 1900 100 cache future fields', 'rides');
        check([$r->allowed, $r->limit, $r->remaining, $r->resetMs, $r->waitMs, $r->source] === [false, 20, 0, 1900, 100, 'cache'], 'parse');
    } finally {
        $d->run('stop');
    }
};

$tests['fails open (or closed) when the daemon is absent'] = function () {
    $path = sys_get_temp_dir() . '/rl-php-none-' . bin2hex(random_bytes(4)) . '.sock';
    $r = (new Client($path))->check('api', 'k');
    check($r->allowed && $r->source === 'client_fail_open' && $r->error !== null && $r->headers() === [], 'fail open: ' . json_encode($r));
    $r = (new Client($path, 0.2, false))->check('api', 'k');
    check(!$r->allowed && $r->source === 'client_fail_closed' && $r->headers() === ['Retry-After' => '1'], 'fail closed');
};

$tests['reconnects after a daemon restart'] = function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        check($rl->check('api', 'k')->source === 'local', 'first');
        $d->run('stop');
        check($rl->check('api', 'k')->source === 'client_fail_open', 'while down');
        $d->run('start');
        $r = $rl->check('api', 'k');
        check($r->source === 'local' && $r->remaining === 4, 'after restart: ' . json_encode($r));
        $d->run('stop');
        $d->run('start');
        check($rl->check('api', 'k')->source === 'local', 'kept connection, restarted daemon');
    } finally {
        $d->run('stop');
    }
};

$tests['times out and fails open when the daemon is stalled'] = function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        check($rl->check('fast', 'k')->source === 'local', 'first');
        $rl->timeout = 0.3;
        $d->run('pause');
        $t0 = microtime(true);
        $r = $rl->check('fast', 'k');
        check($r->source === 'client_fail_open' && str_contains((string) $r->error, 'timeout'), 'timeout: ' . json_encode($r));
        check(microtime(true) - $t0 < 3.0, 'bounded');
        check((new Client($d->socket, 0.3, false))->check('fast', 'k')->source === 'client_fail_closed', 'fail closed');
        $d->run('resume');
        $rl->timeout = 5.0;
        check($rl->check('fast', 'k')->source === 'local', 'after resume');
    } finally {
        $d->run('resume');
        $d->run('stop');
    }
};

$failed = 0;
foreach ($tests as $name => $fn) {
    try {
        $fn();
        echo "ok - $name\n";
    } catch (Throwable $e) {
        $failed++;
        echo "not ok - $name: {$e->getMessage()}\n";
    }
}
printf("php: %d passed, %d failed\n", count($tests) - $failed, $failed);
exit($failed ? 1 : 0);
