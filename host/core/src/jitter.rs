//! The jitter of retry backoffs (the watch loops', the pipeline's, the
//! plugin calls'): one per thread, seeded from the clock, which is enough
//! to spread replicas apart, or from a seed by the simulator (host/sim),
//! so that a schedule replays exactly.
use std::cell::Cell;

thread_local! {
    static STATE: Cell<u64> = Cell::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
}

/// A number in [0, 1) (splitmix64 over this thread's state).
pub fn unit() -> f64 {
    STATE.with(|state| {
        let s = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// `base` times a factor in [0.75, 1.25): ±25 %.
pub fn spread(base: std::time::Duration) -> std::time::Duration {
    base.mul_f64(0.75 + 0.5 * unit())
}

/// Seeds this thread's jitter (the simulator: one seed, one schedule).
pub fn seed(seed: u64) {
    STATE.with(|state| state.set(seed));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_seed_gives_the_same_numbers_in_range() {
        super::seed(7);
        let a: Vec<f64> = (0..100).map(|_| super::unit()).collect();
        super::seed(7);
        let b: Vec<f64> = (0..100).map(|_| super::unit()).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|x| (0.0..1.0).contains(x)));
        let d = super::spread(std::time::Duration::from_secs(4));
        assert!(d >= std::time::Duration::from_secs(3) && d < std::time::Duration::from_secs(5));
    }
}
