// What one all-or-nothing request (CHECKALL) decided, with each rule's state, so that the
// response can list every policy it answered to.
package io.github.ratelimitd;

import java.util.List;
import java.util.Map;

/**
 * The result of {@link RateLimitClient#checkAllPolicies}: the binding check's result (as
 * {@link RateLimitClient#checkAll} returns it) and, when the checks named more than one rule,
 * each distinct rule's state from a check of cost 0 in the same round trip, in the order the
 * rules first appear (client-decided where its line could not be read).
 *
 * @param binding the CHECKALL result; its rule is the binding one
 * @param policies one cost-0 result per distinct rule; empty for a single rule
 */
public record AllOrNothing(Result binding, List<Result> policies) {
  /** Copies the list. */
  public AllOrNothing {
    policies = List.copyOf(policies);
  }

  /** The response headers: {@link RateLimitHeaders#allOrNothing}. */
  public Map<String, String> headers(boolean legacy) {
    return RateLimitHeaders.allOrNothing(binding, policies, legacy);
  }
}
