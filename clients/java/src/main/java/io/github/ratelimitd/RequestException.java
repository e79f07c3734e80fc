// The daemon rejected a request as malformed: a bug in the caller, never an outage, so it
// is thrown instead of being hidden behind fail-open.
package io.github.ratelimitd;

/**
 * The daemon answered {@code ERR PROTO}, {@code RULE}, {@code KEY}, {@code COST} or {@code
 * TOO_LONG}: an unknown rule, a cost above the rule's limit, and the like.
 */
public final class RequestException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;
  private final String code;

  public RequestException(String code, String message) {
    super("ratelimitd: ERR " + code + (message.isEmpty() ? "" : " " + message));
    this.code = code;
  }

  /** The daemon's error code, e.g. {@code RULE}. */
  public String code() {
    return code;
  }
}
