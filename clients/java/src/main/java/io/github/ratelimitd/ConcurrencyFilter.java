// The servlet filter holding one concurrency slot per request while the chain runs.
package io.github.ratelimitd;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.util.Map;
import java.util.function.Function;

/**
 * {@code new ConcurrencyFilter(slots, "inflight", req -> "user:" + req.getRemoteUser())}: a
 * request holds one slot of the rule while the chain runs, given back when it returns or
 * throws (and by the daemon, should the process die). A denied request gets 429 with {@code
 * RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests"}, {@code RateLimit} and {@code
 * Retry-After}; the chain does not run. A null key: no slot.
 */
public class ConcurrencyFilter implements Filter {
  private final Slots slots;
  private final String rule;
  private final Function<HttpServletRequest, String> key;

  public ConcurrencyFilter(Slots slots, String rule, Function<HttpServletRequest, String> key) {
    this.slots = slots;
    this.rule = rule;
    this.key = key;
  }

  @Override
  public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
      throws IOException, ServletException {
    String k = key.apply((HttpServletRequest) request);
    if (k == null) {
      chain.doFilter(request, response);
      return;
    }
    HttpServletResponse res = (HttpServletResponse) response;
    try (Slot s = slots.acquire(rule, k)) {
      for (Map.Entry<String, String> h : s.headers().entrySet()) {
        res.setHeader(h.getKey(), h.getValue());
      }
      if (!s.allowed()) {
        res.setStatus(429);
        res.setContentType("text/plain; charset=utf-8");
        res.getWriter().write("Too many requests in progress\n");
        return;
      }
      chain.doFilter(request, response);
    }
  }
}
