// One decision of ratelimitd for one check, as the daemon replied it, or the client's own
// fallback when the daemon could not answer (source client_fail_open / client_fail_closed).
package io.github.ratelimitd;

import java.util.OptionalLong;

/**
 * One decision. Times are in milliseconds.
 *
 * @param allowed whether the request may go ahead
 * @param limit the rule's limit (windows) or capacity (buckets); 0 when the client decided
 * @param remaining units the key could still take now
 * @param resetMs ms until the key is back to fully unused
 * @param waitMs on a denial, ms until the same request could pass; on an allowed
 *     leaky_bucket decision, ms to wait before doing the work
 * @param source who decided: the daemon's word (redis, cache, local, lease, fail_open,
 *     fail_closed) or client_fail_open / client_fail_closed
 * @param rule the rule this result is for (names the headers)
 * @param windowMs the rule's policy window (the reply's 7th field), empty from older daemons
 *     and when the client decided
 * @param error why the client decided (null when the daemon did)
 */
public record Result(
    boolean allowed,
    long limit,
    long remaining,
    long resetMs,
    long waitMs,
    String source,
    String rule,
    OptionalLong windowMs,
    String error) {

  static final String CLIENT_FAIL_OPEN = "client_fail_open";
  static final String CLIENT_FAIL_CLOSED = "client_fail_closed";

  /** The client's own decision for a check the daemon could not answer. */
  static Result fallback(String rule, boolean failOpen, String cause) {
    return new Result(
        failOpen,
        0,
        0,
        0,
        0,
        failOpen ? CLIENT_FAIL_OPEN : CLIENT_FAIL_CLOSED,
        rule,
        OptionalLong.empty(),
        cause);
  }

  /** True when the daemon did not decide (the client failed open or closed). */
  public boolean fromClient() {
    return source.startsWith("client_");
  }

  /** The IETF draft's headers for this result alone (see {@link RateLimitHeaders}). */
  public java.util.Map<String, String> headers(boolean legacy) {
    return RateLimitHeaders.of(this, legacy);
  }
}
