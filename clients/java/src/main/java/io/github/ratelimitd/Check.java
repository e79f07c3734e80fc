// One request of a batch: take cost units from key's budget under rule.
package io.github.ratelimitd;

/**
 * One check: {@code cost} units (0 to 1,000,000; 0 only reports the state) of {@code key}'s
 * budget under the configured rule {@code rule}. Any key is fine: the client percent-encodes it.
 */
public record Check(String rule, String key, long cost) {
  public Check(String rule, String key) {
    this(rule, key, 1);
  }
}
