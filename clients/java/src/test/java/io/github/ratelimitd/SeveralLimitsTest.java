// checkAll (CHECKALL: all or nothing) and refund (REFUND) against a real daemon
// (redis.mode = "none", rule "api": a token bucket of 5 that barely refills), and the one
// warning naming the socket path when the daemon cannot be reached.
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.Test;

class SeveralLimitsTest {
  @Test
  void checkAllTakesNothingWhenOneCheckDenies() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = new RateLimitClient(Path.of(d.socket))) {
      Check a = new Check("api", "java:all:a");
      Check b = new Check("api", "java:all:b", 1);
      for (long left = 4; left >= 3; left--) {
        Result r = rl.checkAll(a, b);
        assertTrue(r.allowed() && r.limit() == 5 && r.remaining() == left, r.toString());
        assertEquals("api", r.rule());
      }
      assertEquals(0, rl.check("api", "java:all:a", 3).remaining());
      for (int i = 0; i < 3; i++) {
        Result r = rl.checkAll(List.of(a, b));
        assertFalse(r.allowed(), r.toString());
        assertTrue(r.waitMs() > 0 && "api".equals(r.rule()) && r.error() == null, r.toString());
      }
      assertEquals(3, rl.check("api", "java:all:b", 0).remaining(), "b untouched by the denials");
      // Without Redis a refund gives nothing back (docs/PROTOCOL.md): the reply is the state.
      Result r = rl.refund("api", "java:all:b", 1);
      assertTrue(r.allowed() && r.limit() == 5 && r.remaining() == 3, r.toString());
      assertNull(r.error());
      List<Check> nine = Collections.nCopies(9, a);
      assertEquals("PROTO", assertThrows(RequestException.class, () -> rl.checkAll(nine)).code());
    }
  }

  @Test
  void anUnreachableDaemonIsWarnedAboutOnceThenFailsOpen() throws Exception {
    String root = System.getenv().getOrDefault("RL_TEST_ROOT", System.getProperty("java.io.tmpdir"));
    Path dir = Files.createTempDirectory(Path.of(root), "rl-java-none-");
    String path = dir.resolve("nowhere.sock").toString();
    List<LogRecord> records = Collections.synchronizedList(new ArrayList<>());
    Handler h =
        new Handler() {
          @Override
          public void publish(LogRecord r) {
            records.add(r);
          }

          @Override
          public void flush() {}

          @Override
          public void close() {}
        };
    Logger log = Logger.getLogger(RateLimitClient.class.getName());
    log.addHandler(h);
    try (RateLimitClient rl =
        RateLimitClient.builder().socket(path).timeout(Duration.ofMillis(500)).build()) {
      List<Result> results =
          List.of(
              rl.check("api", "k"),
              rl.checkAll(new Check("api", "k"), new Check("fast", "k")),
              rl.refund("api", "k", 1));
      for (Result r : results) {
        assertTrue(r.allowed() && r.fromClient() && r.error().contains(path), r.toString());
      }
    } finally {
      log.removeHandler(h);
      Files.deleteIfExists(dir);
    }
    assertEquals(1, records.size(), records.toString());
    LogRecord w = records.get(0);
    assertEquals(Level.WARNING, w.getLevel());
    String msg = java.text.MessageFormat.format(w.getMessage(), w.getParameters());
    assertTrue(msg.contains(path) && msg.contains("failing open"), msg);
  }
}
