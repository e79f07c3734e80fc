<?php
/**
 * Client for ratelimitd, the per-host rate-limit daemon (PHP, no extensions beyond core).
 *
 *   require 'RateLimitd.php';
 *   $rl = new RateLimitd\Client('/run/ratelimitd/ratelimitd.sock');
 *   $r = $rl->check('rides_request', 'user:42');
 *   if (!$r->allowed) { http_response_code(429); foreach ($r->headers() as $k => $v) header("$k: $v"); exit; }
 *
 * One connection per Client, opened on first use and reused (also across requests when
 * the Client lives in a long-running worker), re-opened after the daemon restarts.
 * checkMany() pipelines several checks in one round trip. When the daemon is absent,
 * refuses, or does not answer within the timeout, the result is allowed (failOpen, the
 * default; source "client_fail_open") or denied ("client_fail_closed"), with the cause
 * in ->error. A request the daemon rejects as malformed (unknown rule, bad key or
 * cost) throws RequestError.
 */

namespace RateLimitd;

const DEFAULT_SOCKET = '/run/ratelimitd/ratelimitd.sock';

/** The daemon rejected the request itself (ERR PROTO/RULE/KEY/COST/TOO_LONG). */
class RequestError extends \InvalidArgumentException
{
    public string $errorCode;

    public function __construct(string $code, string $message)
    {
        parent::__construct("ratelimitd: ERR $code $message");
        $this->errorCode = $code;
    }
}

/** One decision; times in ms. $source is the daemon's or client_fail_open|closed. */
final class Result
{
    public function __construct(
        public bool $allowed,
        public int $limit = 0,
        public int $remaining = 0,
        public int $resetMs = 0,
        public int $waitMs = 0,
        public string $source = '',
        public string $rule = '',
        public ?string $error = null,
    ) {
    }

    /** True when the daemon did not decide (the client failed open or closed). */
    public function fromClient(): bool
    {
        return str_starts_with($this->source, 'client_');
    }

    /**
     * HTTP response headers: IETF draft-ietf-httpapi-ratelimit-headers (RateLimit-Policy,
     * RateLimit), X-RateLimit-Limit/Remaining/Reset (seconds from now), Retry-After
     * (seconds) when denied. Empty when the daemon did not decide (Retry-After: 1 if the
     * client failed closed).
     *
     * @return array<string, string>
     */
    public function headers(): array
    {
        if ($this->fromClient()) {
            return $this->allowed ? [] : ['Retry-After' => '1'];
        }
        $reset = intdiv($this->resetMs + 999, 1000);
        $h = [
            'RateLimit-Policy' => "\"{$this->rule}\";q={$this->limit}",
            'RateLimit' => "\"{$this->rule}\";r={$this->remaining};t=$reset",
            'X-RateLimit-Limit' => (string) $this->limit,
            'X-RateLimit-Remaining' => (string) $this->remaining,
            'X-RateLimit-Reset' => (string) $reset,
        ];
        if (!$this->allowed) {
            $h['Retry-After'] = (string) max(1, intdiv($this->waitMs + 999, 1000));
        }
        return $h;
    }
}

/** Percent-encodes every byte outside 0x21..0x7E, and '%' itself. */
function encode_key(string $key): string
{
    return preg_replace_callback(
        '/[^\x21-\x24\x26-\x7e]/',
        fn ($m) => sprintf('%%%02X', ord($m[0])),
        $key
    );
}

/** Parses a CHECK reply (six fields, extra trailing ones ignored). Throws on ERR. */
function parse_reply(string $line, string $rule = ''): Result
{
    $f = preg_split('/[ \t]+/', trim($line));
    if ($f[0] === 'ERR') {
        throw new RequestError($f[1] ?? 'INTERNAL', implode(' ', array_slice($f, 2)));
    }
    if (count($f) < 6 || ($f[0] !== 'ALLOW' && $f[0] !== 'DENY')) {
        throw new \UnexpectedValueException('ratelimitd: unexpected reply ' . json_encode($line));
    }
    foreach (array_slice($f, 1, 4) as $n) {
        if (!ctype_digit($n)) {
            throw new \UnexpectedValueException('ratelimitd: bad number in reply ' . json_encode($line));
        }
    }
    return new Result($f[0] === 'ALLOW', (int) $f[1], (int) $f[2], (int) $f[3], (int) $f[4], $f[5], $rule);
}

