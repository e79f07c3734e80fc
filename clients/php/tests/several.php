<?php
// checkAll (CHECKALL: all or nothing), refund (REFUND) and the all-or-nothing middleware
// against a real daemon and against the stand-in (conformance.json's several_cases and
// several_header_cases), and the one warning naming the socket path when the daemon cannot
// be reached.

declare(strict_types=1);

use Nyholm\Psr7\Factory\Psr17Factory;
use Nyholm\Psr7\ServerRequest;
use RateLimitd\Client;
use RateLimitd\Middleware;
use RateLimitd\RequestError;

test('daemon: checkAll takes nothing when one check denies; refund answers the state', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0);
        $both = [['api', 'php:all:a'], ['api', 'php:all:b', 1]];
        foreach ([1, 2] as $i) {
            $r = $rl->checkAll($both);
            check($r->allowed && $r->rule === 'api' && $r->limit === 5 && $r->remaining === 3 + (2 - $i), "allow $i: " . json_encode($r));
        }
        check($rl->check('api', 'php:all:a', 3)->remaining === 0, 'a used up');
        foreach ([1, 2, 3] as $i) {
            $r = $rl->checkAll($both);
            check(!$r->allowed && $r->rule === 'api' && $r->waitMs > 0 && $r->error === null, "deny $i: " . json_encode($r));
        }
        check($rl->check('api', 'php:all:b', 0)->remaining === 3, 'b untouched by the denied requests');
        // The test daemon runs without Redis, where a refund gives nothing back (PROTOCOL.md):
        // the reply is the state, a cost-0 decision.
        $r = $rl->refund('api', 'php:all:b', 1);
        check($r->allowed && $r->rule === 'api' && $r->limit === 5 && $r->remaining === 3 && $r->error === null, 'refund: ' . json_encode($r));
        $bug = null;
        try {
            $rl->checkAll(array_fill(0, 9, ['api', 'k']));
        } catch (RequestError $e) {
            $bug = $e;
        }
        check($bug !== null && $bug->errorCode === 'PROTO', '9 checks are a caller bug');
        $rl->close();
    } finally {
        $d->stop();
    }
});

test('unreachable daemon: one warning naming the socket path, then fail open', function () {
    $path = temp_dir('rl-php-none') . '/nowhere.sock';
    $warnings = [];
    set_error_handler(function (int $no, string $msg) use (&$warnings) {
        if ($no === E_USER_WARNING) {
            $warnings[] = $msg;
        }
        return true;
    });
    try {
        $rl = new Client($path, 0.2, true, false);
        $r1 = $rl->check('api', 'k');
        $r2 = $rl->checkAll([['api', 'k'], ['fast', 'k']]);
        $r3 = $rl->refund('api', 'k', 1);
    } finally {
        restore_error_handler();
    }
    foreach ([$r1, $r2, $r3] as $r) {
        check($r->allowed && $r->source === 'client_fail_open' && str_contains((string) $r->error, $path), 'fail open: ' . json_encode($r));
    }
    check(count($warnings) === 1, 'one warning: ' . json_encode($warnings));
    check(str_contains($warnings[0], $path) && str_contains($warnings[0], 'failing open'), json_encode($warnings));
});

// conformance.json's several_cases: CHECKALL and REFUND against the scripted stand-in.
$several = json_decode((string) file_get_contents(__DIR__ . '/../../conformance.json'), true)['several_cases'] ?? [];
check(count($several) > 0, 'conformance.json has several_cases');
foreach ($several as $c) {
    test("conformance several {$c['name']}", function () use ($c) {
        $d = new StandIn($c['daemon'], $c['replies'] ?? []);
        $o = $c['options'] ?? [];
        $rl = new Client($d->socket, ($o['timeout_ms'] ?? 5000) / 1000, $o['fail_open'] ?? true);
        $want = $c['expect'];
        set_error_handler(fn () => true, E_USER_WARNING);
        try {
            try {
                $r = $c['call'] === 'refund'
                    ? $rl->refund(...$c['checks'][0])
                    : $rl->checkAll($c['checks']);
            } catch (RequestError $e) {
                check(isset($want['raises']) && $e->errorCode === $want['raises'], "raised {$e->errorCode}");
                return;
            }
            check(!isset($want['raises']), 'should raise ' . ($want['raises'] ?? ''));
            $have = [
                'allowed' => $r->allowed, 'limit' => $r->limit, 'remaining' => $r->remaining,
                'reset_ms' => $r->resetMs, 'wait_ms' => $r->waitMs, 'window_ms' => $r->windowMs,
                'source' => $r->source, 'rule' => $r->rule, 'error' => $r->error !== null && $r->error !== '',
            ];
            check($have === $want['result'], 'result ' . json_encode($have) . " ({$r->error}) want " . json_encode($want['result']));
            if (isset($c['requests'])) {
                check($d->requests() === $c['requests'], 'requests ' . json_encode($d->requests()));
            }
        } finally {
            restore_error_handler();
            $rl->close();
            $d->stop();
        }
    });
}

