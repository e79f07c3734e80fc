// A scripted stand-in for the daemon on a Unix socket, driven by one case of
// clients/conformance.json: replies from a list, stalls, closes, or no socket at all.
package io.github.ratelimitd;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

final class StandIn implements AutoCloseable {
  final Path dir;
  final Path socket;
  final List<String> requests = new CopyOnWriteArrayList<>();
  final AtomicInteger connections = new AtomicInteger();
  private final ServerSocketChannel server;
  private final List<SocketChannel> open = new CopyOnWriteArrayList<>();

  StandIn(String mode, List<String> replies) throws IOException {
    String root = System.getenv().getOrDefault("RL_TEST_ROOT", System.getProperty("java.io.tmpdir"));
    dir = Files.createTempDirectory(Path.of(root), "rl-java-");
    socket = dir.resolve("s.sock");
    if (mode.equals("absent")) {
      server = null;
      return;
    }
    server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
    server.bind(UnixDomainSocketAddress.of(socket));
    Thread t =
        new Thread(
            () -> {
              while (true) {
                SocketChannel ch;
                try {
                  ch = server.accept();
                } catch (IOException e) {
                  return;
                }
                connections.incrementAndGet();
                open.add(ch);
                Thread w = new Thread(() -> serve(ch, mode, replies), "standin-conn");
                w.setDaemon(true);
                w.start();
              }
            },
            "standin-accept");
    t.setDaemon(true);
    t.start();
  }

  private void serve(SocketChannel ch, String mode, List<String> replies) {
    ByteBuffer in = ByteBuffer.allocate(8192);
    StringBuilder partial = new StringBuilder();
    int served = 0;
    try (ch) {
      while (true) {
        in.clear();
        if (ch.read(in) < 0) {
          return;
        }
        in.flip();
        partial.append(StandardCharsets.US_ASCII.decode(in));
        if (mode.equals("close")) {
          return;
        }
        int nl;
        while ((nl = partial.indexOf("\n")) >= 0) {
          String line = partial.substring(0, nl);
          partial.delete(0, nl + 1);
          requests.add(line);
          if (mode.equals("stall") || served >= replies.size()) {
            continue;
          }
          String reply = replies.get(served++);
          ch.write(ByteBuffer.wrap((reply + "\n").getBytes(StandardCharsets.US_ASCII)));
          if (reply.startsWith("ERR BUSY") || reply.startsWith("ERR PERM")) {
            return;
          }
        }
      }
    } catch (IOException e) {
      // the client went away
    }
  }

  @Override
  public void close() throws IOException {
    if (server != null) {
      server.close();
    }
    for (SocketChannel ch : open) {
      ch.close();
    }
    Files.deleteIfExists(socket);
    Files.deleteIfExists(dir);
  }
}
