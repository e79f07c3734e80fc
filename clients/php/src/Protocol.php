<?php
// The line protocol, and nothing else: request lines out, reply lines in. No I/O here.

declare(strict_types=1);

namespace RateLimitd;

final class Protocol
{
    /** Percent-encodes every byte outside 0x21..0x7E, and '%' itself. */
    public static function encodeKey(string $key): string
    {
        return (string) preg_replace_callback(
            '/[^\x21-\x24\x26-\x7e]/',
            fn (array $m) => sprintf('%%%02X', ord($m[0])),
            $key
        );
    }

    /** "CHECK <rule> <key> <cost>\n"; a rule or key that cannot be sent is a caller bug. */
    public static function requestLine(string $rule, string $key, int $cost): string
    {
        if (!preg_match('/^[\x21-\x7e]+$/', $rule)) {
            throw new RequestError('RULE', 'rule name must be printable ASCII without spaces');
        }
        if ($key === '') {
            throw new RequestError('KEY', 'empty key');
        }
        return sprintf("CHECK %s %s %d\n", $rule, self::encodeKey($key), $cost);
    }

    /**
     * "CHECKALL <rule> <key> <cost> ...\n" for 1 to 8 [rule, key, cost = 1] checks; more,
     * fewer or a bad rule or key is a caller bug.
     *
     * @param list<array{0: string, 1: string, 2?: int}> $checks
     */
    public static function checkAllLine(array $checks): string
    {
        if (count($checks) < 1 || count($checks) > 8) {
            throw new RequestError('PROTO', 'CHECKALL takes 1 to 8 checks, got ' . count($checks));
        }
        $parts = [];
        foreach ($checks as $c) {
            $parts[] = substr(self::requestLine((string) $c[0], (string) $c[1], (int) ($c[2] ?? 1)), 6, -1);
        }
        return 'CHECKALL ' . implode(' ', $parts) . "\n";
    }

    /** "REFUND <rule> <key> <units>\n". */
    public static function refundLine(string $rule, string $key, int $units): string
    {
        return 'REFUND ' . substr(self::requestLine($rule, $key, $units), 6);
    }

    /** Parses a CHECKALL reply: a CHECK reply whose 8th field names the binding rule. */
    public static function parseCheckAllReply(string $line, string $rule = ''): Result
    {
        $r = self::parseReply($line, $rule);
        $f = preg_split('/[ \t]+/', trim($line)) ?: [];
        if (!isset($f[7]) || $f[7] === '') {
            return $r;
        }
        return new Result($r->allowed, $r->limit, $r->remaining, $r->resetMs, $r->waitMs, $r->source, $f[7], $r->windowMs);
    }

    /**
     * Parses a CHECK reply: six fields or more; the 7th, window_ms, is optional (older
     * daemons) and later ones are ignored. An ERR line throws RequestError whatever its code
     * (the caller decides which codes are caller bugs); anything else unusable throws
     * \UnexpectedValueException.
     */
    public static function parseReply(string $line, string $rule = ''): Result
    {
        $f = preg_split('/[ \t]+/', trim($line)) ?: [''];
        if ($f[0] === 'ERR') {
            throw new RequestError($f[1] ?? 'INTERNAL', implode(' ', array_slice($f, 2)));
        }
        if (count($f) < 6 || ($f[0] !== 'ALLOW' && $f[0] !== 'DENY')) {
            throw new \UnexpectedValueException('ratelimitd: unexpected reply ' . json_encode($line));
        }
        foreach (array_slice($f, 1, 4) as $n) {
            if (!self::isNumber($n)) {
                throw new \UnexpectedValueException('ratelimitd: bad number in reply ' . json_encode($line));
            }
        }
        $window = isset($f[6]) && self::isNumber($f[6]) ? (int) $f[6] : null;
        return new Result($f[0] === 'ALLOW', (int) $f[1], (int) $f[2], (int) $f[3], (int) $f[4], $f[5], $rule, $window);
    }

    private static function isNumber(string $s): bool
    {
        return strlen($s) <= 18 && ctype_digit($s);
    }
}
