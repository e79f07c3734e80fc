<?php
// One ACQUIRE's answer (a concurrency rule's slot), and its HTTP headers.

declare(strict_types=1);

namespace RateLimitd;

final class Slot
{
    /** @param ?string $token names the slot for Slots::release (null when denied or decided by the client) */
    public function __construct(
        public readonly bool $allowed,
        public readonly string $rule,
        public readonly string $key,
        public readonly int $limit = 0,
        public readonly int $remaining = 0,
        public readonly int $waitMs = 0,
        public readonly string $source = '',
        public ?string $token = null,
        public readonly ?string $error = null,
    ) {
    }

    /**
     * RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests", RateLimit and, when
     * denied, Retry-After; none when the client failed open.
     *
     * @return array<string, string>
     */
    public function headers(): array
    {
        if (str_starts_with($this->source, 'client_')) {
            return $this->allowed ? [] : ['Retry-After' => '1'];
        }
        $h = [
            'RateLimit-Policy' => "\"{$this->rule}\";q={$this->limit};qu=\"concurrent-requests\"",
            'RateLimit' => "\"{$this->rule}\";r={$this->remaining}",
        ];
        if (!$this->allowed) {
            $h['Retry-After'] = (string) max(1, intdiv($this->waitMs + 999, 1000));
        }
        return $h;
    }
}
