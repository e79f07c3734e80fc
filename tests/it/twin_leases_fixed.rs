//! A fixed window's leases against the reference model, saturated (the key and its
//! holders: `twin_leases.rs`): each whole window goes in equal shares, exactly, whenever
//! in the window a host asks, every unit passing the model; and what Redis keeps back
//! for a host is what it is due while it asks, and what it took it keeps through a pause
//! within the window (docs/DESIGN.md "Leases", "Windows").

use crate::common::redis_text;
use crate::twin_leases::{model, redis, Key};
use ratelimitd::algorithm::Kind;

/// Three saturated holders of a fixed window of 600 per 1 s, paced as the daemons are
/// (`src/lease/granted.rs`): each spends a unit every 0.5 ms while its lease holds one
/// and calls when it holds none, no sooner than 200 ms after its last call nor, after a
/// call that brought nothing, before Redis's `wait_ms`. Holder 2's calls cannot come
/// before `late` µs into a window (they arrive late: after the others' second calls
/// when `late` is 300 ms). Returns each whole window's admissions per holder, the calls
/// and the units admitted; every unit passes the model.
fn fixed_window_run(late: u64) -> (Vec<[u64; 3]>, u64, u64) {
    let (limit, window) = (600u64, 1_000_000u64);
    let mut key = Key::new(Kind::FixedWindow, limit, window, 3);
    let mut m = model(Kind::FixedWindow, limit, window);
    let t0 = 1_790_000_000_000_000u64 + 137_000;
    let mut next = [t0, t0 + 7_000, t0 + 19_000];
    let mut per_window: std::collections::BTreeMap<u64, [u64; 3]> = Default::default();
    let (mut calls, mut admitted) = (0u64, 0u64);
    let end = t0 + 6 * window;
    let mut now = t0;
    while now < end {
        for (h, next) in next.iter_mut().enumerate() {
            let at = now + h as u64 * 97;
            let spent = key.holders[h].spend(1, at);
            let may_call = at >= *next && (h != 2 || at % window >= late);
            let ok = spent
                || may_call && {
                    calls += 1;
                    let r = key.reply(h, at, 1, 2_000, 200_000);
                    let wait = if r[4] > 0 { 0 } else { r[3] as u64 * 1000 };
                    *next = at + wait.clamp(200_000, 1_000_000);
                    r[0] == 1
                };
            if ok {
                assert_eq!(m.decide(at as f64, 1)[0], 1, "holder {h} at {at}");
                per_window.entry(at / window).or_default()[h] += 1;
                admitted += 1;
            }
        }
        now += 500;
    }
    let (first, last) = (t0 / window, (end - 1) / window);
    let whole = per_window
        .into_iter()
        .filter(|(w, _)| *w != first && *w != last)
        .map(|(_, per)| per)
        .collect();
    (whole, calls, admitted)
}

/// Each whole window of a fixed window goes in equal shares, exactly ⌊limit ÷ 3⌋ per
/// saturated holder, whenever in the window a holder asks: a host asking after the
/// others took their shares, and asked again, still finds its own kept back.
#[test]
fn saturated_holders_get_their_share_of_each_fixed_window_even_asking_late() {
    for late in [0, 300_000, 700_000] {
        let (windows, calls, admitted) = fixed_window_run(late);
        assert!(windows.len() >= 4, "{windows:?}");
        for per in &windows {
            println!("late {late} µs: per holder {per:?}");
            assert_eq!(per, &[200, 200, 200], "holder 2 asking {late} µs late");
        }
        assert!(calls * 10 <= admitted, "{calls} calls for {admitted}");
    }
}

