//! Line framing: splits a byte stream into request lines of bounded length.
//!
//! Unlike tokio-util's `LinesCodec`, which ends the stream on an over-long line, an
//! over-long line here is one [`Frame::TooLong`] item and the decoder skips to the next
//! `\n`, so the connection stays usable (`ERR TOO_LONG`, then the next request). It
//! knows nothing of what a line means.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

/// One item out of the [`LineDecoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line without its `\n` and without a `\r` just before it.
    Line(BytesMut),
    /// A line longer than the limit; its bytes were discarded up to the next `\n`.
    TooLong,
}

/// Splits a byte stream into [`Frame`]s of at most `max_line_bytes` bytes of content.
///
/// The limit counts the line's content, not its `\r\n`/`\n` terminator. When a line
/// exceeds it, the decoder yields [`Frame::TooLong`] as soon as that is known and then
/// discards input up to and including the next `\n`, so the connection stays usable.
#[derive(Debug)]
pub struct LineDecoder {
    max_line_bytes: usize,
    /// True while skipping the rest of an over-long line (its `TooLong` already yielded).
    discarding: bool,
    /// How far the buffer has already been searched for `\n` (avoids rescanning).
    scanned: usize,
}

impl LineDecoder {
    /// A decoder for lines of at most `max_line_bytes` bytes (terminator excluded).
    pub fn new(max_line_bytes: usize) -> Self {
        LineDecoder {
            max_line_bytes,
            discarding: false,
            scanned: 0,
        }
    }

    /// The line limit this decoder enforces, in bytes.
    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }
}

fn strip_cr(mut line: BytesMut) -> BytesMut {
    if line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    line
}

impl Decoder for LineDecoder {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        loop {
            let newline = buf[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| i + self.scanned);
            if self.discarding {
                match newline {
                    Some(i) => {
                        buf.advance(i + 1);
                        self.discarding = false;
                        self.scanned = 0;
                        continue;
                    }
                    None => {
                        buf.clear();
                        self.scanned = 0;
                        return Ok(None);
                    }
                }
            }
            return Ok(match newline {
                Some(i) => {
                    self.scanned = 0;
                    let mut line = buf.split_to(i + 1);
                    line.truncate(i);
                    let line = strip_cr(line);
                    if line.len() > self.max_line_bytes {
                        Some(Frame::TooLong)
                    } else {
                        Some(Frame::Line(line))
                    }
                }
                // Without a `\n` yet: `max + 1` bytes could still be content plus `\r`,
                // anything beyond is certainly too long.
                None if buf.len() > self.max_line_bytes + 1 => {
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    Some(Frame::TooLong)
                }
                None => {
                    self.scanned = buf.len();
                    None
                }
            });
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        // A last line without `\n` is still a request; bytes of a discarded line are not.
        self.scanned = 0;
        if buf.is_empty() || self.discarding {
            buf.clear();
            self.discarding = false;
            return Ok(None);
        }
        let line = strip_cr(buf.split());
        Ok(Some(if line.len() > self.max_line_bytes {
            Frame::TooLong
        } else {
            Frame::Line(line)
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn frames(max: usize, chunks: &[&[u8]], eof: bool) -> Vec<Frame> {
        let mut dec = LineDecoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        if eof {
            while let Some(f) = dec.decode_eof(&mut buf).unwrap() {
                out.push(f);
            }
        }
        out
    }

    fn line(s: &str) -> Frame {
        Frame::Line(BytesMut::from(s))
    }

    #[test]
    fn splits_lines_and_strips_cr() {
        assert_eq!(
            frames(16, &[b"PING\r\nQU", b"IT\n\n"], false),
            vec![line("PING"), line("QUIT"), line("")]
        );
    }

    #[test]
    fn too_long_is_one_frame_and_the_next_line_survives() {
        // Known too long before the newline arrives.
        let got = frames(8, &[b"0123456789abc", b"defgh", b"ij\nPING\n"], false);
        assert_eq!(got, vec![Frame::TooLong, line("PING")]);
        // Known too long only when the newline arrives.
        let got = frames(8, &[b"012345678\nPING\n"], false);
        assert_eq!(got, vec![Frame::TooLong, line("PING")]);
        // Exactly the limit, with \r\n, is fine.
        let got = frames(8, &[b"01234567\r\n"], false);
        assert_eq!(got, vec![line("01234567")]);
    }

    #[test]
    fn last_line_without_newline_is_served_at_eof() {
        assert_eq!(frames(8, &[b"PING"], true), vec![line("PING")]);
        assert_eq!(frames(8, &[b"0123456789xyz"], true), vec![Frame::TooLong]);
        assert_eq!(frames(8, &[b""], true), vec![]);
    }
}
