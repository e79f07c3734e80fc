//! The line protocol (docs/PROTOCOL.md): framing, request parsing, reply encoding.
//!
//! Everything here is pure (no I/O, no clock, no configuration beyond the line limit),
//! so it can be unit-, property- and fuzz-tested on its own. It knows nothing of rules,
//! Redis or what a decision means.
//!
//! * [`frame`]: [`LineDecoder`] splits a byte stream into [`Frame`]s;
//! * [`request`]: [`parse`] turns one line into a [`Request`] or a [`ProtoError`];
//! * [`overrides`]: the fields of an `OVERRIDE` ([`OverrideRequest`]);
//! * [`reply`]: [`Reply`] is what goes back, [`Reply::encode`] appends its wire form;
//! * [`error`]: the `ERR <CODE> <message>` replies.

pub mod error;
pub mod frame;
pub mod overrides;
pub mod reply;
pub mod request;

pub use error::{printable, ErrorCode, ProtoError};
pub use frame::{Found, Frame, LineDecoder};
pub use overrides::OverrideRequest;
pub use reply::Reply;
pub use request::{parse, Request, Triple, Triples, MAX_COST, MAX_KEY_LEN, MAX_TRIPLES};

#[cfg(test)]
mod tests {
    use super::frame::tests::frames;
    use super::*;
    use bytes::BytesMut;
    use proptest::prelude::*;

    proptest! {
        /// Any byte soup, cut anywhere: every `\n`-terminated line yields exactly one frame,
        /// and every frame parses or errors without panicking; error messages are one line.
        #[test]
        fn one_frame_per_line(data in proptest::collection::vec(any::<u8>(), 0..2048),
                              cut in 0usize..2048, max in 1usize..64) {
            let cut = cut.min(data.len());
            let got = frames(max, &[&data[..cut], &data[cut..]], false);
            let lines = data.iter().filter(|&&b| b == b'\n').count();
            // An unterminated last line already known to be too long is answered early.
            let tail = data.len() - data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            prop_assert_eq!(got.len(), lines + usize::from(tail > max + 1));
            for f in got {
                if let Frame::Line(l) = f {
                    prop_assert!(l.len() <= max);
                    let mut out = BytesMut::new();
                    match parse(&l) {
                        Ok(_) => {}
                        Err(e) => Reply::Error(e).encode(&mut out),
                    }
                    prop_assert!(out.iter().filter(|&&b| b == b'\n').count() <= 1);
                }
            }
        }

        #[test]
        fn valid_checks_roundtrip(rule in "[a-z_]{1,20}", key in "[!-~]{1,256}", cost in 0u32..=1_000_000) {
            let l = format!("CHECK {rule} {key} {cost}");
            prop_assert_eq!(parse(l.as_bytes()), Ok(Request::Check { rule: rule.as_bytes(), key: key.as_bytes(), cost }));
        }
    }
}
