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

/// One item found in place by [`LineDecoder::scan`]: where the line is in the scanned
/// bytes, or that it was too long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A complete line at `buf[range]`, without its `\n` and a `\r` just before it.
    Line(std::ops::Range<usize>),
    /// A line longer than the limit; its bytes are being discarded up to the next `\n`.
    TooLong,
}

/// The content of the line `buf[..end]` without a trailing `\r`.
fn without_cr(buf: &[u8], end: usize) -> std::ops::Range<usize> {
    if end > 0 && buf[end - 1] == b'\r' {
        0..end - 1
    } else {
        0..end
    }
}

impl LineDecoder {
    /// Finds the next item at the start of `buf` without copying anything: returns how
    /// many bytes of `buf` it used up (drop them before the next call; they may be used
    /// up without an item, while discarding an over-long line) and the item, if a whole
    /// one is there. At `eof`, a last line without `\n` is an item too. The line of a
    /// [`Found::Line`] lies within the bytes used up.
    pub fn scan(&mut self, buf: &[u8], eof: bool) -> (usize, Option<Found>) {
        let mut used = 0;
        loop {
            let rest = &buf[used..];
            let newline = memchr(&rest[self.scanned.min(rest.len())..]).map(|i| i + self.scanned);
            if self.discarding {
                match newline {
                    Some(i) => {
                        used += i + 1;
                        self.discarding = false;
                        self.scanned = 0;
                        continue;
                    }
                    None => {
                        self.scanned = 0;
                        if eof {
                            self.discarding = false;
                        }
                        return (buf.len(), None);
                    }
                }
            }
            return match newline {
                Some(i) => {
                    self.scanned = 0;
                    let line = without_cr(rest, i);
                    let found = if line.len() > self.max_line_bytes {
                        Found::TooLong
                    } else {
                        Found::Line(line.start + used..line.end + used)
                    };
                    (used + i + 1, Some(found))
                }
                // Without a `\n` yet: `max + 1` bytes could still be content plus `\r`,
                // anything beyond is certainly too long.
                None if rest.len() > self.max_line_bytes + 1 => {
                    self.scanned = 0;
                    self.discarding = !eof;
                    (buf.len(), Some(Found::TooLong))
                }
                // A last line without `\n` is still a request.
                None if eof && !rest.is_empty() => {
                    self.scanned = 0;
                    let line = without_cr(rest, rest.len());
                    let found = if line.len() > self.max_line_bytes {
                        Found::TooLong
                    } else {
                        Found::Line(line.start + used..line.end + used)
                    };
                    (buf.len(), Some(found))
                }
                None => {
                    self.scanned = rest.len();
                    (used, None)
                }
            };
        }
    }

    /// [`Self::scan`] for a [`BytesMut`]: the item as an owned [`Frame`], the bytes used
    /// up taken out of `buf`.
    fn next_frame(&mut self, buf: &mut BytesMut, eof: bool) -> Option<Frame> {
        let (used, found) = self.scan(buf, eof);
        let frame = found.map(|f| match f {
            Found::Line(range) => Frame::Line(BytesMut::from(&buf[range])),
            Found::TooLong => Frame::TooLong,
        });
        buf.advance(used);
        frame
    }
}

/// The first `\n` in `b`.
fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

impl Decoder for LineDecoder {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        Ok(self.next_frame(buf, false))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        Ok(self.next_frame(buf, true))
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
