//! Names a rule whose keys share a Redis Cluster hash slot with another rule's, for every
//! client key of one length. The daemon's keys are `<prefix>:{<rule>:<key>}:<suffix>`,
//! so a key's slot is the CRC16 of `<rule>:<key>` (mod 16,384). CRC16 is linear: for a
//! fixed key, `crc(a:key) ^ crc(b:key)` depends only on the names `a`, `b` and the key's
//! length, not on its bytes. So two rules' keys of one client key share a slot for every
//! key of a length, or for none; by chance, for 1 pair of names in 16,384 per length.
//! `benches/several.sh` names a composite's second member with this, to measure one
//! whose members are decided by one all-or-nothing script in Redis Cluster. Standard
//! library only.
//!
//! `same_slot_rule RULE STEM KEY_LEN` prints the first `<STEM><n>` whose keys share a
//! slot with RULE's for keys of KEY_LEN bytes; run bare, it checks itself.

/// CRC16-CCITT (XModem), the hash of Redis Cluster's key slots.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of a hash tag's content.
fn slot(tag: &str) -> u16 {
    crc16(tag.as_bytes()) % 16_384
}

/// The first `<stem><n>` (n < 10^7) whose keys of `len` bytes share a slot with
/// `rule`'s, checked on a key of `len` zeros (linearity makes it hold for all).
fn name(rule: &str, stem: &str, len: usize) -> Option<String> {
    let key = "0".repeat(len);
    let want = slot(&format!("{rule}:{key}"));
    (0..10_000_000u64)
        .map(|n| format!("{stem}{n}"))
        .find(|b| slot(&format!("{b}:{key}")) == want)
}

fn self_test() {
    // Redis's own figures (CLUSTER KEYSLOT).
    assert_eq!(crc16(b"123456789"), 0x31c3);
    assert_eq!(slot("foo"), 12_182);
    assert_eq!(slot("bar"), 5_061);
    let b = name("burst", "perday", 7).expect("a name");
    for key in ["k000000", "k123456", "xyzzy42", "k999999"] {
        assert_eq!(slot(&format!("burst:{key}")), slot(&format!("{b}:{key}")));
    }
    // Another length: no longer the same slot, but for 1 in 16,384.
    let other = (slot("burst:k1") == slot(&format!("{b}:k1"))) as u32
        + (slot("burst:k12") == slot(&format!("{b}:k12"))) as u32;
    assert!(other < 2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        self_test();
        println!("same_slot_rule self-test ok");
        return;
    }
    let (Some(rule), Some(stem), Some(len)) = (
        args.first(),
        args.get(1),
        args.get(2).and_then(|l| l.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: same_slot_rule RULE STEM KEY_LEN");
        std::process::exit(2);
    };
    match name(rule, stem, len) {
        Some(n) => println!("{n}"),
        None => {
            eprintln!("same_slot_rule: no name {stem}<n> below 10^7");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn self_test() {
        super::self_test();
    }
}
