//! The bit reader of the parameter sets: emulation prevention bytes removed (H.264/H.265
//! `00 00 03` -> `00 00`), fixed-width reads and Exp-Golomb codes (`ue(v)`, `se(v)`).
//! Reading past the end is an error, never a panic.

/// Reading past the end of a parameter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short;

/// The RBSP of a NAL unit's payload: `00 00 03` emulation prevention removed.
pub(crate) fn rbsp(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len());
    let mut zeros = 0;
    for &b in payload {
        if zeros >= 2 && b == 3 {
            zeros = 0;
            continue;
        }
        zeros = if b == 0 { zeros + 1 } else { 0 };
        out.push(b);
    }
    out
}

/// Bits of an RBSP, most significant first.
pub(crate) struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bits<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Bits { data, pos: 0 }
    }

    /// One bit.
    pub(crate) fn bit(&mut self) -> Result<u32, Short> {
        let byte = self.data.get(self.pos / 8).ok_or(Short)?;
        let b = (byte >> (7 - self.pos % 8)) & 1;
        self.pos += 1;
        Ok(u32::from(b))
    }

    /// `n` bits (at most 32) as an unsigned number.
    pub(crate) fn bits(&mut self, n: u32) -> Result<u32, Short> {
        let mut v: u32 = 0;
        for _ in 0..n {
            v = (v << 1) | self.bit()?;
        }
        Ok(v)
    }

    /// Skip `n` bits.
    pub(crate) fn skip(&mut self, n: usize) -> Result<(), Short> {
        if self.pos + n > self.data.len() * 8 {
            return Err(Short);
        }
        self.pos += n;
        Ok(())
    }

    /// `ue(v)`: an unsigned Exp-Golomb code (at most 31 leading zeros: larger values are
    /// not in any field read here).
    pub(crate) fn ue(&mut self) -> Result<u32, Short> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return Err(Short);
            }
        }
        let rest = self.bits(zeros)?;
        Ok(((1u64 << zeros) - 1 + u64::from(rest)).min(u64::from(u32::MAX)) as u32)
    }

    /// `se(v)`: a signed Exp-Golomb code.
    pub(crate) fn se(&mut self) -> Result<i64, Short> {
        let k = i64::from(self.ue()?);
        Ok(if k % 2 == 1 { (k + 1) / 2 } else { -(k / 2) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_golomb_codes_and_emulation_prevention() {
        // ue: 1 -> 0, 010 -> 1, 011 -> 2, 00100 -> 3; se of 00101 (ue 4) -> -2.
        let data = [0b1010_0110, 0b0100_0010, 0b1000_0000];
        let mut b = Bits::new(&data);
        assert_eq!((b.ue(), b.ue(), b.ue(), b.ue()), (Ok(0), Ok(1), Ok(2), Ok(3)));
        assert_eq!(b.se(), Ok(-2));
        assert_eq!(rbsp(&[0, 0, 3, 1, 0, 0, 3, 0, 3]), vec![0, 0, 1, 0, 0, 0, 3]);
        let mut short = Bits::new(&[0u8]);
        assert_eq!(short.ue(), Err(Short));
    }
}