// conformance.json's several_header_cases: the all-or-nothing middleware against the stand-in.
$headerCases = json_decode((string) file_get_contents(__DIR__ . '/../../conformance.json'), true)['several_header_cases'] ?? [];
check(count($headerCases) > 0, 'conformance.json has several_header_cases');

/**
 * One GET through the all-or-nothing middleware: [status, rate-limit headers (lower-case
 * names), whether the handler ran].
 *
 * @param list<array{0: string, 1: string, 2?: int}> $checks
 * @return array{0: int, 1: array<string, string>, 2: bool}
 */
function all_or_nothing_request(Client $rl, array $checks, bool $legacy): array
{
    $mw = new Middleware($rl, new Psr17Factory(), fn () => $checks, $legacy, allOrNothing: true);
    $app = new HelloHandler();
    $res = $mw->process(new ServerRequest('GET', '/'), $app);
    $got = [];
    foreach ($res->getHeaders() as $name => $values) {
        $l = strtolower($name);
        if (in_array($l, ['ratelimit', 'ratelimit-policy', 'retry-after'], true) || str_starts_with($l, 'x-ratelimit-')) {
            $got[$l] = implode(', ', $values);
        }
    }
    ksort($got);
    return [$res->getStatusCode(), $got, $app->ran];
}

foreach ($headerCases as $c) {
    test("conformance all-or-nothing middleware {$c['name']}", function () use ($c) {
        $d = new StandIn($c['daemon'], $c['replies'] ?? []);
        $o = $c['options'] ?? [];
        $rl = new Client($d->socket, ($o['timeout_ms'] ?? 5000) / 1000, $o['fail_open'] ?? true);
        $want = $c['expect'];
        set_error_handler(fn () => true, E_USER_WARNING);
        try {
            try {
                [$status, $got, $ran] = all_or_nothing_request($rl, $c['checks'], $o['legacy_headers'] ?? false);
            } catch (RequestError $e) {
                check(isset($want['raises']) && $e->errorCode === $want['raises'], "raised {$e->errorCode}");
                return;
            }
            check(!isset($want['raises']), 'should raise ' . ($want['raises'] ?? ''));
            check($status === $want['status'], "status $status");
            check($ran === ($want['status'] === 200), 'the handler runs exactly when allowed');
            $exp = array_change_key_case($want['headers'], CASE_LOWER);
            ksort($exp);
            check($got === $exp, 'headers ' . json_encode($got) . ' want ' . json_encode($exp));
            if (isset($c['requests'])) {
                check($d->requests() === $c['requests'], 'requests ' . json_encode($d->requests()));
            }
        } finally {
            restore_error_handler();
            $rl->close();
            $d->stop();
        }
    });
}

test('daemon: the all-or-nothing middleware takes nothing when denied', function () {
    $d = new Daemon();
    try {
        $rl = new Client($d->socket, 5.0, true, false);
        $rl->check('api', 'php:mw:a', 3); // "a" has 2 left, "b" 5
        $checks = [['api', 'php:mw:a'], ['fast', 'php:mw:a'], ['api', 'php:mw:b']];
        foreach ([200, 200, 429, 429, 429] as $i => $want) {
            [$status, $h, $ran] = all_or_nothing_request($rl, $checks, false);
            check($status === $want && $ran === ($want === 200), "request $i: $status");
            check((bool) preg_match('/^"api";q=5;w=5000, "fast";q=1000000;w=\d+$/', $h['ratelimit-policy'] ?? ''), 'policy ' . json_encode($h));
            check((bool) preg_match('/^"api";r=\d+;t=\d+$/', $h['ratelimit'] ?? ''), 'ratelimit ' . json_encode($h));
            check(isset($h['retry-after']) === ($want === 429), 'retry-after ' . json_encode($h));
        }
        // Two allowed requests took 2 of b's 5; the three denied ones took nothing.
        check($rl->check('api', 'php:mw:b', 0)->remaining === 3, 'b lost nothing to denied requests');
        $rl->close();
    } finally {
        $d->stop();
    }
});
