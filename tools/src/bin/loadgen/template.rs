//! The request template of `--request`: the escapes it may carry and the `{n}` counter
//! that makes each request's key, expanded into the write buffer without allocating.

/// Interpret `\r`, `\n`, `\t`, `\\` escapes.
pub(crate) fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let c = match b[i + 1] {
                b'r' => Some(b'\r'),
                b'n' => Some(b'\n'),
                b't' => Some(b'\t'),
                b'\\' => Some(b'\\'),
                _ => None,
            };
            if let Some(c) = c {
                out.push(c);
                i += 2;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A request template split on `{n}`: `parts[0] n parts[1] n ... parts[k]`.
pub(crate) struct Template {
    parts: Vec<Vec<u8>>,
    /// Minimum digits of `n` (zero-padded).
    width: usize,
    /// What `{n}` stands for, by `n mod len` (`--values`); empty: `n` itself.
    pub(crate) values: Vec<Vec<u8>>,
}

impl Template {
    pub(crate) fn parse(s: &str, width: usize) -> Result<Self, String> {
        let bytes = unescape(s);
        if bytes.last() != Some(&b'\n') {
            return Err("--request must end with a newline: write it as '\\n' or '\\r\\n'".into());
        }
        let mut parts = Vec::new();
        let mut rest: &[u8] = &bytes;
        while let Some(pos) = rest.windows(3).position(|w| w == b"{n}") {
            parts.push(rest[..pos].to_vec());
            rest = &rest[pos + 3..];
        }
        parts.push(rest.to_vec());
        Ok(Template {
            parts,
            width,
            values: Vec::new(),
        })
    }

    pub(crate) fn has_counter(&self) -> bool {
        self.parts.len() > 1
    }

    /// Append one request with counter value `n` to `buf`.
    #[inline]
    pub(crate) fn expand_into(&self, buf: &mut Vec<u8>, n: u64, num: &mut itoa::Buffer) {
        let (last, init) = self.parts.split_last().expect("at least one part");
        if init.is_empty() {
            buf.extend_from_slice(last);
            return;
        }
        let digits = match self.values.len() {
            0 => num.format(n).as_bytes(),
            len => &self.values[(n % len as u64) as usize],
        };
        let pad = self.width.saturating_sub(digits.len());
        for p in init {
            buf.extend_from_slice(p);
            buf.resize(buf.len() + pad, b'0');
            buf.extend_from_slice(digits);
        }
        buf.extend_from_slice(last);
    }
}
