// A real ratelimitd for the tests, started and stopped by pid through clients/testdaemon.sh
// (needs RATELIMITD_BIN; clients/run_tests.sh sets it).
package io.github.ratelimitd;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

final class TestDaemon implements AutoCloseable {
  final Path dir;
  final String socket;

  TestDaemon() throws Exception {
    String root = System.getenv().getOrDefault("RL_TEST_ROOT", System.getProperty("java.io.tmpdir"));
    dir = Files.createTempDirectory(Path.of(root), "rl-java-d-");
    socket = dir.resolve("rl.sock").toString();
    run("start");
  }

  void run(String cmd) throws IOException {
    String script = System.getProperty("rl.testdaemon", "../testdaemon.sh");
    Process p =
        new ProcessBuilder("bash", script, cmd, dir.toString()).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    int rc;
    try {
      rc = p.waitFor();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted", e);
    }
    if (rc != 0) {
      throw new IllegalStateException("testdaemon.sh " + cmd + " failed: " + out);
    }
  }

  @Override
  public void close() throws IOException {
    run("resume");
    run("stop");
    try (Stream<Path> s = Files.walk(dir)) {
      s.sorted(Comparator.reverseOrder())
          .forEach(
              f -> {
                try {
                  Files.deleteIfExists(f);
                } catch (IOException e) {
                  // left for run_tests.sh's cleanup
                }
              });
    }
  }
}
