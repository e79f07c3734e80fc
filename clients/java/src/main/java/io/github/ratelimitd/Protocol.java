// The line protocol, and nothing else: request lines out, reply lines in. No I/O here.
package io.github.ratelimitd;

import java.nio.charset.StandardCharsets;
import java.util.OptionalLong;
import java.util.Set;

final class Protocol {
  private Protocol() {}

  /** ERR codes that mean the request itself is wrong (raised, never failed open). */
  static final Set<String> REQUEST_ERRORS = Set.of("PROTO", "RULE", "KEY", "COST", "TOO_LONG");

  private static final char[] HEX = "0123456789ABCDEF".toCharArray();

  /** Percent-encodes every byte (UTF-8) outside 0x21..0x7E, and '%' itself. */
  static String encodeKey(String key) {
    StringBuilder b = new StringBuilder(key.length());
    for (byte x : key.getBytes(StandardCharsets.UTF_8)) {
      int c = x & 0xff;
      if (c >= 0x21 && c <= 0x7e && c != '%') {
        b.append((char) c);
      } else {
        b.append('%').append(HEX[c >> 4]).append(HEX[c & 15]);
      }
    }
    return b.toString();
  }

  /** {@code CHECK <rule> <key> <cost>\n}; a rule name that cannot be sent is a caller bug. */
  static void appendRequest(StringBuilder out, Check c) {
    String rule = c.rule();
    if (rule == null || rule.isEmpty() || !rule.chars().allMatch(ch -> ch >= 0x21 && ch <= 0x7e)) {
      throw new RequestException("RULE", "rule name must be 1+ printable ASCII characters");
    }
    if (c.key() == null || c.key().isEmpty()) {
      throw new RequestException("KEY", "empty key");
    }
    out.append("CHECK ")
        .append(rule)
        .append(' ')
        .append(encodeKey(c.key()))
        .append(' ')
        .append(c.cost())
        .append('\n');
  }

  /** A reply line the client cannot use (not a verdict, or a bad number). */
  static final class BadReply extends Exception {
    private static final long serialVersionUID = 1L;

    BadReply(String message) {
      super(message);
    }
  }

  /**
   * Parses a CHECK reply: six fields or more (the 7th, window_ms, optional; later ones
   * ignored). {@code ERR <CODE> …} comes back as a {@link RequestException} carrying the code,
   * whatever the code; the caller decides which codes are caller bugs.
   */
  static Result parseReply(String line, String rule) throws BadReply {
    String[] f = line.trim().split("[ \t]+");
    if (f[0].equals("ERR")) {
      String code = f.length > 1 ? f[1] : "INTERNAL";
      String msg = f.length > 2 ? String.join(" ", java.util.Arrays.copyOfRange(f, 2, f.length)) : "";
      throw new RequestException(code, msg);
    }
    if (f.length < 6 || !(f[0].equals("ALLOW") || f[0].equals("DENY"))) {
      throw new BadReply("unexpected reply: " + line);
    }
    long[] n = new long[4];
    for (int i = 0; i < 4; i++) {
      n[i] = number(f[i + 1], line);
    }
    OptionalLong window = OptionalLong.empty();
    if (f.length > 6 && isNumber(f[6])) {
      window = OptionalLong.of(Long.parseLong(f[6]));
    }
    return new Result(f[0].equals("ALLOW"), n[0], n[1], n[2], n[3], f[5], rule, window, null);
  }

  private static long number(String s, String line) throws BadReply {
    if (!isNumber(s)) {
      throw new BadReply("bad number in reply: " + line);
    }
    return Long.parseLong(s);
  }

  private static boolean isNumber(String s) {
    return !s.isEmpty() && s.length() <= 18 && s.chars().allMatch(c -> c >= '0' && c <= '9');
  }
}
