<?php
// checkAll (CHECKALL: all or nothing), refund (REFUND) against a real daemon, and the one
// warning naming the socket path when the daemon cannot be reached.

declare(strict_types=1);

use RateLimitd\Client;
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
