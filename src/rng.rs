//! splitmix64: the small seedable generator of the random inputs of the tests and the
//! benchmark (fresh, never-zero frames; the same seed gives the same bytes everywhere).

/// The splitmix64 generator (Steele, Lea and Flood 2014; the constants of Vigna's
/// reference implementation).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state starts at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A random byte (the top 8 bits of [`SplitMix64::next`]).
    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }

    /// A random number below `n` (> 0; `next() % n`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `n` random bytes: the little-endian bytes of successive [`SplitMix64::next`] values.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // Vigna's splitmix64.c with x = 0: the first outputs.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next(), 0x6e78_9e6a_a1b9_65f4);
        let mut a = SplitMix64::new(0);
        assert_eq!(a.bytes(9)[..8], 0xe220_a839_7b1d_cdafu64.to_le_bytes());
    }
}
