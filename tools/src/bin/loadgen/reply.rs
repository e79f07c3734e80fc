//! Reply scanning: the reply lines counted in what a connection reads (a batch is done
//! when all of its lines are in), and checked against `--expect` and
//! `--expect-contains` even when a line is split across reads.

#[inline]
pub(crate) fn count_newlines(b: &[u8]) -> usize {
    // Branch-free; LLVM vectorises this.
    b.iter().fold(0usize, |n, &c| n + (c == b'\n') as usize)
}

const KEEP_BAD_LINE: usize = 200;

/// Checks that every reply line starts with a prefix; lines may be split
/// across reads.
pub(crate) struct LineCheck {
    prefix: Vec<u8>,
    contains: Vec<u8>,
    /// Start of the current (incomplete) line, at most `keep` bytes.
    cur: Vec<u8>,
    /// Length of the current line so far (may exceed `cur.len()`).
    cur_len: usize,
    keep: usize,
    /// Only the first line of each `reply_lines`-line reply is checked.
    reply_lines: usize,
    /// Check every line, not only each reply's first.
    every: bool,
    line_no: usize,
    pub(crate) errors: u64,
    pub(crate) first_bad: Option<Vec<u8>>,
}

impl LineCheck {
    pub(crate) fn new(prefix: Vec<u8>, contains: Vec<u8>, reply_lines: usize, every: bool) -> Self {
        let keep = prefix.len().max(contains.len()).max(KEEP_BAD_LINE);
        LineCheck {
            prefix,
            contains,
            cur: Vec::with_capacity(keep),
            cur_len: 0,
            keep,
            reply_lines,
            every,
            line_no: 0,
            errors: 0,
            first_bad: None,
        }
    }

    fn check_line(&mut self, line: &[u8]) {
        let first = self.every || self.line_no == 0;
        self.line_no += 1;
        if self.line_no == self.reply_lines {
            self.line_no = 0;
        }
        if first
            && !(line.starts_with(&self.prefix)
                && (self.contains.is_empty()
                    || line
                        .windows(self.contains.len())
                        .any(|w| w == self.contains.as_slice())))
        {
            self.errors += 1;
            if self.first_bad.is_none() {
                let mut l = line[..line.len().min(KEEP_BAD_LINE)].to_vec();
                if l.last() == Some(&b'\r') {
                    l.pop();
                }
                self.first_bad = Some(l);
            }
        }
    }

    /// Feed received bytes; returns the number of complete lines.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> usize {
        let mut lines = 0;
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            let piece = &data[..pos];
            if self.cur_len == 0 {
                self.check_line(piece);
            } else {
                let room = self.keep - self.cur.len();
                self.cur.extend_from_slice(&piece[..piece.len().min(room)]);
                let line = std::mem::take(&mut self.cur);
                self.check_line(&line);
                self.cur = line;
                self.cur.clear();
                self.cur_len = 0;
            }
            lines += 1;
            data = &data[pos + 1..];
        }
        if !data.is_empty() {
            let room = self.keep - self.cur.len();
            self.cur.extend_from_slice(&data[..data.len().min(room)]);
            self.cur_len += data.len();
        }
        lines
    }
}
