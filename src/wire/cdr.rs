//! CDR (XCDR1, as ROS 2 serializes messages in bags) for the four message types the CLI
//! reads and writes: `sensor_msgs/Image` and `CameraInfo` in, `vision_preproc_msgs/Tensor`
//! and `FrameTiming` out.
//!
//! Hand-written rather than serde + the `cdr` crate because bags are untrusted input: that
//! crate allocates a sequence's claimed length before checking it against the data, so one
//! corrupt length field asks for gigabytes. Here every length is checked against the bytes
//! that remain before anything is allocated, and image data is borrowed, not copied.

use std::fmt;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdrError {
    /// Field being read.
    pub field: &'static str,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for CdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt CDR at field `{}`: {}", self.field, self.what)
    }
}

impl std::error::Error for CdrError {}

type Res<T> = Result<T, CdrError>;

/// Reads CDR fields in order, checking every length against what remains.
pub(crate) struct Reader<'a> {
    body: &'a [u8],
    pos: usize,
    little: bool,
}

impl<'a> Reader<'a> {
    /// Start after the 4-byte encapsulation header (CDR_BE = 00 00, CDR_LE = 00 01).
    pub(crate) fn new(data: &'a [u8]) -> Res<Self> {
        let err = |what: String| CdrError { field: "encapsulation", what };
        if data.len() < 4 {
            return Err(err(format!("{} bytes, shorter than the 4-byte header", data.len())));
        }
        let little = match (data[0], data[1]) {
            (0, 0) => false,
            (0, 1) => true,
            (a, b) => {
                return Err(err(format!(
                    "unsupported representation {a:02x} {b:02x} (expected CDR)"
                )))
            }
        };
        Ok(Reader { body: &data[4..], pos: 0, little })
    }

