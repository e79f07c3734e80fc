// The request lines and reply of CHECKALL (several limits, all or nothing), the cost-0
// checks that let a response list every policy, and REFUND; like Protocol, no I/O here.
package io.github.ratelimitd;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

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

  /** One cost-0 check per distinct rule (its first key), or none for a single rule. */
  static List<Check> policyChecks(List<Check> checks) {
    Map<String, String> first = new LinkedHashMap<>();
    for (Check c : checks) {
      first.putIfAbsent(c.rule(), c.key());
    }
    List<Check> out = new ArrayList<>();
    if (first.size() > 1) {
      first.forEach((rule, key) -> out.add(new Check(rule, key, 0)));
    }
    return out;
  }

  /** r under the rule name it was asked for (a composite's reply names its member). */
  static Result withRule(Result r, String rule) {
    return new Result(
        r.allowed(), r.limit(), r.remaining(), r.resetMs(), r.waitMs(), r.source(), rule,
        r.windowMs(), r.error());
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