/// What a fixed window keeps back for a host is what it is due while it counts among the
/// holders: a host not saturated keeps back only what its last ask wanted, and a host
/// that stops asking keeps nothing back once its ask ends (1.2 s after it).
#[test]
fn a_fixed_window_keeps_back_only_what_the_hosts_asking_are_due() {
    let (limit, window) = (600u64, 1_000_000u64);
    let mut key = Key::new(Kind::FixedWindow, limit, window, 3);
    let w0 = 1_790_000_000_000_000u64 / window * window;
    // Each holder spends all its lease holds before it asks again.
    let ask = |key: &mut Key, h: usize, at: u64, want: u64, pace: u64| {
        while key.holders[h].spend(1, at) {}
        let r = key.reply(h, at, 1, want, pace);
        (r[4], r[1])
    };
    // Holder 0 is hot, not saturated (5 units at a time); holder 1 saturated takes all
    // but the 5 holder 0's next ask wants, which it then gets.
    assert_eq!(ask(&mut key, 0, w0 + 10_000, 5, 0).0, 5);
    assert_eq!(ask(&mut key, 1, w0 + 20_000, 2_000, 200_000).0, 588);
    assert_eq!(ask(&mut key, 0, w0 + 30_000, 5, 0).0, 4);
    // Their leases, cut at the window's end, are named back just before it, as the
    // sweep does (WINDOW_SPARE_US): a window's lease still stored in the next window is
    // counted there too (lua/lease_window.lua place_leases()).
    for h in [0, 1] {
        key.call(h, w0 + window - 20_000, 0, 0, 0);
    }
    // Next window, three holders (share 200): holder 2 takes what is not kept back for
    // holder 0's ask (5) and holder 1's share (200, its ask saturated); each then gets
    // it (less the unit its call's own request takes). The remaining reported to a
    // holder is what it could still take: none once it took its due.
    let w1 = w0 + window;
    assert_eq!(ask(&mut key, 2, w1 + 10_000, 2_000, 200_000), (394, 0));
    assert_eq!(ask(&mut key, 1, w1 + 20_000, 2_000, 200_000), (199, 0));
    assert_eq!(ask(&mut key, 0, w1 + 30_000, 5, 0), (4, 0));
    for h in [0, 1, 2] {
        key.call(h, w1 + window - 20_000, 0, 0, 0);
    }
    // Holders 1 and 2 asked last over 1.2 s ago: holder 0 alone is due the window.
    assert_eq!(
        ask(&mut key, 0, w1 + window + 300_000, 2_000, 200_000).0,
        599
    );
}

/// A host that took part of a long window, gave its lease back and paused past its
/// ask's life still has what it took when it asks again in that window: its due there
/// is its share less that, and the hosts still asking keep what they are due.
#[test]
fn a_host_back_from_a_pause_in_its_window_is_due_its_share_less_what_it_took() {
    let (limit, window) = (600u64, 10_000_000u64);
    let mut key = Key::new(Kind::FixedWindow, limit, window, 3);
    let w0 = 1_790_000_000_000_000u64 / window * window;
    let taken = |key: &Key, h: usize| -> u64 {
        let v = redis_text(&redis().addr(), &["HGET", &key.name, &format!("g:h{h}")]).unwrap();
        v.split(' ').nth(1).map_or(0, |u| u.parse().unwrap())
    };
    // Holders 0 and 1 take 125 each, holder 2 takes 100 and gives back what it left.
    for (h, want) in [(0, 125), (1, 125), (2, 100)] {
        let r = key.reply(h, w0 + 10_000 + h as u64 * 1000, 1, want, 0);
        println!("holder {h} asked {want}: {r:?}");
        while key.holders[h].spend(1, w0 + 20_000) {}
    }
    key.call(2, w0 + 30_000, 0, 0, 0);
    let before = taken(&key, 2);
    // Holders 0 and 1 keep asking (saturated, for a unit); holder 2 pauses past its
    // ask's life (1.2 s) and comes back in the same window.
    for at in [w0 + 1_000_000, w0 + 2_000_000] {
        for h in [0, 1] {
            while key.holders[h].spend(1, at) {}
            key.reply(h, at, 0, 1, 200_000);
        }
    }
    let (t0, t1) = (taken(&key, 0), taken(&key, 1));
    let back = w0 + 2_100_000;
    let r = key.reply(2, back, 0, 2_000, 200_000);
    let share = limit / 3;
    println!("taken {t0} {t1} {before}; holder 2 back: {r:?}");
    assert_eq!(
        taken(&key, 2),
        share,
        "its share, less the {before} it took: {r:?}"
    );
    assert_eq!(r[4] as u64, share - before, "{r:?}");
}