    fn take(&mut self, field: &'static str, n: usize, align: usize) -> Res<&'a [u8]> {
        let start = self.pos.next_multiple_of(align);
        let end =
            start.checked_add(n).filter(|&e| e <= self.body.len()).ok_or_else(|| CdrError {
                field,
                what: format!("needs {n} bytes at offset {start}, message has {}", self.body.len()),
            })?;
        self.pos = end;
        Ok(&self.body[start..end])
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Res<[u8; N]> {
        let b = self.take(field, N, N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        if !self.little {
            a.reverse();
        }
        Ok(a)
    }

    /// `uint8` / `bool`.
    pub(crate) fn u8(&mut self, field: &'static str) -> Res<u8> {
        Ok(self.take(field, 1, 1)?[0])
    }
    /// `uint32`.
    pub(crate) fn u32(&mut self, field: &'static str) -> Res<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    /// `int32`.
    pub(crate) fn i32(&mut self, field: &'static str) -> Res<i32> {
        Ok(i32::from_le_bytes(self.array(field)?))
    }
    /// `uint64`.
    pub(crate) fn u64(&mut self, field: &'static str) -> Res<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    /// `float32`.
    pub(crate) fn f32(&mut self, field: &'static str) -> Res<f32> {
        Ok(f32::from_le_bytes(self.array(field)?))
    }
    /// `float64`.
    pub(crate) fn f64(&mut self, field: &'static str) -> Res<f64> {
        Ok(f64::from_le_bytes(self.array(field)?))
    }

    /// `string`: length including the terminating NUL, bytes, NUL.
    pub(crate) fn string(&mut self, field: &'static str) -> Res<String> {
        let n = self.u32(field)? as usize;
        let b = self.take(field, n, 1)?;
        let Some((0, text)) = b.split_last() else {
            return Err(CdrError { field, what: "string without its terminating NUL".into() });
        };
        String::from_utf8(text.to_vec())
            .map_err(|e| CdrError { field, what: format!("not UTF-8: {e}") })
    }

    /// `string`, borrowed from the message.
    pub(crate) fn str(&mut self, field: &'static str) -> Res<&'a str> {
        let n = self.u32(field)? as usize;
        let b = self.take(field, n, 1)?;
        let Some((0, text)) = b.split_last() else {
            return Err(CdrError { field, what: "string without its terminating NUL".into() });
        };
        std::str::from_utf8(text).map_err(|e| CdrError { field, what: format!("not UTF-8: {e}") })
    }

    /// `uint32[]`.
    pub(crate) fn u32_seq(&mut self, field: &'static str) -> Res<Vec<u32>> {
        let n = self.u32(field)? as usize;
        if n > self.body.len() / 4 {
            return Err(CdrError {
                field,
                what: format!("claims {n} uint32 in a {}-byte message", self.body.len()),
            });
        }
        (0..n).map(|_| self.u32(field)).collect()
    }

    /// `uint8[]`, borrowed from the message.
    pub(crate) fn bytes(&mut self, field: &'static str) -> Res<&'a [u8]> {
        let n = self.u32(field)? as usize;
        self.take(field, n, 1)
    }

    /// `float64[]`.
    pub(crate) fn f64_seq(&mut self, field: &'static str) -> Res<Vec<f64>> {
        let n = self.u32(field)? as usize;
        if n > self.body.len() / 8 {
            return Err(CdrError {
                field,
                what: format!("claims {n} doubles in a {}-byte message", self.body.len()),
            });
        }
        (0..n).map(|_| self.f64(field)).collect()
    }

    /// `float64[N]`.
    pub(crate) fn f64_array<const N: usize>(&mut self, field: &'static str) -> Res<[f64; N]> {
        let mut out = [0.0; N];
        for v in &mut out {
            *v = self.f64(field)?;
        }
        Ok(out)
    }
}

/// Writes CDR little-endian with the encapsulation header.
pub struct Writer {
    buf: Vec<u8>,
    /// Bytes of `buf` before the body: 4 (the encapsulation header) or 0 (a
    /// continuation, see [`Writer::continuing`]).
    header: usize,
    /// Body offset of the first body byte of `buf` (0, or where a continuation starts).
    base: usize,
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

impl Writer {
    /// A buffer holding the CDR_LE encapsulation header.
    pub fn new() -> Self {
        Writer { buf: vec![0, 1, 0, 0], header: 4, base: 0 }
    }
    /// The bytes of a message that continue after `body_offset` body bytes written
    /// elsewhere (no encapsulation header; alignment counted from the message's body
    /// start), e.g. the fields after a large `uint8[]` that is written in place.
    pub(crate) fn continuing(body_offset: usize) -> Self {
        Writer { buf: Vec::new(), header: 0, base: body_offset }
    }
    fn align(&mut self, n: usize) {
        let pos = self.base + self.buf.len() - self.header;
        self.buf.resize(self.buf.len() + (pos.next_multiple_of(n) - pos), 0);
    }
    /// Body bytes written so far, counting those before a continuation's start.
    pub(crate) fn body_len(&self) -> usize {
        self.base + self.buf.len() - self.header
    }
    /// `uint8`.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// `uint16`.
    pub fn u16(&mut self, v: u16) {
        self.align(2);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// `uint32`.
    pub fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// `int32`.
    pub fn i32(&mut self, v: i32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// `uint64`.
    pub fn u64(&mut self, v: u64) {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// `int64[]`.
    pub(crate) fn i64_seq(&mut self, v: &[i64]) {
        self.u32(v.len() as u32);
        for x in v {
            self.align(8);
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    /// `uint8[N]` (a fixed array: no length).
    pub(crate) fn u8_array(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// `float32`.
    pub fn f32(&mut self, v: f32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// `string`.
    pub fn string(&mut self, s: &str) {
        self.u32(s.len() as u32 + 1);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }
    /// `uint8[]`.
    pub fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    /// The length of a `uint8[]` whose `len` bytes the caller writes after these bytes.
    pub(crate) fn bytes_len(&mut self, len: usize) {
        self.u32(len as u32);
    }
    /// `uint32[]`.
    pub(crate) fn u32_seq(&mut self, v: &[u32]) {
        self.u32(v.len() as u32);
        for x in v {
            self.u32(*x);
        }
    }
    /// The serialized message.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_alignment() {
        let mut w = Writer::new();
        w.u8(7);
        w.u32(0xdead_beef);
        w.string("abc");
        w.u64(1 << 40);
        w.bytes(&[1, 2, 3]);
        let data = w.finish();
        // header, u8 at 0, pad to 4, u32, string len 4 "abc\0" (8..16), u64 aligned to 16.
        assert_eq!(&data[..4], &[0, 1, 0, 0]);
        assert_eq!(data.len(), 4 + 16 + 8 + 4 + 3);
        let mut r = Reader::new(&data).unwrap();
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u32("b").unwrap(), 0xdead_beef);
        assert_eq!(r.string("c").unwrap(), "abc");
        assert_eq!(r.f64("d").unwrap().to_bits(), 1 << 40);
        assert_eq!(r.bytes("e").unwrap(), &[1, 2, 3]);
    }

    #[test]
    fn a_continuation_aligns_like_one_writer() {
        // One writer: u8, 5 data bytes, then a u32 (aligned to 4 in the body) and a u64.
        let mut one = Writer::new();
        one.u8(9);
        one.bytes(&[1, 2, 3, 4, 5]);
        one.u32(7);
        one.u64(8);
        let one = one.finish();
        // The same message in three parts: prefix with the length, data, continuation.
        let mut prefix = Writer::new();
        prefix.u8(9);
        prefix.bytes_len(5);
        let body = prefix.body_len() + 5;
        let mut rest = Writer::continuing(body);
        rest.u32(7);
        rest.u64(8);
        let joined = [prefix.finish(), vec![1, 2, 3, 4, 5], rest.finish()].concat();
        assert_eq!(joined, one);
    }

    #[test]
    fn corrupt_lengths_are_errors_not_allocations() {
        let mut w = Writer::new();
        w.u32(u32::MAX); // a sequence claiming 4 GiB
        let data = w.finish();
        let e = Reader::new(&data).unwrap().bytes("data").unwrap_err();
        assert_eq!(e.field, "data");
        assert!(e.to_string().contains("needs 4294967295 bytes"), "{e}");
        let e = Reader::new(&data).unwrap().f64_seq("d").unwrap_err();
        assert!(e.to_string().contains("claims 4294967295 doubles"), "{e}");
        assert!(Reader::new(&[0, 1]).is_err());
        assert!(Reader::new(&[1, 1, 0, 0]).is_err());
    }

    #[test]
    fn big_endian_is_read() {
        let data = [0u8, 0, 0, 0, 0, 0, 1, 2];
        assert_eq!(Reader::new(&data).unwrap().u32("x").unwrap(), 0x0102);
    }
}
