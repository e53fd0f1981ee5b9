//! Nearest-rank percentiles, the one definition behind every p50/p99 the project reports
//! (diagnostics, `replay` and `record` summaries, the benchmarks).

/// The nearest-rank `percent` percentile of `sorted` (ascending): the smallest sample with
/// at least `percent` % of the samples at or below it, `sorted[ceil(percent / 100 * n) - 1]`
/// (the first sample for 0); `None` when there are no samples.
pub fn nearest_rank<T: Copy>(sorted: &[T], percent: f64) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((percent / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Mean, minimum, p50 and p99 of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest sample.
    pub min: f64,
    /// Nearest-rank median.
    pub p50: f64,
    /// Nearest-rank 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// The summary of `samples` (any order); `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Some(Summary {
            mean: v.iter().sum::<f64>() / v.len().max(1) as f64,
            min: *v.first()?,
            p50: nearest_rank(&v, 50.0)?,
            p99: nearest_rank(&v, 99.0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_by_hand() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        // ceil(0.5 * 200) = 100 -> the 100th sample; ceil(0.99 * 200) = 198.
        assert_eq!(nearest_rank(&v, 50.0), Some(100.0));
        assert_eq!(nearest_rank(&v, 99.0), Some(198.0));
        assert_eq!(nearest_rank(&v, 0.0), Some(1.0));
        assert_eq!(nearest_rank(&v, 100.0), Some(200.0));
        // One sample is every percentile; none has none.
        assert_eq!(nearest_rank(&[7.5f32], 99.0), Some(7.5));
        assert_eq!(nearest_rank::<f32>(&[], 50.0), None);
        // 3 samples: ceil(1.5) = 2nd, ceil(2.97) = 3rd.
        assert_eq!(nearest_rank(&[1, 2, 3], 50.0), Some(2));
        assert_eq!(nearest_rank(&[1, 2, 3], 99.0), Some(3));
    }

    #[test]
    fn summary_sorts_first() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        // sorted 1 2 3 10: mean 4, p50 = 2nd (ceil 2), p99 = 4th.
        assert_eq!(s, Summary { mean: 4.0, min: 1.0, p50: 2.0, p99: 10.0 });
        assert_eq!(Summary::of(&[]), None);
    }
}
