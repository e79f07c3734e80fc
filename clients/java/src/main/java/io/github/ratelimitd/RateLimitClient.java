// The client applications hold: thread-safe checks against the daemon over a small pool
// of kept Unix-socket connections, pipelined batches, a CompletableFuture variant, and the
// failure policy (fail open or closed with the cause; one retry on a stale connection;
// never a retry after a timeout; caller bugs thrown).
package io.github.ratelimitd;

import java.io.IOException;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A client for ratelimitd, safe to share between threads.
 *
 * <pre>{@code
 * RateLimitClient rl = RateLimitClient.builder().socket("/run/ratelimitd/ratelimitd.sock").build();
 * Result r = rl.check("rides_request", "user:42");
 * if (!r.allowed()) { ... 429, RateLimitHeaders.of(r, false) ... }
 * }</pre>
 *
 * <p>Each call borrows a kept connection (or opens one) and gives it back; at most {@code
 * maxIdle} are kept. When the daemon is absent, refuses, answers {@code ERR BUSY/PERM/INTERNAL}
 * or garbage, or does not answer within the timeout, the result is allowed (fail-open, the
 * default; source {@code client_fail_open}) or denied ({@code client_fail_closed}), with the
 * cause in {@link Result#error()}. {@code ERR PROTO/RULE/KEY/COST/TOO_LONG} throw {@link
 * RequestException}.
 */
public final class RateLimitClient implements AutoCloseable {
  /** The daemon's default socket path. */
  public static final String DEFAULT_SOCKET = "/run/ratelimitd/ratelimitd.sock";

  private static final ExecutorService SHARED_EXECUTOR =
      Executors.newCachedThreadPool(
          r -> {
            Thread t = new Thread(r, "ratelimitd-client");
            t.setDaemon(true);
            return t;
          });

  private final Path socket;
  private final long timeoutNanos;
  private final boolean failOpen;
  private final int maxIdle;
  private final Executor executor;
  private final ArrayDeque<Connection> idle = new ArrayDeque<>();
  private static final Logger LOG = Logger.getLogger(RateLimitClient.class.getName());
  /** Set once the daemon could not be reached and a warning named the socket path. */
  private final AtomicBoolean warned = new AtomicBoolean();

  private RateLimitClient(Builder b) {
    this.socket = b.socket;
    this.timeoutNanos = b.timeout.toNanos();
    this.failOpen = b.failOpen;
    this.maxIdle = b.maxIdle;
    this.executor = b.executor;
  }

  /** A client for the socket at path with the defaults (200 ms, fail-open). */
  public RateLimitClient(String socket) {
    this(builder().socket(socket));
  }

  /** A client for the socket at path with the defaults (200 ms, fail-open). */
  public RateLimitClient(Path socket) {
    this(builder().socket(socket));
  }

  public static Builder builder() {
    return new Builder();
  }

  /** Settings; every one has a default. */
  public static final class Builder {
    private Path socket = Path.of(DEFAULT_SOCKET);
    private Duration timeout = Duration.ofMillis(200);
    private boolean failOpen = true;
    private int maxIdle = 8;
    private Executor executor = SHARED_EXECUTOR;

    /** The daemon's socket (default {@value #DEFAULT_SOCKET}). */
    public Builder socket(String path) {
      this.socket = Path.of(path);
      return this;
    }

    /** The daemon's socket (default {@value #DEFAULT_SOCKET}). */
    public Builder socket(Path path) {
      this.socket = Objects.requireNonNull(path);
      return this;
    }

    /** Bounds each check or batch, connecting included (default 200 ms). */
    public Builder timeout(Duration timeout) {
      if (timeout.isNegative() || timeout.isZero()) {
        throw new IllegalArgumentException("timeout must be positive");
      }
      this.timeout = timeout;
      return this;
    }

    /** Allow (true, default) or deny (false) when the daemon cannot answer. */
    public Builder failOpen(boolean failOpen) {
      this.failOpen = failOpen;
      return this;
    }

    /** Connections kept open between calls (default 8). */
    public Builder maxIdle(int maxIdle) {
      this.maxIdle = Math.max(0, maxIdle);
      return this;
    }

    /** Where the async variants run their blocking I/O (default: a shared daemon-thread pool). */
    public Builder executor(Executor executor) {
      this.executor = Objects.requireNonNull(executor);
      return this;
    }

