// Just enough of HttpServletRequest/Response (java.lang.reflect.Proxy, no servlet container)
// to run RateLimitFilter in tests and behind the JDK's own HTTP server.
package io.github.ratelimitd;

import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.Proxy;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;

final class FakeHttp {
  private FakeHttp() {}

  static HttpServletRequest request(String remoteAddr, String path) {
    Map<String, Object> attributes = new HashMap<>();
    return (HttpServletRequest)
        Proxy.newProxyInstance(
            FakeHttp.class.getClassLoader(),
            new Class<?>[] {HttpServletRequest.class},
            (proxy, m, args) ->
                switch (m.getName()) {
                  case "getRemoteAddr" -> remoteAddr;
                  case "getRequestURI" -> path;
                  case "getMethod" -> "GET";
                  case "getHeader" -> null;
                  case "setAttribute" -> attributes.put((String) args[0], args[1]);
                  case "getAttribute" -> attributes.get((String) args[0]);
                  case "toString" -> "FakeRequest " + path;
                  default -> throw new UnsupportedOperationException(m.getName());
                });
  }

  /** A response that records status, headers (case-insensitive names) and body. */
  static final class Response {
    int status = 200;
    final Map<String, String> headers = new TreeMap<>(String.CASE_INSENSITIVE_ORDER);
    final StringWriter body = new StringWriter();
    private final PrintWriter writer = new PrintWriter(body, true);

    HttpServletResponse proxy() {
      return (HttpServletResponse)
          Proxy.newProxyInstance(
              FakeHttp.class.getClassLoader(),
              new Class<?>[] {HttpServletResponse.class},
              (p, m, args) ->
                  switch (m.getName()) {
                    case "setStatus" -> {
                      status = (Integer) args[0];
                      yield null;
                    }
                    case "getStatus" -> status;
                    case "setHeader", "addHeader" -> headers.put((String) args[0], (String) args[1]);
                    case "getHeader" -> headers.get((String) args[0]);
                    case "containsHeader" -> headers.containsKey((String) args[0]);
                    case "setContentType", "setCharacterEncoding" -> null;
                    case "getWriter" -> writer;
                    case "toString" -> "FakeResponse";
                    default -> throw new UnsupportedOperationException(m.getName());
                  });
    }
  }
}
