//! A Parquet page reader that decompresses into pooled buffers.
//!
//! parquet's own page reader allocates a fresh buffer for every page it reads and another for
//! every page it decompresses, about a hundred 1 MiB buffers per shard spread over the decoding
//! threads. The allocator keeps much of that churn resident. This reader reads each page into one
//! buffer it keeps and decompresses it into a buffer taken from a small process-wide pool; the
//! column reader returns the buffer to the pool when it is done with the page. It handles the
//! codecs rollout shards use (none, Snappy, zstd); [`open`] falls back to parquet's reader for the
//! others.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::serialized_reader::SerializedPageReader;

/// Bytes read at a page's start to find its header; longer headers are read again in full.
const HEADER_WINDOW: usize = 256;
/// Buffers the pool keeps at most.
const POOL_MAX: usize = 16;
/// Larger buffers are freed rather than kept (pages are usually about 1 MiB).
const POOL_BUFFER_MAX: usize = 16 << 20;
/// Largest page accepted (uncompressed), as a guard against corrupted headers.
const PAGE_MAX: usize = 1 << 30;

/// Free page buffers, shared by every reader of the process.
static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer from the pool (or a new one) with room for `len` bytes, empty.
fn take(len: usize) -> Vec<u8> {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let pick = pool
        .iter()
        .position(|b| b.capacity() >= len)
        .or(pool.len().checked_sub(1));
    let mut buf = pick.map(|i| pool.swap_remove(i)).unwrap_or_default();
    drop(pool);
    buf.clear();
    buf.reserve(len);
    buf
}

/// Returns a buffer to the pool (or frees it when the pool is full).
fn give(buf: Vec<u8>) {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < POOL_MAX && (1..=POOL_BUFFER_MAX).contains(&buf.capacity()) {
        pool.push(buf);
    }
}

/// A page's bytes; back to the pool when the last `Bytes` referring to them is dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0));
    }
}

/// The pages of one column chunk of a row group: this module's reader for the codecs it
/// handles, parquet's otherwise.
pub(crate) fn open(
    file: &Arc<File>,
    column: &ColumnChunkMetaData,
    rows: usize,
) -> Result<Box<dyn PageReader>> {
    let codec = match column.compression() {
        Compression::UNCOMPRESSED => Codec::None,
        Compression::SNAPPY => Codec::Snappy(snap::raw::Decoder::new()),
        Compression::ZSTD(_) => Codec::Zstd(Box::new(
            zstd::bulk::Decompressor::new().map_err(|e| ParquetError::External(e.into()))?,
        )),
        _ => {
            return Ok(Box::new(SerializedPageReader::new(
                Arc::clone(file),
                column,
                rows,
                None,
            )?))
        }
    };
    let (start, len) = match (column.dictionary_page_offset(), column.compressed_size()) {
        (_, len) if len < 0 => return Err(general("negative column chunk size")),
        (Some(dict), len) if dict >= 0 => (dict as u64, len as u64),
        (None, len) if column.data_page_offset() >= 0 => {
            (column.data_page_offset() as u64, len as u64)
        }
        _ => return Err(general("negative column chunk offset")),
    };
    if start.saturating_add(len) > file.metadata()?.len() {
        return Err(ParquetError::EOF(
            "column chunk beyond the end of the file".into(),
        ));
    }
    Ok(Box::new(Pages {
        file: Arc::clone(file),
        offset: start,
        remaining: len,
        codec,
        peeked: None,
        head: Vec::new(),
        body: take(0),
    }))
}

/// A `ParquetError` with this message.
fn general(msg: &str) -> ParquetError {
    ParquetError::General(msg.to_owned())
}

