<?php
// PSR-15 middleware holding one concurrency slot per request while the handler runs.

declare(strict_types=1);

namespace RateLimitd;

use Psr\Http\Message\ResponseFactoryInterface;
use Psr\Http\Message\ResponseInterface;
use Psr\Http\Message\ServerRequestInterface;
use Psr\Http\Server\MiddlewareInterface;
use Psr\Http\Server\RequestHandlerInterface;

/**
 * $mw = new ConcurrencyMiddleware(new Slots($socket), new Psr17Factory(), 'inflight',
 *     fn (ServerRequestInterface $r) => 'user:' . $r->getAttribute('user'));
 *
 * $key returns the key (null: no slot). Denied: 429 with RateLimit-Policy
 * "<rule>";q=<limit>;qu="concurrent-requests", RateLimit and Retry-After; the handler does
 * not run. Allowed: the handler runs holding the slot, given back when it returns or
 * throws (and, should the request die, when PHP closes the connection at its end).
 */
final class ConcurrencyMiddleware implements MiddlewareInterface
{
    /** @var \Closure(ServerRequestInterface): ?string */
    private \Closure $key;

    /** @param callable(ServerRequestInterface): ?string $key */
    public function __construct(
        private readonly Slots $slots,
        private readonly ResponseFactoryInterface $responses,
        private readonly string $rule,
        callable $key,
    ) {
        $this->key = \Closure::fromCallable($key);
    }

    public function process(ServerRequestInterface $request, RequestHandlerInterface $handler): ResponseInterface
    {
        $key = ($this->key)($request);
        if ($key === null) {
            return $handler->handle($request);
        }
        $slot = $this->slots->acquire($this->rule, $key);
        if ($slot->allowed) {
            try {
                $response = $handler->handle($request);
            } finally {
                $this->slots->release($slot);
            }
        } else {
            $response = $this->responses->createResponse(429)->withHeader('Content-Type', 'text/plain; charset=utf-8');
            $response->getBody()->write("Too Many Requests\n");
        }
        foreach ($slot->headers() as $name => $value) {
            $response = $response->withHeader($name, $value);
        }
        return $response;
    }
}
