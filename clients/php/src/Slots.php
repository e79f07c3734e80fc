<?php
// Concurrency slots (algorithm = "concurrency" rules): acquire, release, and hold() that
// always gives the slot back, on a connection of their own.

declare(strict_types=1);

namespace RateLimitd;

/**
 * $slots = new Slots('/run/ratelimitd/ratelimitd.sock');
 * $result = $slots->hold('jobs', 'user:42', function (Slot $s) { ... });
 *
 * The connection is never persistent: the daemon gives a slot back when the connection
 * that took it closes, so a request that dies (PHP closes its streams at the end of every
 * request) frees its slots at once, and a slot cannot outlive the rule's max_hold. When
 * the daemon cannot be asked, $failOpen decides: allowed without a token, or denied, the
 * cause in ->error. ERR PROTO/RULE/KEY throw RequestError (a caller bug).
 */
final class Slots
{
    /** @var resource|null */
    private $conn = null;

    public function __construct(
        public readonly string $path = Client::DEFAULT_SOCKET,
        public readonly float $timeout = 0.2,
        public readonly bool $failOpen = true,
    ) {
    }

    /** ACQUIRE: a slot of $rule for $key, or a denial (waitMs: until the oldest slot's max_hold ends). */
    public function acquire(string $rule, string $key): Slot
    {
        $k = Protocol::encodeKey($key);
        [$line, $cause] = $this->ask("ACQUIRE $rule $k\n");
        if ($line !== null) {
            self::refuse($line);
            $f = explode(' ', $line);
            $nums = array_slice($f, 1, 4);
            $ok = count($f) >= 6 && count($nums) === 4 && array_reduce($nums, fn ($a, $x) => $a && ctype_digit($x), true)
                && ($f[0] === 'DENY' || ($f[0] === 'ALLOW' && count($f) >= 8));
            if ($ok) {
                $allowed = $f[0] === 'ALLOW';
                return new Slot($allowed, $rule, $k, (int) $f[1], (int) $f[2], (int) $f[4], $f[5], $allowed ? $f[7] : null);
            }
            $cause = 'unexpected reply: ' . substr($line, 0, 80);
            $this->close();
        }
        $source = $this->failOpen ? 'client_fail_open' : 'client_fail_closed';
        return new Slot($this->failOpen, $rule, $k, source: $source, error: "ratelimitd at {$this->path}: " . ($cause ?? 'no reply'));
    }

    /** RELEASE: true when given back; false when the daemon no longer held it or could not be asked. Idempotent. */
    public function release(Slot $slot): bool
    {
        $token = $slot->token;
        $slot->token = null;
        if ($token === null) {
            return false;
        }
        [$line] = $this->ask("RELEASE {$slot->rule} {$slot->key} $token\n");
        if ($line === null) {
            return false;
        }
        self::refuse($line);
        return $line === 'OK';
    }

    /**
     * Runs $fn($slot) holding a slot of $rule for $key and releases it however $fn ends
     * (a return or an exception); $fn sees $slot->allowed.
     *
     * @template T
     * @param callable(Slot): T $fn
     * @return T
     */
    public function hold(string $rule, string $key, callable $fn): mixed
    {
        $slot = $this->acquire($rule, $key);
        try {
            return $fn($slot);
        } finally {
            $this->release($slot);
        }
    }

    /** Closes the connection: the daemon gives back every slot it took. */
    public function close(): void
    {
        if (is_resource($this->conn)) {
            fclose($this->conn);
        }
        $this->conn = null;
    }

    private static function refuse(string $line): void
    {
        $f = explode(' ', $line, 3);
        if ($f[0] === 'ERR' && isset($f[1]) && in_array($f[1], RequestError::CODES, true)) {
            throw new RequestError($f[1], $f[2] ?? '');
        }
    }

    /** @return array{0: ?string, 1: ?string} the reply line, or null and why */
    private function ask(string $line): array
    {
        $deadline = microtime(true) + $this->timeout;
        if (!is_resource($this->conn)) {
            $errno = 0;
            $errstr = '';
            $conn = @stream_socket_client('unix://' . $this->path, $errno, $errstr, $this->timeout);
            if (!$conn) {
                return [null, "cannot connect: $errstr"];
            }
            $this->conn = $conn;
        }
        $left = max($deadline - microtime(true), 0.001);
        stream_set_timeout($this->conn, (int) $left, (int) (($left - (int) $left) * 1e6));
        if (@fwrite($this->conn, $line) !== strlen($line)) {
            $this->close();
            return [null, 'daemon closed the connection'];
        }
        $reply = fgets($this->conn);
        if ($reply === false || !str_ends_with($reply, "\n")) {
            $timedOut = stream_get_meta_data($this->conn)['timed_out'];
            $this->close();
            return [null, $timedOut ? "timeout: no reply within {$this->timeout} s" : 'daemon closed the connection'];
        }
        return [rtrim($reply, "\r\n"), null];
    }
}