/// How page bodies are compressed.
enum Codec {
    /// Stored as they are.
    None,
    /// Snappy (raw blocks).
    Snappy(snap::raw::Decoder),
    /// zstd frames.
    Zstd(Box<zstd::bulk::Decompressor<'static>>),
}

/// The reader of one column chunk (see the module documentation).
struct Pages {
    file: Arc<File>,
    /// Where the next header starts.
    offset: u64,
    /// Bytes of the column chunk left from `offset`.
    remaining: u64,
    codec: Codec,
    /// The next page's header, already read (`offset` is past it).
    peeked: Option<Header>,
    /// Scratch for headers.
    head: Vec<u8>,
    /// Scratch for compressed bodies.
    body: Vec<u8>,
}

impl Drop for Pages {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.body));
    }
}

impl Pages {
    /// Reads `len` bytes at `at` into `buf` (replacing its contents).
    fn read_at(&self, at: u64, len: usize, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        buf.reserve(len);
        let mut f = &*self.file;
        f.seek(SeekFrom::Start(at))?;
        f.take(len as u64).read_to_end(buf)?;
        if buf.len() != len {
            return Err(ParquetError::EOF("unexpected end of file in a page".into()));
        }
        Ok(())
    }

    /// The next page's header, without consuming it; `None` at the end of the chunk.
    fn header(&mut self) -> Result<Option<&Header>> {
        if self.peeked.is_none() && self.remaining > 0 {
            let mut head = std::mem::take(&mut self.head);
            let mut window = HEADER_WINDOW;
            let parsed = loop {
                let len = window.min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                self.read_at(self.offset, len, &mut head)?;
                match Header::parse(&head) {
                    Ok(h) => break h,
                    Err(Short) if len < usize::try_from(self.remaining).unwrap_or(usize::MAX) => {
                        window = window.saturating_mul(16);
                    }
                    Err(Short) => return Err(general("truncated page header")),
                }
            };
            self.head = head;
            let (header, used) = parsed?;
            let total = used as u64 + header.compressed as u64;
            if total > self.remaining {
                return Err(ParquetError::EOF("Invalid page header".into()));
            }
            self.offset += used as u64;
            self.remaining -= used as u64;
            self.peeked = Some(header);
        }
        Ok(self.peeked.as_ref())
    }

    /// Consumes the next header and its body; `None` at the end of the chunk.
    fn next_raw(&mut self) -> Result<Option<(Header, Bytes)>> {
        if self.header()?.is_none() {
            return Ok(None);
        }
        let h = self.peeked.take().expect("header just read");
        let (at, n) = (self.offset, h.compressed);
        self.offset += n as u64;
        self.remaining -= n as u64;
        if h.kind == PageKind::Index {
            return Ok(Some((h, Bytes::new())));
        }
        // Levels of a v2 page are stored uncompressed in front of the values.
        let (prefix, compressed) = match h.v2 {
            Some(v2) => (v2.def_len + v2.rep_len, v2.compressed),
            None => (0, true),
        };
        if prefix > n || prefix > h.uncompressed {
            return Err(general("Invalid page header"));
        }
        // Back to the pool on every path, errors included.
        let mut out = Pooled(take(h.uncompressed.max(n)));
        let direct = matches!(self.codec, Codec::None) || !compressed;
        if direct {
            self.read_at(at, n, &mut out.0)?;
        } else {
            let mut body = std::mem::take(&mut self.body);
            let read = self.read_at(at, n, &mut body);
            let done = read.and_then(|()| {
                out.0.extend_from_slice(&body[..prefix]);
                self.decompress(&body[prefix..], &mut out.0, h.uncompressed - prefix)
            });
            self.body = body;
            done?;
            if out.0.len() != h.uncompressed {
                return Err(general(&format!(
                    "Actual decompressed size doesn't match the expected one ({} vs {})",
                    out.0.len(),
                    h.uncompressed
                )));
            }
        }
        Ok(Some((h, Bytes::from_owner(out))))
    }

