<?php
// A tiny PSR-15 application limited per client address: the ratelimitd middleware in front
// of a handler saying hello. Run: RATELIMITD_SOCKET=/run/ratelimitd/ratelimitd.sock \
//   RATELIMITD_RULE=rides_request php -S 127.0.0.1:8080 -t public   (after composer install)

declare(strict_types=1);

require __DIR__ . '/../vendor/autoload.php';

use Nyholm\Psr7\Factory\Psr17Factory;
use Nyholm\Psr7\ServerRequest;
use Psr\Http\Message\ResponseInterface;
use Psr\Http\Message\ServerRequestInterface;
use Psr\Http\Server\RequestHandlerInterface;
use RateLimitd\Client;
use RateLimitd\Middleware;

$factory = new Psr17Factory();
$rule = getenv('RATELIMITD_RULE') ?: 'rides_request';
$limit = new Middleware(
    new Client(getenv('RATELIMITD_SOCKET') ?: Client::DEFAULT_SOCKET),
    $factory,
    fn (ServerRequestInterface $r) => [[$rule, 'ip:' . ($r->getServerParams()['REMOTE_ADDR'] ?? '-')]],
);
$app = new class ($factory) implements RequestHandlerInterface {
    public function __construct(private Psr17Factory $factory)
    {
    }

    public function handle(ServerRequestInterface $request): ResponseInterface
    {
        return $this->factory->createResponse(200)->withBody($this->factory->createStream("hello\n"));
    }
};

// A framework does this part; here, by hand: globals in, response out.
$request = new ServerRequest($_SERVER['REQUEST_METHOD'] ?? 'GET', $_SERVER['REQUEST_URI'] ?? '/', getallheaders(), null, '1.1', $_SERVER);
$response = $limit->process($request, $app);
http_response_code($response->getStatusCode());
foreach ($response->getHeaders() as $name => $values) {
    header($name . ': ' . implode(', ', $values));
}
echo $response->getBody();
