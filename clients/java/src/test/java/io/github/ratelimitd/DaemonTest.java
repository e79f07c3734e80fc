// The client and the filter against a real daemon (redis.mode = "none", rules "api": a
// token bucket of 5 that barely refills, and "fast"): counts, pipelining, errors,
// restarts, stalls, threads, futures, and a web server that answers 429 with the headers.
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import jakarta.servlet.FilterConfig;
import java.io.OutputStream;
import java.lang.reflect.Proxy;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;

class DaemonTest {
  private static RateLimitClient client(String socket, long timeoutMs) {
    return RateLimitClient.builder().socket(socket).timeout(Duration.ofMillis(timeoutMs)).build();
  }

  @Test
  void countsDownDeniesAndMapsHeaders() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 5000)) {
      for (long left = 4; left >= 0; left--) {
        Result r = rl.check("api", "java:count");
        assertTrue(r.allowed() && r.limit() == 5 && r.remaining() == left, r.toString());
        assertEquals("local", r.source());
        assertNull(r.error());
      }
      assertEquals(1, rl.idleConnections(), "one kept connection, reused");
      Result r = rl.check("api", "java:count");
      assertFalse(r.allowed());
      assertTrue(r.waitMs() > 0);
      var h = r.headers(true);
      // capacity 5 at 0.001/s: 5000 s to refill, the 7th field when the daemon sends it.
      String policy = r.windowMs().isPresent() ? "\"api\";q=5;w=5000" : "\"api\";q=5";
      assertEquals(policy, h.get("RateLimit-Policy"));
      assertTrue(h.get("RateLimit").matches("\"api\";r=0;t=\\d+"), h.toString());
      assertEquals(Long.toString(Math.max(1, (r.waitMs() + 999) / 1000)), h.get("Retry-After"));
      assertEquals("5", h.get("X-RateLimit-Limit"));
      assertFalse(rl.check("api", "java:other").headers(false).containsKey("Retry-After"));
    }
  }

  @Test
  void pipelinesInOrder() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 5000)) {
      List<Check> checks = new ArrayList<>();
      for (int i = 0; i < 7; i++) {
        checks.add(new Check("api", "java:pipe"));
      }
      checks.add(new Check("api", "java:pipe2", 2));
      checks.add(new Check("fast", "x", 0));
      List<Result> rs = rl.checkMany(checks);
      boolean[] want = {true, true, true, true, true, false, false, true, true};
      for (int i = 0; i < want.length; i++) {
        assertEquals(want[i], rs.get(i).allowed(), "reply " + i);
      }
      assertEquals(3, rs.get(7).remaining());
      assertEquals(1_000_000, rs.get(8).limit());
      assertEquals("fast", rs.get(8).rule());
    }
  }

  @Test
  void callerBugsThrowAndKeysAreEncoded() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 5000)) {
      assertEquals("RULE", assertThrows(RequestException.class, () -> rl.check("nope", "k")).code());
      assertEquals("COST", assertThrows(RequestException.class, () -> rl.check("api", "k", 6)).code());
      assertThrows(RequestException.class, () -> rl.check("two words", "k"));
      assertThrows(RequestException.class, () -> rl.check("api", ""));
      assertTrue(rl.check("api", "user name/é\n").allowed());
      assertEquals(4, rl.check("api", "user name/é\n", 0).remaining());
      assertEquals(5, rl.check("api", "user name/é", 0).remaining(), "a different key");
    }
  }

  @Test
  void failsOpenWhileDownAndReconnectsAfterRestart() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 5000)) {
      assertEquals("local", rl.check("api", "k").source());
      d.run("stop");
      Result r = rl.check("api", "k");
      assertEquals("client_fail_open", r.source());
      assertTrue(r.allowed() && r.error() != null);
      d.run("start");
      r = rl.check("api", "k");
      assertEquals("local", r.source());
      assertEquals(4, r.remaining(), "a fresh daemon (mode none keeps no state)");
      d.run("stop");
      d.run("start");
      assertEquals("local", rl.check("api", "k").source(), "a stale kept connection is retried once");
    }
  }

  @Test
  void timesOutWithoutRetryWhenStalled() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 300);
        RateLimitClient closed =
            RateLimitClient.builder().socket(d.socket).timeout(Duration.ofMillis(300)).failOpen(false).build()) {
      assertEquals("local", rl.check("fast", "k").source());
      d.run("pause");
      long t0 = System.nanoTime();
      Result r = rl.check("fast", "k");
      long ms = (System.nanoTime() - t0) / 1_000_000;
      assertEquals("client_fail_open", r.source());
      assertTrue(r.error().contains("timeout"), r.error());
      assertTrue(ms >= 290 && ms < 1500, ms + " ms: one timeout, no retry");
      r = closed.check("fast", "k");
      assertEquals("client_fail_closed", r.source());
      assertEquals("1", r.headers(false).get("Retry-After"));
      d.run("resume");
      assertEquals("local", rl.check("fast", "k").source());
    }
  }

  @Test
  void threadsAndFuturesShareOneClient() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 5000)) {
      ExecutorService pool = Executors.newFixedThreadPool(8);
      try {
        List<Future<Result>> fs = new ArrayList<>();
        for (int i = 0; i < 400; i++) {
          String key = "t" + (i % 16);
          fs.add(pool.submit(() -> rl.check("fast", key)));
        }
        for (Future<Result> f : fs) {
          assertEquals("local", f.get().source());
        }
      } finally {
        pool.shutdown();
      }
      assertTrue(rl.idleConnections() <= 8);
      List<CompletableFuture<Result>> cf = new ArrayList<>();
      for (int i = 0; i < 7; i++) {
        cf.add(rl.checkAsync("api", "java:async", 1));
      }
      long allowed = cf.stream().map(CompletableFuture::join).filter(Result::allowed).count();
      assertEquals(5, allowed, "exactly the bucket's 5, whatever the interleaving");
      CompletionException e =
          assertThrows(
              CompletionException.class, () -> rl.checkManyAsync(List.of(new Check("nope", "k"))).join());
      assertTrue(e.getCause() instanceof RequestException);
    }
  }

  @Test
  void webServerAnswers429WithHeaders() throws Exception {
    try (TestDaemon d = new TestDaemon();
        RateLimitClient rl = client(d.socket, 5000)) {
      RateLimitFilter filter =
          new RateLimitFilter(rl, req -> List.of(new Check("api", "ip:" + req.getRemoteAddr())), true);
      HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
      // The JDK's HTTP server stands in for a servlet container: each exchange goes through
      // the filter, and the chain is the application ("hello").
      server.createContext(
          "/",
          ex -> {
            FakeHttp.Response resp = new FakeHttp.Response();
            try {
              filter.doFilter(
                  FakeHttp.request(ex.getRemoteAddress().getAddress().getHostAddress(), "/"),
                  resp.proxy(),
                  (rq, rs) -> resp.body.write("hello\n"));
            } catch (Exception e) {
              resp.status = 500;
            }
            resp.headers.forEach((k, v) -> ex.getResponseHeaders().set(k, v));
            byte[] body = resp.body.toString().getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(resp.status, body.length);
            try (OutputStream o = ex.getResponseBody()) {
              o.write(body);
            }
          });
      server.start();
      try {
        HttpClient http = HttpClient.newHttpClient();
        URI uri = URI.create("http://127.0.0.1:" + server.getAddress().getPort() + "/");
        HttpResponse<String> res = null;
        for (int i = 0; i < 6; i++) {
          res = http.send(HttpRequest.newBuilder(uri).build(), HttpResponse.BodyHandlers.ofString());
          if (i < 5) {
            assertEquals(200, res.statusCode());
            assertEquals("hello\n", res.body());
            assertEquals("\"api\";r=" + (4 - i) + ";t=" + res.headers().firstValue("X-RateLimit-Reset").orElse("?"),
                res.headers().firstValue("RateLimit").orElse(""));
          }
        }
        assertEquals(429, res.statusCode());
        assertTrue(res.headers().firstValue("RateLimit-Policy").orElse("").startsWith("\"api\";q=5"));
        assertTrue(res.headers().firstValue("RateLimit").orElse("").matches("\"api\";r=0;t=\\d+"));
        assertTrue(Long.parseLong(res.headers().firstValue("Retry-After").orElse("0")) >= 1);
        assertEquals("0", res.headers().firstValue("X-RateLimit-Remaining").orElse(""));
      } finally {
        server.stop(0);
      }
    }
  }

  @Test
  void webXmlStyleInitParams() throws Exception {
    try (TestDaemon d = new TestDaemon()) {
      Map<String, String> params = Map.of("rule", "api", "socket", d.socket, "timeoutMs", "5000", "legacyHeaders", "true");
      FilterConfig config =
          (FilterConfig)
              Proxy.newProxyInstance(
                  getClass().getClassLoader(),
                  new Class<?>[] {FilterConfig.class},
                  (p, m, args) -> m.getName().equals("getInitParameter") ? params.get((String) args[0]) : null);
      RateLimitFilter filter = new RateLimitFilter();
      filter.init(config);
      try {
        FakeHttp.Response resp = null;
        int ran = 0;
        for (int i = 0; i < 6; i++) {
          resp = new FakeHttp.Response();
          boolean[] chain = {false};
          filter.doFilter(FakeHttp.request("10.0.0.7", "/"), resp.proxy(), (rq, rs) -> chain[0] = true);
          ran += chain[0] ? 1 : 0;
        }
        assertEquals(5, ran, "the key is the client address: 5 pass");
        assertEquals(429, resp.status);
        assertEquals("0", resp.headers.get("X-RateLimit-Remaining"));
        assertThrows(jakarta.servlet.ServletException.class, () -> new RateLimitFilter().init(
            (FilterConfig) Proxy.newProxyInstance(getClass().getClassLoader(), new Class<?>[] {FilterConfig.class}, (p, m, a) -> null)));
      } finally {
        filter.destroy();
      }
    }
  }
}

