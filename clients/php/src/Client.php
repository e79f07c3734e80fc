<?php
// The client applications hold: checks over one kept Unix-socket connection (persistent
// across php-fpm requests), pipelined batches, and the failure policy (fail open or closed
// with the cause; one retry on a stale connection; never after a timeout; caller bugs thrown).

declare(strict_types=1);

namespace RateLimitd;

/**
 * $rl = new Client('/run/ratelimitd/ratelimitd.sock');
 * $r = $rl->check('rides_request', 'user:42');
 *
 * With $persistent (the default) the connection is opened with STREAM_CLIENT_PERSISTENT:
 * it outlives the request, and the next request served by the same php-fpm worker (any
 * Client for the same socket) reuses it. A kept connection found closed (the daemon
 * restarted) or holding stray bytes (a request that died mid-read) is replaced. When the
 * daemon is absent, refuses, answers ERR BUSY/PERM/INTERNAL or garbage, or does not answer
 * within $timeout seconds, the result is allowed ($failOpen, the default; source
 * client_fail_open) or denied (client_fail_closed), with the cause in ->error. ERR
 * PROTO/RULE/KEY/COST/TOO_LONG throw RequestError.
 */
final class Client
{
    use SeveralLimits;

    public const DEFAULT_SOCKET = '/run/ratelimitd/ratelimitd.sock';

    /** @var resource|null */
    private $conn = null;

    /** True once the daemon could not be reached and a warning named the socket path. */
    private bool $warned = false;

    public function __construct(
        public readonly string $path = self::DEFAULT_SOCKET,
        public readonly float $timeout = 0.2,
        public readonly bool $failOpen = true,
        public readonly bool $persistent = true,
    ) {
    }

    /** Takes $cost units (0: only report) of $key's budget under $rule. */
    public function check(string $rule, string $key, int $cost = 1): Result
    {
        return $this->checkMany([[$rule, $key, $cost]])[0];
    }

    /**
     * Several checks in one round trip (one write, then the replies in order).
     *
     * @param list<array{0: string, 1: string, 2?: int}> $checks [rule, key, cost = 1]
     * @return list<Result>
     */
    public function checkMany(array $checks): array
    {
        if (!$checks) {
            return [];
        }
        $requests = [];
        foreach ($checks as $c) {
            $requests[] = [Protocol::requestLine($c[0], $c[1], $c[2] ?? 1), $c[0], [Protocol::class, 'parseReply']];
        }
        return $this->roundTrip($requests);
    }

    /**
     * Sends the request lines in one write and reads one reply per line, with the failure
     * policy of checkMany(). Each request: [line, rule named in a fallback, parser(line, rule)].
     *
     * @param list<array{0: string, 1: string, 2: callable(string, string): Result}> $requests
     * @return list<Result>
     */
    private function roundTrip(array $requests): array
    {
        $payload = implode('', array_column($requests, 0));
        $checks = $requests;
        $n = count($checks);
        $deadline = microtime(true) + $this->timeout;
        $lines = [];
        $cause = null;
        $inStep = false;
        $reused = false;
        try {
            $reused = $this->open($deadline);
            $inStep = $this->exchange($payload, $n, $deadline, $lines);
        } catch (ConnectionLost $e) {
            $this->close();
            $cause = $e->getMessage();
            if ($reused && !$lines) {
                // A kept connection closed by a daemon restart or an idle timeout: one retry
                // on a fresh connection.
                $cause = null;
                try {
                    $this->open($deadline);
                    $inStep = $this->exchange($payload, $n, $deadline, $lines);
                } catch (\RuntimeException $e2) {
                    $cause = $e2->getMessage();
                }
            }
        } catch (\RuntimeException $e) {
            // Connecting failed, or a timeout: never retried (the daemon is alive but slow,
            // and a retry would double the wait).
            $cause = $e->getMessage();
        }
        $out = [];
        $bug = null;
        foreach ($checks as $i => $c) {
            if (!isset($lines[$i])) {
                $out[] = $this->fallback($c[1], "ratelimitd at {$this->path}: " . ($cause ?? 'no reply'));
                continue;
            }
            try {
                $out[] = ($c[2])($lines[$i], $c[1]);
            } catch (RequestError $e) {
                if (in_array($e->errorCode, RequestError::CODES, true)) {
                    $bug ??= $e;
                }
                // BUSY and PERM close the connection; INTERNAL and later versions' codes
                // leave it open. Either way the daemon cannot serve this check now.
                $inStep = $inStep && $e->errorCode !== 'BUSY' && $e->errorCode !== 'PERM';
                $out[] = $this->fallback($c[1], "daemon said: {$lines[$i]}");
            } catch (\UnexpectedValueException $e) {
                $inStep = false;
                $out[] = $this->fallback($c[1], $e->getMessage());
            }
        }
        if ($cause !== null || !$inStep) {
            $this->close();
        }
        if ($bug) {
            throw $bug;
        }
        return $out;
    }