    /// Appends the decompression of `src` (`len` bytes expected) to `out`.
    fn decompress(&mut self, src: &[u8], out: &mut Vec<u8>, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let start = out.len();
        match &mut self.codec {
            Codec::None => out.extend_from_slice(src),
            Codec::Snappy(d) => {
                let n =
                    snap::raw::decompress_len(src).map_err(|e| ParquetError::External(e.into()))?;
                if n != len {
                    return Err(general("snappy page of an unexpected size"));
                }
                out.resize(start + n, 0);
                d.decompress(src, &mut out[start..])
                    .map_err(|e| ParquetError::External(e.into()))?;
            }
            Codec::Zstd(d) => {
                // Written after the prefix, into the spare capacity.
                let mut w = std::io::Cursor::new(&mut *out);
                w.set_position(start as u64);
                let n = d
                    .decompress_to_buffer(src, &mut w)
                    .map_err(|e| ParquetError::External(e.into()))?;
                if n != len {
                    return Err(general("zstd page of an unexpected size"));
                }
            }
        }
        Ok(())
    }
}

impl Iterator for Pages {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Pages {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        loop {
            let Some((h, buf)) = self.next_raw()? else {
                return Ok(None);
            };
            return Ok(Some(match (h.kind, h.v2) {
                (PageKind::Index, _) => continue,
                (PageKind::Dictionary, _) => Page::DictionaryPage {
                    buf,
                    num_values: h.num_values,
                    encoding: h.encoding,
                    is_sorted: h.is_sorted,
                },
                (PageKind::Data, _) => Page::DataPage {
                    buf,
                    num_values: h.num_values,
                    encoding: h.encoding,
                    def_level_encoding: h.def_encoding,
                    rep_level_encoding: h.rep_encoding,
                    statistics: None,
                },
                (PageKind::DataV2, Some(v2)) => Page::DataPageV2 {
                    buf,
                    num_values: h.num_values,
                    encoding: h.encoding,
                    num_nulls: v2.num_nulls,
                    num_rows: v2.num_rows,
                    def_levels_byte_len: v2.def_len as u32,
                    rep_levels_byte_len: v2.rep_len as u32,
                    is_compressed: v2.compressed,
                    statistics: None,
                },
                (PageKind::DataV2, None) => return Err(general("Missing V2 data page header")),
            }));
        }
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        loop {
            let Some(h) = self.header()? else {
                return Ok(None);
            };
            return Ok(Some(match h.kind {
                PageKind::Index => {
                    self.skip_next_page()?;
                    continue;
                }
                PageKind::Dictionary => PageMetadata {
                    num_rows: None,
                    num_levels: None,
                    is_dict: true,
                },
                PageKind::Data => PageMetadata {
                    num_rows: None,
                    num_levels: Some(h.num_values as usize),
                    is_dict: false,
                },
                PageKind::DataV2 => PageMetadata {
                    num_rows: h.v2.map(|v2| v2.num_rows as usize),
                    num_levels: Some(h.num_values as usize),
                    is_dict: false,
                },
            }));
        }
    }

    fn skip_next_page(&mut self) -> Result<()> {
        if let Some(h) = self.header()? {
            let n = h.compressed as u64;
            self.peeked = None;
            self.offset += n;
            self.remaining -= n;
        }
        Ok(())
    }
}

/// The kinds of page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageKind {
    Data,
    Index,
    Dictionary,
    DataV2,
}

/// The fields of a v2 data page header that matter here.
#[derive(Debug, Clone, Copy)]
struct V2 {
    num_nulls: u32,
    num_rows: u32,
    def_len: usize,
    rep_len: usize,
    compressed: bool,
}

/// A page header (the fields the column readers need).
#[derive(Debug, Clone)]
struct Header {
    kind: PageKind,
    uncompressed: usize,
    compressed: usize,
    num_values: u32,
    encoding: Encoding,
    def_encoding: Encoding,
    rep_encoding: Encoding,
    is_sorted: bool,
    v2: Option<V2>,
}

