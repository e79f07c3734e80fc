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
