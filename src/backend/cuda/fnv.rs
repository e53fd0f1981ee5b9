//! 64-bit FNV-1a: the kernel cache's key and its files' checksum (not a security hash: the
//! cache lives in the user's own directory). One file for the crate and `build.rs`, which
//! names the embedded kernels' cache entries with it (`#[path]` there).

/// FNV-1a over `parts`, each followed by a separator so ("ab", "c") and ("a", "bc") differ.
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
