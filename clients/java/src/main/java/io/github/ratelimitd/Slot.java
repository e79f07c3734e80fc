// One ACQUIRE's answer (a concurrency rule's slot), holding the connection that took it
// until it is closed (try-with-resources gives it back).
package io.github.ratelimitd;

import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * {@code try (Slot s = slots.acquire("jobs", "user:42")) { if (s.allowed()) work(); }}
 *
 * <p>{@link #close()} sends RELEASE on the connection that took the slot, then closes it; the
 * daemon also gives the slot back when that connection closes any other way (a process that
 * dies frees its slots at once).
 */
public final class Slot implements AutoCloseable {
  private final boolean allowed;
  private final String rule;
  private final String key;
  private final long limit;
  private final long remaining;
  private final long waitMs;
  private final String source;
  private final String error;
  private final long deadlineNanos;
  private String token;
  private Connection conn;

  Slot(boolean allowed, String rule, String key, long limit, long remaining, long waitMs,
      String source, String token, String error, Connection conn, long timeoutNanos) {
    this.allowed = allowed;
    this.rule = rule;
    this.key = key;
    this.limit = limit;
    this.remaining = remaining;
    this.waitMs = waitMs;
    this.source = source;
    this.token = token;
    this.error = error;
    this.conn = conn;
    this.deadlineNanos = timeoutNanos;
  }

  /** A slot was taken (or the client failed open). */
  public boolean allowed() {
    return allowed;
  }

  /** The rule's limit (slots per key); 0 when the client decided. */
  public long limit() {
    return limit;
  }

  /** Slots still free. */
  public long remaining() {
    return remaining;
  }

  /** On a denial: ms until the oldest slot held ends its max_hold. */
  public long waitMs() {
    return waitMs;
  }

  /** Who decided: the daemon's word, or client_fail_open / client_fail_closed. */
  public String source() {
    return source;
  }

  /** The token naming the slot (null when denied, decided by the client, or released). */
  public synchronized String token() {
    return token;
  }

  /** Why the client decided (null when the daemon did). */
  public String error() {
    return error;
  }

  /**
   * {@code RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests"}, {@code RateLimit}
   * and, when denied, {@code Retry-After}; none when the client failed open.
   */
  public Map<String, String> headers() {
    Map<String, String> h = new LinkedHashMap<>();
    if (source.startsWith("client_")) {
      if (!allowed) {
        h.put("Retry-After", "1");
      }
      return h;
    }
    h.put("RateLimit-Policy", "\"" + rule + "\";q=" + limit + ";qu=\"concurrent-requests\"");
    h.put("RateLimit", "\"" + rule + "\";r=" + remaining);
    if (!allowed) {
      h.put("Retry-After", Long.toString(Math.max(1, (waitMs + 999) / 1000)));
    }
    return h;
  }

  /**
   * RELEASE: true when the daemon gave the slot back, false when it no longer held it (its
   * max_hold ended) or could not be asked. Idempotent.
   */
  public synchronized boolean release() {
    Connection c = conn;
    String t = token;
    conn = null;
    token = null;
    if (c == null || t == null) {
      return false;
    }
    try {
      List<String> out = new ArrayList<>(1);
      byte[] line = ("RELEASE " + rule + " " + key + " " + t + "\n").getBytes(java.nio.charset.StandardCharsets.US_ASCII);
      c.exchange(line, 1, System.nanoTime() + deadlineNanos, out);
      return out.size() == 1 && out.get(0).equals("OK");
    } catch (IOException e) {
      return false;
    } finally {
      c.close();
    }
  }

  /** {@link #release()}. */
  @Override
  public void close() {
    release();
  }

  @Override
  public String toString() {
    return "Slot[allowed=" + allowed + ", rule=" + rule + ", limit=" + limit + ", remaining="
        + remaining + ", waitMs=" + waitMs + ", source=" + source + ", error=" + error + "]";
  }
}
