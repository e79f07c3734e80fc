// A minimal JSON reader for the tests (the JDK has none and Maven Central is out of reach):
// objects -> LinkedHashMap, arrays -> ArrayList, numbers -> Long, plus String, Boolean, null.
package io.github.ratelimitd;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

final class Json {
  private final String s;
  private int i;

  private Json(String s) {
    this.s = s;
  }

  static Object parse(String text) {
    Json j = new Json(text);
    Object v = j.value();
    j.ws();
    if (j.i != j.s.length()) {
      throw j.err("trailing text");
    }
    return v;
  }

  private Object value() {
    ws();
    char c = s.charAt(i);
    switch (c) {
      case '{':
        return object();
      case '[':
        return array();
      case '"':
        return string();
      case 't':
        return literal("true", Boolean.TRUE);
      case 'f':
        return literal("false", Boolean.FALSE);
      case 'n':
        return literal("null", null);
      default:
        int start = i;
        while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
          i++;
        }
        if (start == i) {
          throw err("unexpected " + c);
        }
        return Long.parseLong(s.substring(start, i));
    }
  }

  private Map<String, Object> object() {
    Map<String, Object> m = new LinkedHashMap<>();
    i++;
    ws();
    if (s.charAt(i) == '}') {
      i++;
      return m;
    }
    while (true) {
      ws();
      String k = string();
      ws();
      expect(':');
      m.put(k, value());
      ws();
      if (s.charAt(i) == '}') {
        i++;
        return m;
      }
      expect(',');
    }
  }

  private List<Object> array() {
    List<Object> a = new ArrayList<>();
    i++;
    ws();
    if (s.charAt(i) == ']') {
      i++;
      return a;
    }
    while (true) {
      a.add(value());
      ws();
      if (s.charAt(i) == ']') {
        i++;
        return a;
      }
      expect(',');
    }
  }

  private String string() {
    expect('"');
    StringBuilder b = new StringBuilder();
    while (true) {
      char c = s.charAt(i++);
      if (c == '"') {
        return b.toString();
      }
      if (c != '\\') {
        b.append(c);
        continue;
      }
      char e = s.charAt(i++);
      switch (e) {
        case 'n' -> b.append('\n');
        case 't' -> b.append('\t');
        case 'r' -> b.append('\r');
        case 'b' -> b.append('\b');
        case 'f' -> b.append('\f');
        case 'u' -> {
          b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
          i += 4;
        }
        default -> b.append(e);
      }
    }
  }

  private Object literal(String word, Object v) {
    if (!s.startsWith(word, i)) {
      throw err("bad literal");
    }
    i += word.length();
    return v;
  }

  private void expect(char c) {
    if (s.charAt(i) != c) {
      throw err("expected " + c);
    }
    i++;
  }

  private void ws() {
    while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
      i++;
    }
  }

  private IllegalArgumentException err(String what) {
    return new IllegalArgumentException("JSON: " + what + " at " + i);
  }
}
