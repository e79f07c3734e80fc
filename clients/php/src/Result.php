<?php
// One decision of the daemon for one check, or the client's own fallback when the daemon
// could not answer, with the HTTP headers it maps to.

declare(strict_types=1);

namespace RateLimitd;

final class Result
{
    /**
     * @param int|null $windowMs the rule's policy window (the reply's 7th field); null from
     *   older daemons and when the client decided
     * @param string $source the daemon's word (redis, cache, local, lease, fail_open,
     *   fail_closed) or client_fail_open / client_fail_closed, with the cause in $error
     */
    public function __construct(
        public readonly bool $allowed,
        public readonly int $limit = 0,
        public readonly int $remaining = 0,
        public readonly int $resetMs = 0,
        public readonly int $waitMs = 0,
        public readonly string $source = '',
        public readonly string $rule = '',
        public readonly ?int $windowMs = null,
        public readonly ?string $error = null,
    ) {
    }

    /** True when the daemon did not decide (the client failed open or closed). */
    public function fromClient(): bool
    {
        return str_starts_with($this->source, 'client_');
    }

    /**
     * Daemon-decided: RateLimit-Policy: "<rule>";q=<limit>;w=<window s> (w omitted without a
     * window), RateLimit: "<rule>";r=<remaining>;t=<reset s>, and when denied
     * Retry-After: max(1, ceil(wait s)); with $legacy also X-RateLimit-Limit, -Remaining and
     * -Reset. Client fail-open: none; client fail-closed: only Retry-After: 1.
     *
     * @return array<string, string>
     */
    public function headers(bool $legacy = false): array
    {
        if ($this->fromClient()) {
            return $this->allowed ? [] : ['Retry-After' => '1'];
        }
        $reset = self::ceilSeconds($this->resetMs);
        $h = [
            'RateLimit-Policy' => $this->policy(),
            'RateLimit' => "\"{$this->rule}\";r={$this->remaining};t=$reset",
        ];
        if (!$this->allowed) {
            $h['Retry-After'] = (string) max(1, self::ceilSeconds($this->waitMs));
        }
        if ($legacy) {
            $h['X-RateLimit-Limit'] = (string) $this->limit;
            $h['X-RateLimit-Remaining'] = (string) $this->remaining;
            $h['X-RateLimit-Reset'] = (string) $reset;
        }
        return $h;
    }

    /**
     * The headers of a request decided by checkAllPolicies(): those of $binding (see
     * headers()), with RateLimit-Policy listing every rule (see policyList()) from $binding
     * and the cost-0 results.
     *
     * @param list<Result> $policies
     * @return array<string, string>
     */
    public static function allOrNothingHeaders(self $binding, array $policies, bool $legacy = false): array
    {
        $h = $binding->headers($legacy);
        if (!$binding->fromClient()) {
            $h['RateLimit-Policy'] = self::policyList($binding, $policies);
        }
        return $h;
    }

    /**
     * The headers of a request checked against several rules (checkMany()): those of the
     * most restrictive result (see headers()), with RateLimit-Policy listing every rule (see
     * policyList()).
     *
     * @param non-empty-list<Result> $results
     * @return array<string, string>
     */
    public static function responseHeaders(array $results, bool $legacy = false): array
    {
        $r = self::mostRestrictive($results);
        $h = $r->headers($legacy);
        if (!$r->fromClient()) {
            $h['RateLimit-Policy'] = self::policyList($r, $results);
        }
        return $h;
    }

    /**
     * The RateLimit-Policy value: every distinct rule of $results once, in order, joined by
     * ", "; the binding rule's from $binding, another's from its first daemon-decided result
     * (a rule with none is left out). A binding rule not among them (a composite rule's
     * member) comes first.
     *
     * @param list<Result> $results
     */
    public static function policyList(self $binding, array $results): string
    {
        $names = [];
        $first = [$binding->rule => $binding];
        foreach ($results as $r) {
            if (!in_array($r->rule, $names, true)) {
                $names[] = $r->rule;
            }
            if (!$r->fromClient() && !isset($first[$r->rule])) {
                $first[$r->rule] = $r;
            }
        }
        if (!in_array($binding->rule, $names, true)) {
            array_unshift($names, $binding->rule);
        }
        $parts = [];
        foreach ($names as $n) {
            if (isset($first[$n])) {
                $parts[] = $first[$n]->policy();
            }
        }
        return implode(', ', $parts);
    }

    /** "<rule>";q=<limit>;w=<window s> (w omitted without a window). */
    private function policy(): string
    {
        $policy = "\"{$this->rule}\";q={$this->limit}";
        if ($this->windowMs !== null && $this->windowMs > 0) {
            $policy .= ';w=' . self::ceilSeconds($this->windowMs);
        }
        return $policy;
    }

    /**
     * The result that sets the headers when one request was checked against several rules:
     * any denial beats any allowance; a daemon decision beats a client fallback of the same
     * verdict; among denials the longest wait, among allowances the fewest remaining; then
     * the lowest remaining/limit ratio (limit 0 counts as 0); then the first.
     *
     * @param non-empty-list<Result> $results
     */
    public static function mostRestrictive(array $results): self
    {
        $best = $results[0];
        foreach (array_slice($results, 1) as $r) {
            if (self::stricter($r, $best)) {
                $best = $r;
            }
        }
        return $best;
    }

    private static function stricter(self $a, self $b): bool
    {
        if ($a->allowed !== $b->allowed) {
            return !$a->allowed;
        }
        if ($a->fromClient() !== $b->fromClient()) {
            return !$a->fromClient();
        }
        if (!$a->allowed && $a->waitMs !== $b->waitMs) {
            return $a->waitMs > $b->waitMs;
        }
        if ($a->allowed && $a->remaining !== $b->remaining) {
            return $a->remaining < $b->remaining;
        }
        return self::ratio($a) < self::ratio($b);
    }

    private static function ratio(self $r): float
    {
        return $r->limit === 0 ? 0.0 : $r->remaining / $r->limit;
    }

    private static function ceilSeconds(int $ms): int
    {
        return intdiv($ms + 999, 1000);
    }
}
