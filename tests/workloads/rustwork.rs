//! Built twice by build.rs with `rustc -C opt-level=3 -g`, once with `-C
//! force-frame-pointers=no` (a release build's default) and once with `=yes`.
//!
//! `rustwork SECONDS`: the hot leaf `burn` is called by `parent_a` with 3 units of work and by
//! `parent_b` with 1, so about 75% / 25% of its samples. `#[inline(never)]` and `black_box`
//! keep the three functions apart and their work from being folded away.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The hot leaf; its local array moves the stack pointer, so a frame-pointer walk cannot skip
/// it by luck.
#[inline(never)]
fn burn(n: u64) -> u64 {
    let mut pad = [0u8; 64];
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        pad[(i & 63) as usize] = x as u8;
        black_box(&mut pad);
    }
    x ^ u64::from(pad[5])
}

#[inline(never)]
fn parent_a() -> u64 {
    black_box(burn(black_box(3_000_000))) + 1
}

#[inline(never)]
fn parent_b() -> u64 {
    black_box(burn(black_box(1_000_000))) + 2
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("usage: rustwork SECONDS");
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut sink = 0u64;
    let mut rounds = 0u64;
    while Instant::now() < end {
        sink = sink.wrapping_add(parent_a());
        sink = sink.wrapping_add(parent_b());
        rounds += 1;
    }
    println!("{rounds} rounds ({})", sink & 1);
}