final class Client
{
    private const REQUEST_ERRORS = ['PROTO', 'RULE', 'KEY', 'COST', 'TOO_LONG'];

    /** @var resource|null */
    private $conn = null;

    /**
     * @param float $timeout seconds for a whole check/checkMany, connecting included
     */
    public function __construct(
        public string $path = DEFAULT_SOCKET,
        public float $timeout = 0.2,
        public bool $failOpen = true,
    ) {
    }

    /** Asks for $cost units of $key's budget under $rule. */
    public function check(string $rule, string $key, int $cost = 1): Result
    {
        return $this->checkMany([[$rule, $key, $cost]])[0];
    }

    /**
     * Several checks in one round trip; results in the same order.
     *
     * @param list<array{0: string, 1: string, 2?: int}> $checks
     * @return list<Result>
     */
    public function checkMany(array $checks): array
    {
        if (!$checks) {
            return [];
        }
        $payload = '';
        foreach ($checks as $c) {
            $payload .= sprintf("CHECK %s %s %d\n", $c[0], encode_key($c[1]), $c[2] ?? 1);
        }
        try {
            $lines = $this->roundTrip($payload, count($checks));
        } catch (\RuntimeException $e) {
            $this->close();
            return array_map(fn ($c) => $this->fallback($c[0], $e->getMessage()), $checks);
        }
        $out = [];
        foreach ($lines as $i => $line) {
            $f = preg_split('/[ \t]+/', $line);
            if ($f[0] === 'ERR' && in_array($f[1] ?? '', self::REQUEST_ERRORS, true)) {
                throw new RequestError($f[1], implode(' ', array_slice($f, 2)));
            }
            if ($f[0] === 'ERR') {
                // BUSY, PERM, INTERNAL: the daemon cannot serve us now.
                $this->close();
                $out[] = $this->fallback($checks[$i][0], "daemon said: $line");
                continue;
            }
            $out[] = parse_reply($line, $checks[$i][0]);
        }
        return $out;
    }

    /** Closes the connection; the next check opens a new one. */
    public function close(): void
    {
        if ($this->conn) {
            fclose($this->conn);
        }
        $this->conn = null;
    }

    private function fallback(string $rule, string $error): Result
    {
        return new Result($this->failOpen, source: $this->failOpen ? 'client_fail_open' : 'client_fail_closed', rule: $rule, error: $error);
    }

    /** @return list<string> */
    private function roundTrip(string $payload, int $n): array
    {
        $deadline = microtime(true) + $this->timeout;
        $reused = $this->conn !== null;
        try {
            return $this->exchange($payload, $n, $deadline);
        } catch (ConnectionLost $e) {
            // A kept connection closed by a daemon restart or idle timeout: one retry on
            // a fresh connection (not after a timeout: the daemon is alive but slow).
            $this->close();
            if (!$reused) {
                throw $e;
            }
            return $this->exchange($payload, $n, $deadline);
        }
    }

    /** @return list<string> */
    private function exchange(string $payload, int $n, float $deadline): array
    {
        if (!$this->conn) {
            $errno = 0;
            $errstr = '';
            $conn = @stream_socket_client('unix://' . $this->path, $errno, $errstr, max($deadline - microtime(true), 0.001));
            if (!$conn) {
                throw new \RuntimeException("cannot connect to {$this->path}: $errstr");
            }
            $this->conn = $conn;
        }
        $this->setTimeout($deadline);
        $written = @fwrite($this->conn, $payload);
        if ($written !== strlen($payload)) {
            throw new ConnectionLost('write failed: daemon closed the connection');
        }
        $lines = [];
        while (count($lines) < $n) {
            $this->setTimeout($deadline);
            $line = fgets($this->conn);
            if ($line === false || !str_ends_with($line, "\n")) {
                if (stream_get_meta_data($this->conn)['timed_out']) {
                    throw new \RuntimeException("timeout: no reply within {$this->timeout} s");
                }
                throw new ConnectionLost('daemon closed the connection');
            }
            $lines[] = rtrim($line, "\n");
        }
        return $lines;
    }

    private function setTimeout(float $deadline): void
    {
        $left = max($deadline - microtime(true), 0.001);
        stream_set_timeout($this->conn, (int) $left, (int) (($left - (int) $left) * 1e6));
    }
}

/** The connection ended (EOF, reset): worth one retry if it was a kept one. */
final class ConnectionLost extends \RuntimeException
{
}
