<?php
// The daemon rejected a request as malformed (ERR PROTO, RULE, KEY, COST, TOO_LONG), or the
// client refused to send one that cannot be valid: a caller bug, thrown, never failed open.

declare(strict_types=1);

namespace RateLimitd;

final class RequestError extends \InvalidArgumentException
{
    /** ERR codes that mean the request itself is wrong. */
    public const CODES = ['PROTO', 'RULE', 'KEY', 'COST', 'TOO_LONG'];

    public function __construct(public readonly string $errorCode, string $message)
    {
        parent::__construct(rtrim("ratelimitd: ERR $errorCode $message"));
    }
}