/// The header's bytes end before the header does.
struct Short;

/// A header parse outcome: the header and its length, an invalid header, or too few bytes.
type Parsed = std::result::Result<Result<(Header, usize)>, Short>;

/// Thrift compact protocol types.
mod ttype {
    pub const TRUE: u8 = 1;
    pub const FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
}

/// Nesting deeper than this is refused (a corrupted header must not exhaust the stack).
const MAX_DEPTH: usize = 16;

/// A failed read: out of bytes, or bytes that cannot be a header.
enum Bad {
    Short,
    Invalid(&'static str),
}

/// Reads Thrift compact protocol values from a byte slice.
struct Thrift<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// A Thrift read's outcome.
type TResult<T> = std::result::Result<T, Bad>;

impl Thrift<'_> {
    fn byte(&mut self) -> TResult<u8> {
        let b = *self.bytes.get(self.pos).ok_or(Bad::Short)?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> TResult<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(Bad::Invalid("varint overflow"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Bad::Invalid("varint overflow"))
    }

    fn zigzag(&mut self) -> TResult<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn i32(&mut self) -> TResult<i32> {
        i32::try_from(self.zigzag()?).map_err(|_| Bad::Invalid("i32 out of range"))
    }

    fn skip_bytes(&mut self, n: u64) -> TResult<()> {
        let n = usize::try_from(n).map_err(|_| Bad::Short)?;
        let end = self.pos.checked_add(n).ok_or(Bad::Short)?;
        if end > self.bytes.len() {
            return Err(Bad::Short);
        }
        self.pos = end;
        Ok(())
    }

    /// The next field's id and type, `None` at the struct's end.
    fn field(&mut self, last: &mut i16) -> TResult<Option<u8>> {
        let b = self.byte()?;
        if b == 0 {
            return Ok(None);
        }
        let delta = i16::from(b >> 4);
        *last = if delta == 0 {
            i16::try_from(self.zigzag()?).map_err(|_| Bad::Invalid("field id out of range"))?
        } else {
            last.checked_add(delta)
                .ok_or(Bad::Invalid("field id out of range"))?
        };
        Ok(Some(b & 0x0f))
    }

    /// Skips a value of type `t`; `elem` when it is an element of a list, set or map.
    fn skip(&mut self, t: u8, elem: bool, depth: usize) -> TResult<()> {
        if depth > MAX_DEPTH {
            return Err(Bad::Invalid("nesting too deep"));
        }
        match t {
            ttype::TRUE | ttype::FALSE if !elem => Ok(()),
            ttype::TRUE | ttype::FALSE | ttype::BYTE => self.byte().map(drop),
            ttype::I16 | ttype::I32 | ttype::I64 => self.varint().map(drop),
            ttype::DOUBLE => self.skip_bytes(8),
            ttype::BINARY => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            ttype::LIST | ttype::SET => {
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                for _ in 0..n {
                    self.skip(h & 0x0f, true, depth + 1)?;
                }
                Ok(())
            }
            ttype::MAP => {
                let n = self.varint()?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.skip(kv >> 4, true, depth + 1)?;
                        self.skip(kv & 0x0f, true, depth + 1)?;
                    }
                }
                Ok(())
            }
            ttype::STRUCT => {
                let mut last = 0;
                while let Some(t) = self.field(&mut last)? {
                    self.skip(t, false, depth + 1)?;
                }
                Ok(())
            }
            _ => Err(Bad::Invalid("unknown Thrift type")),
        }
    }

    /// Reads a struct, handing each field (id, type) to `f`, which reads the value or returns
    /// `false` to skip it.
    fn fields(&mut self, mut f: impl FnMut(&mut Self, i16, u8) -> TResult<bool>) -> TResult<()> {
        let mut last = 0;
        while let Some(t) = self.field(&mut last)? {
            if !f(self, last, t)? {
                self.skip(t, false, 1)?;
            }
        }
        Ok(())
    }

    /// An i32 field of type `t`.
    fn i32_field(&mut self, t: u8) -> TResult<i32> {
        if t != ttype::I32 {
            return Err(Bad::Invalid("a field of the wrong type"));
        }
        self.i32()
    }
}

