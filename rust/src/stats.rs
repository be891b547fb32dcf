//! Per-RPC counters and latency histograms, kept as atomics on the serving path and read by
//! Python's /metrics collector at scrape time (Prometheus names and buckets live in Python).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// gRPC status codes 0..=16.
pub const CODES: usize = 17;

pub struct MethodStats {
    codes: [AtomicU64; CODES],
    /// Observations per bucket (not cumulative); the last one is +Inf.
    buckets: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

pub struct Stats {
    bounds: Vec<f64>,
    methods: Vec<MethodStats>,
}

/// One method's figures: count per status code, observations per bucket, sum of seconds.
pub type Reading = (Vec<u64>, Vec<u64>, f64);

impl Stats {
    pub fn new(methods: usize, bounds: Vec<f64>) -> Stats {
        let methods = (0..methods)
            .map(|_| MethodStats {
                codes: std::array::from_fn(|_| AtomicU64::new(0)),
                buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_nanos: AtomicU64::new(0),
            })
            .collect();
        Stats { bounds, methods }
    }

    pub fn observe(&self, method: usize, code: u8, took: Duration) {
        let m = &self.methods[method];
        m.codes[usize::from(code).min(CODES - 1)].fetch_add(1, Relaxed);
        let seconds = took.as_secs_f64();
        let bucket = self.bounds.partition_point(|&bound| bound < seconds);
        m.buckets[bucket].fetch_add(1, Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        m.sum_nanos.fetch_add(nanos, Relaxed);
    }

    pub fn read(&self, method: usize) -> Reading {
        let m = &self.methods[method];
        (
            m.codes.iter().map(|c| c.load(Relaxed)).collect(),
            m.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            m.sum_nanos.load(Relaxed) as f64 / 1e9,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_upper_bounds() {
        let stats = Stats::new(1, vec![0.001, 0.01]);
        stats.observe(0, 0, Duration::from_micros(1000)); // le 0.001
        stats.observe(0, 5, Duration::from_millis(5));
        stats.observe(0, 0, Duration::from_secs(1));
        let (codes, buckets, sum) = stats.read(0);
        assert_eq!((codes[0], codes[5]), (2, 1));
        assert_eq!(buckets, vec![1, 1, 1]);
        assert!((sum - 1.006).abs() < 1e-9);
    }
}
