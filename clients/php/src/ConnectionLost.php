<?php
// The daemon closed the connection (EOF, failed write): on a kept connection, worth one retry.

declare(strict_types=1);

namespace RateLimitd;

final class ConnectionLost extends \RuntimeException
{
}
