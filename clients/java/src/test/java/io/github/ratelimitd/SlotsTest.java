// Concurrency slots against a real daemon (rule "inflight": 2 slots per key): acquire, deny,
// release, try-with-resources giving back on an exception, and the filter releasing after
// the chain and after a throw.
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import org.junit.jupiter.api.Test;

class SlotsTest {
  @Test
  void acquireDenyReleaseAndTryWithResources() throws Exception {
    try (TestDaemon d = new TestDaemon()) {
      Slots slots = new Slots(d.socket, Duration.ofSeconds(5), true);
      Slot a = slots.acquire("inflight", "java:k");
      Slot b = slots.acquire("inflight", "java:k");
      assertTrue(a.allowed() && b.allowed() && a.token() != null, a.toString());
      assertEquals(2, a.limit());
      assertEquals(0, b.remaining());
      assertEquals("local", a.source());
      Slot denied = slots.acquire("inflight", "java:k");
      assertFalse(denied.allowed());
      assertTrue(denied.waitMs() > 55_000);
      assertEquals("\"inflight\";q=2;qu=\"concurrent-requests\"", denied.headers().get("RateLimit-Policy"));
      assertTrue(denied.headers().containsKey("Retry-After"));
      assertTrue(a.release());
      assertFalse(a.release());
      assertTrue(slots.acquire("inflight", "java:k").allowed());
      RequestException e = assertThrows(RequestException.class, () -> slots.acquire("api", "k"));
      assertEquals("RULE", e.code());
      for (int i = 0; i < 3; i++) {
        assertThrows(IllegalStateException.class, () -> {
          try (Slot s = slots.acquire("inflight", "java:w")) {
            assertTrue(s.allowed());
            throw new IllegalStateException("handler failed");
          }
        });
      }
      try (Slot x = slots.acquire("inflight", "java:w");
          Slot y = slots.acquire("inflight", "java:w")) {
        assertTrue(x.allowed() && y.allowed(), "try-with-resources gave the slots back");
      }
    }
  }

  @Test
  void filterReleasesAfterTheChainAndAfterAThrow() throws Exception {
    try (TestDaemon d = new TestDaemon()) {
      Slots slots = new Slots(d.socket, Duration.ofSeconds(5), true);
      ConcurrencyFilter f = new ConcurrencyFilter(slots, "inflight", req -> "web");
      for (int i = 0; i < 5; i++) {
        FakeHttp.Response ok = new FakeHttp.Response();
        f.doFilter(FakeHttp.request("10.0.0.1", "/"), ok.proxy(), (req, res) -> {});
        assertEquals(200, ok.status);
        assertEquals("\"inflight\";q=2;qu=\"concurrent-requests\"", ok.headers.get("RateLimit-Policy"));
        FakeHttp.Response boom = new FakeHttp.Response();
        assertThrows(IllegalStateException.class, () -> f.doFilter(FakeHttp.request("10.0.0.1", "/boom"),
            boom.proxy(), (req, res) -> {
              throw new IllegalStateException("handler failed");
            }));
      }
      try (Slot x = slots.acquire("inflight", "web");
          Slot y = slots.acquire("inflight", "web")) {
        assertTrue(x.allowed() && y.allowed(), "the filter gave every slot back");
        FakeHttp.Response full = new FakeHttp.Response();
        f.doFilter(FakeHttp.request("10.0.0.1", "/"), full.proxy(), (req, res) -> {});
        assertEquals(429, full.status);
        assertTrue(full.headers.containsKey("Retry-After"));
      }
    }
  }
}
