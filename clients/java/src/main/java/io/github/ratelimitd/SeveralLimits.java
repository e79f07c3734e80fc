// The request lines and reply of CHECKALL (several limits, all or nothing) and REFUND;
// like Protocol, no I/O here.
package io.github.ratelimitd;

import java.util.List;

final class SeveralLimits {
  private SeveralLimits() {}

  /** Checks one CHECKALL carries at most. */
  static final int MAX_CHECKS = 8;

  /** {@code CHECKALL <rule> <key> <cost> ...\n}; fewer than 1 or more than 8 is a caller bug. */
  static String checkAllLine(List<Check> checks) {
    if (checks.isEmpty() || checks.size() > MAX_CHECKS) {
      throw new RequestException(
          "PROTO", "CHECKALL takes 1 to " + MAX_CHECKS + " checks, got " + checks.size());
    }
    StringBuilder sb = new StringBuilder("CHECKALL");
    for (Check c : checks) {
      sb.append(' ').append(triple(c));
    }
    return sb.append('\n').toString();
  }

  /** {@code REFUND <rule> <key> <units>\n}. */
  static String refundLine(Check c) {
    return "REFUND " + triple(c) + "\n";
  }

  /** "rule key cost", checked and encoded as for CHECK. */
  private static String triple(Check c) {
    StringBuilder one = new StringBuilder();
    Protocol.appendRequest(one, c);
    return one.substring("CHECK ".length(), one.length() - 1);
  }

  /** A CHECKALL reply: a CHECK reply whose 8th field names the binding rule. */
  static Result parseCheckAllReply(String line, String rule) throws Protocol.BadReply {
    Result r = Protocol.parseReply(line, rule);
    String[] f = line.trim().split("[ \t]+");
    if (f.length < 8 || f[7].isEmpty()) {
      return r;
    }
    return new Result(
        r.allowed(), r.limit(), r.remaining(), r.resetMs(), r.waitMs(), r.source(), f[7],
        r.windowMs(), r.error());
  }
}
