<?php
// Every case of clients/conformance.json (the table all clients share), against the client
// and against the PSR-15 middleware, each with the scripted stand-in daemon.

declare(strict_types=1);

use Nyholm\Psr7\Factory\Psr17Factory;
use Nyholm\Psr7\ServerRequest;
use Psr\Http\Message\ResponseInterface;
use Psr\Http\Message\ServerRequestInterface;
use Psr\Http\Server\RequestHandlerInterface;
use RateLimitd\Client;
use RateLimitd\Middleware;
use RateLimitd\RequestError;
use RateLimitd\Result;

final class HelloHandler implements RequestHandlerInterface
{
    public bool $ran = false;

    public function handle(ServerRequestInterface $request): ResponseInterface
    {
        $this->ran = true;
        check($request->getAttribute(Middleware::RESULT_ATTRIBUTE) instanceof Result, 'result attribute');
        return (new Psr17Factory())->createResponse(200);
    }
}

/** @param array<string, mixed> $c */
function conformance_client(array $c, StandIn $d): Client
{
    $o = $c['options'] ?? [];
    return new Client($d->socket, ($o['timeout_ms'] ?? 200) / 1000, $o['fail_open'] ?? true);
}

$doc = json_decode((string) file_get_contents(__DIR__ . '/../../conformance.json'), true);
check(count($doc['cases'] ?? []) > 0, 'conformance.json has cases');

foreach ($doc['cases'] as $c) {
    test("conformance client {$c['name']}", function () use ($c) {
        $d = new StandIn($c['daemon'], $c['replies'] ?? []);
        $rl = conformance_client($c, $d);
        $want = $c['expect'];
        try {
            $t0 = microtime(true);
            try {
                $got = count($c['checks']) === 1
                    ? [$rl->check(...$c['checks'][0])]
                    : $rl->checkMany($c['checks']);
            } catch (RequestError $e) {
                check(isset($want['raises']) && $e->errorCode === $want['raises'], "raised {$e->errorCode}");
                return;
            }
            $took = microtime(true) - $t0;
            check(!isset($want['raises']), 'should raise ' . ($want['raises'] ?? ''));
            check(count($got) === count($want['results']), 'result count');
            foreach ($want['results'] as $i => $w) {
                $r = $got[$i];
                $have = [
                    'allowed' => $r->allowed, 'limit' => $r->limit, 'remaining' => $r->remaining,
                    'reset_ms' => $r->resetMs, 'wait_ms' => $r->waitMs, 'window_ms' => $r->windowMs,
                    'source' => $r->source, 'error' => $r->error !== null && $r->error !== '',
                ];
                check($have === $w && $r->rule === $c["checks"][$i][0], "result $i: " . json_encode($have) . " ({$r->error}) want " . json_encode($w));
            }
            if (isset($c['requests'])) {
                check($d->requests() === $c['requests'], 'requests ' . json_encode($d->requests()));
            }
            if ($c['daemon'] === 'stall' || $c['daemon'] === 'close') {
                usleep(50000);
                check($d->connections() === 1, "{$d->connections()} connections: never retried");
            }
            if ($c['daemon'] === 'stall') {
                $limit = $rl->timeout;
                check($took >= $limit - 0.005 && $took < $limit + 1, "took $took s");
            }
        } finally {
            $rl->close();
            $d->stop();
        }
    });

    test("conformance middleware {$c['name']}", function () use ($c) {
        $d = new StandIn($c['daemon'], $c['replies'] ?? []);
        $rl = conformance_client($c, $d);
        $want = $c['expect'];
        $mw = new Middleware($rl, new Psr17Factory(), fn () => $c['checks'], $c['options']['legacy_headers'] ?? false);
        $app = new HelloHandler();
        try {
            try {
                $res = $mw->process(new ServerRequest('GET', '/'), $app);
            } catch (RequestError $e) {
                check(isset($want['raises']) && $e->errorCode === $want['raises'] && !$app->ran, "raised {$e->errorCode}");
                return;
            }
            check(!isset($want['raises']), 'should raise ' . ($want['raises'] ?? ''));
            check($res->getStatusCode() === $want['status'], "status {$res->getStatusCode()}");
            check($app->ran === ($want['status'] === 200), 'the app runs exactly when allowed');
            $got = [];
            foreach ($res->getHeaders() as $name => $values) {
                $l = strtolower($name);
                if (in_array($l, ['ratelimit', 'ratelimit-policy', 'retry-after'], true) || str_starts_with($l, 'x-ratelimit-')) {
                    $got[$l] = implode(', ', $values);
                }
            }
            $exp = array_change_key_case($want['headers'], CASE_LOWER);
            ksort($got);
            ksort($exp);
            check($got === $exp, 'headers ' . json_encode($got) . ' want ' . json_encode($exp));
        } finally {
            $rl->close();
            $d->stop();
        }
    });
}
