<?php
// Several limits at once (CHECKALL: all or nothing) and giving units back (REFUND), over
// the Client's connection and with its failure policy.

declare(strict_types=1);

namespace RateLimitd;

/**
 * $r = $rl->checkAll([['ride_burst', 'rider:7'], ['ride_daily', 'rider:7'], ['ride_ip', $ip]]);
 * $rl->refund('ride_daily', 'rider:7', 1);   // the upstream failed: give the unit back
 */
trait SeveralLimits
{
    /**
     * Decides 1 to 8 checks as one request: allowed only if every one is, and then each is
     * taken; on a deny none is consumed. The Result is the binding check's (the denied one
     * with the longest wait, or the one closest to its limit), its rule in ->rule. When the
     * daemon cannot answer, the fallback of check() (fail open or closed, the cause in
     * ->error, ->rule the first check's).
     *
     * @param list<array{0: string, 1: string, 2?: int}> $checks [rule, key, cost = 1]
     */
    public function checkAll(array $checks): Result
    {
        $line = Protocol::checkAllLine($checks);
        return $this->roundTrip([[$line, (string) $checks[0][0], [Protocol::class, 'parseCheckAllReply']]])[0];
    }

    /**
     * checkAll() plus, in the same round trip, one check of cost 0 (it takes nothing) per
     * distinct rule when the checks name more than one: [the binding Result, each rule's
     * state in the order the rules first appear], for Result::allOrNothingHeaders() to list
     * every policy. A policy line that cannot be read gives a client-decided Result (left
     * out of the headers).
     *
     * @param list<array{0: string, 1: string, 2?: int}> $checks [rule, key, cost = 1]
     * @return array{0: Result, 1: list<Result>}
     */
    public function checkAllPolicies(array $checks): array
    {
        $requests = [[Protocol::checkAllLine($checks), (string) $checks[0][0], [Protocol::class, 'parseCheckAllReply']]];
        $first = [];
        foreach ($checks as $c) {
            $first[(string) $c[0]] ??= (string) $c[1];
        }
        if (count($first) > 1) {
            foreach ($first as $rule => $key) {
                $requests[] = [Protocol::requestLine((string) $rule, $key, 0), (string) $rule, [Protocol::class, 'parseReply']];
            }
        }
        $rs = $this->roundTrip($requests);
        return [$rs[0], array_slice($rs, 1)];
    }

    /**
     * Gives $units back to $key's budget under $rule (never beyond its capacity or limit,
     * never into a window other than the current one). The Result is the state after the
     * refund (a check of cost 0).
     */
    public function refund(string $rule, string $key, int $units = 1): Result
    {
        return $this->roundTrip([[Protocol::refundLine($rule, $key, $units), $rule, [Protocol::class, 'parseReply']]])[0];
    }
}
