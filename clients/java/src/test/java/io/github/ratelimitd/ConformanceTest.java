// Runs every case of clients/conformance.json (the table all clients share) against the
// client and against RateLimitFilter, each with a scripted stand-in daemon.
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

class ConformanceTest {
  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> cases() throws Exception {
    Path p = Path.of(System.getProperty("rl.conformance", "../conformance.json"));
    Map<String, Object> doc = (Map<String, Object>) Json.parse(Files.readString(p));
    return (List<Map<String, Object>>) doc.get("cases");
  }

  @TestFactory
  Stream<DynamicTest> client() throws Exception {
    return cases().stream().map(c -> DynamicTest.dynamicTest("client " + c.get("name"), () -> runClient(c)));
  }

  @TestFactory
  Stream<DynamicTest> filter() throws Exception {
    return cases().stream().map(c -> DynamicTest.dynamicTest("filter " + c.get("name"), () -> runFilter(c)));
  }

  @SuppressWarnings("unchecked")
  private static List<String> strings(Object o) {
    return o == null ? List.of() : (List<String>) o;
  }

  @SuppressWarnings("unchecked")
  private static Map<String, Object> map(Object o) {
    return o == null ? Map.of() : (Map<String, Object>) o;
  }

  @SuppressWarnings("unchecked")
  static List<Check> checks(Map<String, Object> c) {
    List<Check> out = new ArrayList<>();
    for (Object o : (List<Object>) c.get("checks")) {
      List<Object> t = (List<Object>) o;
      out.add(new Check((String) t.get(0), (String) t.get(1), (Long) t.get(2)));
    }
    return out;
  }

  private static RateLimitClient client(Map<String, Object> c, StandIn d) {
    Map<String, Object> opt = map(c.get("options"));
    return RateLimitClient.builder()
        .socket(d.socket.toString())
        .failOpen((Boolean) opt.getOrDefault("fail_open", true))
        .timeout(Duration.ofMillis((Long) opt.getOrDefault("timeout_ms", 200L)))
        .build();
  }

  private static StandIn standIn(Map<String, Object> c) throws Exception {
    return new StandIn((String) c.get("daemon"), strings(c.get("replies")));
  }

  @SuppressWarnings("unchecked")
  private static void runClient(Map<String, Object> c) throws Exception {
    Map<String, Object> expect = map(c.get("expect"));
    List<Check> checks = checks(c);
    try (StandIn d = standIn(c);
        RateLimitClient rl = client(c, d)) {
      if (expect.containsKey("raises")) {
        RequestException e =
            assertThrows(
                RequestException.class,
                () -> {
                  if (checks.size() == 1) {
                    rl.check(checks.get(0).rule(), checks.get(0).key(), checks.get(0).cost());
                  } else {
                    rl.checkMany(checks);
                  }
                });
        assertEquals(expect.get("raises"), e.code());
        return;
      }
      long t0 = System.nanoTime();
      List<Result> got =
          checks.size() == 1
              ? List.of(rl.check(checks.get(0).rule(), checks.get(0).key(), checks.get(0).cost()))
              : rl.checkMany(checks);
      long tookMs = (System.nanoTime() - t0) / 1_000_000;
      List<Map<String, Object>> want = (List<Map<String, Object>>) expect.get("results");
      assertEquals(want.size(), got.size());
      for (int i = 0; i < want.size(); i++) {
        Map<String, Object> w = want.get(i);
        Result r = got.get(i);
        String at = "result " + i + ": " + r;
        assertEquals(w.get("allowed"), r.allowed(), at);
        assertEquals(w.get("limit"), r.limit(), at);
        assertEquals(w.get("remaining"), r.remaining(), at);
        assertEquals(w.get("reset_ms"), r.resetMs(), at);
        assertEquals(w.get("wait_ms"), r.waitMs(), at);
        Object wantWindow = w.get("window_ms");
        assertEquals(wantWindow == null, r.windowMs().isEmpty(), at);
        if (wantWindow != null) {
          assertEquals(wantWindow, r.windowMs().getAsLong(), at);
        }
        assertEquals(w.get("source"), r.source(), at);
        assertEquals(w.get("error"), r.error() != null && !r.error().isEmpty(), at);
        assertEquals(checks.get(i).rule(), r.rule(), at);
      }
      List<String> requests = strings(c.get("requests"));
      if (!requests.isEmpty()) {
        assertEquals(requests, d.requests);
      }
      String mode = (String) c.get("daemon");
      if (mode.equals("stall") || mode.equals("close")) {
        Thread.sleep(50);
        assertEquals(1, d.connections.get(), "no retry after a timeout or on a fresh connection");
      }
      if (mode.equals("stall")) {
        long limit = (Long) map(c.get("options")).getOrDefault("timeout_ms", 200L);
        assertTrue(tookMs >= limit - 5 && tookMs < limit + 1000, "took " + tookMs + " ms");
      }
    }
  }

  @SuppressWarnings("unchecked")
  private static void runFilter(Map<String, Object> c) throws Exception {
    Map<String, Object> expect = map(c.get("expect"));
    Map<String, Object> opt = map(c.get("options"));
    List<Check> checks = checks(c);
    try (StandIn d = standIn(c);
        RateLimitClient rl = client(c, d)) {
      RateLimitFilter f =
          new RateLimitFilter(rl, req -> checks, (Boolean) opt.getOrDefault("legacy_headers", false));
      FakeHttp.Response resp = new FakeHttp.Response();
      boolean[] ran = {false};
      Runnable call =
          () -> {
            try {
              f.doFilter(
                  FakeHttp.request("127.0.0.1", "/"),
                  resp.proxy(),
                  (rq, rs) -> {
                    ran[0] = true;
                  });
            } catch (java.io.IOException | jakarta.servlet.ServletException e) {
              throw new RuntimeException(e);
            }
          };
      if (expect.containsKey("raises")) {
        RequestException e = assertThrows(RequestException.class, call::run);
        assertEquals(expect.get("raises"), e.code());
        assertFalse(ran[0]);
        return;
      }
      call.run();
      long status = (Long) expect.get("status");
      assertEquals(status, (long) resp.status, "status");
      assertEquals(status == 200, ran[0], "the app runs exactly when allowed");
      Map<String, String> want = new TreeMap<>(String.CASE_INSENSITIVE_ORDER);
      map(expect.get("headers")).forEach((k, v) -> want.put(k, (String) v));
      assertEquals(want, resp.headers);
    }
  }
}
