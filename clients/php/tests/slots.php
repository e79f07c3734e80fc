<?php
// Concurrency slots against a real daemon (rule "inflight": 2 slots per key): acquire,
// deny, release, hold() giving back on an exception, a closed connection freeing its
// slots, and the PSR-15 middleware releasing after the handler and after a throw.

declare(strict_types=1);

use Nyholm\Psr7\Factory\Psr17Factory;
use Nyholm\Psr7\ServerRequest;
use Psr\Http\Message\ResponseInterface;
use Psr\Http\Message\ServerRequestInterface;
use Psr\Http\Server\RequestHandlerInterface;
use RateLimitd\ConcurrencyMiddleware;
use RateLimitd\RequestError;
use RateLimitd\Slot;
use RateLimitd\Slots;

test('slots: acquire, deny, release, hold gives back on an exception', function () {
    $d = new Daemon();
    try {
        $s = new Slots($d->socket, 5.0);
        $a = $s->acquire('inflight', 'php:k');
        $b = $s->acquire('inflight', 'php:k');
        check($a->allowed && $b->allowed && $a->token !== null && $a->limit === 2 && $b->remaining === 0 && $a->source === 'local', 'two slots');
        $denied = $s->acquire('inflight', 'php:k');
        check(!$denied->allowed && $denied->waitMs > 55000, 'a denial');
        $h = $denied->headers();
        check($h['RateLimit-Policy'] === '"inflight";q=2;qu="concurrent-requests"' && isset($h['Retry-After']), 'headers');
        check($s->release($a) && !$s->release($a), 'released once');
        check($s->acquire('inflight', 'php:k')->allowed, 'a released slot is free');
        try {
            $s->acquire('api', 'php:k');
            check(false, 'a token bucket rule throws');
        } catch (RequestError $e) {
            check($e->errorCode === 'RULE', 'ERR RULE');
        }
        for ($i = 0; $i < 3; $i++) {
            try {
                $s->hold('inflight', 'php:w', function (Slot $slot) {
                    throw new RuntimeException('handler failed');
                });
            } catch (RuntimeException $e) {
            }
        }
        check($s->hold('inflight', 'php:w', fn (Slot $x) => $x->allowed), 'hold gave its slots back');
        $s->acquire('inflight', 'php:c');
        $s->acquire('inflight', 'php:c');
        $s->close();
        $back = false;
        for ($i = 0; $i < 100 && !$back; $i++) {
            $back = $s->acquire('inflight', 'php:c')->allowed;
        }
        check($back, 'a closed connection frees its slots');
        $s->close();
    } finally {
        $d->stop();
    }
});

test('slots: the PSR-15 middleware releases after the handler and after a throw', function () {
    $d = new Daemon();
    try {
        $s = new Slots($d->socket, 5.0);
        $mw = new ConcurrencyMiddleware($s, new Psr17Factory(), 'inflight', fn (ServerRequestInterface $r) => 'web');
        $handler = new class () implements RequestHandlerInterface {
            public function handle(ServerRequestInterface $request): ResponseInterface
            {
                if ($request->getUri()->getPath() === '/boom') {
                    throw new RuntimeException('handler failed');
                }
                return (new Psr17Factory())->createResponse(200);
            }
        };
        for ($i = 0; $i < 5; $i++) {
            $r = $mw->process(new ServerRequest('GET', '/'), $handler);
            check($r->getStatusCode() === 200 && $r->getHeaderLine('RateLimit-Policy') === '"inflight";q=2;qu="concurrent-requests"', 'allowed with the policy');
            try {
                $mw->process(new ServerRequest('GET', '/boom'), $handler);
            } catch (RuntimeException $e) {
            }
        }
        $other = new Slots($d->socket, 5.0);
        check($other->acquire('inflight', 'web')->allowed && $other->acquire('inflight', 'web')->allowed, 'every slot given back');
        $r = $mw->process(new ServerRequest('GET', '/'), $handler);
        check($r->getStatusCode() === 429 && $r->getHeaderLine('Retry-After') !== '', '429 with Retry-After');
        $other->close();
        $s->close();
    } finally {
        $d->stop();
    }
});
