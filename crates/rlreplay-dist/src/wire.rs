//! A little-endian byte encoding for what ranks send each other over
//! [`Collective::broadcast_bytes`](crate::Collective::broadcast_bytes) and
//! [`Collective::all_gather_bytes`](crate::Collective::all_gather_bytes): integers, floats (their
//! exact bits), strings and length-prefixed slices. [`Reader`] reports a message that is cut
//! short or malformed as [`DistError::Message`] naming the rank that sent it.

use crate::error::{DistError, Result};

/// Builds a message.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty message.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a length or index (as a `u64`).
    pub fn usize(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }

    /// Appends an `f64`'s bits.
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a length-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.usize(v.len());
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends a length-prefixed UTF-8 string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    /// Appends a length-prefixed slice, each element's `N` little-endian bytes.
    fn slice_of<const N: usize, T: Copy>(&mut self, v: &[T], to_le: fn(T) -> [u8; N]) -> &mut Self {
        self.usize(v.len());
        v.iter()
            .for_each(|&x| self.buf.extend_from_slice(&to_le(x)));
        self
    }

    /// Appends a length-prefixed slice of `u32`.
    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.slice_of(v, u32::to_le_bytes)
    }

    /// Appends a length-prefixed slice of `f32` bits.
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.slice_of(v, f32::to_le_bytes)
    }

    /// Appends a length-prefixed slice of `u64`.
    pub fn u64s(&mut self, v: &[u64]) -> &mut Self {
        self.slice_of(v, u64::to_le_bytes)
    }

    /// Appends a length-prefixed slice of `f64` bits.
    pub fn f64s(&mut self, v: &[f64]) -> &mut Self {
        self.slice_of(v, f64::to_le_bytes)
    }

    /// The message.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads a message from rank `rank`.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
    rank: usize,
}

impl<'a> Reader<'a> {
    /// The message `bytes` that rank `rank` sent.
    pub fn new(bytes: &'a [u8], rank: usize) -> Self {
        Self { rest: bytes, rank }
    }

    /// An error about this message.
    pub fn error(&self, msg: impl Into<String>) -> DistError {
        DistError::Message {
            rank: self.rank,
            msg: msg.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(self.error(format!(
                "message cut short ({} bytes missing)",
                n - self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let b = self.take(N)?;
        Ok(b.try_into().expect("take returns N bytes"))
    }

    /// Reads a `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Reads a `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a length or index.
    pub fn usize(&mut self) -> Result<usize> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| self.error(format!("length {v} does not fit")))
    }

    /// Reads an `f64`.
    pub fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    /// A length prefix for elements of `size` bytes, checked against what is left.
    fn len(&mut self, size: usize) -> Result<usize> {
        let n = self.usize()?;
        if n.checked_mul(size).is_none_or(|b| b > self.rest.len()) {
            return Err(self.error(format!(
                "{n} elements of {size} bytes announced, {} bytes left",
                self.rest.len()
            )));
        }
        Ok(n)
    }

    /// Reads a length-prefixed byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len(1)?;
        self.take(n)
    }

    /// Reads a length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<&'a str> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|_| self.error("a string is not UTF-8"))
    }

    /// Reads a length-prefixed slice of elements of `N` little-endian bytes.
    fn slice_of<const N: usize, T>(&mut self, from_le: fn([u8; N]) -> T) -> Result<Vec<T>> {
        let n = self.len(N)?;
        let b = self.take(N * n)?;
        Ok(b.chunks_exact(N)
            .map(|c| from_le(c.try_into().expect("chunks of N bytes")))
            .collect())
    }

    /// Reads a length-prefixed slice of `u32`.
    pub fn u32s(&mut self) -> Result<Vec<u32>> {
        self.slice_of(u32::from_le_bytes)
    }

    /// Reads a length-prefixed slice of `f32`.
    pub fn f32s(&mut self) -> Result<Vec<f32>> {
        self.slice_of(f32::from_le_bytes)
    }

    /// Reads a length-prefixed slice of `u64`.
    pub fn u64s(&mut self) -> Result<Vec<u64>> {
        self.slice_of(u64::from_le_bytes)
    }

    /// Reads a length-prefixed slice of `f64`.
    pub fn f64s(&mut self) -> Result<Vec<f64>> {
        self.slice_of(f64::from_le_bytes)
    }

    /// Checks that the whole message was read.
    pub fn end(&self) -> Result<()> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.error(format!("{} bytes after the message", self.rest.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_exact_bits_and_refuses_short_messages() {
        let mut w = Writer::new();
        w.u32(7)
            .u64(u64::MAX)
            .usize(3)
            .f64(-0.0)
            .f64(f64::NAN)
            .str("héllo")
            .u32s(&[1, 2, 3])
            .f32s(&[f32::MIN_POSITIVE, -1.5e-7])
            .bytes(b"");
        let msg = w.finish();
        let mut r = Reader::new(&msg, 1);
        assert_eq!(r.u32().unwrap(), 7);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.usize().unwrap(), 3);
        assert_eq!(r.f64().unwrap().to_bits(), (-0.0f64).to_bits());
        assert!(r.f64().unwrap().is_nan());
        assert_eq!(r.str().unwrap(), "héllo");
        assert_eq!(r.u32s().unwrap(), [1, 2, 3]);
        let f = r.f32s().unwrap();
        assert_eq!(f[1].to_bits(), (-1.5e-7f32).to_bits());
        assert!(r.bytes().unwrap().is_empty());
        r.end().unwrap();
        for cut in [0, 5, msg.len() - 1] {
            let mut r = Reader::new(&msg[..cut], 1);
            let all = (|| -> Result<()> {
                r.u32()?;
                r.u64()?;
                r.usize()?;
                r.f64()?;
                r.f64()?;
                r.str()?;
                r.u32s()?;
                r.f32s()?;
                r.bytes()?;
                Ok(())
            })();
            assert!(all.unwrap_err().to_string().starts_with("from rank 1"));
        }
        let mut long = Writer::new();
        long.usize(usize::MAX / 2);
        let long = long.finish();
        assert!(Reader::new(&long, 0).u32s().is_err());
        assert!(Reader::new(&msg, 0).end().is_err());
    }
}
