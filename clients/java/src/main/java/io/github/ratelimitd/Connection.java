// One Unix-socket connection to the daemon with a deadline on every step. A blocking
// SocketChannel has no read timeout on Unix sockets, so the channel is non-blocking and
// each step waits on its own Selector until the caller's deadline.
package io.github.ratelimitd;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;

final class Connection implements AutoCloseable {
  /** The daemon closed the connection (EOF): on a kept connection, worth one retry. */
  static final class Closed extends IOException {
    private static final long serialVersionUID = 1L;

    Closed(String message) {
      super(message);
    }
  }

  private final SocketChannel channel;
  private final Selector selector;
  private final SelectionKey key;
  private final ByteBuffer in = ByteBuffer.allocate(16 * 1024);
  private final ByteArrayOutputStream partial = new ByteArrayOutputStream();

  private Connection(SocketChannel channel, Selector selector) throws IOException {
    this.channel = channel;
    this.selector = selector;
    this.key = channel.register(selector, SelectionKey.OP_READ);
  }

  /** Connects to the socket at path before the deadline (System.nanoTime()). */
  static Connection open(Path path, long deadline) throws IOException {
    SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
    Selector sel = null;
    try {
      ch.configureBlocking(false);
      sel = Selector.open();
      Connection c = new Connection(ch, sel);
      if (!ch.connect(UnixDomainSocketAddress.of(path))) {
        c.await(SelectionKey.OP_CONNECT, deadline, "connect");
        ch.finishConnect();
      }
      return c;
    } catch (IOException | RuntimeException e) {
      ch.close();
      if (sel != null) {
        sel.close();
      }
      throw e;
    }
  }

  /**
   * Writes the request lines, then reads lines until {@code n} replies arrived, into {@code
   * out}. On an error the replies read so far stay in {@code out}. Returns false when more
   * bytes came than replies were asked for (the stream is out of step: do not reuse it).
   */
  boolean exchange(byte[] payload, int n, long deadline, List<String> out) throws IOException {
    ByteBuffer b = ByteBuffer.wrap(payload);
    while (b.hasRemaining()) {
      if (channel.write(b) == 0) {
        await(SelectionKey.OP_WRITE, deadline, "write");
      }
    }
    while (out.size() < n) {
      in.clear();
      int got = channel.read(in);
      if (got < 0) {
        throw new Closed("daemon closed the connection");
      }
      if (got == 0) {
        await(SelectionKey.OP_READ, deadline, "reply");
        continue;
      }
      in.flip();
      while (in.hasRemaining()) {
        byte x = in.get();
        if (x == '\n') {
          String line = partial.toString(StandardCharsets.US_ASCII);
          partial.reset();
          out.add(line.endsWith("\r") ? line.substring(0, line.length() - 1) : line);
        } else {
          partial.write(x);
        }
      }
    }
    return out.size() == n && partial.size() == 0;
  }

  /**
   * Waits until the channel is ready for op. The key stays interested in OP_READ between
   * waits (one epoll registration per connection, not one per reply); a write or connect
   * wait switches it over and back.
   */
  private void await(int op, long deadline, String what) throws IOException {
    if (key.interestOps() != op) {
      key.interestOps(op);
    }
    try {
      while (true) {
        long left = (deadline - System.nanoTime()) / 1_000_000;
        if (left <= 0) {
          throw new SocketTimeoutException("timeout: no " + what + " within the deadline");
        }
        selector.select(left);
        if (selector.selectedKeys().remove(key) && (key.readyOps() & op) != 0) {
          return;
        }
      }
    } finally {
      if (op != SelectionKey.OP_READ && key.isValid()) {
        key.interestOps(SelectionKey.OP_READ);
      }
    }
  }

  @Override
  public void close() {
    try {
      selector.close();
    } catch (IOException ignored) {
      // closing: nothing to do
    }
    try {
      channel.close();
    } catch (IOException ignored) {
      // closing: nothing to do
    }
  }
}
