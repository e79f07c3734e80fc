//! The parser's unit tests: each verb's requests, and each malformed line refused with
//! its code.

use super::*;

#[test]
fn parses_requests() {
    assert_eq!(
        parse(b"CHECK rides_request user:42"),
        Ok(Request::Check {
            rule: b"rides_request",
            key: b"user:42",
            cost: 1
        })
    );
    assert_eq!(
        parse(b" \tcheck\t a  b 0 "),
        Ok(Request::Check {
            rule: b"a",
            key: b"b",
            cost: 0
        })
    );
    assert_eq!(parse(b"ping"), Ok(Request::Ping));
    assert_eq!(parse(b"Quit"), Ok(Request::Quit));
    assert_eq!(
        parse(b"acquire jobs user:1"),
        Ok(Request::Acquire {
            rule: b"jobs",
            key: b"user:1"
        })
    );
    assert_eq!(
        parse(b"RELEASE jobs user:1 17-a.1"),
        Ok(Request::Release {
            rule: b"jobs",
            key: b"user:1",
            token: b"17-a.1"
        })
    );
    assert_eq!(
        parse(b"CHECK a b 000000000007"),
        Ok(Request::Check {
            rule: b"a",
            key: b"b",
            cost: 7
        })
    );
    let eight = "CHECKALL".to_owned() + &" r k 2".repeat(8);
    match parse(eight.as_bytes()) {
        Ok(Request::CheckAll(t)) => {
            assert_eq!(t.as_slice().len(), 8);
            assert_eq!(
                t.as_slice()[7],
                Triple {
                    rule: b"r",
                    key: b"k",
                    cost: 2
                }
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        parse(b"refund r k 3"),
        Ok(Request::Refund {
            rule: b"r",
            key: b"k",
            units: 3
        })
    );
    let max = format!("CHECK a b {MAX_COST}");
    assert!(parse(max.as_bytes()).is_ok());
}

#[test]
fn parses_operator_verbs() {
    assert_eq!(
        parse(b"inspect api user:1"),
        Ok(Request::Inspect {
            rule: b"api",
            key: b"user:1"
        })
    );
    assert_eq!(
        parse(b"RESET api user:1"),
        Ok(Request::Reset {
            rule: b"api",
            key: b"user:1"
        })
    );
    assert_eq!(parse(b"RULES"), Ok(Request::Rules));
    assert_eq!(
        parse(b"TOP api"),
        Ok(Request::Top {
            rule: b"api",
            n: DEFAULT_TOP_N
        })
    );
    assert_eq!(parse(b"TOP api 3"), Ok(Request::Top { rule: b"api", n: 3 }));
    for bad in [
        "INSPECT api",
        "INSPECT api k x",
        "RESET api",
        "RULES x",
        "TOP",
        "TOP api 0",
        "TOP api 1001",
        "TOP api x",
        "TOP api 1 2",
        "TOP api 99999999999999999999",
    ] {
        assert_eq!(code(bad.as_bytes()), ErrorCode::Proto, "{bad}");
    }
    assert_eq!(code(b"INSPECT api k\x01"), ErrorCode::Key);
    assert_eq!(code(b"RESET api \x01"), ErrorCode::Key);
}

fn code(line: &[u8]) -> ErrorCode {
    parse(line).unwrap_err().code
}

#[test]
fn rejects_bad_requests_with_their_code() {
    assert_eq!(code(b""), ErrorCode::Proto);
    assert_eq!(code(b"  \t "), ErrorCode::Proto);
    assert_eq!(code(b"FETCH a b"), ErrorCode::Proto);
    assert_eq!(code(b"CHECK a"), ErrorCode::Proto);
    assert_eq!(code(b"CHECK a b 1 2"), ErrorCode::Proto);
    assert_eq!(code(b"PING x"), ErrorCode::Proto);
    assert_eq!(code(b"CHECKALL"), ErrorCode::Proto);
    assert_eq!(code(b"CHECKALL a b"), ErrorCode::Proto);
    assert_eq!(code(b"CHECKALL a b 1 c"), ErrorCode::Proto);
    assert_eq!(code(b"CHECKALL a b x c d 1"), ErrorCode::Cost);
    assert_eq!(code(b"CHECKALL a b\x01 1"), ErrorCode::Key);
    let nine = "CHECKALL".to_owned() + &" r k 1".repeat(9);
    assert_eq!(code(nine.as_bytes()), ErrorCode::Proto);
    assert_eq!(code(b"REFUND a b"), ErrorCode::Proto);
    assert_eq!(code(b"REFUND a b 1 2"), ErrorCode::Proto);
    assert_eq!(code(b"REFUND a b -1"), ErrorCode::Cost);
    assert_eq!(code(b"ACQUIRE a"), ErrorCode::Proto);
    assert_eq!(code(b"ACQUIRE a b 1"), ErrorCode::Proto);
    assert_eq!(code(b"RELEASE a b"), ErrorCode::Proto);
    assert_eq!(
        code(&[b"RELEASE a b ".as_slice(), &[b't'; 129]].concat()),
        ErrorCode::Token
    );
    assert_eq!(code(b"CHECK a b\x01c"), ErrorCode::Key);
    assert_eq!(code("CHECK a bé".as_bytes()), ErrorCode::Key);
    assert_eq!(
        code(&[b"CHECK a ".as_slice(), &[b'k'; 257]].concat()),
        ErrorCode::Key
    );
    for cost in ["-1", "+1", "1.5", "x", "1000001", "99999999999999999999"] {
        assert_eq!(
            code(format!("CHECK a b {cost}").as_bytes()),
            ErrorCode::Cost,
            "{cost}"
        );
    }
}