    public RateLimitClient build() {
      return new RateLimitClient(this);
    }
  }

  public Result check(String rule, String key) {
    return check(rule, key, 1);
  }

  /** Takes cost units of key's budget under rule (cost 0 only reports the state). */
  public Result check(String rule, String key, long cost) {
    return checkMany(List.of(new Check(rule, key, cost))).get(0);
  }

  /** Several checks in one round trip (one write, then the replies in order). */
  public List<Result> checkMany(List<Check> checks) {
    if (checks.isEmpty()) {
      return List.of();
    }
    StringBuilder sb = new StringBuilder(checks.size() * 32);
    for (Check c : checks) {
      Protocol.appendRequest(sb, c);
    }
    byte[] payload = sb.toString().getBytes(StandardCharsets.US_ASCII);
    List<String> rules = new ArrayList<>(checks.size());
    for (Check c : checks) {
      rules.add(c.rule());
    }
    return roundTrip(payload, rules, Protocol::parseReply);
  }

  /** Parses one reply line for the check of rule. */
  @FunctionalInterface
  interface ReplyParser {
    Result parse(String line, String rule) throws Protocol.BadReply;
  }

  /**
   * Writes payload (one request line per rule) and reads one reply per line, with the
   * failure policy of {@link #checkMany}.
   */
  List<Result> roundTrip(byte[] payload, List<String> rules, ReplyParser parser) {
    int n = rules.size();
    long deadline = System.nanoTime() + timeoutNanos;
    List<String> lines = new ArrayList<>(n);
    String cause = null;
    boolean reusable = false;
    Connection conn = takeIdle();
    boolean reused = conn != null;
    try {
      if (conn == null) {
        conn = open(deadline);
      }
      reusable = conn.exchange(payload, n, deadline, lines);
    } catch (IOException e) {
      close(conn);
      conn = null;
      if (reused && lines.isEmpty() && !(e instanceof SocketTimeoutException)) {
        // A kept connection closed by a daemon restart or an idle timeout (and so, likely,
        // every kept one): one retry on a fresh connection. Never after a timeout: the
        // daemon is alive but slow, and a retry would double the wait.
        drainIdle();
        try {
          conn = open(deadline);
          reusable = conn.exchange(payload, n, deadline, lines);
        } catch (IOException e2) {
          close(conn);
          conn = null;
          cause = describe(e2);
        }
      } else {
        cause = describe(e);
      }
    }
    List<Result> out = new ArrayList<>(n);
    RequestException bug = null;
    for (int i = 0; i < n; i++) {
      String rule = rules.get(i);
      if (i >= lines.size()) {
        out.add(Result.fallback(rule, failOpen, cause));
        continue;
      }
      String line = lines.get(i);
      try {
        out.add(parser.parse(line, rule));
      } catch (RequestException e) {
        if (Protocol.REQUEST_ERRORS.contains(e.code())) {
          bug = bug == null ? e : bug;
        } else {
          // BUSY and PERM close the connection; INTERNAL and codes of later versions
          // leave it open. Either way the daemon cannot serve this check now.
          reusable &= !(e.code().equals("BUSY") || e.code().equals("PERM"));
        }
        out.add(Result.fallback(rule, failOpen, "daemon said: " + line));
      } catch (Protocol.BadReply e) {
        reusable = false;
        out.add(Result.fallback(rule, failOpen, e.getMessage()));
      }
    }
    if (conn != null) {
      if (reusable && cause == null) {
        giveBack(conn);
      } else {
        close(conn);
      }
    }
    if (bug != null) {
      throw bug;
    }
    return out;
  }

  public CompletableFuture<Result> checkAsync(String rule, String key, long cost) {
    return CompletableFuture.supplyAsync(() -> check(rule, key, cost), executor);
  }

  /**
   * {@link #checkMany} on the executor. A {@link RequestException} completes the future
   * exceptionally (wrapped in a CompletionException by {@code join()}).
   */
  public CompletableFuture<List<Result>> checkManyAsync(List<Check> checks) {
    return CompletableFuture.supplyAsync(() -> checkMany(checks), executor);
  }

  /** Closes the kept connections; later calls open new ones. */
  @Override
  public void close() {
    drainIdle();
  }

