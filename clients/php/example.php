<?php
// A page rate-limited per client address through ratelimitd.
//   RATELIMITD_SOCKET=/run/ratelimitd/ratelimitd.sock php -S 127.0.0.1:8080 example.php
require __DIR__ . '/RateLimitd.php';

$rl = new RateLimitd\Client(getenv('RATELIMITD_SOCKET') ?: RateLimitd\DEFAULT_SOCKET);
$r = $rl->check('rides_request', $_SERVER['REMOTE_ADDR'] ?? 'cli');
foreach ($r->headers() as $name => $value) {
    header("$name: $value");
}
if (!$r->allowed) {
    http_response_code(429);
    exit("slow down\n");
}
echo "hello\n";
