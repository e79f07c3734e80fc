// HTTP headers for a decision (IETF draft-ietf-httpapi-ratelimit-headers, plus the legacy
// X-RateLimit-* trio on request), and the choice of the one result that sets them when a
// request was checked against several rules.
package io.github.ratelimitd;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.StringJoiner;

/** Header mapping shared by the client's users and {@link RateLimitFilter}. */
public final class RateLimitHeaders {
  private RateLimitHeaders() {}

  /**
   * The headers for one result. Daemon-decided: {@code RateLimit-Policy: "<rule>";q=<limit>;w=<
   * window s>} ({@code w} omitted without a window), {@code RateLimit: "<rule>";r=<remaining>;t=<
   * reset s>}, and when denied {@code Retry-After: max(1, ceil(wait s))}; with {@code legacy}
   * also X-RateLimit-Limit/-Remaining/-Reset. Client fail-open: none; client fail-closed: only
   * {@code Retry-After: 1}. Seconds are rounded up.
   */
  public static Map<String, String> of(Result r, boolean legacy) {
    Map<String, String> h = new LinkedHashMap<>();
    if (r.fromClient()) {
      if (!r.allowed()) {
        h.put("Retry-After", "1");
      }
      return h;
    }
    long reset = ceilSeconds(r.resetMs());
    h.put("RateLimit-Policy", policy(r));
    h.put("RateLimit", "\"" + r.rule() + "\";r=" + r.remaining() + ";t=" + reset);
    if (!r.allowed()) {
      h.put("Retry-After", Long.toString(Math.max(1, ceilSeconds(r.waitMs()))));
    }
    if (legacy) {
      h.put("X-RateLimit-Limit", Long.toString(r.limit()));
      h.put("X-RateLimit-Remaining", Long.toString(r.remaining()));
      h.put("X-RateLimit-Reset", Long.toString(reset));
    }
    return h;
  }

  /**
   * The headers of a request decided all or nothing ({@link RateLimitClient#checkAllPolicies}):
   * those of {@code binding} (see {@link #of}), with {@code RateLimit-Policy} listing every rule
   * (see {@link #policyList}) from {@code binding} and the cost-0 results.
   */
  public static Map<String, String> allOrNothing(
      Result binding, List<Result> policies, boolean legacy) {
    Map<String, String> h = of(binding, legacy);
    if (!binding.fromClient()) {
      h.put("RateLimit-Policy", policyList(binding, policies));
    }
    return h;
  }

  /**
   * The headers of a request checked against several rules ({@link RateLimitClient#checkMany}):
   * those of the {@link #mostRestrictive} result (see {@link #of}), with {@code
   * RateLimit-Policy} listing every rule (see {@link #policyList}).
   */
  public static Map<String, String> of(List<Result> results, boolean legacy) {
    Result r = mostRestrictive(results);
    Map<String, String> h = of(r, legacy);
    if (!r.fromClient()) {
      h.put("RateLimit-Policy", policyList(r, results));
    }
    return h;
  }

  /**
   * The {@code RateLimit-Policy} value: every distinct rule of {@code results} once, in order,
   * joined by ", "; the binding rule's from {@code binding}, another's from its first
   * daemon-decided result (a rule with none is left out). A binding rule not among them (a
   * composite rule's member) comes first.
   */
  public static String policyList(Result binding, List<Result> results) {
    List<String> names = new ArrayList<>();
    Map<String, Result> first = new HashMap<>();
    first.put(binding.rule(), binding);
    for (Result r : results) {
      if (!names.contains(r.rule())) {
        names.add(r.rule());
      }
      if (!r.fromClient()) {
        first.putIfAbsent(r.rule(), r);
      }
    }
    if (!names.contains(binding.rule())) {
      names.add(0, binding.rule());
    }
    StringJoiner parts = new StringJoiner(", ");
    for (String n : names) {
      Result r = first.get(n);
      if (r != null) {
        parts.add(policy(r));
      }
    }
    return parts.toString();
  }

  /** {@code "<rule>";q=<limit>;w=<window s>} ({@code w} omitted without a window). */
  private static String policy(Result r) {
    String policy = "\"" + r.rule() + "\";q=" + r.limit();
    long window = r.windowMs().orElse(0);
    return window > 0 ? policy + ";w=" + ceilSeconds(window) : policy;
  }

  /**
   * The most restrictive of several results (one request checked against several rules): any
   * denial beats any allowance; a daemon decision beats a client fallback of the same verdict;
   * among denials the longest wait, among allowances the fewest remaining; then the lowest
   * remaining/limit ratio (limit 0 counts as 0); then the first in request order.
   */
  public static Result mostRestrictive(List<Result> results) {
    Result best = null;
    for (Result r : results) {
      if (best == null || stricter(r, best)) {
        best = r;
      }
    }
    if (best == null) {
      throw new IllegalArgumentException("no results");
    }
    return best;
  }

  /** True when a is strictly more restrictive than b (ties keep the earlier one). */
  private static boolean stricter(Result a, Result b) {
    if (a.allowed() != b.allowed()) {
      return !a.allowed();
    }
    if (a.fromClient() != b.fromClient()) {
      return !a.fromClient();
    }
    if (!a.allowed() && a.waitMs() != b.waitMs()) {
      return a.waitMs() > b.waitMs();
    }
    if (a.allowed() && a.remaining() != b.remaining()) {
      return a.remaining() < b.remaining();
    }
    return ratio(a) < ratio(b);
  }

  private static double ratio(Result r) {
    return r.limit() == 0 ? 0 : (double) r.remaining() / r.limit();
  }

  static long ceilSeconds(long ms) {
    return (ms + 999) / 1000;
  }
}
