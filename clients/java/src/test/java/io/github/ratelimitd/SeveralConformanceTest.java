// Runs conformance.json's several_cases (CHECKALL and REFUND) against the client, each with
// the scripted stand-in daemon of ConformanceTest.
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

class SeveralConformanceTest {
  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> cases() throws Exception {
    Path p = Path.of(System.getProperty("rl.conformance", "../conformance.json"));
    Map<String, Object> doc = (Map<String, Object>) Json.parse(Files.readString(p));
    return (List<Map<String, Object>>) doc.get("several_cases");
  }

  @TestFactory
  Stream<DynamicTest> several() throws Exception {
    List<Map<String, Object>> all = cases();
    assertFalse(all == null || all.isEmpty(), "conformance.json has several_cases");
    return all.stream().map(c -> DynamicTest.dynamicTest("several " + c.get("name"), () -> run(c)));
  }

  @SuppressWarnings("unchecked")
  private static void run(Map<String, Object> c) throws Exception {
    Map<String, Object> expect = (Map<String, Object>) c.get("expect");
    Map<String, Object> opt = (Map<String, Object>) c.getOrDefault("options", Map.of());
    List<Check> checks = ConformanceTest.checks(c);
    List<String> replies = (List<String>) c.getOrDefault("replies", List.of());
    Logger log = Logger.getLogger(RateLimitClient.class.getName());
    Level level = log.getLevel();
    log.setLevel(Level.OFF); // the unreachable-daemon warning is tested in SeveralLimitsTest
    try (StandIn d = new StandIn((String) c.get("daemon"), replies);
        RateLimitClient rl =
            RateLimitClient.builder()
                .socket(d.socket.toString())
                .failOpen((Boolean) opt.getOrDefault("fail_open", true))
                .timeout(Duration.ofMillis((Long) opt.getOrDefault("timeout_ms", 5000L)))
                .build()) {
      boolean refund = "refund".equals(c.get("call"));
      if (expect.containsKey("raises")) {
        RequestException e =
            assertThrows(
                RequestException.class,
                () -> {
                  if (refund) {
                    rl.refund(checks.get(0).rule(), checks.get(0).key(), checks.get(0).cost());
                  } else {
                    rl.checkAll(checks);
                  }
                });
        assertEquals(expect.get("raises"), e.code());
        return;
      }
      Result r =
          refund
              ? rl.refund(checks.get(0).rule(), checks.get(0).key(), checks.get(0).cost())
              : rl.checkAll(checks);
      Map<String, Object> w = (Map<String, Object>) expect.get("result");
      String at = r.toString();
      assertEquals(w.get("allowed"), r.allowed(), at);
      assertEquals(w.get("limit"), r.limit(), at);
      assertEquals(w.get("remaining"), r.remaining(), at);
      assertEquals(w.get("reset_ms"), r.resetMs(), at);
      assertEquals(w.get("wait_ms"), r.waitMs(), at);
      Object window = w.get("window_ms");
      assertEquals(window == null, r.windowMs().isEmpty(), at);
      if (window != null) {
        assertEquals(window, r.windowMs().getAsLong(), at);
      }
      assertEquals(w.get("source"), r.source(), at);
      assertEquals(w.get("rule"), r.rule(), at);
      assertEquals(w.get("error"), r.error() != null && !r.error().isEmpty(), at);
      List<String> requests = (List<String>) c.getOrDefault("requests", List.of());
      if (!requests.isEmpty()) {
        assertEquals(requests, d.requests);
      }
    } finally {
      log.setLevel(level);
    }
  }
}