/// The encoding numbered `v` in the Parquet format.
fn encoding(v: i32) -> TResult<Encoding> {
    Encoding::VARIANTS
        .iter()
        .copied()
        .find(|&e| e as i32 == v)
        .ok_or(Bad::Invalid("unknown encoding"))
}

/// A non-negative i32 as usize.
fn size(v: i32) -> TResult<usize> {
    usize::try_from(v).map_err(|_| Bad::Invalid("negative size"))
}

impl Header {
    /// Parses the header at the start of `bytes`.
    fn parse(bytes: &[u8]) -> Parsed {
        let mut r = Thrift { bytes, pos: 0 };
        match Self::read(&mut r) {
            Ok(h) => Ok(Ok((h, r.pos))),
            Err(Bad::Short) => Err(Short),
            Err(Bad::Invalid(why)) => Ok(Err(general(&format!("invalid page header: {why}")))),
        }
    }

    fn read(r: &mut Thrift) -> TResult<Header> {
        let (mut kind, mut uncompressed, mut compressed) = (None, None, None);
        let (mut num_values, mut enc, mut def_enc, mut rep_enc) = (None, None, None, None);
        let (mut is_sorted, mut v2) = (false, None);
        r.fields(|r, id, t| {
            match id {
                1 => {
                    kind = Some(match r.i32_field(t)? {
                        0 => PageKind::Data,
                        1 => PageKind::Index,
                        2 => PageKind::Dictionary,
                        3 => PageKind::DataV2,
                        _ => return Err(Bad::Invalid("unknown page type")),
                    })
                }
                2 => uncompressed = Some(size(r.i32_field(t)?)?),
                3 => compressed = Some(size(r.i32_field(t)?)?),
                5 | 7 | 8 if t == ttype::STRUCT => {
                    let (mut nulls, mut rows, mut def_len, mut rep_len) = (0, 0, 0, 0);
                    let mut is_compressed = true;
                    r.fields(|r, fid, ft| {
                        match (id, fid) {
                            (_, 1) => num_values = Some(size(r.i32_field(ft)?)?),
                            (5, 2) | (7, 2) | (8, 4) => enc = Some(encoding(r.i32_field(ft)?)?),
                            (5, 3) => def_enc = Some(encoding(r.i32_field(ft)?)?),
                            (5, 4) => rep_enc = Some(encoding(r.i32_field(ft)?)?),
                            (7, 3) if ft == ttype::TRUE || ft == ttype::FALSE => {
                                is_sorted = ft == ttype::TRUE
                            }
                            (8, 2) => nulls = size(r.i32_field(ft)?)?,
                            (8, 3) => rows = size(r.i32_field(ft)?)?,
                            (8, 5) => def_len = size(r.i32_field(ft)?)?,
                            (8, 6) => rep_len = size(r.i32_field(ft)?)?,
                            (8, 7) if ft == ttype::TRUE || ft == ttype::FALSE => {
                                is_compressed = ft == ttype::TRUE
                            }
                            _ => return Ok(false),
                        }
                        Ok(true)
                    })?;
                    if id == 8 {
                        v2 = Some(V2 {
                            num_nulls: nulls as u32,
                            num_rows: rows as u32,
                            def_len,
                            rep_len,
                            compressed: is_compressed,
                        });
                    }
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        let missing = Bad::Invalid("a required field is missing");
        let (Some(kind), Some(uncompressed), Some(compressed)) = (kind, uncompressed, compressed)
        else {
            return Err(missing);
        };
        if uncompressed > PAGE_MAX || compressed > PAGE_MAX {
            return Err(Bad::Invalid("page too large"));
        }
        let data = matches!(
            kind,
            PageKind::Data | PageKind::DataV2 | PageKind::Dictionary
        );
        let num_values = match num_values {
            Some(n) => u32::try_from(n).map_err(|_| Bad::Invalid("too many values"))?,
            None if !data => 0,
            None => return Err(missing),
        };
        let encoding = match enc {
            Some(e) => e,
            None if !data => Encoding::PLAIN,
            None => return Err(missing),
        };
        let (def_encoding, rep_encoding) = match (kind, def_enc, rep_enc) {
            (PageKind::Data, Some(d), Some(r)) => (d, r),
            (PageKind::Data, _, _) => return Err(missing),
            _ => (Encoding::RLE, Encoding::RLE),
        };
        if kind == PageKind::DataV2 && v2.is_none() {
            return Err(missing);
        }
        Ok(Header {
            kind,
            uncompressed,
            compressed,
            num_values,
            encoding,
            def_encoding,
            rep_encoding,
            is_sorted,
            v2,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::RecordBatch;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use proptest::prelude::*;

    use super::*;

    /// The bytes of the list column chunk of a small file parquet writes.
    fn chunk(v2: bool, dictionary: bool) -> Vec<u8> {
        let mut ids = ListBuilder::new(Int32Builder::new());
        for r in 0..100 {
            for j in 0..r % 7 {
                ids.values().append_value(r * 3 + j);
            }
            ids.append(true);
        }
        let batch = RecordBatch::try_from_iter([("ids", Arc::new(ids.finish()) as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_dictionary_enabled(dictionary)
            .set_writer_version(if v2 {
                WriterVersion::PARQUET_2_0
            } else {
                WriterVersion::PARQUET_1_0
            })
            .build();
        let mut file = Vec::new();
        let mut w = ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let file = Bytes::from(file);
        let reader = SerializedFileReader::new(file.clone()).unwrap();
        let (start, len) = reader.metadata().row_group(0).column(0).byte_range();
        file[start as usize..(start + len) as usize].to_vec()
    }

    #[test]
    fn parses_the_headers_parquet_writes() {
        for v2 in [false, true] {
            for dictionary in [false, true] {
                let bytes = chunk(v2, dictionary);
                let Ok(Ok((first, used))) = Header::parse(&bytes) else {
                    panic!("header not parsed (v2 {v2}, dictionary {dictionary})");
                };
                let mut at = used + first.compressed;
                if dictionary {
                    assert_eq!(first.kind, PageKind::Dictionary);
                    let Ok(Ok((data, n))) = Header::parse(&bytes[at..]) else {
                        panic!("data page header not parsed");
                    };
                    at += n + data.compressed;
                    assert_eq!(data.encoding, Encoding::RLE_DICTIONARY);
                    assert_eq!(data.num_values, 310);
                } else {
                    assert_eq!(first.num_values, 310, "one level per value or empty list");
                    assert_eq!(
                        first.kind,
                        [PageKind::Data, PageKind::DataV2][usize::from(v2)]
                    );
                    assert_eq!(first.v2.is_some(), v2);
                }
                assert_eq!(at, bytes.len(), "one data page");
                for cut in 0..used {
                    assert!(
                        Header::parse(&bytes[..cut]).is_err(),
                        "prefix {cut} is short"
                    );
                }
            }
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        // Field 4 as a struct, then structs nested in field 1 of each.
        let mut bytes = vec![0x4c];
        bytes.extend([0x1c; 64]);
        match Header::parse(&bytes) {
            Ok(Err(e)) => assert!(e.to_string().contains("nesting"), "{e}"),
            _ => panic!("deep nesting accepted"),
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(Ok((h, used))) = Header::parse(&bytes) {
                prop_assert!(used <= bytes.len());
                prop_assert!(h.uncompressed <= PAGE_MAX && h.compressed <= PAGE_MAX);
            }
        }
    }
}
