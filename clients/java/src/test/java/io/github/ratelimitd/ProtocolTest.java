// Unit tests of the pure parts: key encoding, reply parsing, request lines, the choice of
// the most restrictive result (the conformance table covers the rest end to end).
package io.github.ratelimitd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.OptionalLong;
import org.junit.jupiter.api.Test;

class ProtocolTest {
  @Test
  void encodesKeys() {
    assertEquals("user:42", Protocol.encodeKey("user:42"));
    assertEquals("user%20name/%C3%A9%25", Protocol.encodeKey("user name/é%"));
    assertEquals("a%0Ab%09c%7F", Protocol.encodeKey("a\nb\tc\u007f"));
  }

  @Test
  void parsesReplies() throws Exception {
    Result r = Protocol.parseReply("DENY 20 0 1900 100 cache 2000 later", "rides");
    assertEquals(
        new Result(false, 20, 0, 1900, 100, "cache", "rides", OptionalLong.of(2000), null), r);
    assertTrue(Protocol.parseReply("ALLOW 1 1 0 0 redis", "x").windowMs().isEmpty());
    assertTrue(Protocol.parseReply("ALLOW 1 1 0 0 redis soon", "x").windowMs().isEmpty());
    RequestException e =
        assertThrows(RequestException.class, () -> Protocol.parseReply("ERR RULE unknown rule x", "x"));
    assertEquals("RULE", e.code());
    for (String bad : List.of("", "HELLO", "ALLOW 1 2 3 4", "ALLOW -1 1 0 0 redis", "MAYBE 1 1 0 0 redis")) {
      assertThrows(Protocol.BadReply.class, () -> Protocol.parseReply(bad, "x"), bad);
    }
  }

  @Test
  void refusesRequestsThatCannotBeSent() {
    StringBuilder b = new StringBuilder();
    Protocol.appendRequest(b, new Check("api", "a b", 0));
    assertEquals("CHECK api a%20b 0\n", b.toString());
    for (Check bad : List.of(new Check("", "k"), new Check("a b", "k"), new Check("a\n", "k"), new Check("api", ""))) {
      assertThrows(RequestException.class, () -> Protocol.appendRequest(b, bad), bad.toString());
    }
  }

  private static Result allow(String rule, long limit, long remaining) {
    return new Result(true, limit, remaining, 0, 0, "redis", rule, OptionalLong.empty(), null);
  }

  private static Result deny(String rule, long wait) {
    return new Result(false, 1, 0, 0, wait, "redis", rule, OptionalLong.empty(), null);
  }

  @Test
  void picksTheMostRestrictive() {
    Result clientDeny = Result.fallback("c", false, "down");
    assertEquals("b", RateLimitHeaders.mostRestrictive(List.of(allow("a", 10, 0), deny("b", 5))).rule());
    assertEquals("b", RateLimitHeaders.mostRestrictive(List.of(deny("a", 5), deny("b", 7))).rule());
    assertEquals("b", RateLimitHeaders.mostRestrictive(List.of(allow("a", 10, 3), allow("b", 10, 2))).rule());
    assertEquals("a", RateLimitHeaders.mostRestrictive(List.of(allow("a", 100, 2), allow("b", 10, 2))).rule());
    assertEquals("a", RateLimitHeaders.mostRestrictive(List.of(allow("a", 10, 2), allow("b", 10, 2))).rule());
    assertEquals("d", RateLimitHeaders.mostRestrictive(List.of(clientDeny, deny("d", 0))).rule());
    assertFalse(RateLimitHeaders.of(clientDeny, true).containsKey("RateLimit"));
  }
}
