<?php
// PSR-15 middleware: checks each request against ratelimitd (several checks pipelined, or
// all or nothing as one CHECKALL), sets the rate-limit headers, and answers 429 itself
// when denied.

declare(strict_types=1);

namespace RateLimitd;

use Psr\Http\Message\ResponseFactoryInterface;
use Psr\Http\Message\ResponseInterface;
use Psr\Http\Message\ServerRequestInterface;
use Psr\Http\Server\MiddlewareInterface;
use Psr\Http\Server\RequestHandlerInterface;

/**
 * $mw = new Middleware($client, new Psr17Factory(),
 *     fn (ServerRequestInterface $r) => [['api', 'ip:' . ($r->getServerParams()['REMOTE_ADDR'] ?? '')]]);
 *
 * $checks returns the checks one request makes, [rule, key, cost = 1] each (none: the
 * request goes through). Denied: 429, the headers, a short text body; the handler does not
 * run. Allowed: the handler runs with the result in the request attribute
 * Middleware::RESULT_ATTRIBUTE, and its response gets the headers. A RequestError (a
 * misconfigured rule, a cost above the limit) propagates: the framework answers 500. The
 * middleware does not sleep for a leaky_bucket's waitMs: read it from the attribute.
 */
final class Middleware implements MiddlewareInterface
{
    public const RESULT_ATTRIBUTE = 'ratelimitd.result';

    /** @var \Closure(ServerRequestInterface): list<array{0: string, 1: string, 2?: int}> */
    private \Closure $checks;

    /**
     * @param callable(ServerRequestInterface): list<array{0: string, 1: string, 2?: int}> $checks
     * @param bool $legacyHeaders also send X-RateLimit-Limit, -Remaining and -Reset
     * @param bool $allOrNothing decide the checks as one CHECKALL (at most 8; no
     *   lease = "auto" or concurrency rule): a denied request takes nothing from any rule;
     *   RateLimit names the binding rule, RateLimit-Policy lists every rule
     */
    public function __construct(
        private readonly Client $client,
        private readonly ResponseFactoryInterface $responses,
        callable $checks,
        private readonly bool $legacyHeaders = false,
        private readonly bool $allOrNothing = false,
    ) {
        $this->checks = \Closure::fromCallable($checks);
    }

    public function process(ServerRequestInterface $request, RequestHandlerInterface $handler): ResponseInterface
    {
        $checks = ($this->checks)($request);
        if (!$checks) {
            return $handler->handle($request);
        }
        if ($this->allOrNothing) {
            [$r, $policies] = $this->client->checkAllPolicies($checks);
            $headers = Result::allOrNothingHeaders($r, $policies, $this->legacyHeaders);
        } else {
            $results = $this->client->checkMany($checks);
            $r = Result::mostRestrictive($results);
            $headers = Result::responseHeaders($results, $this->legacyHeaders);
        }
        if ($r->allowed) {
            $response = $handler->handle($request->withAttribute(self::RESULT_ATTRIBUTE, $r));
        } else {
            $response = $this->responses->createResponse(429)->withHeader('Content-Type', 'text/plain; charset=utf-8');
            $response->getBody()->write("Too Many Requests\n");
        }
        foreach ($headers as $name => $value) {
            $response = $response->withHeader($name, $value);
        }
        return $response;
    }
}