    /** Closes the connection (a persistent one too); the next check opens a new one. */
    public function close(): void
    {
        if (is_resource($this->conn)) {
            fclose($this->conn);
        }
        $this->conn = null;
    }

    private function fallback(string $rule, string $error): Result
    {
        return new Result($this->failOpen, source: $this->failOpen ? 'client_fail_open' : 'client_fail_closed', rule: $rule, error: $error);
    }

    /**
     * Opens the connection, or takes the kept one: this object's, or with $persistent a
     * persistent stream an earlier request of this worker left (PHP hands it over after
     * checking it is alive). True when it is a kept one (it has read replies before). A kept
     * one that is readable before we asked anything (EOF, or stray replies of a request that
     * died mid-read) is replaced now.
     */
    private function open(float $deadline): bool
    {
        if (!is_resource($this->conn)) {
            $this->conn = $this->connect($deadline);
        }
        if (ftell($this->conn) === 0) {
            return false;
        }
        $r = [$this->conn];
        $w = $e = null;
        if (@stream_select($r, $w, $e, 0) === 0) {
            return true;
        }
        $this->close();
        $this->conn = $this->connect($deadline);
        return false;
    }

    /** @return resource */
    private function connect(float $deadline)
    {
        $flags = STREAM_CLIENT_CONNECT | ($this->persistent ? STREAM_CLIENT_PERSISTENT : 0);
        $errno = 0;
        $errstr = '';
        $conn = @stream_socket_client('unix://' . $this->path, $errno, $errstr, max($deadline - microtime(true), 0.001), $flags);
        if (!$conn) {
            if (!$this->warned) {
                // Once per Client: a wrong path must not pass silently as "everything allowed".
                $this->warned = true;
                $then = $this->failOpen ? 'failing open (allowing)' : 'failing closed (denying)';
                trigger_error("ratelimitd: cannot reach the daemon at {$this->path} ($errstr): $then until it answers", E_USER_WARNING);
            }
            throw new \RuntimeException("cannot connect: $errstr");
        }
        return $conn;
    }

    /**
     * Writes the request lines and reads $n replies into $lines (kept on error). False when
     * more bytes came than replies were asked for (do not reuse the connection).
     *
     * @param list<string> $lines
     */
    private function exchange(string $payload, int $n, float $deadline, array &$lines): bool
    {
        $this->setTimeout($deadline);
        $written = @fwrite($this->conn, $payload);
        if ($written !== strlen($payload)) {
            throw new ConnectionLost('write failed: daemon closed the connection');
        }
        while (count($lines) < $n) {
            $this->setTimeout($deadline);
            $line = fgets($this->conn);
            if ($line === false || !str_ends_with($line, "\n")) {
                if (stream_get_meta_data($this->conn)['timed_out']) {
                    throw new \RuntimeException("timeout: no reply within {$this->timeout} s");
                }
                throw new ConnectionLost('daemon closed the connection');
            }
            $lines[] = rtrim($line, "\r\n");
        }
        return stream_get_meta_data($this->conn)['unread_bytes'] === 0;
    }

    private function setTimeout(float $deadline): void
    {
        $left = max($deadline - microtime(true), 0.001);
        stream_set_timeout($this->conn, (int) $left, (int) (($left - (int) $left) * 1e6));
    }
}
