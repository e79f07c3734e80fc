// RateLimitFilter deciding all or nothing (one CHECKALL): conformance.json's
// several_header_cases against the scripted stand-in, and a real daemon (redis.mode = "none";
// "api": a token bucket of 5 that barely refills, "fast": unlimited).
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

class AllOrNothingFilterTest {
  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> cases() throws Exception {
    Path p = Path.of(System.getProperty("rl.conformance", "../conformance.json"));
    Map<String, Object> doc = (Map<String, Object>) Json.parse(Files.readString(p));
    return (List<Map<String, Object>>) doc.get("several_header_cases");
  }

  @TestFactory
  Stream<DynamicTest> headers() throws Exception {
    List<Map<String, Object>> all = cases();
    assertFalse(all == null || all.isEmpty(), "conformance.json has several_header_cases");
    return all.stream()
        .map(c -> DynamicTest.dynamicTest("all-or-nothing filter " + c.get("name"), () -> run(c)));
  }

  /** One GET through the all-or-nothing filter; whether the chain ran. */
  static boolean request(
      RateLimitClient rl, List<Check> checks, boolean legacy, FakeHttp.Response resp)
      throws Exception {
    RateLimitFilter f = new RateLimitFilter(rl, req -> checks, legacy, true);
    boolean[] ran = {false};
    f.doFilter(FakeHttp.request("127.0.0.1", "/"), resp.proxy(), (rq, rs) -> ran[0] = true);
    return ran[0];
  }

  @SuppressWarnings("unchecked")
  private static void run(Map<String, Object> c) throws Exception {
    Map<String, Object> expect = (Map<String, Object>) c.get("expect");
    Map<String, Object> opt = (Map<String, Object>) c.getOrDefault("options", Map.of());
    List<Check> checks = ConformanceTest.checks(c);
    List<String> replies = (List<String>) c.getOrDefault("replies", List.of());
    boolean legacy = (Boolean) opt.getOrDefault("legacy_headers", false);
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
      FakeHttp.Response resp = new FakeHttp.Response();
      if (expect.containsKey("raises")) {
        RequestException e =
            assertThrows(RequestException.class, () -> request(rl, checks, legacy, resp));
        assertEquals(expect.get("raises"), e.code());
        return;
      }
      boolean ran = request(rl, checks, legacy, resp);
      long status = (Long) expect.get("status");
      assertEquals(status, (long) resp.status, "status");
      assertEquals(status == 200, ran, "the chain runs exactly when allowed");
      Map<String, String> want = new TreeMap<>(String.CASE_INSENSITIVE_ORDER);
      ((Map<String, Object>) expect.get("headers")).forEach((k, v) -> want.put(k, (String) v));
      assertEquals(want, resp.headers);
      List<String> requests = (List<String>) c.getOrDefault("requests", List.of());
      if (!requests.isEmpty()) {
        assertEquals(requests, d.requests);
      }
    } finally {
      log.setLevel(level);
    }
  }

  @Test
  void aDeniedRequestTakesNothingFromTheOtherRule() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = new RateLimitClient(Path.of(d.socket))) {
      rl.check("api", "java:mw:a", 3); // "a" has 2 left, "b" 5
      List<Check> checks =
          List.of(
              new Check("api", "java:mw:a"),
              new Check("fast", "java:mw:a"),
              new Check("api", "java:mw:b"));
      long[] want = {200, 200, 429, 429, 429};
      for (int i = 0; i < want.length; i++) {
        FakeHttp.Response resp = new FakeHttp.Response();
        boolean ran = request(rl, checks, false, resp);
        String at = "request " + i + ": " + resp.headers;
        assertEquals(want[i], (long) resp.status, at);
        assertEquals(want[i] == 200, ran, at);
        String policy = resp.headers.get("RateLimit-Policy");
        assertTrue(policy.matches("\"api\";q=5;w=5000, \"fast\";q=1000000;w=\\d+"), at);
        assertTrue(resp.headers.get("RateLimit").matches("\"api\";r=\\d+;t=\\d+"), at);
        assertEquals(want[i] == 429, resp.headers.containsKey("Retry-After"), at);
      }
      // Two allowed requests took 2 of b's 5; the three denied ones took nothing.
      assertEquals(3, rl.check("api", "java:mw:b", 0).remaining());
    }
  }
}