  /**
   * A new connection; the first time the daemon cannot be reached (not a timeout), one
   * warning naming the socket path, so that a wrong path does not pass silently.
   */
  private Connection open(long deadline) throws IOException {
    try {
      return Connection.open(socket, deadline);
    } catch (IOException e) {
      if (!(e instanceof SocketTimeoutException) && !warned.getAndSet(true)) {
        LOG.log(
            Level.WARNING,
            "ratelimitd: cannot reach the daemon at {0} ({1}): failing {2} until it answers",
            new Object[] {socket, e.getMessage(), failOpen ? "open (allowing)" : "closed (denying)"});
      }
      throw e;
    }
  }

  private String describe(IOException e) {
    String msg = e.getMessage() == null ? e.getClass().getSimpleName() : e.getMessage();
    if (e instanceof SocketTimeoutException) {
      return msg + " (" + timeoutNanos / 1_000_000 + " ms)";
    }
    return "ratelimitd at " + socket + ": " + msg;
  }

  private synchronized Connection takeIdle() {
    return idle.pollFirst();
  }

  private void giveBack(Connection c) {
    synchronized (this) {
      if (idle.size() < maxIdle) {
        idle.addFirst(c);
        return;
      }
    }
    c.close();
  }

  private void drainIdle() {
    List<Connection> all;
    synchronized (this) {
      all = new ArrayList<>(idle);
      idle.clear();
    }
    all.forEach(Connection::close);
  }

  private static void close(Connection c) {
    if (c != null) {
      c.close();
    }
  }

  /** Kept connections right now (for tests and metrics). */
  synchronized int idleConnections() {
    return idle.size();
  }

  /**
   * Decides 1 to 8 checks as one request ({@code CHECKALL}): allowed only if every one is,
   * and then each is taken; on a denial none is consumed. The result is the binding check's
   * (the denied one with the longest wait, or the one closest to its limit), its rule in
   * {@link Result#rule()}. When the daemon cannot answer: the fallback of {@link #check}
   * (the first check's rule).
   *
   * @throws RequestException fewer than 1 or more than 8 checks, or a caller bug the daemon
   *     reports ({@code ERR PROTO/RULE/KEY/COST})
   */
  public Result checkAll(List<Check> checks) {
    byte[] line = SeveralLimits.checkAllLine(checks).getBytes(StandardCharsets.US_ASCII);
    return roundTrip(line, List.of(checks.get(0).rule()), SeveralLimits::parseCheckAllReply)
        .get(0);
  }

  /**
   * {@link #checkAll(List)} plus, in the same round trip, one check of cost 0 (it takes
   * nothing) per distinct rule when the checks name more than one, so that the response can
   * list every policy ({@link AllOrNothing#headers}).
   *
   * @throws RequestException as {@link #checkAll(List)}
   */
  public AllOrNothing checkAllPolicies(List<Check> checks) {
    List<Check> asks = SeveralLimits.policyChecks(checks);
    StringBuilder sb = new StringBuilder(SeveralLimits.checkAllLine(checks));
    List<String> rules = new ArrayList<>(List.of(checks.get(0).rule()));
    for (Check c : asks) {
      Protocol.appendRequest(sb, c);
      rules.add(c.rule());
    }
    List<Result> rs =
        roundTrip(
            sb.toString().getBytes(StandardCharsets.US_ASCII),
            rules,
            SeveralLimits::parseCheckAllReply);
    List<Result> policies = new ArrayList<>(asks.size());
    for (int i = 1; i < rs.size(); i++) {
      policies.add(SeveralLimits.withRule(rs.get(i), rules.get(i)));
    }
    return new AllOrNothing(rs.get(0), policies);
  }

  /** {@link #checkAll(List)} of its arguments. */
  public Result checkAll(Check... checks) {
    return checkAll(List.of(checks));
  }

  /**
   * Gives units back to key's budget under rule ({@code REFUND}): never beyond its capacity
   * or limit, never into another window. The result is the state after the refund (a check of
   * cost 0).
   */
  public Result refund(String rule, String key, long units) {
    byte[] line =
        SeveralLimits.refundLine(new Check(rule, key, units)).getBytes(StandardCharsets.US_ASCII);
    return roundTrip(line, List.of(rule), Protocol::parseReply).get(0);
  }
}
