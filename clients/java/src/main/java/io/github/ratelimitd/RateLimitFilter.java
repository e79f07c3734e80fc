// The servlet filter applications put in front of their handlers: checks each request
// against ratelimitd (several checks pipelined, or all or nothing as one CHECKALL), sets the
// rate-limit headers, and answers 429 itself when denied.
package io.github.ratelimitd;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.FilterConfig;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

/**
 * A {@code jakarta.servlet.Filter}. In code:
 *
 * <pre>{@code
 * RateLimitClient rl = RateLimitClient.builder().socket("/run/ratelimitd/ratelimitd.sock").build();
 * Filter f = new RateLimitFilter(rl, req -> List.of(new Check("rides_request", req.getRemoteAddr())));
 * }</pre>
 *
 * <p>Or in web.xml with init-params {@code rule} (required), {@code socket}, {@code timeoutMs},
 * {@code failOpen}, {@code legacyHeaders}, {@code allOrNothing}; the key is then the client's
 * address.
 *
 * <p>A denied request gets 429, the headers (see {@link RateLimitHeaders}) and a short text
 * body; the chain does not run. An allowed one gets the headers and runs the chain. A request
 * the daemon rejects as malformed (unknown rule, cost above the limit) throws {@link
 * RequestException}: a configuration bug, answered 500 by the container.
 * The filter does not sleep for a leaky_bucket's {@code wait_ms}; read it from the request
 * attribute {@value #RESULT_ATTRIBUTE} to shape work.
 */
public class RateLimitFilter implements Filter {
  /** The request attribute holding the {@link Result} that set the headers. */
  public static final String RESULT_ATTRIBUTE = "io.github.ratelimitd.result";

  private RateLimitClient client;
  private Function<HttpServletRequest, List<Check>> checks;
  private boolean legacyHeaders;
  private boolean allOrNothing;

  /**
   * @param checks the checks one request makes (rule, key, cost); an empty list lets it through
   */
  public RateLimitFilter(RateLimitClient client, Function<HttpServletRequest, List<Check>> checks) {
    this(client, checks, false);
  }

  /** @param legacyHeaders also send X-RateLimit-Limit, -Remaining and -Reset */
  public RateLimitFilter(
      RateLimitClient client,
      Function<HttpServletRequest, List<Check>> checks,
      boolean legacyHeaders) {
    this.client = client;
    this.checks = checks;
    this.legacyHeaders = legacyHeaders;
  }

  /**
   * @param legacyHeaders also send X-RateLimit-Limit, -Remaining and -Reset
   * @param allOrNothing decide the checks as one CHECKALL (at most 8; no {@code lease = "auto"}
   *     or concurrency rule): a denied request takes nothing from any rule; {@code RateLimit}
   *     names the binding rule, {@code RateLimit-Policy} lists every rule ({@link
   *     RateLimitHeaders#allOrNothing})
   */
  public RateLimitFilter(
      RateLimitClient client,
      Function<HttpServletRequest, List<Check>> checks,
      boolean legacyHeaders,
      boolean allOrNothing) {
    this(client, checks, legacyHeaders);
    this.allOrNothing = allOrNothing;
  }

  /** For containers that instantiate filters from web.xml: configured in {@link #init}. */
  public RateLimitFilter() {}

  @Override
  public void init(FilterConfig config) throws ServletException {
    if (client != null) {
      return;
    }
    String rule = config.getInitParameter("rule");
    if (rule == null || rule.isBlank()) {
      throw new ServletException("RateLimitFilter: init-param 'rule' is required");
    }
    RateLimitClient.Builder b = RateLimitClient.builder();
    String socket = config.getInitParameter("socket");
    if (socket != null) {
      b.socket(socket);
    }
    String timeout = config.getInitParameter("timeoutMs");
    if (timeout != null) {
      b.timeout(Duration.ofMillis(Long.parseLong(timeout.trim())));
    }
    String failOpen = config.getInitParameter("failOpen");
    if (failOpen != null) {
      b.failOpen(Boolean.parseBoolean(failOpen.trim()));
    }
    client = b.build();
    checks = req -> List.of(new Check(rule, req.getRemoteAddr()));
    legacyHeaders = Boolean.parseBoolean(config.getInitParameter("legacyHeaders"));
    allOrNothing = Boolean.parseBoolean(config.getInitParameter("allOrNothing"));
  }

  @Override
  public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
      throws IOException, ServletException {
    if (!(request instanceof HttpServletRequest req)
        || !(response instanceof HttpServletResponse resp)) {
      chain.doFilter(request, response);
      return;
    }
    List<Check> wanted = checks.apply(req);
    if (wanted == null || wanted.isEmpty()) {
      chain.doFilter(request, response);
      return;
    }
    // A RequestException (a caller bug) propagates: the container answers 500.
    Result r;
    Map<String, String> headers;
    if (allOrNothing) {
      AllOrNothing d = client.checkAllPolicies(wanted);
      r = d.binding();
      headers = d.headers(legacyHeaders);
    } else {
      List<Result> results = client.checkMany(wanted);
      r = RateLimitHeaders.mostRestrictive(results);
      headers = RateLimitHeaders.of(results, legacyHeaders);
    }
    req.setAttribute(RESULT_ATTRIBUTE, r);
    for (Map.Entry<String, String> h : headers.entrySet()) {
      resp.setHeader(h.getKey(), h.getValue());
    }
    if (!r.allowed()) {
      resp.setStatus(429);
      resp.setContentType("text/plain;charset=utf-8");
      resp.getWriter().write("Too Many Requests\n");
      return;
    }
    chain.doFilter(request, response);
  }

  @Override
  public void destroy() {
    if (client != null) {
      client.close();
    }
  }
}
