// Concurrency slots (algorithm = "concurrency" rules): ACQUIRE on a connection of the
// slot's own, which the slot keeps until it is released.
package io.github.ratelimitd;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * {@code Slots slots = new Slots("/run/ratelimitd/ratelimitd.sock", Duration.ofMillis(200), true);}
 *
 * <p>Each allowed {@link Slot} holds its own connection until {@link Slot#close()}: the
 * daemon gives a slot back when that connection closes, so a process that dies frees its
 * slots at once, and the rule's max_hold ends any slot held too long. When the daemon cannot
 * be asked, {@code failOpen} decides (allowed without a token, or denied). Safe for threads.
 */
public final class Slots {
  private final Path socket;
  private final long timeoutNanos;
  private final boolean failOpen;

  public Slots(String socket, Duration timeout, boolean failOpen) {
    this.socket = Path.of(socket);
    this.timeoutNanos = timeout.toNanos();
    this.failOpen = failOpen;
  }

  /**
   * ACQUIRE: a slot of {@code rule} for {@code key}, or a denial ({@link Slot#waitMs()}: until
   * the oldest slot's max_hold ends).
   *
   * @throws RequestException for a caller bug (unknown rule, not a concurrency rule, bad key)
   */
  public Slot acquire(String rule, String key) {
    String k = Protocol.encodeKey(key);
    long deadline = System.nanoTime() + timeoutNanos;
    Connection c = null;
    String cause;
    try {
      c = Connection.open(socket, deadline);
      List<String> out = new ArrayList<>(1);
      c.exchange(("ACQUIRE " + rule + " " + k + "\n").getBytes(StandardCharsets.US_ASCII), 1, deadline, out);
      String line = out.get(0);
      String[] f = line.split(" ");
      if (f.length >= 2 && f[0].equals("ERR") && Protocol.REQUEST_ERRORS.contains(f[1])) {
        c.close();
        String[] parts = line.split(" ", 3);
        throw new RequestException(f[1], parts.length > 2 ? parts[2] : "");
      }
      boolean allow = f[0].equals("ALLOW") && f.length >= 8;
      if ((allow || (f[0].equals("DENY") && f.length >= 6)) && numbers(f)) {
        Slot s = new Slot(allow, rule, k, Long.parseLong(f[1]), Long.parseLong(f[2]),
            Long.parseLong(f[4]), f[5], allow ? f[7] : null, null, allow ? c : null, timeoutNanos);
        if (!allow) {
          c.close();
        }
        return s;
      }
      cause = "unexpected reply: " + (line.length() > 80 ? line.substring(0, 80) : line);
    } catch (IOException e) {
      cause = e.getClass().getSimpleName() + ": " + e.getMessage();
    }
    if (c != null) {
      c.close();
    }
    return new Slot(failOpen, rule, k, 0, 0, 0, failOpen ? "client_fail_open" : "client_fail_closed",
        null, "ratelimitd at " + socket + ": " + cause, null, timeoutNanos);
  }

  private static boolean numbers(String[] f) {
    for (int i = 1; i <= 4; i++) {
      if (!f[i].matches("[0-9]{1,18}")) {
        return false;
      }
    }
    return true;
  }
}
